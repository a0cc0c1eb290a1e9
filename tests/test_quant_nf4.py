"""NF4: rlvr's codebook, packing and checkpoints agree with bitsandbytes (and transformers' loader
for it), the packed model computes like its dequantized float copy, LoRA trains on it, and an
RL run through vLLM and 2 FSDP2 ranks trains LoRA on an NF4 base.

The bitsandbytes cross-checks need the `bitsandbytes` package (0.50 has a CPU path); it is no
dependency of rlvr, so without it they are skipped, saying so.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
from _floats import assert_close_scaled
from peft import LoraConfig, get_peft_model
from run_fixtures import check_two_trained_steps, two_rl_steps
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

from rlvr.models.tiny import build_tiny_model
from rlvr.quant import (
    NF4Linear,
    dequantized_state_dict,
    load_quantized_model,
    nf4,
    prepare_lora_config,
    quantize_checkpoint,
    quantized_format,
    quantized_linear_names,
    write_dequantized_checkpoint,
)

NO_BNB = "bitsandbytes is not installed (pip install bitsandbytes): the cross-check against its own kernels is skipped"


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return build_tiny_model(
        tmp_path_factory.mktemp("base"), "qwen2", hidden_size=128, num_layers=2, intermediate_size=256
    )


@pytest.fixture(scope="module")
def nf4_dir(base_dir, tmp_path_factory):
    return quantize_checkpoint(base_dir, tmp_path_factory.mktemp("nf4"), format="nf4")


def test_codebook_is_the_normalised_normal_quantiles_of_qlora():
    """QLoRA's construction (bitsandbytes' create_normal_map, offset 0.9677083): 8 positive and
    7 negative quantiles of N(0, 1), an exact zero, all divided by the largest."""
    offset = 0.9677083
    normal = torch.distributions.Normal(0.0, 1.0)
    positive = normal.icdf(torch.linspace(offset, 0.5, 9)[:-1].double())
    negative = -normal.icdf(torch.linspace(offset, 0.5, 8)[:-1].double())
    # like bitsandbytes: float32 probabilities, quantiles in float64, normalised in float32
    values = torch.cat([positive, torch.zeros(1, dtype=torch.float64), negative]).float().sort().values
    assert torch.equal(nf4.NF4_CODE, values / values.max())
    assert nf4.NF4_CODE[0] == -1 and nf4.NF4_CODE[7] == 0 and nf4.NF4_CODE[15] == 1


def test_round_trip_packing_and_rounding():
    torch.manual_seed(0)
    weight = torch.randn(8, 128) * 0.02
    absmax = 0.5
    weight[0, :16] = nf4.NF4_CODE * absmax  # on the grid: comes back exactly (block absmax is 0.5)
    weight[0, 16:64] = 0.0
    weight[1, :64] = 0.0  # an all-zero block: absmax 0, every value 0
    midpoint = (nf4.NF4_CODE[8] + nf4.NF4_CODE[9]) / 2
    weight[2, :2] = torch.tensor([1.0, midpoint])  # a value exactly on a midpoint takes the lower code
    packed = nf4.quantize(weight)
    assert packed.weight_packed.shape == (8, 64) and packed.weight_packed.dtype == torch.uint8
    assert packed.weight_absmax.shape == (8, 2) and packed.weight_absmax.dtype == torch.float32
    assert packed.weight_packed[0, 0] == (0 << 4 | 1)  # column 0 in the high nibble, column 1 in the low
    assert packed.weight_packed[2, 0] == (15 << 4 | 8)
    restored = nf4.dequantize(packed.weight_packed, packed.weight_absmax)
    assert torch.equal(restored[0, :64], weight[0, :64])
    assert torch.equal(restored[1, :64], torch.zeros(64))
    # everywhere the nearest codebook value of `w / absmax`, times absmax
    blocks_absmax = weight.abs().unflatten(-1, (-1, 64)).amax(-1).repeat_interleave(64, -1)
    scaled = weight / blocks_absmax.clamp(min=1e-38)
    nearest = nf4.NF4_CODE[(scaled.unsqueeze(-1) - nf4.NF4_CODE).abs().argmin(-1)]
    torch.testing.assert_close(restored, nearest * blocks_absmax, rtol=0, atol=1e-9)
    assert torch.equal(nf4.dequantize(packed.weight_packed, packed.weight_absmax, torch.bfloat16), restored.bfloat16())


def test_config_is_the_one_transformers_writes(nf4_dir):
    config = json.loads((nf4_dir / "config.json").read_text())["quantization_config"]
    expected = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        llm_int8_skip_modules=["lm_head"],
        bnb_4bit_compute_dtype=torch.float32,
    )
    assert config == expected.to_dict()
    assert quantized_format(nf4_dir) == "nf4"


def test_rlvr_quantize_format_nf4_writes_the_same_checkpoint(base_dir, nf4_dir, tmp_path):
    done = subprocess.run([sys.executable, "-m", "rlvr.cli", "quantize", "--format", "nf4", str(base_dir), str(tmp_path / "q")],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert quantized_format(tmp_path / "q") == "nf4"
    assert (tmp_path / "q" / "model.safetensors").read_bytes() == (nf4_dir / "model.safetensors").read_bytes()


def test_packed_model_computes_like_its_dequantized_float_model_and_lora_trains_on_it(nf4_dir, tmp_path):
    torch.manual_seed(0)
    packed = load_quantized_model(nf4_dir)
    assert len(quantized_linear_names(packed)) == 2 * 7 and packed.lm_head.weight is packed.model.embed_tokens.weight
    float_model = AutoModelForCausalLM.from_pretrained(write_dequantized_checkpoint(nf4_dir, tmp_path / "float"))
    ids = torch.randint(4, 200, (2, 12))
    with torch.no_grad():
        assert_close_scaled(packed(ids).logits, float_model(ids).logits)

    config = prepare_lora_config(
        LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False), packed
    )
    peft_packed = get_peft_model(packed, config)
    peft_float = get_peft_model(float_model, LoraConfig(r=4, lora_alpha=8, target_modules=config.target_modules))
    lora_state = {key: value for key, value in peft_packed.state_dict().items() if "lora_" in key}
    assert not peft_float.load_state_dict(lora_state, strict=False).unexpected_keys
    peft_packed(ids, labels=ids).loss.backward()
    peft_float(ids, labels=ids).loss.backward()
    grads = {name: p.grad for name, p in peft_float.named_parameters() if p.requires_grad}
    trainable = {name: p for name, p in peft_packed.named_parameters() if p.requires_grad}
    assert trainable.keys() == grads.keys() and all("lora_" in name for name in trainable)
    for name, parameter in trainable.items():
        assert_close_scaled(parameter.grad, grads[name], msg=name)


def test_backward_keeps_only_packed_tensors(nf4_dir):
    layer = next(m for m in load_quantized_model(nf4_dir).modules() if isinstance(m, NF4Linear))
    x = torch.randn(3, layer.in_features, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        layer(x).sum().backward()
    packed = {t.data_ptr() for t in layer.packed_tensors()}
    assert len(saved) == 2 and all(t.data_ptr() in packed for t in saved)
    assert_close_scaled(x.grad, torch.ones(3, layer.out_features) @ layer.dequantized_weight())


def test_bad_checkpoints_fail_with_the_file_and_tensor_named(nf4_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(nf4_dir, broken)
    tensors = load_file(broken / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight.absmax"]
    save_file(tensors, broken / "model.safetensors")
    with pytest.raises(
        ValueError,
        match=r"model\.safetensors: model\.layers\.1\.mlp\.up_proj: has weight\.quant_state\.bitsandbytes__nf4 but no weight\.absmax",
    ):
        load_quantized_model(broken)

    config = json.loads((broken / "config.json").read_text())
    config["quantization_config"]["bnb_4bit_use_double_quant"] = True
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config\.json: bitsandbytes quantization_config .*double quantization"):
        dequantized_state_dict(broken)


def test_a_linear_with_a_partial_block_per_row_is_refused_with_its_name(tmp_path):
    narrow = build_tiny_model(tmp_path / "narrow", "qwen2", hidden_size=96, num_layers=1, intermediate_size=128)
    with pytest.raises(
        ValueError,
        match=r"narrow: model\.layers\.0\.self_attn\.q_proj has 96 input features, not a multiple of 64; add",
    ):
        quantize_checkpoint(narrow, tmp_path / "out", format="nf4")
    assert not (tmp_path / "out").exists()


def test_vllm_has_no_bitsandbytes_method_so_every_engine_gets_the_dequantized_view(nf4_dir):
    from vllm.config import ModelConfig

    from rlvr.engines import served_folder
    from rlvr.models.folder import read_model_folder

    with pytest.raises(ValueError, match="Unknown quantization method: bitsandbytes"):
        ModelConfig(model=str(nf4_dir))
    view = served_folder(read_model_folder(nf4_dir))
    assert str(view.path) == f"{nf4_dir}.dequantized" and view.quantization_config is None
    assert "quantization_config" not in json.loads(
        (nf4_dir.parent / f"{nf4_dir.name}.dequantized" / "config.json").read_text()
    )


# --------------------------------------------------------------------------- bitsandbytes itself


def test_bitsandbytes_quantize_4bit_gives_rlvrs_bytes_and_dequantize_4bit_rlvrs_values():
    bnb_functional = pytest.importorskip("bitsandbytes.functional", reason=NO_BNB)
    torch.manual_seed(0)
    weight = torch.randn(64, 256) * 0.02
    weight[0, :64] = 0.0
    weight[1, :64] = torch.linspace(-1, 1, 64)
    ours = nf4.quantize(weight)
    packed, state = bnb_functional.quantize_4bit(weight, blocksize=64, quant_type="nf4", compress_statistics=False)
    assert torch.equal(packed.reshape(-1), ours.weight_packed.reshape(-1))
    assert torch.equal(state.absmax, ours.weight_absmax.reshape(-1))
    theirs = bnb_functional.dequantize_4bit(ours.weight_packed.reshape(-1, 1), state)
    assert torch.equal(theirs, nf4.dequantize(ours.weight_packed, ours.weight_absmax))
    # the serialized quant state (what Linear4bit puts in a state dict), byte for byte
    stored = nf4.to_checkpoint(ours, torch.float32)
    assert torch.equal(stored["weight"], packed)
    for key, value in state.as_dict(packed=True).items():
        assert torch.equal(stored[f"weight.{key}"], value), key


def test_transformers_loads_rlvrs_checkpoint_with_bitsandbytes_to_rlvrs_values(nf4_dir):
    bnb_functional = pytest.importorskip("bitsandbytes.functional", reason=NO_BNB)
    theirs = AutoModelForCausalLM.from_pretrained(nf4_dir)
    ours = load_quantized_model(nf4_dir)
    for name in quantized_linear_names(ours):
        layer = theirs.get_submodule(name)
        assert type(layer).__name__ == "Linear4bit"
        dequantized = bnb_functional.dequantize_4bit(layer.weight.data, layer.weight.quant_state)
        assert torch.equal(dequantized, ours.get_submodule(name).dequantized_weight()), name
    # in eval mode bnb's CPU kernel repacks absmax to bfloat16 (its own speed path); training
    # mode keeps its exact dequantize-then-matmul
    ids = torch.randint(4, 200, (2, 12))
    with torch.no_grad():
        assert_close_scaled(theirs.train()(ids).logits, ours(ids).logits, rel=1e-6)


def test_a_checkpoint_bitsandbytes_wrote_loads_in_rlvr_to_its_values(base_dir, tmp_path):
    bnb_functional = pytest.importorskip("bitsandbytes.functional", reason=NO_BNB)
    source = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    tensors, expected = {}, {}
    for key, value in source.state_dict().items():
        prefix = key.removesuffix(".weight")
        if (
            key.endswith(".weight")
            and isinstance(source.get_submodule(prefix), torch.nn.Linear)
            and prefix != "lm_head"
        ):
            packed, state = bnb_functional.quantize_4bit(
                value, blocksize=64, quant_type="nf4", compress_statistics=False
            )
            tensors[key] = packed
            tensors.update({f"{key}.{k}": v for k, v in state.as_dict(packed=True).items()})
            expected[prefix] = bnb_functional.dequantize_4bit(packed, state)
        elif key != "lm_head.weight":  # tied to the embedding
            tensors[key] = value
    for path in base_dir.iterdir():
        if path.name != "model.safetensors":
            shutil.copy2(path, tmp_path / path.name)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4").to_dict()
    (tmp_path / "config.json").write_text(json.dumps(config))

    model = load_quantized_model(tmp_path)
    assert set(quantized_linear_names(model)) == set(expected)
    for name, weight in expected.items():
        assert torch.equal(model.get_submodule(name).dequantized_weight(), weight)


# --------------------------------------------------------------------------- an RL run


@pytest.mark.slow
def test_two_rl_steps_through_vllm_and_two_fsdp2_ranks_with_lora_on_an_nf4_base(tmp_path):
    done = two_rl_steps(tmp_path, "qwen2", "nf4")
    assert done.returncode == 0, done.stdout[-3000:]
    check_two_trained_steps(tmp_path, "qwen2", "nf4", "vllm")
    assert quantized_format(tmp_path / "assets" / "model") == "nf4"
