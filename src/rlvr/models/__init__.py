"""Models: folders, tiny builders, layouts, estimates.

transformers 5.19 builds `mistral4` (Mistral Large 3's math: MLA with interleaved rope, softmax
routing with renormalised top-k, llama-4 query scaling) only as an image-text-to-text model,
and has no checkpoint conversion for its experts, so `AutoModelForCausalLM` refuses its config
and `save_pretrained` writes fused `experts.gate_up_proj` tensors that vLLM does not read. Every
rlvr path that builds a model (trainer ranks, engines, quantize, import, tiny models) imports a
module of this package first, so registering here, once, reaches all of them; a transformers
release that lists either itself keeps its own.
"""

from transformers import AutoModelForCausalLM
from transformers.conversion_mapping import get_checkpoint_conversion_mapping, register_checkpoint_conversion_mapping
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
from transformers.models.mistral4 import Mistral4Config, Mistral4ForCausalLM

if Mistral4Config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
    # exist_ok: without it transformers silently skips a config class of its own
    AutoModelForCausalLM.register(Mistral4Config, Mistral4ForCausalLM, exist_ok=True)
if get_checkpoint_conversion_mapping(Mistral4Config.model_type) is None:
    # one Linear per expert on disk, as DeepSeek-V3 (whose MoE block mistral4 shares) and vLLM read it
    register_checkpoint_conversion_mapping(Mistral4Config.model_type, get_checkpoint_conversion_mapping("deepseek_v3"))
