"""Building a causal LM through transformers, with the one model class rlvr adds to it.

transformers 5.19 builds `mistral4` (Mistral Large 3's math: MLA with interleaved rope, softmax
routing with renormalised top-k, llama-4 query scaling) only as an image-text-to-text model,
and has no checkpoint conversion for its experts, so `AutoModelForCausalLM` refuses its config
and `save_pretrained` writes fused `experts.gate_up_proj` tensors that vLLM does not read.
`register_mistral4` adds both, once; a transformers release that lists either itself keeps its
own. Every rlvr path that builds a model calls `causal_lm_from_config` or
`causal_lm_from_pretrained`, which register first; code that builds one with transformers'
own classes calls `register_mistral4` itself. The conversion is rlvr's, not transformers':
transformers' own class, in a process that has not registered it, reads the experts fused as
they are in memory, which is what `rlvr import` writes (`transformers_disk_layout`).
"""

from __future__ import annotations

from functools import cache

from transformers import AutoModelForCausalLM, PreTrainedModel
from transformers.conversion_mapping import get_checkpoint_conversion_mapping, register_checkpoint_conversion_mapping
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
from transformers.models.mistral4 import Mistral4Config, Mistral4ForCausalLM

from rlvr.models.hub_layout import to_disk

# model types whose checkpoint conversion rlvr registered (transformers ships none for them)
_RLVR_CONVERSIONS: set[str] = set()


@cache
def register_mistral4() -> None:
    if Mistral4Config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        # exist_ok: without it transformers silently skips a config class of its own
        AutoModelForCausalLM.register(Mistral4Config, Mistral4ForCausalLM, exist_ok=True)
    if get_checkpoint_conversion_mapping(Mistral4Config.model_type) is None:
        # one Linear per expert on disk, as DeepSeek-V3 (whose MoE block mistral4 shares) and vLLM read it
        register_checkpoint_conversion_mapping(
            Mistral4Config.model_type, get_checkpoint_conversion_mapping("deepseek_v3")
        )
        _RLVR_CONVERSIONS.add(Mistral4Config.model_type)


def transformers_disk_layout(model: PreTrainedModel, state: dict) -> dict:
    """`model`'s in-memory tensors under the names and shapes transformers' own class loads
    (what its `save_pretrained` writes with no rlvr registration): through transformers' own
    conversion mapping, or as they are in memory where it ships none."""
    register_mistral4()
    return state if model.config.model_type in _RLVR_CONVERSIONS else to_disk(model, state)


def causal_lm_from_config(config, **kwargs) -> PreTrainedModel:
    register_mistral4()
    return AutoModelForCausalLM.from_config(config, **kwargs)


def causal_lm_from_pretrained(path, **kwargs) -> PreTrainedModel:
    register_mistral4()
    return AutoModelForCausalLM.from_pretrained(path, **kwargs)
