"""4-bit checkpoints, NVFP4 in compressed-tensors' format or NF4 in bitsandbytes': write one, load it
packed, or get its float weights.

A checkpoint folder is an HF model folder where every quantized Linear `P` stores, instead of
`P.weight`, the tensors `P.weight_packed`, `P.weight_scale`, `P.weight_global_scale` and
`P.input_global_scale` (see `rlvr.quant.nvfp4` for their layout), and `config.json` carries
the `quantization_config` that llm-compressor writes for its NVFP4 scheme (W4A4: FP4 weights,
FP4 activations quantized dynamically per group of 16 with a calibrated global scale), so vLLM
serves it with its NVFP4 kernels where the GPU has them. MoE experts are stored as on the Hub
and as llm-compressor writes them, one quantized Linear per expert projection
(`...experts.{i}.gate_proj/up_proj/down_proj`, Mixtral's `...experts.{i}.w1/w3/w2`), although
transformers 5 fuses them into 3-D parameters in memory; names go through transformers' own
conversion mapping (rlvr.models.hub_layout), so `P` is always the on-disk module name.

An NF4 folder (`format="nf4"`) is the one transformers saves for a bitsandbytes 4-bit model:
each quantized Linear `P` stores `P.weight` (packed uint8) with `P.weight.absmax`,
`P.weight.quant_map` and `P.weight.quant_state.bitsandbytes__nf4` (see `rlvr.quant.nf4`), and
`quantization_config` is `BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")`'s.
NF4 needs no calibration: each block of 64 weights carries its own absmax. bitsandbytes
quantizes `nn.Linear` only, so MoE experts stay float in an NF4 folder.

- `quantize_checkpoint(model_dir, out_dir)`: every `nn.Linear` and (NVFP4) every experts
  module outside `ignore` is quantized; routers, embeddings and norms stay float, and the
  routers are added to the written ignore list (vLLM would otherwise quantize its gate).
  Layers that read the very same input tensor (q/k/v, gate/up, MLA's q_a/kv_a) share one
  weight global scale, found by watching a calibration forward, not from names: vLLM fuses
  them into one GEMM with one global scale; an expert's gate and up rows share one likewise.
  The same forward (rlvr.quant.calibration) calibrates `input_global_scale`.
- `load_quantized_model(model_dir)`: the HF model with those Linears replaced by frozen
  `NVFP4Linear` / `NF4Linear` modules and the experts packed (rlvr.quant.experts); no float
  copy of their weights is ever built.
- `dequantized_state_dict(model_dir)` / `write_dequantized_checkpoint(model_dir, out_dir)`: the
  float weights, for an engine with no 4-bit kernel (vLLM on CPU), so that sampler and trainer
  compute with the same numbers; `dequantized_view(model_dir)`: that folder beside the checkpoint,
  written once, for the engine and a trainer that reads float weights alike.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from rlvr.models.checkpoint_files import CheckpointFiles
from rlvr.models.folder import ModelFolder, as_model_folder
from rlvr.models.hub_layout import ExpertPiece, disk_name, expert_pieces, to_disk
from rlvr.models.mistral_layout import PARAMS_FILE, WEIGHTS_FILE, write_mistral_folder
from rlvr.models.moe import expert_projections, moe_layers
from rlvr.models.transformers_classes import causal_lm_from_pretrained
from rlvr.quant import nf4, nvfp4
from rlvr.quant.calibration import DEFAULT_CALIBRATION_TEXTS, calibrate, calibration_inputs
from rlvr.quant.formats import nvfp4_quantization_config, quantized_format
from rlvr.quant.skeleton import Skeleton

QUANTIZED_TENSOR_SUFFIXES = ("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale")
# what `quantize_checkpoint(format=...)` writes, and the columns each needs a multiple of
FORMATS = {"nvfp4": nvfp4.GROUP_SIZE, "nf4": nf4.BLOCK_SIZE}


def is_ignored(name: str, ignore: Sequence[str]) -> bool:
    """compressed-tensors' ignore rule: an exact module name, or `re:PATTERN` matched from the start."""
    return any(re.match(entry[3:], name) if entry.startswith("re:") else entry == name for entry in ignore)


# --------------------------------------------------------------------------- writing


def _copy_non_weight_files(model_dir: Path, out_dir: Path) -> None:
    """Tokenizer, chat template, generation config…: everything but weights and the config
    (config.json, params.json)."""
    for path in model_dir.iterdir():
        is_weight = path.suffix in (".safetensors", ".bin", ".pt") or path.name.endswith(".index.json")
        if path.is_file() and not is_weight and path.name not in ("config.json", PARAMS_FILE):
            shutil.copy2(path, out_dir / path.name)


def _write_quantization_config(out_dir: Path, quantization_config: dict, dtype: torch.dtype) -> None:
    """Add `quantization_config` to the written config.json; `dtype` is the source's float dtype
    (save_pretrained writes the model's, float32 after the float calibration forward)."""
    config_path = out_dir / "config.json"
    config = json.loads(config_path.read_text())
    config["quantization_config"] = quantization_config
    config["dtype"] = str(dtype).removeprefix("torch.")
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


@dataclass
class _Plan:
    """What `quantize_checkpoint` packs, under on-disk names."""

    linears: dict[str, nn.Linear]  # in-memory name -> module
    linear_disk: dict[str, str]  # in-memory name -> on-disk module name
    experts: dict[str, nn.Module]  # in-memory name -> experts module
    expert_disk: dict[tuple[str, str], list[ExpertPiece]]  # (experts name, projection) -> its on-disk pieces
    routers: list[str]  # on-disk names of router modules and the Linears inside them, kept float


def _plan(model: nn.Module, model_dir: Path, ignore: Sequence[str], multiple: int, pack_experts: bool) -> _Plan:
    """Which Linears and experts modules to pack (by their on-disk names), checked."""
    layers = moe_layers(model)
    router_names = [layer.router_name for layer in layers]

    def in_router(name: str) -> bool:
        return any(name == r or name.startswith(f"{r}.") for r in router_names)

    def disk(name: str, module: nn.Module) -> str:
        return disk_name(model, f"{name}.weight", module.weight.shape).removesuffix(".weight")

    routers = [
        disk(name, m)
        for name, m in model.named_modules()
        if in_router(name) and isinstance(getattr(m, "weight", None), nn.Parameter)
    ]
    linears, linear_disk = {}, {}
    embedding_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear) or in_router(name):
            continue
        on_disk = disk(name, module)
        if is_ignored(on_disk, ignore):
            continue
        if id(module.weight) in embedding_weights:
            raise ValueError(f"{model_dir}: {name}.weight is tied to an embedding; add {on_disk!r} to ignore")
        if module.in_features % multiple:
            raise ValueError(
                f"{model_dir}: {name} has {module.in_features} input features, not a multiple of {multiple}; "
                f"add {on_disk!r} to ignore"
            )
        linears[name], linear_disk[name] = module, on_disk

    experts, expert_disk = {}, {}
    for layer in layers if pack_experts else []:
        pieces = {
            p: expert_pieces(model, f"{layer.experts_name}.{p}", getattr(layer.experts, p).shape)
            for p in expert_projections(layer.experts)
        }
        ignored = [piece.prefix for ps in pieces.values() for piece in ps if is_ignored(piece.prefix, ignore)]
        if ignored and len(ignored) < sum(map(len, pieces.values())):
            raise ValueError(
                f"{model_dir}: ignore names {ignored[0]} but not every expert of {layer.experts_name}; ignore all or none"
            )
        if ignored:
            continue
        if layer.experts.has_bias:
            raise ValueError(
                f"{model_dir}: {layer.experts_name} has biases, which rlvr does not pack; add its experts to ignore"
            )
        for projection, ps in pieces.items():
            columns = getattr(layer.experts, projection).shape[-1]
            if columns % multiple:
                raise ValueError(
                    f"{model_dir}: {layer.experts_name}.{projection} has {columns} input features, not a multiple "
                    f"of {multiple}; add 're:{re.escape(layer.experts_name)}\\..*' to ignore"
                )
        experts[layer.experts_name] = layer.experts
        expert_disk.update({(layer.experts_name, p): ps for p, ps in pieces.items()})
    return _Plan(linears, linear_disk, experts, expert_disk, routers)


def _float_tensors_on_disk(model: nn.Module, plan: _Plan, dtypes: dict[str, torch.dtype]) -> dict[str, torch.Tensor]:
    """Every tensor not packed, in its source dtype, under its on-disk name (tied ones stay one tensor)."""
    packed = {f"{name}.weight" for name in plan.linears} | {f"{name}.{p}" for name, p in plan.expert_disk}
    converted: dict[int, torch.Tensor] = {}
    state = {}
    for key, tensor in model.state_dict().items():
        if key not in packed:
            state[key] = converted.setdefault(tensor.data_ptr(), tensor.to(dtypes[key]))
    return to_disk(model, state)


def quantize_checkpoint(
    model_dir: ModelFolder | str | Path,
    out_dir: str | Path,
    format: str = "nvfp4",
    ignore: Sequence[str] = ("lm_head",),
    calibration_texts: Sequence[str] = DEFAULT_CALIBRATION_TEXTS,
) -> Path:
    """Write `model_dir` (an HF causal LM folder, or one in Mistral's layout) to `out_dir` as
    `format`: "nvfp4" (compressed-tensors `nvfp4-pack-quantized`, MoE experts included) or "nf4"
    (bitsandbytes 4-bit NF4, Linears only). `ignore` names modules kept in float (exact, or
    `re:`) by their transformers on-disk names. A Mistral folder is written in Mistral's layout
    (params.json's `quantization`, consolidated.safetensors), as vLLM reads it with
    `--load-format mistral`."""
    if format not in FORMATS:
        raise ValueError(f"unknown quantization format {format!r}; known: {', '.join(FORMATS)}")
    folder, out_dir = as_model_folder(model_dir), Path(out_dir)
    model_dir = folder.path
    if folder.mistral and format != "nvfp4":
        raise ValueError(
            f"{model_dir}: Mistral's layout carries compressed-tensors quantization only (vLLM's "
            f"adapt_config_dict); quantize it as nvfp4, or import it first (rlvr import) for {format}"
        )
    model = _float_model(folder)
    source_dtype = model.dtype
    dtypes = {key: tensor.dtype for key, tensor in model.state_dict().items()}
    model.float().eval()
    plan = _plan(model, model_dir, ignore, FORMATS[format], pack_experts=format == "nvfp4")
    kept_float = [*ignore, *(r for r in plan.routers if not is_ignored(r, ignore))]
    if format == "nf4":
        state = {}
        for name, module in plan.linears.items():
            stored = nf4.to_checkpoint(nf4.quantize(module.weight.detach()), source_dtype)
            state.update({f"{plan.linear_disk[name]}.{suffix}": tensor for suffix, tensor in stored.items()})
        quantization_config = nf4.quantization_config(kept_float, source_dtype)
    else:
        state = _nvfp4_tensors(model, plan, model_dir, calibration_texts)
        quantization_config = nvfp4_quantization_config(kept_float)
    state.update(_float_tensors_on_disk(model, plan, dtypes))  # biases of packed Linears included
    out_dir.mkdir(parents=True, exist_ok=True)
    _copy_non_weight_files(model_dir, out_dir)
    if folder.mistral:
        model.config.dtype = source_dtype
        write_mistral_folder(state, model.config, out_dir, quantization=quantization_config)
        return out_dir
    model.save_pretrained(out_dir, state_dict=state, save_original_format=False)
    _write_quantization_config(out_dir, quantization_config, source_dtype)
    return out_dir


def _float_model(folder: ModelFolder) -> nn.Module:
    """The float model of an HF folder (as stored), or of a Mistral folder (read as the trainer
    reads it, in the dtype of its embedding). Its names go out through transformers' own mapping,
    not through the one the folder was read with, so a folder of fused experts (what
    `save_pretrained` writes where transformers has no conversion) is written one Linear per
    expert, as vLLM reads it."""
    if not folder.mistral:
        model = causal_lm_from_pretrained(folder.path, dtype="auto")
        model._weight_conversions = None  # revert_weight_conversion then takes the model type's mapping
        return model
    dtype = CheckpointFiles(folder).meta("model.embed_tokens.weight").dtype
    skeleton = Skeleton.from_checkpoint(folder, dtype)
    skeleton.keep_initialized(skeleton.model)
    skeleton.fill(skeleton.model, "cpu")
    return skeleton.model


def _stored(prefix: str, weight: nvfp4.NVFP4Weight, input_global_scale: torch.Tensor) -> dict[str, torch.Tensor]:
    """One quantized Linear's checkpoint tensors under `prefix`."""
    tensors = (weight.weight_packed, weight.weight_scale, weight.weight_global_scale, input_global_scale)
    return {f"{prefix}.{suffix}": tensor for suffix, tensor in zip(QUANTIZED_TENSOR_SUFFIXES, tensors, strict=True)}


def _nvfp4_tensors(model: nn.Module, plan: _Plan, model_dir: Path, texts: Sequence[str]) -> dict[str, torch.Tensor]:
    """The packed tensors of every planned Linear and expert projection, under on-disk names."""
    inputs, _source = calibration_inputs(model_dir, model.config.get_text_config().vocab_size, texts)
    input_amax, shared_groups, expert_amax = calibrate(model, plan.linears, plan.experts, inputs)
    weight_global_scale = {name: nvfp4.global_scale_for(m.weight.abs().max()) for name, m in plan.linears.items()}
    for group in shared_groups:
        # the largest weight sets the scale, so that no member's group scales overflow FP8
        shared = torch.stack([weight_global_scale[name] for name in group]).min().reshape(1)
        weight_global_scale.update({name: shared.clone() for name in group})

    state = {}
    for name, module in plan.linears.items():
        weight = nvfp4.quantize(module.weight.detach(), weight_global_scale[name])
        # an uncalibrated layer gets 1.0, as in llm-compressor
        state.update(
            _stored(plan.linear_disk[name], weight, nvfp4.global_scale_for(input_amax.get(name, torch.tensor(0.0))))
        )
    for (name, projection), pieces in plan.expert_disk.items():
        weights = getattr(plan.experts[name], projection).detach()
        input_global_scale = [nvfp4.global_scale_for(amax) for amax in expert_amax[(name, projection)]]
        for expert in range(weights.shape[0]):
            mine = [p for p in pieces if p.expert == expert]
            # gate and up rows read one input, and vLLM fuses them into one GEMM with one global scale
            shared = torch.stack(
                [nvfp4.global_scale_for(weights[expert, p.start : p.stop].abs().max()) for p in mine]
            ).min()
            for p in mine:
                # each stored tensor its own (safetensors refuses shared storage)
                weight = nvfp4.quantize(weights[expert, p.start : p.stop], shared.clone())
                state.update(_stored(p.prefix, weight, input_global_scale[expert].clone()))
    return state


# --------------------------------------------------------------------------- reading


def _read_tensors(folder: ModelFolder):
    """All tensors of the folder's safetensors files under transformers' on-disk names, and the
    files (a CheckpointFiles, for naming where each came from)."""
    files = CheckpointFiles(folder)
    return {key: files.read(key) for key in files.keys()}, files


def _pop_quantized(tensors: dict, files, prefix: str) -> tuple[nvfp4.NVFP4Weight, torch.Tensor | None]:
    """Remove and return one layer's NVFP4 tensors (checked), and its input global scale if any."""
    where = files.where(f"{prefix}.weight_packed", prefix)
    missing = [s for s in ("weight_scale", "weight_global_scale") if f"{prefix}.{s}" not in tensors]
    if missing:
        raise ValueError(f"{where}: has weight_packed but no {' or '.join(missing)}")
    weight = nvfp4.NVFP4Weight(*(tensors.pop(f"{prefix}.{s}") for s in QUANTIZED_TENSOR_SUFFIXES[:3]))
    nvfp4.check_shapes(weight, where)
    return weight, tensors.pop(f"{prefix}.input_global_scale", None)


def _quantized_prefixes(tensors: dict) -> list[str]:
    return [key.removesuffix(".weight_packed") for key in tensors if key.endswith(".weight_packed")]


def _pop_nf4(tensors: dict, files, prefix: str) -> nf4.NF4Weight:
    """Remove and return one layer's NF4 tensors (bitsandbytes' keys), checked."""
    where = files.where(f"{prefix}.weight.{nf4.QUANT_STATE_KEY}", prefix)
    stored = {
        suffix: tensors.pop(f"{prefix}.{suffix}")
        for suffix in nf4.CHECKPOINT_SUFFIXES
        if f"{prefix}.{suffix}" in tensors
    }
    nested = [key for key in tensors if key.startswith(f"{prefix}.weight.nested_")]
    stored.update({key.removeprefix(f"{prefix}."): tensors[key] for key in nested})
    return nf4.from_checkpoint(stored, where)


def _nf4_prefixes(tensors: dict) -> list[str]:
    suffix = f".weight.{nf4.QUANT_STATE_KEY}"
    return [key.removesuffix(suffix) for key in tensors if key.endswith(suffix)]


def load_quantized_model(model_dir: ModelFolder | str | Path, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The HF causal LM of a 4-bit checkpoint, each quantized Linear an `NVFP4Linear` (or
    `NF4Linear`) and each NVFP4 experts module packed (rlvr.quant.experts), computing in `dtype`.

    Modules are found by type, not by name, and matched to the files through transformers'
    own conversion mapping (rlvr.models.hub_layout): a Linear whose on-disk name has
    `weight_packed` (NF4: `weight.quant_state.bitsandbytes__nf4`) becomes packed, and so does an
    experts module whose every expert projection has. No float copy of a packed weight is ever
    built. A parameter no file provides, or a tensor no module takes, is an error naming it.
    The trainer's ranks load the same skeleton sharded (rlvr.quant.skeleton).
    """
    folder = as_model_folder(model_dir)
    quantized_format(folder)  # a quantized checkpoint, its config checked
    skeleton = Skeleton.from_checkpoint(folder, dtype)
    skeleton.keep_initialized(skeleton.model)
    skeleton.fill(skeleton.model, "cpu")
    return skeleton.model.eval()


def dequantized_state_dict(
    model_dir: ModelFolder | str | Path, dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors with every packed weight replaced by `P.weight` in `dtype`.

    These are the values `load_quantized_model` computes with, under transformers' on-disk names
    (a Mistral folder's mapped as vLLM maps them), which is what an engine without 4-bit kernels
    (vLLM on CPU) loads.
    """
    folder = as_model_folder(model_dir)
    format = quantized_format(folder)
    tensors, files = _read_tensors(folder)
    if format == "nf4":
        for prefix in _nf4_prefixes(tensors):
            weight = _pop_nf4(tensors, files, prefix)
            tensors[f"{prefix}.weight"] = nf4.dequantize(weight.weight_packed, weight.weight_absmax, dtype)
    for prefix in _quantized_prefixes(tensors):
        weight, _input_global_scale = _pop_quantized(tensors, files, prefix)
        tensors[f"{prefix}.weight"] = nvfp4.dequantize(
            weight.weight_packed, weight.weight_scale, weight.weight_global_scale, dtype
        )
    return {key: value.to(dtype) if value.is_floating_point() else value for key, value in tensors.items()}


def write_dequantized_checkpoint(
    model_dir: ModelFolder | str | Path, out_dir: str | Path, dtype: torch.dtype = torch.float32, layout: str = "hf"
) -> Path:
    """A plain float folder (no quantization) holding `dequantized_state_dict(model_dir)`, in the
    Hugging Face layout (config.json, model.safetensors) or, `layout="mistral"`, in Mistral's
    (params.json, consolidated.safetensors; rlvr.models.mistral_layout)."""
    folder, out_dir = as_model_folder(model_dir), Path(out_dir)
    state = {k: v.contiguous() for k, v in dequantized_state_dict(folder, dtype).items()}
    config = folder.transformers_config()
    del config.quantization_config
    config.dtype = dtype
    out_dir.mkdir(parents=True, exist_ok=True)
    _copy_non_weight_files(folder.path, out_dir)
    if layout == "mistral":
        write_mistral_folder(state, config, out_dir)
        return out_dir
    if layout != "hf":
        raise ValueError(f"unknown layout {layout!r}; known: hf, mistral")
    config.save_pretrained(out_dir)
    save_file(state, out_dir / "model.safetensors", metadata={"format": "pt"})
    return out_dir


def dequantized_view(model_dir: ModelFolder | str | Path, layout: str = "hf") -> Path:
    """`write_dequantized_checkpoint`'s float32 folder beside the checkpoint (`<folder>.dequantized`,
    or `.dequantized-mistral`), written on first use. Written aside and renamed into place: the
    engine and the trainer ranks of a run start together, and each may be the first to ask."""
    folder = as_model_folder(model_dir)
    view = Path(str(folder.path).rstrip("/") + (".dequantized" if layout == "hf" else ".dequantized-mistral"))
    done = view / (WEIGHTS_FILE if layout == "mistral" else "model.safetensors")  # written last
    if done.is_file():
        return view
    staging = Path(tempfile.mkdtemp(prefix=view.name + ".", dir=view.parent))
    write_dequantized_checkpoint(folder, staging, layout=layout)
    if not done.is_file():
        shutil.rmtree(view, ignore_errors=True)  # what a process killed while writing it left
    try:
        staging.rename(view)
    except OSError:  # another process's copy got there first: the same values
        shutil.rmtree(staging)
    return view
