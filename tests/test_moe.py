"""NVFP4 MoE checkpoints (DeepSeek-V3 MLA + fine-grained experts, Qwen3-MoE, Mixtral): written
in llm-compressor's per-expert layout, read back by compressed-tensors' own decompressor, read
from compressed-tensors' own compressor, and trained with the experts packed (LoRA included)
exactly like the same model with the dequantized weights in float, on 1 and 2 FSDP2 ranks."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket

import pytest
import torch
import torch.multiprocessing as mp
from _floats import assert_close_scaled
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.compressors.nvfp4 import NVFP4PackedCompressor
from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme
from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam
from engine_fixtures import random_train_batch, rank_spec, reference_logprobs
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from rlvr.models.moe import moe_layers
from rlvr.models.tiny import build_tiny_model
from rlvr.quant import (
    dequantized_state_dict,
    load_quantized_model,
    nvfp4,
    peft_targets_as_given,
    prepare_lora_config,
    quantize_checkpoint,
    quantized_linear_names,
    write_dequantized_checkpoint,
)
from rlvr.quant.experts import NAME, packed_experts_names, packed_projection
from rlvr.quant.packed_bytes import as_bytes
from rlvr.training.policy import apply_lora

ARCHS = ["deepseek_v3", "qwen3_moe", "mixtral"]
SIZES = dict(hidden_size=64, num_heads=4, num_kv_heads=4, num_layers=2, intermediate_size=128)
SCHEME = preset_name_to_scheme("NVFP4", ["Linear"])
# on-disk expert projection names of each architecture (Hub names), per expert
EXPERT_PROJECTIONS = {"deepseek_v3": ("gate_proj", "up_proj", "down_proj"), "qwen3_moe": ("gate_proj", "up_proj", "down_proj"),
                      "mixtral": ("w1", "w3", "w2")}  # fmt: skip


@pytest.fixture(scope="module", params=ARCHS)
def arch(request):
    return request.param


@pytest.fixture(scope="module")
def float_dir(arch, tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp(arch) / "float", arch, **SIZES)


@pytest.fixture(scope="module")
def nvfp4_dir(float_dir):
    return quantize_checkpoint(float_dir, float_dir.parent / "nvfp4")


@pytest.fixture(scope="module")
def dequantized_dir(nvfp4_dir):
    return write_dequantized_checkpoint(nvfp4_dir, nvfp4_dir.parent / "dequantized")


def _quantized_prefixes(tensors: dict) -> list[str]:
    return sorted(k.removesuffix(".weight_packed") for k in tensors if k.endswith(".weight_packed"))


def _within_nvfp4_error(original: torch.Tensor, stored: dict) -> bool:
    """|W - Q(W)| is at most one quantization step of its group (the largest E2M1 gap is 2
    steps, 4 -> 6) plus whatever FP8 rounding of the group scale pushed past 6 steps (clamped)."""
    values = nvfp4.dequantize(stored["weight_packed"], stored["weight_scale"], stored["weight_global_scale"])
    step = (stored["weight_scale"].float() / stored["weight_global_scale"]).repeat_interleave(nvfp4.GROUP_SIZE, -1)
    groups = original.abs().unflatten(-1, (-1, nvfp4.GROUP_SIZE)).amax(-1).repeat_interleave(nvfp4.GROUP_SIZE, -1)
    bound = step + (groups - 6 * step).clamp(min=0)
    return bool(((original - values).abs() <= bound * (1 + 1e-6)).all())


def test_every_expert_projection_is_packed_and_compressed_tensors_reads_back_rlvrs_values(arch, float_dir, nvfp4_dir):
    original = load_file(float_dir / "model.safetensors")
    files = load_file(nvfp4_dir / "model.safetensors")
    config = json.loads((nvfp4_dir / "config.json").read_text())["quantization_config"]
    scheme = QuantizationConfig.model_validate(config).config_groups["group_0"]
    model_fp32, model_bf16 = load_quantized_model(nvfp4_dir), load_quantized_model(nvfp4_dir, dtype=torch.bfloat16)
    layers = moe_layers(model_fp32)
    num_experts = layers[0].num_experts

    prefixes = _quantized_prefixes(files)
    routers = sorted(k.removesuffix(".weight") for k in files if k.endswith("gate.weight"))
    assert len(routers) == len(layers) and config["ignore"] == ["lm_head", *routers]  # vLLM keeps its gates float
    expected_experts = {f"{router.removesuffix('.gate')}.experts.{e}.{p}" for router in routers
                        for e in range(num_experts) for p in EXPERT_PROJECTIONS[arch]}  # fmt: skip
    assert {p for p in prefixes if ".experts." in p} == expected_experts
    # attention (MLA's q_a/q_b/kv_a/kv_b/o too) and shared experts are packed; routers, norms and
    # embeddings stay float (the tied head is the embedding)
    float_matrices = {
        k for k, v in files.items() if v.ndim == 2 and v.is_floating_point() and v.dtype != torch.float8_e4m3fn
    }
    assert float_matrices == {f"{r}.weight" for r in routers} | {"model.embed_tokens.weight"}
    if arch == "deepseek_v3":
        mla = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")
        assert all(f"model.layers.1.self_attn.{p}" in prefixes for p in mla)
        assert all(f"model.layers.1.mlp.shared_experts.{p}" in prefixes for p in ("gate_proj", "up_proj", "down_proj"))

    assert len(packed_experts_names(model_bf16)) == len(layers)
    for prefix in prefixes:
        stored = {s: files[f"{prefix}.{s}"] for s in ("weight_packed", "weight_scale", "weight_global_scale")}
        theirs = NVFP4PackedCompressor.decompress(stored, scheme)["weight"]  # bfloat16, as it returns
        assert _within_nvfp4_error(original[f"{prefix}.weight"], stored), prefix
        if ".experts." not in prefix:
            assert torch.equal(model_bf16.get_submodule(prefix).dequantized_weight(), theirs)
            continue
        # the trainer's packed experts hold exactly these values, at the rows transformers fuses them to
        assert torch.equal(_packed_expert_rows(model_bf16, arch, prefix), theirs), prefix


def _packed_expert_rows(model, arch: str, prefix: str) -> torch.Tensor:
    """The bfloat16 rows that a model's packed experts hold for one on-disk expert projection
    (`...layers.{i}....experts.{e}.{projection}`): transformers fuses gate (first) and up rows."""
    layer, expert, projection = re.search(r"layers\.(\d+)\..*experts\.(\d+)\.(\w+)$", prefix).groups()
    experts = next(m.experts for m in moe_layers(model) if f"layers.{layer}." in m.experts_name)
    gate, up, down = EXPERT_PROJECTIONS[arch]
    rows = packed_projection(experts, "down_proj" if projection == down else "gate_up_proj").expert(int(expert))
    values = nvfp4.dequantize(rows.weight_packed, rows.weight_scale, rows.weight_global_scale, torch.bfloat16)
    return values.chunk(2)[projection == up] if projection != down else values


def test_gate_and_up_of_an_expert_share_one_global_scale_and_experts_are_calibrated(arch, nvfp4_dir):
    files = load_file(nvfp4_dir / "model.safetensors")
    gate, up, down = EXPERT_PROJECTIONS[arch]
    for key in (k for k in files if k.endswith(f".{gate}.weight_global_scale") and ".experts." in k):
        assert torch.equal(files[key], files[key.replace(f".{gate}.", f".{up}.")])  # vLLM fuses them (w13)
        assert not torch.equal(files[key], files[key.replace(f".{gate}.", f".{down}.")])
        assert files[key.replace("weight_global_scale", "input_global_scale")].item() != 1.0  # every expert calibrated


def test_compressed_tensors_written_moe_checkpoint_loads_packed_to_its_values(arch, float_dir, tmp_path):
    """A checkpoint written with compressed-tensors' own observers and compressor, expert by expert
    (each expert projection its own global scale, as a plain compressor writes them)."""
    original = load_file(float_dir / "model.safetensors")
    tensors, expected = {}, {}
    for key, value in original.items():
        prefix = key.removesuffix(".weight")
        if value.ndim == 2 and not key.endswith(("gate.weight", "embed_tokens.weight", "lm_head.weight")):
            global_scale = generate_gparam(value.min(), value.max())
            groups = value.unflatten(-1, (-1, nvfp4.GROUP_SIZE))
            scale, zero = calculate_qparams(groups.amin(-1), groups.amax(-1), SCHEME.weights, global_scale=global_scale)
            state = {
                "weight": value,
                "weight_scale": scale,
                "weight_global_scale": global_scale,
                "weight_zero_point": zero,
            }
            compressed = NVFP4PackedCompressor.compress(state, SCHEME)
            compressed["input_global_scale"] = generate_gparam(torch.tensor(-3.0), torch.tensor(3.0))
            tensors.update({f"{prefix}.{k}": v for k, v in compressed.items()})
            expected[prefix] = NVFP4PackedCompressor.decompress(compressed, SCHEME)["weight"]
        else:
            tensors[key] = value
    for path in float_dir.iterdir():
        if path.name != "model.safetensors":
            shutil.copy2(path, tmp_path / path.name)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    routers = sorted(k.removesuffix(".weight") for k in original if k.endswith("gate.weight"))
    config = QuantizationConfig(config_groups={"group_0": preset_name_to_scheme("NVFP4", ["Linear"])},
                                format="nvfp4-pack-quantized", quantization_status="compressed", ignore=["lm_head", *routers])  # fmt: skip
    ModelCompressor(quantization_config=config).update_config(str(tmp_path))

    model = load_quantized_model(tmp_path, dtype=torch.bfloat16)
    assert model.config._experts_implementation == NAME
    for prefix, weight in expected.items():
        if ".experts." not in prefix:
            assert torch.equal(model.get_submodule(prefix).dequantized_weight(), weight)
            continue
        assert torch.equal(_packed_expert_rows(model, arch, prefix), weight), prefix


def _lora_pair(nvfp4_dir, dequantized_dir):
    """The same random LoRA (attention, MLA, shared experts and every routed expert) on the packed
    model (rlvr) and on the float model holding its dequantized weights (peft's own
    `target_parameters` wrappers for the experts)."""
    torch.manual_seed(0)
    packed = apply_lora(load_quantized_model(nvfp4_dir), 4, 8.0, 0.0, "all-linear", target_experts=True)
    float_model = AutoModelForCausalLM.from_pretrained(dequantized_dir, dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=packed.peft_config["default"].target_modules,
                        target_parameters=["gate_up_proj", "down_proj"])  # fmt: skip
    with peft_targets_as_given():
        reference = get_peft_model(float_model, prepare_lora_config(config, float_model))
    with torch.no_grad():
        for name, parameter in packed.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.1)
    lora = {k: v for k, v in packed.state_dict().items() if "lora_" in k}
    assert lora.keys() == {k for k in reference.state_dict() if "lora_" in k}
    reference.load_state_dict(lora, strict=False)
    return packed, reference


def test_packed_experts_with_lora_give_the_float_models_logits_and_gradients(nvfp4_dir, dequantized_dir):
    packed, reference = _lora_pair(nvfp4_dir, dequantized_dir)
    assert all(not p.requires_grad for n, p in packed.named_parameters() if "lora_" not in n)
    # every packed Linear (attention, MLA's low-rank projections, shared experts, dense MLPs) has LoRA
    assert all(name.endswith(".base_layer") for name in quantized_linear_names(packed))
    ids = torch.randint(4, 300, (2, 24), generator=torch.Generator().manual_seed(1))
    logits, expected = packed(ids).logits, reference(ids).logits
    assert_close_scaled(logits, expected)
    (logits.float().log_softmax(-1)[..., 7].sum()).backward()
    (expected.float().log_softmax(-1)[..., 7].sum()).backward()
    grads = {n: p.grad for n, p in packed.named_parameters() if p.requires_grad}
    reference_grads = {n: p.grad for n, p in reference.named_parameters() if p.requires_grad}
    assert grads.keys() == reference_grads.keys() and any(".experts." in n for n in grads)
    for name, grad in grads.items():
        assert_close_scaled(grad, reference_grads[name], msg=name)
    with torch.no_grad(), packed.disable_adapter(), reference.disable_adapter():  # the KL reference: the base
        assert_close_scaled(packed(ids).logits, reference(ids).logits)


def test_lora_goes_where_its_targets_say_where_peft_alone_would_move_it_to_the_routed_experts(tmp_path):
    """peft rewrites `gate_proj`/`up_proj`/`down_proj` targets of a DeepSeek/Qwen-MoE model as if
    the adapter came from transformers 4 (`convert_peft_config_for_transformers`): it adds a LoRA on
    the fused routed experts (rank doubled for `gate_up_proj`), an adapter vLLM cannot serve, and
    peft 0.21 also drops the shared experts' and dense MLPs' LoRA. rlvr's `apply_lora` puts LoRA
    exactly where its targets say: the routed experts only with `lora.target_experts`."""
    model_dir = build_tiny_model(tmp_path, "deepseek_v3", **SIZES)
    mlps = {"model.layers.0.mlp.gate_proj", "model.layers.1.mlp.shared_experts.down_proj"}

    plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    by_peft = get_peft_model(plain, prepare_lora_config(LoraConfig(r=4, target_modules="all-linear"), plain))
    assert "model.layers.1.mlp.experts" in _lora_targets(by_peft)

    ours = apply_lora(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), 4, 8.0, 0.0, "all-linear")
    assert mlps <= _lora_targets(ours) and not any(".experts" in name for name in _lora_targets(ours))


def test_measuring_an_adapter_draws_no_expert_pairs(tmp_path):
    """`apply_lora(..., shapes_only=True)` (the rehearsals' measurement) leaves every factor on the
    meta device, the routed experts' pairs too: at the seed's size those are 3.2 billion values."""
    from rlvr.quant.skeleton import Skeleton

    skeleton = Skeleton.from_checkpoint(build_tiny_model(tmp_path, "deepseek_v3", **SIZES), torch.bfloat16)
    peft = apply_lora(skeleton.model, 4, 8.0, 0.0, ["q_a_proj"], target_experts=True, shapes_only=True)
    factors = {n: p.device.type for n, p in peft.named_parameters() if p.requires_grad}
    assert any(".mlp.experts." in n for n in factors) and set(factors.values()) == {"meta"}


def _lora_targets(peft_model) -> set[str]:
    """Model names of the modules holding a LoRA pair."""
    names = {n.rsplit(".lora_A.", 1)[0] for n, _ in peft_model.named_parameters() if ".lora_A." in n}
    return {n.removeprefix("base_model.model.").removesuffix(".base_layer") for n in names}


def test_only_experts_that_received_tokens_dequantize_and_backward_keeps_no_float_weights(nvfp4_dir, monkeypatch):
    model = load_quantized_model(nvfp4_dir)
    experts = model.get_submodule(packed_experts_names(model)[0])
    dequantized_rows = []
    real = nvfp4.dequantize
    monkeypatch.setattr(
        nvfp4, "dequantize", lambda packed, *rest: dequantized_rows.append(packed.data_ptr()) or real(packed, *rest)
    )
    hidden = torch.randn(5, as_bytes(experts.gate_up_proj_weight_packed).shape[2] * 2, requires_grad=True)
    top_k_index = torch.tensor([[1, 3]] * 5)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = experts(hidden, top_k_index, torch.full((5, 2), 0.5))
    out.sum().backward()
    packed = (experts.gate_up_proj_weight_packed, experts.down_proj_weight_packed)
    owner = {tensor[e].data_ptr(): e for tensor in packed for e in range(experts.num_experts)}
    assert sorted(owner[ptr] for ptr in dequantized_rows) == [1] * 4 + [3] * 4  # 2 projections, forward + backward
    weight_shapes = {(t.shape[1], 2 * as_bytes(t).shape[2]) for t in packed}
    assert not [t for t in saved if t.is_floating_point() and tuple(t.shape) in weight_shapes]


# --------------------------------------------------------------------------- ranks


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _expert_shards(rank: int, world_size: int, port: int, model_dir: str, out) -> None:
    """One FSDP2 rank: what it holds of each packed experts tensor after a LoRA forward and backward."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from rlvr.config import TrainerConfig
    from rlvr.quant.skeleton import Skeleton
    from rlvr.training.policy import TokenLogprobs, shard_and_load

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        skeleton = Skeleton.from_checkpoint(model_dir, torch.float32)
        policy = TokenLogprobs(
            apply_lora(skeleton.model, 4, 8.0, 0.0, "all-linear", target_experts=True), TrainerConfig().logits_chunk_mb
        )
        shard_and_load(policy, skeleton, init_device_mesh("cpu", (world_size,)), torch.float32, "cpu")
        ids = torch.arange(4, 20).unsqueeze(0)
        logprobs, _ = policy(ids, torch.arange(16).unsqueeze(0), torch.arange(15), ids[0, 1:])
        logprobs.sum().backward()
        held = {}
        for name in packed_experts_names(policy):
            for pname, p in policy.get_submodule(name).named_parameters(recurse=False):
                local = p.to_local() if isinstance(p, DTensor) else p
                held[f"{name}.{pname}"] = (tuple(local.shape), tuple(p.shape))
        out.put((rank, held))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_fsdp2_shards_packed_experts_over_ranks(nvfp4_dir):
    port, ctx = _free_port(), mp.get_context("spawn")
    out = ctx.Queue()
    processes = [ctx.Process(target=_expert_shards, args=(r, 2, port, str(nvfp4_dir), out)) for r in range(2)]
    for p in processes:
        p.start()
    held = dict(out.get(timeout=300) for _ in processes)
    for p in processes:
        p.join(timeout=60)
    assert held[0] and held[0].keys() == held[1].keys()
    for rank in (0, 1):
        for name, (local, full) in held[rank].items():
            assert local == (full[0] // 2, *full[1:]), name  # half the experts each


@pytest.mark.slow
def test_trainer_on_packed_moe_matches_float_on_one_and_two_ranks(arch, nvfp4_dir, dequantized_dir):
    from rlvr.training.trainer import Trainer

    batch = random_train_batch()
    sequences = [p + c for p, c in zip(batch.prompt_ids, batch.completion_ids)]
    prompt_lens = [len(p) for p in batch.prompt_ids]
    expected = reference_logprobs(
        AutoModelForCausalLM.from_pretrained(dequantized_dir, dtype=torch.float32), sequences, prompt_lens
    )
    lora = dict(rank=4, alpha=8.0, dropout=0.0, target_modules="all-linear", target_experts=True)
    results = {}
    for ranks in (1, 2):
        with Trainer(rank_spec(nvfp4_dir, lr=1e-2, lora=lora, ranks=ranks, micro_batch_tokens=14)) as trainer:
            logprobs = trainer.logprobs(sequences, prompt_lens)
            metrics = trainer.train_step(batch)
            results[ranks] = (metrics, trainer.adapter().tensors)
        assert_close_scaled(sum(logprobs, []), sum(expected, []))
    (m1, a1), (m2, a2) = results[1], results[2]
    assert m1["loss"] == pytest.approx(m2["loss"], abs=1e-5)
    assert m1["grad_norm"] == pytest.approx(m2["grad_norm"], rel=1e-5)
    assert a1.keys() == a2.keys() and any(".experts." in k for k in a1)
    for name in a1:  # the updated adapters agree, so the gradients did
        torch.testing.assert_close(a1[name], a2[name], atol=1e-5, rtol=1e-5)


def test_packed_base_has_no_integer_parameters(tmp_path):
    """torch 2.11's FSDP2 (the GPU image's) refuses integer parameters: the packed bytes are held
    as float16, read back as the very same uint8 bytes, and the layers compute as before."""
    model_dir = quantize_checkpoint(build_tiny_model(tmp_path / "float", "deepseek_v3", **SIZES), tmp_path / "nvfp4")
    model = load_quantized_model(model_dir)
    packed = {n: p for n, p in model.named_parameters() if "weight_packed" in n}
    assert any(".experts." in n for n in packed) and any(".experts." not in n for n in packed)
    assert all(p.is_floating_point() for p in model.parameters())
    stored = dequantized_state_dict(model_dir)
    files = load_file(model_dir / "model.safetensors")
    linear = next(n for n in packed if ".experts." not in n)
    assert torch.equal(as_bytes(packed[linear]), files[linear])
    weight = model.get_submodule(linear.removesuffix(".weight_packed")).dequantized_weight()
    assert torch.equal(weight, stored[linear.replace("weight_packed", "weight")])


def test_peft_is_left_unpatched_after_models_get_lora_in_threads():
    """Engine replicas build their LoRA models in threads: every patch of peft (targets as given,
    adapters kept off meta) is undone afterwards, whatever the interleaving."""
    from concurrent.futures import ThreadPoolExecutor

    from peft.tuners.lora import LoraModel
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils import transformers_weight_conversion
    from transformers import AutoModelForCausalLM

    from rlvr.models.tiny import tiny_config

    originals = (
        transformers_weight_conversion.convert_peft_config_for_transformers,
        LoraModel._replace_module,
        BaseTunerLayer._get_base_layer_device_and_dtype,
    )
    config = tiny_config("deepseek_v3", vocab_size=64, **SIZES)
    with ThreadPoolExecutor(4) as pool:
        list(
            pool.map(
                lambda _: apply_lora(AutoModelForCausalLM.from_config(config), 4, 8.0, 0.0, "all-linear"), range(8)
            )
        )
    assert (
        transformers_weight_conversion.convert_peft_config_for_transformers,
        LoraModel._replace_module,
        BaseTunerLayer._get_base_layer_device_and_dtype,
    ) == originals
