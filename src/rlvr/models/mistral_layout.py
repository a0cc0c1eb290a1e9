"""Mistral's own checkpoint layout, read and written as vLLM reads it.

A Mistral folder holds `params.json`, `consolidated*.safetensors` (tensors named
`layers.N.attention.wq_a.weight`, `layers.N.experts.E.w1.weight`, ...) and `tekken.json`.
vLLM serves it with `--config-format mistral --load-format mistral --tokenizer-mode mistral`;
rlvr reads it through the same code, from the installed vLLM, so that the trainer computes
what the engine serves:

- config: params.json goes through vLLM's `adapt_config_dict`, and the result is expressed as
  the transformers config whose forward equals vLLM's. Mistral Large 3 (MLA, routed and shared
  experts) becomes `mistral4`: softmax routing with renormalised top-k and no correction bias,
  llama-4 query scaling and YaRN in `rope_parameters`, rope interleaved (MLA's rope dims are
  stored interleaved). transformers' `deepseek_v3` reads the same tensors with other math
  (sigmoid routing, no llama-4 scaling). A dense params.json becomes `mistral`. Anything else,
  and whatever vLLM's own code refuses, is one line naming params.json.
- tensor names: MLA models through `MistralLarge3ForCausalLM.hf_to_vllm_mapper` (a
  `WeightsMapper`); dense models through `MistralForCausalLM.maybe_remap_mistral`, which also
  un-interleaves the rope rows of `wq`/`wk`. vLLM's names are transformers' on-disk names
  (experts one Linear each). The way back (for writing a Mistral folder) is derived from the
  mapper's own patterns, and every name it gives is checked to map forward to where it came
  from; rlvr writes Mistral's layout for MLA models only.
- tensors the mapping leaves alone that `rlvr.models.multimodal.is_encoder_tensor` names belong
  to the image (or audio) encoder, which a text-only run neither loads nor trains; any other
  unmapped tensor is an error.
"""

from __future__ import annotations

import copy
import json
import re
from functools import cache
from pathlib import Path
from types import SimpleNamespace

import torch

from rlvr.errors import UserError
from rlvr.models.multimodal import is_encoder_tensor

PARAMS_FILE = "params.json"
WEIGHTS_PATTERN = "consolidated*.safetensors"
WEIGHTS_FILE = "consolidated.safetensors"
TOKENIZER_FILE = "tekken.json"


class MistralLayoutError(UserError, ValueError):
    pass


# --------------------------------------------------------------------------- the folder


def is_mistral_folder(path: str | Path) -> bool:
    """Mistral's layout: params.json and consolidated*.safetensors, and no other safetensors
    (a repo shipping both layouts is read as its Hugging Face one)."""
    folder = Path(path)
    if not (folder / PARAMS_FILE).is_file():
        return False
    files = list(folder.glob("*.safetensors"))
    consolidated = set(folder.glob(WEIGHTS_PATTERN))
    return bool(consolidated) and all(f in consolidated for f in files)


def weight_files(path: str | Path, *, mistral: bool) -> list[Path]:
    """The safetensors files rlvr reads in the folder (`mistral`: is_mistral_folder's answer):
    consolidated*.safetensors in Mistral's layout, the others in a folder that also ships the
    Hugging Face layout."""
    folder = Path(path)
    files = sorted(folder.glob("*.safetensors"))
    if mistral:
        return files
    consolidated = set(folder.glob(WEIGHTS_PATTERN))
    return [f for f in files if f not in consolidated] or files


def read_params(path: str | Path) -> dict:
    params_file = Path(path) / PARAMS_FILE
    try:
        return json.loads(params_file.read_text())
    except json.JSONDecodeError as err:
        raise MistralLayoutError(f"{params_file}: not valid JSON ({err.msg}, line {err.lineno})") from None


# --------------------------------------------------------------------------- config


def adapted_config(params: dict, where: str) -> dict:
    """params.json as vLLM's `adapt_config_dict` reads it (a DeepSeek-V3 / Mistral / ... dict)."""
    from vllm.transformers_utils.configs.mistral import adapt_config_dict

    try:
        return adapt_config_dict(copy.deepcopy(params), defaults={}).to_dict()
    except (AssertionError, ValueError, KeyError, TypeError) as err:
        raise MistralLayoutError(
            f"{where}: vLLM cannot read it: {str(err).splitlines()[0] or type(err).__name__}"
        ) from None


def hf_config(path: str | Path):
    """The transformers config of a Mistral folder (module doc), `quantization_config` included."""
    params_file = Path(path) / PARAMS_FILE
    return config_from_params(read_params(path), str(params_file))


def config_from_params(params: dict, where: str):
    adapted = adapted_config(params, where)
    if adapted.get("model_type") == "pixtral" or "text_config" in adapted:
        adapted = {**adapted["text_config"], "quantization_config": adapted.get("quantization_config")}
    architecture = (adapted.get("architectures") or [None])[0]
    if architecture == "MistralLarge3ForCausalLM":
        config = _mistral4_config(adapted, where)
    elif architecture == "MistralForCausalLM":
        config = _mistral_config(adapted, where)
    else:
        raise MistralLayoutError(
            f"{where}: vLLM reads it as {architecture}; rlvr reads Mistral's layout for Mistral Large 3 "
            "(MLA with shared experts) and dense Mistral models only"
        )
    quantization = adapted.get("quantization_config")
    if quantization:
        if quantization.get("quant_method") == "fp8":
            raise MistralLayoutError(
                f"{where}: FP8 weights (quantization.qformat_weight fp8_e4m3); rlvr reads "
                "NVFP4 (compressed-tensors) or float Mistral checkpoints"
            )
        config.quantization_config = quantization
    return config


def _fields(config_class, adapted: dict) -> dict:
    """The adapted values that `config_class` has a field for."""
    known = set(getattr(config_class, "__dataclass_fields__", {})) or set(config_class.__annotations__)
    skip = {"model_type", "architectures", "quantization_config", "rope_parameters", "transformers_version"}
    return {k: v for k, v in adapted.items() if k in known and k not in skip and v is not None}


def _rope(adapted: dict) -> dict:
    rope = dict(adapted.get("rope_parameters") or {"rope_type": "default"})
    if "rope_theta" not in rope and adapted.get("rope_theta") is not None:
        rope["rope_theta"] = float(adapted["rope_theta"])
    return rope


def _mistral4_config(adapted: dict, where: str):
    from transformers.models.mistral4 import Mistral4Config

    # what vLLM computes that mistral4's forward must compute too
    routing = {"scoring_func": "softmax", "topk_method": None, "norm_topk_prob": True, "moe_layer_freq": 1}
    wrong = {k: adapted.get(k) for k, v in routing.items() if adapted.get(k, v) != v}
    if wrong:
        raise MistralLayoutError(f"{where}: routing {wrong} is not what mistral4 computes ({routing})")
    scaling = adapted["llama_4_scaling"]  # vLLM asserts it for Mistral Large 3
    rope = _rope(adapted)
    original = int(scaling["original_max_position_embeddings"])
    if rope.get("original_max_position_embeddings", original) != original:
        raise MistralLayoutError(
            f"{where}: yarn.original_max_position_embeddings {rope['original_max_position_embeddings']} differs from "
            f"llama_4_scaling's {original}; transformers' mistral4 reads one value for both"
        )
    rope.update(original_max_position_embeddings=original, llama_4_scaling_beta=float(scaling["beta"]))
    if rope.get("attention_factor") == 1.0:
        # yarn.apply_scale false: vLLM's MLA then takes rope type deepseek_llama_scaling and leaves
        # the softmax scale alone, while transformers' DeepSeek-V3 attention multiplies it by
        # mscale(factor, mscale_all_dim)^2 whenever mscale_all_dim is set (x2.0 at factor 64);
        # with attention_factor given, mscale_all_dim changes nothing else in transformers' YaRN
        rope.pop("mscale_all_dim", None)
    fields = _fields(Mistral4Config, adapted)
    return Mistral4Config(**fields, rope_parameters=rope, rope_interleave=True, architectures=["Mistral4ForCausalLM"])


def _mistral_config(adapted: dict, where: str):
    from transformers import MistralConfig

    if adapted.get("llama_4_scaling"):
        raise MistralLayoutError(
            f"{where}: a dense model with llama_4_scaling (Ministral 3); transformers' mistral has no "
            "llama-4 query scaling, so rlvr reads such a model from its Hugging Face layout only"
        )
    if adapted.get("layer_types") and len(set(adapted["layer_types"])) > 1:
        raise MistralLayoutError(
            f"{where}: sliding_window differs between layers; transformers' mistral takes one window"
        )
    return MistralConfig(
        **_fields(MistralConfig, adapted), rope_parameters=_rope(adapted), architectures=["MistralForCausalLM"]
    )


def params_from_config(config, quantization: dict | None = None) -> dict:
    """params.json as Mistral writes it for a `mistral4` config: `config_from_params` of it gives
    the config back (rlvr's tests check every field)."""
    if config.model_type != "mistral4":
        raise MistralLayoutError(f"rlvr writes Mistral's layout for mistral4 models only, not {config.model_type}")
    rope = config.rope_parameters
    params = {
        "dim": config.hidden_size, "n_layers": config.num_hidden_layers, "n_heads": config.num_attention_heads,
        "n_kv_heads": config.num_key_value_heads, "head_dim": config.qk_nope_head_dim + config.qk_rope_head_dim,
        "hidden_dim": config.intermediate_size, "norm_eps": config.rms_norm_eps, "vocab_size": config.vocab_size,
        "tied_embeddings": config.tie_word_embeddings, "max_position_embeddings": config.max_position_embeddings,
        "rope_theta": rope["rope_theta"], "q_lora_rank": config.q_lora_rank, "kv_lora_rank": config.kv_lora_rank,
        "qk_rope_head_dim": config.qk_rope_head_dim, "qk_nope_head_dim": config.qk_nope_head_dim,
        "v_head_dim": config.v_head_dim,
        "llama_4_scaling": {"original_max_position_embeddings": rope["original_max_position_embeddings"],
                            "beta": rope["llama_4_scaling_beta"]},
        "moe": {
            "num_experts": config.n_routed_experts, "num_experts_per_tok": config.num_experts_per_tok,
            "expert_hidden_dim": config.moe_intermediate_size, "routed_scale": config.routed_scaling_factor,
            "num_shared_experts": config.n_shared_experts, "first_k_dense_replace": config.first_k_dense_replace,
            "route_every_n": 1, "num_expert_groups": config.n_group, "num_expert_groups_per_tok": config.topk_group,
        },
    }  # fmt: skip
    if rope.get("rope_type") == "yarn":
        params["yarn"] = {
            "original_max_position_embeddings": rope["original_max_position_embeddings"], "factor": rope["factor"],
            "beta": rope.get("beta_fast", 32.0), "alpha": rope.get("beta_slow", 1.0),
            "apply_scale": rope.get("attention_factor") != 1.0,
        }  # fmt: skip
    if config.dtype is not None:
        params["dtype"] = str(config.dtype).removeprefix("torch.")
    if quantization:
        params["quantization"] = quantization
    return params


# --------------------------------------------------------------------------- tensor names


class TensorNames:
    """Mistral tensor names <-> transformers' on-disk names, for one architecture (module doc)."""

    def __init__(self, config):
        self.config = config
        self.dense = config.model_type == "mistral"

    def to_hf(self, name: str, tensor: torch.Tensor) -> tuple[str, torch.Tensor] | None:
        """The HF name and tensor of Mistral's `name` (dense: rope rows un-interleaved, vLLM's
        way); None for an encoder tensor. A meta tensor maps the name alone."""
        if self.dense:
            from vllm.model_executor.models.mistral import MistralForCausalLM

            hf_name, tensor = MistralForCausalLM.maybe_remap_mistral(
                SimpleNamespace(config=self.config, mistral_mapping=MistralForCausalLM.mistral_mapping), name, tensor
            )
        else:
            hf_name = _mla_mapper().map_name(name)
        if hf_name is None or (hf_name == name and not hf_name.startswith(("model.", "lm_head."))):
            if is_encoder_tensor(name):
                return None
            raise MistralLayoutError(f"{name}: a tensor vLLM's {self.config.model_type} mapping does not name")
        return hf_name, tensor

    def needs_whole_tensor(self, name: str) -> bool:
        """Whether reading rows of `name` needs the whole tensor first (rows reordered on the way)."""
        return self.dense

    def to_mistral(self, hf_name: str) -> str:
        """Mistral's name for the HF on-disk name `hf_name`, checked to map back to it."""
        if self.dense:
            raise MistralLayoutError("rlvr writes Mistral's layout for mistral4 (MLA) models only")
        for name in _reverse(hf_name):
            if self.to_hf(name, torch.empty(0, device="meta"))[0] == hf_name:
                return name
        raise MistralLayoutError(f"{hf_name}: no Mistral name maps to it through vLLM's mapping")


@cache
def _mla_mapper():
    from vllm.model_executor.models.mistral_large_3 import MistralLarge3ForCausalLM

    mapper = MistralLarge3ForCausalLM.hf_to_vllm_mapper
    others = [
        k
        for k in ("orig_to_new_prefix", "orig_to_new_substr", "orig_to_new_stacked", "orig_to_new_renaming")
        if getattr(mapper, k, None)
    ]
    if others:  # a vLLM whose mapper rlvr's reverse does not cover: say so rather than write wrong names
        raise MistralLayoutError(
            f"vLLM's MistralLarge3ForCausalLM.hf_to_vllm_mapper uses {others}; rlvr inverts regex and suffix maps only"
        )
    return mapper


_GROUP = re.compile(r"\((\\[dw]\+)\)")


def _invert_pattern(pattern: str, replacement: str) -> tuple[re.Pattern, str]:
    """For `\\A lit (grp) lit ... \\Z` -> `repl with \\1...`: the regex matching the replacement's
    results, and the template rebuilding the source from its groups."""
    body = pattern.removeprefix(r"\A").removesuffix(r"\Z")
    pieces = _GROUP.split(body)  # literal, group, literal, ...
    literals, groups = pieces[0::2], pieces[1::2]
    source_literals = [re.sub(r"\\(.)", r"\1", lit) for lit in literals]
    if any(re.search(r"[\\()\[\]*+?|^$]", lit) for lit in source_literals):
        raise MistralLayoutError(
            f"vLLM's Mistral mapping pattern {pattern!r} is not a plain name pattern rlvr can invert"
        )
    refs = [int(n) for n in re.findall(r"\\(\d)", replacement)]
    parts = re.split(r"\\\d", replacement)
    inverse = "".join(re.escape(p) + (f"({groups[refs[i] - 1]})" if i < len(refs) else "") for i, p in enumerate(parts))
    template = "".join(
        lit + (f"\\{refs.index(k + 1) + 1}" if k < len(groups) else "") for k, lit in enumerate(source_literals)
    )
    return re.compile(rf"\A{inverse}\Z"), template


@cache
def _inverse_rules() -> tuple[list[tuple[re.Pattern, str]], dict[str, str]]:
    mapper = _mla_mapper()
    rules = [_invert_pattern(p.pattern, r) for p, r in mapper.orig_to_new_regex.items() if r is not None]
    return rules, {new: old for old, new in mapper.orig_to_new_suffix.items()}


def _reverse(hf_name: str) -> list[str]:
    """Candidate Mistral names of `hf_name`, the suffix kept first: vLLM maps `qscale_weight` to
    `weight_scale` and keeps a `weight_scale` as it is, and compressed-tensors writes the latter."""
    rules, suffixes = _inverse_rules()
    names = [hf_name] + [hf_name.removesuffix(new) + old for new, old in suffixes.items() if hf_name.endswith(new)]
    return [inverse.sub(template, name) for name in names for inverse, template in rules if inverse.match(name)]


# --------------------------------------------------------------------------- writing


def write_mistral_folder(
    tensors: dict[str, torch.Tensor],
    config,
    out_dir: str | Path,
    *,
    quantization: dict | None = None,
    tokenizer_file: Path | None = None,
) -> Path:
    """A Mistral folder of `tensors` (HF on-disk names, experts one Linear each): params.json of
    `config` (with `quantization`), consolidated.safetensors under Mistral's names, and
    `tokenizer_file` copied as tekken.json.

    The ignore list stays in transformers' names: vLLM maps compressed-tensors' layer lists with
    the same weight mapper (`apply_vllm_mapper`), whose patterns need a tensor suffix, so a
    Mistral module name (`layers.0.attention.wkv_b`) would reach vLLM unmapped and match no
    layer, while `model.layers.0.self_attn.kv_b_proj` passes through and matches."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    names = TensorNames(config)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / PARAMS_FILE).write_text(json.dumps(params_from_config(config, quantization), indent=2) + "\n")
    stored = {names.to_mistral(k): v.contiguous() for k, v in tensors.items()}
    save_file(stored, out_dir / WEIGHTS_FILE, metadata={"format": "pt"})
    if tokenizer_file is not None:
        (out_dir / TOKENIZER_FILE).write_bytes(Path(tokenizer_file).read_bytes())
    return out_dir


# --------------------------------------------------------------------------- tokenizer


def write_byte_tekken(out_file: str | Path) -> int:
    """Write a tekken.json with one token per byte after mistral-common's default control tokens
    (`<unk>`, `<s>`, `</s>`, `[INST]`, ...), what tiny Mistral-layout models ship; returns its
    number of ids."""
    import base64

    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    specials = [dict(t) for t in Tekkenizer.DEPRECATED_SPECIAL_TOKENS]
    tekken = {
        "config": {"pattern": r"[^\n]+|\n", "num_vocab_tokens": 256, "default_vocab_size": len(specials) + 256,
                   "default_num_special_tokens": len(specials), "version": "v7"},
        "vocab": [{"rank": b, "token_bytes": base64.b64encode(bytes([b])).decode(), "token_str": None} for b in range(256)],
        "special_tokens": specials,
    }  # fmt: skip
    Path(out_file).write_text(json.dumps(tekken))
    return len(specials) + 256
