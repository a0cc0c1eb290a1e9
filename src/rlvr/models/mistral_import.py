"""A folder in Mistral's own layout (params.json, consolidated*.safetensors, tekken.json) written in
the Hugging Face layout that transformers' own class loads: `rlvr import MISTRAL_DIR OUT`."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from rlvr.models.checkpoint_files import CheckpointFiles, memory_source
from rlvr.models.mistral_layout import TOKENIZER_FILE, MistralLayoutError, TensorNames, hf_config
from rlvr.models.transformers_classes import causal_lm_from_config, transformers_disk_layout

# compressed-tensors quantizes nn.Linear layers; mistral4's experts are fused 3-D parameters, and
# transformers dequantizes per-expert packed experts only inside an experts conversion, of which it
# ships none for mistral4
QUANTIZED_EXPERTS_NOTE = (
    "note: {out}: the NVFP4 experts are stored one Linear per expert, as rlvr and vLLM read them; "
    "transformers {version}'s Mistral4ForCausalLM holds its experts fused and has no conversion that "
    "loads packed per-expert tensors, so transformers alone would leave them unloaded (random): "
    "load {out} with rlvr, or import the float folder"
)


def import_mistral(source: str | Path, out: str | Path) -> Path:
    """Write the Mistral folder `source` in the Hugging Face layout: config.json (mistral4 /
    mistral; a quantized folder's `quantization_config` with its ignore list under HF names),
    model.safetensors under the names and shapes transformers' own class loads (mistral4's
    experts fused, `gate_up_proj` and `down_proj`), and tekken.json with the tokenizer
    transformers converts from it. A quantized folder's tensors are written as stored (experts one
    Linear each: `QUANTIZED_EXPERTS_NOTE`)."""
    source, out = Path(source), Path(out)
    config = hf_config(source)
    files = CheckpointFiles(source)
    quantization = getattr(config, "quantization_config", None)
    if quantization:
        names = TensorNames(config)
        meta = torch.empty(0, device="meta")
        config.quantization_config = {**quantization, "ignore": [
            m if m.startswith("re:") else names.to_hf(f"{m}.weight", meta)[0].removesuffix(".weight")
            for m in quantization.get("ignore", [])]}  # fmt: skip
        tensors = {key: files.read(key) for key in files.keys()}
    else:
        tensors = _transformers_tensors(config, files, source)
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    save_file({k: v.contiguous() for k, v in tensors.items()}, out / "model.safetensors", metadata={"format": "pt"})
    if (source / TOKENIZER_FILE).is_file():
        (out / TOKENIZER_FILE).write_bytes((source / TOKENIZER_FILE).read_bytes())
        _save_hf_tokenizer(out / TOKENIZER_FILE, out)
    return out


def quantized_experts_note(source: str | Path, out: str | Path) -> str | None:
    """What transformers cannot load of `import_mistral(source, out)`: a quantized MoE folder's experts."""
    config = hf_config(source)
    if not getattr(config, "quantization_config", None) or not getattr(config, "n_routed_experts", None):
        return None
    import transformers

    return QUANTIZED_EXPERTS_NOTE.format(out=out, version=transformers.__version__)


def _transformers_tensors(config, files: CheckpointFiles, source: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the model `config` builds, read from `files` (per-expert pieces fused) and
    named as transformers' own class loads it; a tied name once, as save_pretrained writes it."""
    with torch.device("meta"):  # names and shapes only
        model = causal_lm_from_config(config)
    tensors, seen = {}, set()
    for key, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        read = memory_source(model, files, key, tensor.shape)
        if read is None:
            raise MistralLayoutError(f"{source}: no tensor for {key}")
        tensors[key] = read(None)
    if files.unclaimed:
        key = sorted(files.unclaimed)[0]
        raise MistralLayoutError(f"{files.where(key)} belongs to no module of {type(model).__name__}")
    return transformers_disk_layout(model, tensors)


def _save_hf_tokenizer(tekken_file: Path, out: Path) -> None:
    from transformers.integrations.mistral.tokenizer import convert_tekken_tokenizer

    convert_tekken_tokenizer(str(tekken_file)).save_pretrained(out)
