"""4-bit checkpoints, NVFP4 in compressed-tensors' format or NF4 in bitsandbytes': write one, load it
packed, or get its float weights.

A checkpoint folder is an HF model folder where every quantized Linear `P` stores, instead of
`P.weight`, the tensors `P.weight_packed`, `P.weight_scale`, `P.weight_global_scale` and
`P.input_global_scale` (see `rlvr.quant.nvfp4` for their layout), and `config.json` carries
the `quantization_config` that llm-compressor writes for its NVFP4 scheme (W4A4: FP4 weights,
FP4 activations quantized dynamically per group of 16 with a calibrated global scale), so vLLM
serves it with its NVFP4 kernels where the GPU has them.

An NF4 folder (`format="nf4"`) is the one transformers saves for a bitsandbytes 4-bit model:
each quantized Linear `P` stores `P.weight` (packed uint8) with `P.weight.absmax`,
`P.weight.quant_map` and `P.weight.quant_state.bitsandbytes__nf4` (see `rlvr.quant.nf4`), and
`quantization_config` is `BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")`'s.
NF4 needs no calibration: each block of 64 weights carries its own absmax.

- `quantize_checkpoint(model_dir, out_dir)`: every `nn.Linear` outside `ignore` is quantized.
  Layers that read the very same input tensor (q/k/v, gate/up) share one weight global scale,
  found by watching a calibration forward, not from names: vLLM fuses them into one GEMM with
  one global scale. The same forward calibrates `input_global_scale`.
- `load_quantized_model(model_dir)`: the HF model with those Linears replaced by frozen
  `NVFP4Linear` / `NF4Linear` modules; no float copy of their weights is ever built.
- `dequantized_state_dict(model_dir)` / `write_dequantized_checkpoint(model_dir, out_dir)`: the
  float weights, for an engine with no 4-bit kernel (vLLM on CPU), so that sampler and trainer
  compute with the same numbers.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch
from accelerate import init_empty_weights
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from rlvr.quant import nf4, nvfp4
from rlvr.quant.linear import NF4Linear, NVFP4Linear, QuantizedLinear

FORMAT_NAME = "nvfp4-pack-quantized"
QUANT_METHOD = "compressed-tensors"
# The compressed-tensors release whose on-disk format and config this module writes.
COMPRESSED_TENSORS_VERSION = "0.17.0"
QUANTIZED_TENSOR_SUFFIXES = ("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale")
# what `quantize_checkpoint(format=...)` writes, and the columns each needs a multiple of
FORMATS = {"nvfp4": nvfp4.GROUP_SIZE, "nf4": nf4.BLOCK_SIZE}
BITSANDBYTES_METHOD = "bitsandbytes"

# Short, varied text for the activation ranges; they only set per-layer input global scales.
DEFAULT_CALIBRATION_TEXTS = (
    "Solve for x: 3x + 7 = 22. First subtract 7 from both sides, then divide by 3, so x = 5.",
    "The quick brown fox jumps over the lazy dog while 1234567890 counts the seconds.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "Question: what is the sum of the first 100 positive integers? Answer: \\boxed{5050}",
)


def _fp4_args(dynamic: bool | str, observer: str) -> dict:
    """One QuantizationArgs as compressed-tensors 0.17 serializes it for NVFP4."""
    return {
        "actorder": None,
        "block_structure": None,
        "dynamic": dynamic,
        "group_size": nvfp4.GROUP_SIZE,
        "num_bits": 4,
        "observer": observer,
        "observer_kwargs": {},
        "scale_dtype": "torch.float8_e4m3fn",
        "strategy": "tensor_group",
        "symmetric": True,
        "type": "float",
        "zp_dtype": None,
    }


def nvfp4_quantization_config(ignore: Sequence[str]) -> dict:
    """The `quantization_config` llm-compressor writes for scheme "NVFP4" targeting Linear."""
    return {
        "config_groups": {
            "group_0": {
                "format": FORMAT_NAME,
                "input_activations": _fp4_args("local", "static_minmax"),
                "output_activations": None,
                "targets": ["Linear"],
                "weights": _fp4_args(False, "memoryless_minmax"),
            }
        },
        "format": FORMAT_NAME,
        "global_compression_ratio": None,
        "ignore": list(ignore),
        "kv_cache_scheme": None,
        "quant_method": QUANT_METHOD,
        "quantization_status": "compressed",
        "sparsity_config": {},
        "transform_config": {},
        "version": COMPRESSED_TENSORS_VERSION,
    }


def is_ignored(name: str, ignore: Sequence[str]) -> bool:
    """compressed-tensors' ignore rule: an exact module name, or `re:PATTERN` matched from the start."""
    return any(re.match(entry[3:], name) if entry.startswith("re:") else entry == name for entry in ignore)


# --------------------------------------------------------------------------- writing


def _calibrate(model: nn.Module, linears: dict[str, nn.Linear], tokenizer, texts: Sequence[str]):
    """Run `texts` through `model`; return (input amax per Linear, groups of Linears sharing an input).

    The inputs of one forward are kept alive until it ends, so that `id()` identifies a tensor.
    """
    input_amax: dict[str, torch.Tensor] = {}
    readers_of_first_forward: dict[int, list[str]] = {}
    alive: list[torch.Tensor] = []
    first_forward = True

    def watch(name):
        def hook(_module, args):
            amax = args[0].detach().abs().amax().float()
            input_amax[name] = torch.maximum(input_amax.get(name, amax), amax)
            if first_forward:
                alive.append(args[0])
                readers_of_first_forward.setdefault(id(args[0]), []).append(name)

        return hook

    handles = [module.register_forward_pre_hook(watch(name)) for name, module in linears.items()]
    try:
        with torch.no_grad():
            for text in texts:
                ids = tokenizer(text, return_tensors="pt").input_ids
                model(input_ids=ids)
                first_forward = False
                alive.clear()
    finally:
        for handle in handles:
            handle.remove()
    shared_groups = [names for names in readers_of_first_forward.values() if len(names) > 1]
    return input_amax, shared_groups


def _copy_non_weight_files(model_dir: Path, out_dir: Path) -> None:
    """Tokenizer, chat template, generation config…: everything but weights and config.json."""
    for path in model_dir.iterdir():
        is_weight = path.suffix in (".safetensors", ".bin", ".pt") or path.name.endswith(".index.json")
        if path.is_file() and not is_weight and path.name != "config.json":
            shutil.copy2(path, out_dir / path.name)


def _write_quantization_config(out_dir: Path, quantization_config: dict) -> None:
    config_path = out_dir / "config.json"
    config = json.loads(config_path.read_text())
    config["quantization_config"] = quantization_config
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def quantize_checkpoint(
    model_dir: str | Path,
    out_dir: str | Path,
    format: str = "nvfp4",
    ignore: Sequence[str] = ("lm_head",),
    calibration_texts: Sequence[str] = DEFAULT_CALIBRATION_TEXTS,
) -> Path:
    """Write `model_dir` (an HF causal LM folder) to `out_dir` as `format`: "nvfp4"
    (compressed-tensors `nvfp4-pack-quantized`) or "nf4" (bitsandbytes 4-bit NF4)."""
    if format not in FORMATS:
        raise ValueError(f"unknown quantization format {format!r}; known: {', '.join(FORMATS)}")
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
    source_dtype = model.dtype
    _require_module_names_on_disk(model, model_dir)
    model.float().eval()
    linears = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear) and not is_ignored(name, ignore)}
    embedding_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    for name, module in linears.items():
        if id(module.weight) in embedding_weights:
            raise ValueError(f"{model_dir}: {name}.weight is tied to an embedding; add {name!r} to ignore")
        if module.in_features % FORMATS[format]:
            raise ValueError(
                f"{model_dir}: {name} has {module.in_features} input features, not a multiple of "
                f"{FORMATS[format]}; add {name!r} to ignore"
            )
    if format == "nf4":
        return _write_nf4(model, linears, source_dtype, model_dir, out_dir, ignore)

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    input_amax, shared_groups = _calibrate(model, linears, tokenizer, calibration_texts)
    weight_global_scale = {name: nvfp4.global_scale_for(m.weight.abs().max()) for name, m in linears.items()}
    for group in shared_groups:
        # the largest weight sets the scale, so that no member's group scales overflow FP8
        shared = torch.stack([weight_global_scale[name] for name in group]).min().reshape(1)
        weight_global_scale.update({name: shared.clone() for name in group})

    for name, module in linears.items():
        packed = NVFP4Linear(
            nvfp4.quantize(module.weight.detach(), weight_global_scale[name]),
            bias=None if module.bias is None else module.bias.detach().to(source_dtype),
            # an uncalibrated layer (e.g. an expert no text reached) gets 1.0, as in llm-compressor
            input_global_scale=nvfp4.global_scale_for(input_amax.get(name, torch.tensor(0.0))),
            compute_dtype=source_dtype,
        )
        model.set_submodule(name, packed)
    for module in model.modules():
        if not isinstance(module, QuantizedLinear):  # packed tensors keep their own dtypes
            for parameter in module.parameters(recurse=False):
                parameter.data = parameter.data.to(source_dtype)

    out_dir.mkdir(parents=True, exist_ok=True)
    _copy_non_weight_files(model_dir, out_dir)
    model.save_pretrained(out_dir)
    _write_quantization_config(out_dir, nvfp4_quantization_config(ignore))
    return out_dir


def _write_nf4(model: nn.Module, linears: dict[str, nn.Linear], source_dtype, model_dir: Path, out_dir: Path, ignore) -> Path:
    """Save `model` with each of `linears` NF4-quantized, under bitsandbytes' key names."""
    state = {key: value.to(source_dtype) if value.is_floating_point() else value for key, value in model.state_dict().items()}
    for name, module in linears.items():
        del state[f"{name}.weight"]
        stored = nf4.to_checkpoint(nf4.quantize(module.weight.detach()), source_dtype)
        state.update({f"{name}.{suffix}": tensor for suffix, tensor in stored.items()})
    out_dir.mkdir(parents=True, exist_ok=True)
    _copy_non_weight_files(model_dir, out_dir)
    model.save_pretrained(out_dir, state_dict=state)
    _write_quantization_config(out_dir, nf4.quantization_config(list(ignore), source_dtype))
    return out_dir


def _require_module_names_on_disk(model: nn.Module, model_dir: Path) -> None:
    """The packed loader matches file tensors to modules by name; transformers 5 renames and
    fuses some tensors between disk and memory (MoE experts, stored one Linear per expert,
    become one 3-D parameter), and such a model cannot be rebuilt from its files that way."""
    on_disk = set()
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(path, framework="pt") as handle:
            on_disk.update(handle.keys())
    converted = sorted(on_disk - set(model.state_dict()))
    if converted:
        raise ValueError(
            f"{model_dir}: transformers converts {converted[0]} (and {len(converted) - 1} more tensors) when it "
            f"loads {type(model).__name__} (fused MoE experts); rlvr's NVFP4 bases need every tensor stored under "
            f"its module's name, so train this model on its float weights (demo.base_format: hf)"
        )


# --------------------------------------------------------------------------- reading


def is_quantized_checkpoint(model_dir: str | Path) -> bool:
    """Whether config.json declares a quantization_config (then read_quantization_config checks it)."""
    config_path = Path(model_dir) / "config.json"
    return config_path.is_file() and bool(json.loads(config_path.read_text()).get("quantization_config"))


def read_quantization_config(model_dir: str | Path) -> dict:
    """The checkpoint's `quantization_config`, checked to be NVFP4 or NF4 as this module reads them."""
    config_path = Path(model_dir) / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path}: no config.json")
    quantization_config = json.loads(config_path.read_text()).get("quantization_config")
    if not quantization_config:
        raise ValueError(f"{config_path}: no quantization_config (not a quantized checkpoint)")
    if quantization_config.get("quant_method") == BITSANDBYTES_METHOD:
        nf4.check_quantization_config(quantization_config, str(config_path))
        return quantization_config
    if quantization_config.get("quant_method") != QUANT_METHOD:
        raise ValueError(
            f"{config_path}: quant_method is {quantization_config.get('quant_method')!r}, "
            f"not {QUANT_METHOD!r} or {BITSANDBYTES_METHOD!r}"
        )
    for group_name, group in quantization_config.get("config_groups", {}).items():
        group_format = group.get("format") or quantization_config.get("format")
        weights = group.get("weights") or {}
        expected = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": nvfp4.GROUP_SIZE}
        wrong = {key: weights.get(key) for key, value in expected.items() if weights.get(key) != value}
        if group_format != FORMAT_NAME or wrong or weights.get("symmetric") is False:
            raise ValueError(
                f"{config_path}: config group {group_name!r} is not NVFP4 "
                f"(format {group_format!r}, weights {wrong or 'asymmetric'}); only {FORMAT_NAME} is supported"
            )
    return quantization_config


def quantized_format(model_dir: str | Path) -> str:
    """The format of a quantized checkpoint, "nvfp4" or "nf4" (its config checked)."""
    method = read_quantization_config(model_dir)["quant_method"]
    return "nf4" if method == BITSANDBYTES_METHOD else "nvfp4"


def _read_tensors(model_dir: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """All tensors of the folder's safetensors files, and the file each came from."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors files")
    tensors, source = {}, {}
    for path in files:
        with safe_open(path, framework="pt") as handle:
            for key in handle.keys():
                tensors[key] = handle.get_tensor(key)
                source[key] = path.name
    return tensors, source


def _pop_quantized(
    tensors: dict, source: dict, prefix: str, model_dir: Path
) -> tuple[nvfp4.NVFP4Weight, torch.Tensor | None]:
    """Remove and return one layer's NVFP4 tensors (checked), and its input global scale if any."""
    where = f"{model_dir / source[f'{prefix}.weight_packed']}: {prefix}"
    missing = [s for s in ("weight_scale", "weight_global_scale") if f"{prefix}.{s}" not in tensors]
    if missing:
        raise ValueError(f"{where}: has weight_packed but no {' or '.join(missing)}")
    weight = nvfp4.NVFP4Weight(*(tensors.pop(f"{prefix}.{s}") for s in QUANTIZED_TENSOR_SUFFIXES[:3]))
    nvfp4.check_shapes(weight, where)
    return weight, tensors.pop(f"{prefix}.input_global_scale", None)


def _quantized_prefixes(tensors: dict) -> list[str]:
    return [key.removesuffix(".weight_packed") for key in tensors if key.endswith(".weight_packed")]


def _pop_nf4(tensors: dict, source: dict, prefix: str, model_dir: Path) -> nf4.NF4Weight:
    """Remove and return one layer's NF4 tensors (bitsandbytes' keys), checked."""
    where = f"{model_dir / source[f'{prefix}.weight.{nf4.QUANT_STATE_KEY}']}: {prefix}"
    stored = {suffix: tensors.pop(f"{prefix}.{suffix}") for suffix in nf4.CHECKPOINT_SUFFIXES if f"{prefix}.{suffix}" in tensors}
    nested = [key for key in tensors if key.startswith(f"{prefix}.weight.nested_")]
    stored.update({key.removeprefix(f"{prefix}."): tensors[key] for key in nested})
    return nf4.from_checkpoint(stored, where)


def _nf4_prefixes(tensors: dict) -> list[str]:
    suffix = f".weight.{nf4.QUANT_STATE_KEY}"
    return [key.removesuffix(suffix) for key in tensors if key.endswith(suffix)]


def load_quantized_model(model_dir: str | Path, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The HF causal LM of a 4-bit checkpoint, each quantized Linear an `NVFP4Linear` (or
    `NF4Linear`) computing in `dtype`.

    Linears are found by type, not by name: each one with `P.weight_packed` (NF4:
    `P.weight.quant_state.bitsandbytes__nf4`) in the files becomes packed. A parameter no file
    provides, or a tensor no module takes, is an error naming it.
    """
    model_dir = Path(model_dir)
    format = quantized_format(model_dir)
    tensors, source = _read_tensors(model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    # the model is built plain; the packed layers are put in below
    del config.quantization_config
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)

    for name, module in list(model.named_modules()):
        if not isinstance(module, nn.Linear):
            continue
        if format == "nf4" and f"{name}.weight.{nf4.QUANT_STATE_KEY}" in tensors:
            weight = _pop_nf4(tensors, source, name, model_dir)
            model.set_submodule(name, NF4Linear(weight, tensors.pop(f"{name}.bias", None), compute_dtype=dtype))
            continue
        if f"{name}.weight_packed" not in tensors:
            continue  # a float Linear (ignored, or tied to the embedding): loaded below
        weight, input_global_scale = _pop_quantized(tensors, source, name, model_dir)
        bias = tensors.pop(f"{name}.bias", None)
        model.set_submodule(name, NVFP4Linear(weight, bias, input_global_scale, compute_dtype=dtype))

    float_tensors = {key: value.to(dtype) if value.is_floating_point() else value for key, value in tensors.items()}
    result = model.load_state_dict(float_tensors, strict=False, assign=True)
    if result.unexpected_keys:
        key = result.unexpected_keys[0]
        raise ValueError(f"{model_dir / source[key]}: tensor {key} belongs to no module of {type(model).__name__}")
    model.tie_weights()
    still_empty = [name for name, p in model.named_parameters() if p.device.type == "meta"]
    if still_empty:
        raise ValueError(f"{model_dir}: no tensor for {still_empty[0]} ({len(still_empty)} missing)")
    return model.eval()


def dequantized_state_dict(model_dir: str | Path, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors with every packed weight replaced by `P.weight` in `dtype`.

    These are the values `load_quantized_model` computes with, under the checkpoint's own key
    names, which is what an engine without 4-bit kernels (vLLM on CPU) loads.
    """
    model_dir = Path(model_dir)
    format = quantized_format(model_dir)
    tensors, source = _read_tensors(model_dir)
    if format == "nf4":
        for prefix in _nf4_prefixes(tensors):
            weight = _pop_nf4(tensors, source, prefix, model_dir)
            tensors[f"{prefix}.weight"] = nf4.dequantize(weight.weight_packed, weight.weight_absmax, dtype)
    for prefix in _quantized_prefixes(tensors):
        weight, _input_global_scale = _pop_quantized(tensors, source, prefix, model_dir)
        tensors[f"{prefix}.weight"] = nvfp4.dequantize(
            weight.weight_packed, weight.weight_scale, weight.weight_global_scale, dtype
        )
    return {key: value.to(dtype) if value.is_floating_point() else value for key, value in tensors.items()}


def write_dequantized_checkpoint(model_dir: str | Path, out_dir: str | Path, dtype: torch.dtype = torch.float32) -> Path:
    """A plain float HF folder (no quantization_config) holding `dequantized_state_dict(model_dir)`."""
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    state = dequantized_state_dict(model_dir, dtype)
    out_dir.mkdir(parents=True, exist_ok=True)
    _copy_non_weight_files(model_dir, out_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config.pop("quantization_config")
    config["dtype"] = str(dtype).removeprefix("torch.")
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file({k: v.contiguous() for k, v in state.items()}, out_dir / "model.safetensors", metadata={"format": "pt"})
    return out_dir
