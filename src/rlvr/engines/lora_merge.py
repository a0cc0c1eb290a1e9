"""A LoRA adapter merged into the weights it adapts, for an engine that serves it that way.

A bf16 engine rounds W + scale * B @ A to bfloat16. Early in a run the adapter's change to a
weight is far below half a bf16 ulp of the weight (2^-9 of it), so rounding to nearest gives W
back: the engine samples the base while the trainer, which adds the adapter's output on its own,
trains away from it, and their logprob gap grows with every step the adapter grows through the
rounding (0.006 -> 0.017 in 4 steps on a 110M model). Rounded stochastically, up or down with
probability by distance, every merged weight equals bf16(W) + scale * B @ A in expectation, so
every output of the layer does too; with the base first rounded to nearest as the trainer holds
it, the rounding's zero-mean noise scales with the adapter's change, not with the weight.
"""

from __future__ import annotations

import math
import zlib
from pathlib import Path

import torch
from safetensors.torch import load_file

from rlvr.records import LoraAdapter


def stochastic_round(values: torch.Tensor, dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """float32 `values` in `dtype`; to bfloat16 stochastically (E[result] = values), else to nearest.

    bfloat16 is float32's upper 16 bits: adding uniform noise over the lower 16 to the bit
    pattern and dropping them rounds the magnitude up with probability (lower bits) / 2^16,
    whatever the sign."""
    if dtype != torch.bfloat16:
        return values.to(dtype)
    bits = values.float().contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, bits.shape, dtype=torch.int32, generator=generator)
    return ((bits + noise) & -(1 << 16)).view(torch.float32).to(torch.bfloat16)


def content_seed(tensors: dict[str, torch.Tensor]) -> int:
    """A seed drawn from the tensors' bytes: the same adapter is merged to the same weights whatever
    version, process or run serves it (a resumed run, `rlvr eval --run` of a run's adapter)."""
    crc = 0
    for name in sorted(tensors):
        data = tensors[name].detach().cpu().contiguous().view(torch.uint8).numpy()
        crc = zlib.crc32(data, crc)  # type: ignore[arg-type]  # numpy's stubs declare ndarray.__buffer__ on 3.12+ only
    return crc


def merged_weights(
    base: dict[str, torch.Tensor],
    lora: dict[str, torch.Tensor],
    config: dict,
    dtype: torch.dtype | None = None,
) -> list[tuple[str, torch.Tensor]]:
    """The weights a PEFT LoRA adapter changes, merged: the adapted linear weights replaced by
    W + scale * B @ A (scale = alpha / r, or alpha / sqrt(r) with rsLoRA), computed in float32
    and returned in `dtype` (None: the base's; bfloat16 rounded stochastically, drawn from the
    adapter's own bytes), with every other `base` tensor of the modules that hold them (`...self_attn.*`,
    `...mlp.*`): vLLM fuses sibling projections (q, k, v with their biases; gate and up) into
    one layer, which must be reloaded whole. The embeddings, norms and every module the adapter
    does not touch are left out: the engine keeps them."""
    if config.get("use_dora"):
        raise ValueError("merging a DoRA adapter is not supported; serve it with merge_lora=False")
    rank = int(config["r"])
    scale = float(config["lora_alpha"]) / (math.sqrt(rank) if config.get("use_rslora") else rank)
    factors: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in lora.items():
        module, found, part = name.removeprefix("base_model.model.").rpartition(".lora_")
        if not found or part not in ("A.weight", "B.weight"):
            raise ValueError(f"adapter tensor {name!r} is not a LoRA A/B matrix; only those can be merged")
        factors.setdefault(f"{module}.weight", {})[part[0]] = tensor
    parents = tuple(key.rsplit(".", 2)[0] + "." for key in factors)  # "model.layers.0.self_attn."
    merged = {name: tensor for name, tensor in base.items() if name.startswith(parents)}
    generator = torch.Generator().manual_seed(content_seed(lora))
    for key in sorted(factors):  # one draw order for a seed, whatever order the adapter lists its tensors in
        pair = factors[key]
        if key not in base or set(pair) != {"A", "B"}:
            raise ValueError(
                f"adapter adapts {key!r}, which is not a weight of the base model or lacks its A or B matrix"
            )
        w, into = base[key], dtype or base[key].dtype
        # the base weight as the trainer holds it in `into` (rounded to nearest), then the adapter's
        # change on top: the stochastic rounding's noise scales with the change, not with the weight
        summed = w.to(into).float() + scale * (pair["B"].float() @ pair["A"].float())
        merged[key] = stochastic_round(summed, into, generator)
    return list(merged.items())


def read_base_weights(model_path: str) -> dict[str, torch.Tensor]:
    """Every tensor of the model folder's safetensors files: the base an adapter is merged into."""
    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        raise ValueError(f"{model_path}: no .safetensors files to merge a LoRA adapter into")
    return {name: tensor for f in files for name, tensor in load_file(str(f)).items()}


class MergedAdapters:
    """An engine's adapters served merged into its base: the base read from the model folder at the
    first one (a host copy of it, kept), each adapter merged in the engine's `dtype`."""

    def __init__(self, model_path: str, dtype: torch.dtype):
        self.model_path, self.dtype = model_path, dtype
        self.base: dict[str, torch.Tensor] | None = None
        self.version: int | None = None  # the version the engine serves, once it has loaded one

    def merged(self, adapter: LoraAdapter) -> list[tuple[str, torch.Tensor]]:
        """The weights `adapter` changes, merged (see `merged_weights`)."""
        if adapter.version == self.version:
            raise ValueError(f"LoRA version {adapter.version} is already loaded: each sync needs a new version")
        if self.base is None:
            self.base = read_base_weights(self.model_path)
        return merged_weights(self.base, adapter.tensors, adapter.config, self.dtype)
