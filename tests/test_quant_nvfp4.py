"""NVFP4: rlvr's pack/unpack and checkpoints agree bit for bit with compressed-tensors 0.17,
LoRA trains on the packed base, and vLLM reads the config (and what it does on CPU)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from _floats import assert_close_scaled
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.compressors.nvfp4 import NVFP4PackedCompressor, unpack_fp4_from_uint8
from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme
from compressed_tensors.quantization.lifecycle.forward import dequantize as ct_dequantize
from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from rlvr.models.tiny import build_tiny_model
from rlvr.quant import (
    NVFP4Linear,
    dequantized_state_dict,
    load_quantized_model,
    nvfp4,
    prepare_lora_config,
    quantize_checkpoint,
    quantized_linear_names,
    write_dequantized_checkpoint,
)
from rlvr.quant.calibration import DEFAULT_CALIBRATION_TEXTS, calibration_inputs
from rlvr.quant.formats import nvfp4_quantization_config
from rlvr.quant.packed_bytes import STORAGE_DTYPE

SCHEME = preset_name_to_scheme("NVFP4", ["Linear"])


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return build_tiny_model(
        tmp_path_factory.mktemp("base"), "qwen2", hidden_size=128, num_layers=2, intermediate_size=256
    )


@pytest.fixture(scope="module")
def nvfp4_dir(base_dir, tmp_path_factory):
    return quantize_checkpoint(base_dir, tmp_path_factory.mktemp("nvfp4"))


def ct_compress(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """compressed-tensors' own NVFP4 path: its observers' formulas for the scales, its compressor."""
    global_scale = generate_gparam(weight.min(), weight.max())
    groups = weight.unflatten(-1, (-1, nvfp4.GROUP_SIZE))
    scale, zero_point = calculate_qparams(groups.amin(-1), groups.amax(-1), SCHEME.weights, global_scale=global_scale)
    state = {
        "weight": weight,
        "weight_scale": scale,
        "weight_global_scale": global_scale,
        "weight_zero_point": zero_point,
    }
    return NVFP4PackedCompressor.compress(state, SCHEME)


def ct_dequantize_fp32(packed: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """compressed-tensors' unpack + dequantize kept in float32 (its decompressor rounds to bf16)."""
    rows, columns = packed.shape
    values = unpack_fp4_from_uint8(packed, rows, 2 * columns, dtype=torch.float32)
    return ct_dequantize(values, scale.float(), global_scale=global_scale, dtype=torch.float32)


def ct_quantization_config(scheme) -> QuantizationConfig:
    return QuantizationConfig(
        config_groups={"group_0": scheme},
        format="nvfp4-pack-quantized",
        quantization_status="compressed",
        ignore=["lm_head"],
    )


def test_quantize_is_bit_equal_to_compressed_tensors_compressor():
    torch.manual_seed(0)
    weight = torch.randn(32, 64) * 0.02
    # every rounding tie (scale 1 in this group: its amax is 6 and so is the tensor's), signs,
    # negative values that round to zero (packed as -0), and an all-zero group
    weight[0, :16] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 2) * torch.tensor(
        [1.0] * 8 + [-1.0] * 8
    )
    weight[1, :16] = -1e-6
    weight[2, 16:32] = 0.0
    ours = nvfp4.quantize(weight)
    theirs = ct_compress(weight)
    assert torch.equal(ours.weight_packed, theirs["weight_packed"])
    assert torch.equal(ours.weight_scale.view(torch.uint8), theirs["weight_scale"].view(torch.uint8))
    assert torch.equal(ours.weight_global_scale, theirs["weight_global_scale"])
    dequantized = nvfp4.dequantize(ours.weight_packed, ours.weight_scale, ours.weight_global_scale)
    assert torch.equal(
        dequantized, ct_dequantize_fp32(*(theirs[k] for k in ("weight_packed", "weight_scale", "weight_global_scale")))
    )
    ties_to_even = torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0])
    assert torch.equal(dequantized[0, :16], torch.cat([ties_to_even, -ties_to_even]))


def test_config_is_the_one_compressed_tensors_writes(tmp_path):
    scheme = preset_name_to_scheme("NVFP4", ["Linear"])
    scheme.format = "nvfp4-pack-quantized"  # llm-compressor sets each module's format before saving
    config = ct_quantization_config(scheme)
    (tmp_path / "config.json").write_text("{}")
    ModelCompressor(quantization_config=config).update_config(str(tmp_path))
    written = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert nvfp4_quantization_config(["lm_head"]) == written


def test_rlvr_checkpoint_decompresses_with_compressed_tensors_to_the_values_rlvr_uses(nvfp4_dir):
    config = json.loads((nvfp4_dir / "config.json").read_text())["quantization_config"]
    scheme = QuantizationConfig.model_validate(config).config_groups["group_0"]
    files = load_file(nvfp4_dir / "model.safetensors")
    model_fp32 = load_quantized_model(nvfp4_dir, dtype=torch.float32)
    model_bf16 = load_quantized_model(nvfp4_dir, dtype=torch.bfloat16)
    engine_weights = dequantized_state_dict(nvfp4_dir)
    names = quantized_linear_names(model_fp32)
    assert len(names) == 2 * 7  # every Linear of both blocks; lm_head ignored
    for name in names:
        stored = {
            key.removeprefix(f"{name}."): value for key, value in files.items() if key.startswith(f"{name}.weight_")
        }
        # the decompressor itself returns bfloat16: rlvr in bf16 must give exactly those values
        theirs_bf16 = NVFP4PackedCompressor.decompress(stored, scheme)["weight"]
        assert torch.equal(model_bf16.get_submodule(name).dequantized_weight(), theirs_bf16)
        theirs_fp32 = ct_dequantize_fp32(stored["weight_packed"], stored["weight_scale"], stored["weight_global_scale"])
        assert torch.equal(model_fp32.get_submodule(name).dequantized_weight(), theirs_fp32)
        assert torch.equal(engine_weights[f"{name}.weight"], theirs_fp32)


def test_compressed_tensors_checkpoint_loads_in_rlvr_to_its_values(base_dir, tmp_path):
    source = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    tensors, expected = {}, {}
    for key, value in source.state_dict().items():
        prefix = key.removesuffix(".weight")
        if (
            key.endswith(".weight")
            and isinstance(source.get_submodule(prefix), torch.nn.Linear)
            and prefix != "lm_head"
        ):
            compressed = ct_compress(value)
            compressed["input_global_scale"] = generate_gparam(torch.tensor(-3.0), torch.tensor(3.0))
            tensors.update({f"{prefix}.{k}": v for k, v in compressed.items()})
            expected[prefix] = NVFP4PackedCompressor.decompress(compressed, SCHEME)["weight"]
        elif key != "lm_head.weight":  # tied to the embedding
            tensors[key] = value
    for path in base_dir.iterdir():
        if path.name != "model.safetensors":
            shutil.copy2(path, tmp_path / path.name)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    scheme = preset_name_to_scheme("NVFP4", ["Linear"])
    config = ct_quantization_config(scheme)
    ModelCompressor(quantization_config=config).update_config(str(tmp_path))

    model = load_quantized_model(tmp_path, dtype=torch.bfloat16)
    assert set(quantized_linear_names(model)) == set(expected)
    for name, weight in expected.items():
        assert torch.equal(model.get_submodule(name).dequantized_weight(), weight)
    assert torch.equal(model.model.embed_tokens.weight, source.model.embed_tokens.weight.bfloat16())


def test_layers_reading_one_input_share_a_weight_global_scale(nvfp4_dir):
    model = load_quantized_model(nvfp4_dir)
    layer = model.model.layers[0]
    names = [f"self_attn.{p}_proj" for p in "qkvo"] + [f"mlp.{p}_proj" for p in ("gate", "up", "down")]
    scale = {name: layer.get_submodule(name).weight_global_scale.item() for name in names}
    assert scale["self_attn.q_proj"] == scale["self_attn.k_proj"] == scale["self_attn.v_proj"]
    assert scale["mlp.gate_proj"] == scale["mlp.up_proj"]
    assert (
        len({scale["self_attn.q_proj"], scale["self_attn.o_proj"], scale["mlp.gate_proj"], scale["mlp.down_proj"]}) == 4
    )
    assert all(layer.get_submodule(n).input_global_scale.item() != 1.0 for n in scale)  # calibrated


def test_lora_on_packed_base_trains_like_lora_on_the_dequantized_float_model(nvfp4_dir, tmp_path):
    torch.manual_seed(0)
    packed = load_quantized_model(nvfp4_dir)
    config = prepare_lora_config(
        LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False), packed
    )
    peft_packed = get_peft_model(packed, config)
    float_model = AutoModelForCausalLM.from_pretrained(write_dequantized_checkpoint(nvfp4_dir, tmp_path / "float"))
    peft_float = get_peft_model(float_model, LoraConfig(r=4, lora_alpha=8, target_modules=config.target_modules))
    lora_state = {key: value for key, value in peft_packed.state_dict().items() if "lora_" in key}
    assert not peft_float.load_state_dict(lora_state, strict=False).unexpected_keys

    ids = torch.randint(4, 200, (2, 12))
    logits = peft_packed(ids).logits
    assert_close_scaled(logits, peft_float(ids).logits)

    trainable = {name for name, p in peft_packed.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    # the packed tensors are frozen parameters (FSDP2 shards parameters only) in their own dtypes
    frozen = dict(peft_packed.named_buffers()) | {
        n: p for n, p in peft_packed.named_parameters() if not p.requires_grad
    }
    assert {frozen[f"{name}.weight_packed"].dtype for name in quantized_linear_names(peft_packed)} == {STORAGE_DTYPE}
    assert {frozen[f"{name}.weight_scale"].dtype for name in quantized_linear_names(peft_packed)} == {
        torch.float8_e4m3fn
    }
    frozen_before = {name: t.clone() for name, t in frozen.items()}
    optimizer = torch.optim.AdamW([p for p in peft_packed.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(3):
        loss = peft_packed(ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert {name for name, p in peft_packed.named_parameters() if p.grad is not None} == trainable
    # byte for byte: the packed bytes' float16 view holds NaN patterns, which equal nothing
    assert all(
        torch.equal(t.reshape(-1).view(torch.uint8), frozen_before[name].reshape(-1).view(torch.uint8))
        for name, t in frozen.items()
    )


def test_backward_does_not_keep_float_weights(nvfp4_dir):
    layer = next(m for m in load_quantized_model(nvfp4_dir).modules() if isinstance(m, NVFP4Linear))
    x = torch.randn(3, layer.in_features, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        layer(x).sum().backward()
    packed = {t.data_ptr() for t in layer.packed_tensors()}
    assert saved and all(t.data_ptr() in packed for t in saved)
    assert_close_scaled(x.grad, torch.ones(3, layer.out_features) @ layer.dequantized_weight())


def test_gradient_checkpointing_recomputes_a_packed_layer_to_the_same_gradient(nvfp4_dir):
    """trainer.gradient_checkpointing on an NVFP4 base: non-reentrant checkpointing lets backward
    read a layer's saved tensors once (a second read was a CheckpointError), and the LoRA
    gradients equal those without checkpointing."""
    torch.manual_seed(0)
    model = load_quantized_model(nvfp4_dir)
    config = prepare_lora_config(
        LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False), model
    )
    model = get_peft_model(model, config)
    ids = torch.randint(4, 200, (2, 12))

    def lora_grads():
        model.zero_grad()
        model(ids, labels=ids).loss.backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}

    plain = lora_grads()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    checkpointed = lora_grads()
    assert plain.keys() == checkpointed.keys()
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name])


def test_bad_checkpoints_fail_with_the_file_and_tensor_named(nvfp4_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(nvfp4_dir, broken)
    tensors = load_file(broken / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight_scale"]
    save_file(tensors, broken / "model.safetensors")
    expected = r"model\.safetensors: model\.layers\.1\.mlp\.up_proj: has weight_packed but no weight_scale"
    with pytest.raises(ValueError, match=expected):
        load_quantized_model(broken)

    config = json.loads((broken / "config.json").read_text())
    config["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 32
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config\.json: config group 'group_0' is not NVFP4"):
        dequantized_state_dict(broken)


def test_a_folder_saved_with_save_pretrained_alone_quantizes_calibrated_on_its_vocabulary(base_dir, tmp_path):
    """No tokenizer files (transformers then builds an empty tokenizer or none): the calibration
    forward runs on token ids drawn from the model's vocabulary, and compressed-tensors reads
    every packed weight back."""
    bare = tmp_path / "bare"
    AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).save_pretrained(bare)
    assert not [p for p in bare.iterdir() if "token" in p.name]
    inputs, source = calibration_inputs(bare, 320, DEFAULT_CALIBRATION_TEXTS)
    assert source.startswith("vocabulary") and all(x.shape == (1, 64) and x.max() < 320 for x in inputs)
    assert calibration_inputs(base_dir, 320, DEFAULT_CALIBRATION_TEXTS)[1] == "tokenizer"

    out = quantize_checkpoint(bare, tmp_path / "nvfp4")
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    scheme = QuantizationConfig.model_validate(config).config_groups["group_0"]
    files = load_file(out / "model.safetensors")
    model = load_quantized_model(out, dtype=torch.bfloat16)
    names = quantized_linear_names(model)
    assert len(names) == 2 * 7
    for name in names:
        stored = {k.removeprefix(f"{name}."): v for k, v in files.items() if k.startswith(f"{name}.weight_")}
        assert torch.equal(
            NVFP4PackedCompressor.decompress(stored, scheme)["weight"], model.get_submodule(name).dequantized_weight()
        )
        assert files[f"{name}.input_global_scale"].item() != 1.0  # calibrated


def test_vllm_reads_the_config_as_nvfp4_and_has_no_cpu_kernel_for_it(nvfp4_dir):
    """vLLM maps every Linear to its W4A4 NVFP4 scheme; on CPU no NVFP4 GEMM kernel exists
    (they are CUDA only), so the CPU engine is given the dequantized weights instead."""
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig
    from vllm.platforms import current_platform

    config = CompressedTensorsConfig.from_config(
        json.loads((nvfp4_dir / "config.json").read_text())["quantization_config"]
    )
    scheme = config.target_scheme_map["Linear"]
    assert config.ignore == ["lm_head"]
    assert config._is_nvfp4_format(scheme["weights"]) and config._is_nvfp4_format(scheme["input_activations"])
    if current_platform.is_cpu():
        with pytest.raises(ValueError, match="Failed to find a kernel that can implement the NVFP4 linear layer"):
            config._get_scheme_from_parts(scheme["weights"], scheme["input_activations"], format=scheme["format"])


_VLLM_PROMPT_LOGPROBS = """
import json, sys
from vllm import LLM, SamplingParams
if __name__ == "__main__":
    llm = LLM(model=sys.argv[1], dtype="float32", max_model_len=64, enforce_eager=True, seed=0)
    ids = json.loads(sys.argv[2])
    out = llm.generate({"prompt_token_ids": ids}, SamplingParams(max_tokens=1, prompt_logprobs=0))
    print("LOGPROBS", json.dumps([next(iter(d.values())).logprob for d in out[0].prompt_logprobs[1:]]))
"""


@pytest.mark.slow
def test_vllm_cpu_on_the_dequantized_checkpoint_matches_the_packed_trainer_model(nvfp4_dir, tmp_path):
    float_dir = write_dequantized_checkpoint(nvfp4_dir, tmp_path / "float")
    ids = [5, 17, 33, 60, 61, 62, 90, 120]
    script = tmp_path / "prompt_logprobs.py"
    script.write_text(_VLLM_PROMPT_LOGPROBS)
    run = subprocess.run(
        [sys.executable, str(script), str(float_dir), json.dumps(ids)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"},
    )  # fmt: skip
    line = next((text for text in run.stdout.splitlines() if text.startswith("LOGPROBS ")), None)
    assert line, run.stderr[-3000:]
    sampler = torch.tensor(json.loads(line.removeprefix("LOGPROBS ")))
    with torch.no_grad():
        logits = load_quantized_model(nvfp4_dir)(torch.tensor([ids])).logits[0, :-1]
    trainer = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(sampler, trainer, rtol=0, atol=1e-3)


def test_an_fp8_release_is_refused_in_one_line(tmp_path):
    """DeepSeek's and Mistral's FP8 releases (block-scaled float8 weights) are not a format rlvr
    reads: the folder is refused, naming its config, before anything loads."""
    from rlvr.quant.formats import read_quantization_config

    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "deepseek_v3",
                "quantization_config": {
                    "quant_method": "fp8",
                    "activation_scheme": "dynamic",
                    "weight_block_size": [128, 128],
                },
            }
        )
    )
    with pytest.raises(
        ValueError, match=r"config.json: quant_method is 'fp8', not 'compressed-tensors' or 'bitsandbytes'$"
    ):
        read_quantization_config(tmp_path)
