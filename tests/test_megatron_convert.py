"""The HF folder converted into megatron-core's GPTModel (rlvr.training.megatron): its logits
equal transformers' within 1e-5 of their scale in float32, one rank or split by tensor parallel
over two, for each dense family, a packed row of two sequences scored as each alone; and with a
PEFT adapter on some of the targets a fused Megatron layer holds, equal to peft's. The same for a
DeepSeek-V3 (MLA, dense then MoE layers), its routed experts split by expert parallel, and for
its NVFP4 base, read dequantized."""

from __future__ import annotations

import pytest
import torch
from megatron_fixtures import SIZES, dense_folder, moe_folder, run_ranks
from transformers import AutoModelForCausalLM

from rlvr.training.attention import PackedLayout, Segment

RANK, ALPHA = 4, 8.0
SEQUENCES = [[5, 17, 33, 90, 41, 7, 66], [12, 3, 88, 45, 9]]
# past an original length of 16 positions twice (a scaled rotary embedding's, llama-4's query
# scale's: 1 + 0.1 log(1 + floor(p / 16)) takes three values in each sequence)
LONG_SEQUENCES = [[(7 * i) % 300 + 4 for i in range(41)], [(11 * i) % 300 + 4 for i in range(35)]]


def _megatron_logits(
    rank: int,
    world_size: int,
    path: str,
    adapter: dict | None = None,
    split: str = "tensor_parallel",
    sequences: list[list[int]] = SEQUENCES,
) -> torch.Tensor:
    from rlvr.config import MegatronConfig
    from rlvr.models.folder import read_model_folder
    from rlvr.training.megatron.lora import attach_lora
    from rlvr.training.megatron.parallel import start_model_parallel, stop_model_parallel
    from rlvr.training.megatron.policy import MegatronPolicy

    start_model_parallel(MegatronConfig(**{split: world_size}), use_cuda=False)
    try:
        policy = MegatronPolicy(read_model_folder(path), torch.float32, logits_chunk_mb=64)
        if adapter is not None:
            attach_lora(policy.gpt, adapter, policy.shape, scaling=ALPHA / RANK)
        ids = torch.tensor([sum(sequences, [])])
        positions = torch.tensor([[p for s in sequences for p in range(len(s))]])
        layout = PackedLayout.build([Segment(0, len(sequences[0])), Segment(len(sequences[0]), len(sequences[1]))])
        with torch.no_grad():
            return policy.logits(policy.hidden(ids, positions, layout))
    finally:
        stop_model_parallel()


def _hf_logits(path, sequences: list[list[int]] = SEQUENCES) -> torch.Tensor:
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        return torch.cat([hf(torch.tensor([s])).logits[0] for s in sequences])


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "tied"), [("qwen2", True), ("llama", False), ("mistral", True)])
def test_converted_logits_equal_transformers(tmp_path, arch, tied):
    path = dense_folder(tmp_path / arch, arch, tied=tied)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        want = torch.cat([hf(torch.tensor([s])).logits[0] for s in SEQUENCES])
    scale = want.abs().max()
    for ranks in (1, 2):
        for rank, got in run_ranks(_megatron_logits, ranks, str(path)).items():
            error = (got - want).abs().max() / scale
            assert error < 1e-5, (arch, ranks, rank, float(error))


ROTARY_SCALINGS = {
    "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
    "yarn": {"factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0},
    "linear": {"factor": 2.0},
}


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "rope_type"), [("llama", "llama3"), ("qwen2", "yarn"), ("mistral", "linear")])
def test_a_scaled_rotary_embedding_converts(tmp_path, arch, rope_type):
    """A dense model whose config.json scales its rotary embedding (Llama 3.x's llama3, YaRN with
    its attention factor, linear) rotates by transformers' angles, over sequences that run past
    the original length of 16 the scaling is measured from."""
    rope = {"rope_type": rope_type, "rope_theta": 500.0, "original_max_position_embeddings": 16}
    path = dense_folder(tmp_path / arch, arch, rope_parameters=rope | ROTARY_SCALINGS[rope_type])
    want = _hf_logits(path, LONG_SEQUENCES)
    got = run_ranks(_megatron_logits, 1, str(path), None, "tensor_parallel", LONG_SEQUENCES)[0]
    error = (got - want).abs().max() / want.abs().max()
    assert error < 1e-5, float(error)


@pytest.mark.parametrize("rope_type", ["dynamic", "longrope"])
def test_a_rotary_scaling_that_follows_the_length_is_refused_in_one_line(rope_type):
    from rlvr.models.tiny import tiny_config
    from rlvr.training.megatron.gpt import DenseShape

    rope = {"rope_type": rope_type, "rope_theta": 1e4, "factor": 2.0, "original_max_position_embeddings": 16}
    if rope_type == "longrope":
        rope |= {"short_factor": [1.0] * 8, "long_factor": [2.0] * 8}
    config = tiny_config("llama", vocab_size=128, **SIZES, rope_parameters=rope)
    with pytest.raises(ValueError, match=f"no '{rope_type}' rotary scaling") as error:
        DenseShape.of(config, qkv_bias=False)
    assert "\n" not in str(error.value) and "config.json" in str(error.value)


@pytest.mark.slow
def test_a_peft_adapter_on_megatron_layers_gives_peft_logits(tmp_path):
    """q and v of the fused q/k/v (k left as is), up of the fused gate/up, and the row-parallel
    down projection: each factor lands on its rows or columns of the split layer."""
    path = dense_folder(tmp_path / "qwen2", "qwen2")
    want, adapter = _peft_logits(path, ["q_proj", "v_proj", "up_proj", "down_proj"])
    for ranks in (1, 2):
        for rank, got in run_ranks(_megatron_logits, ranks, str(path), adapter).items():
            error = (got - want).abs().max() / want.abs().max()
            assert error < 1e-5, (ranks, rank, float(error))


def _peft_logits(path, targets: list[str], sequences: list[list[int]] = SEQUENCES) -> tuple[torch.Tensor, dict]:
    """peft's logits of the sequences with a random adapter (B too: one that changes the output)
    on `targets`, and that adapter's tensors by name."""
    from peft import LoraConfig, get_peft_model

    from rlvr.quant import peft_targets_as_given

    config = LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=targets)
    with peft_targets_as_given():  # gate/up/down_proj: the dense MLP's and shared experts', not the routed ones
        peft = get_peft_model(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), config)
    return _random_adapter_logits(peft, sequences, seed=2)


def _random_adapter_logits(peft, sequences, seed: int) -> tuple[torch.Tensor, dict]:
    """`peft`'s factors drawn at random (B too: an adapter that changes the output): its logits of
    `sequences`, and the adapter by PEFT's public names."""
    from rlvr.training.rank_weights import public_name

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in peft.parameters():
            if param.requires_grad:
                param.copy_(0.3 * torch.randn(param.shape, generator=generator))
        want = torch.cat([peft(torch.tensor([s])).logits[0] for s in sequences])
    return want, {public_name(n): p.detach() for n, p in peft.named_parameters() if p.requires_grad}


MLA_TARGETS = ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("arch", "sequences"), [("deepseek_v3", SEQUENCES), ("mistral4", LONG_SEQUENCES)], ids=["deepseek_v3", "mistral4"]
)
def test_an_mla_moe_model_by_expert_parallel_gives_transformers_logits(tmp_path, arch, sequences):
    """MLA (interleaved rotary dimensions, position ids restarting per packed sequence), the dense
    first layer, the shared expert, each rank holding 4 of the 8 routed experts; and a PEFT
    adapter on every MLA projection, the dense MLP and the shared experts. DeepSeek-V3 routes by
    group-limited sigmoid scores with correction bias and scaling; mistral4 (Mistral Large 3's
    and Small 4's model) by a softmax over every expert, with YaRN angles and llama-4's query
    scale by position."""
    path = moe_folder(tmp_path / arch, arch)
    want = _hf_logits(path, sequences)
    for ranks in (1, 2):
        for rank, got in run_ranks(_megatron_logits, ranks, str(path), None, "expert_parallel", sequences).items():
            error = (got - want).abs().max() / want.abs().max()
            assert error < 1e-5, (ranks, rank, float(error))
    want, adapter = _peft_logits(path, MLA_TARGETS, sequences)
    assert any(".shared_experts." in name for name in adapter)
    for rank, got in run_ranks(_megatron_logits, 2, str(path), adapter, "expert_parallel", sequences).items():
        error = (got - want).abs().max() / want.abs().max()
        assert error < 1e-5, (rank, float(error))
    want, adapter = _trainer_logits_with_expert_lora(path, sequences)
    for rank, got in run_ranks(_megatron_logits, 2, str(path), adapter, "expert_parallel", sequences).items():
        error = (got - want).abs().max() / want.abs().max()
        assert error < 1e-5, ("routed experts' LoRA", rank, float(error))


def _trainer_logits_with_expert_lora(path, sequences) -> tuple[torch.Tensor, dict]:
    """An FSDP2 rank's model with `lora.target_experts` (rlvr.quant.experts.ExpertsLora: one pair
    per routed expert and projection, in peft's target_parameters layout) and the MLA targets, every
    factor random: its logits, and its adapter by PEFT's names."""
    from rlvr.training.policy import apply_lora

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    peft = apply_lora(model, RANK, ALPHA, 0.0, MLA_TARGETS, target_experts=True)
    want, adapter = _random_adapter_logits(peft, sequences, seed=3)
    assert any(".mlp.experts.base_layer.lora_A." in name for name in adapter)
    return want, adapter


@pytest.mark.slow
def test_a_deepseek_v3_with_yarn_gives_transformers_logits(tmp_path):
    """DeepSeek-V3's own YaRN settings' kind (mscale and mscale_all_dim given, no attention_factor):
    the angles' factor and the softmax scale's both differ from 1, and megatron-core's take
    transformers' values."""
    rope = {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 16,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.5,
    }  # fmt: skip
    path = moe_folder(tmp_path / "deepseek_v3", rope_parameters=rope)
    want = _hf_logits(path, LONG_SEQUENCES)
    got = run_ranks(_megatron_logits, 1, str(path), None, "expert_parallel", LONG_SEQUENCES)[0]
    assert (got - want).abs().max() / want.abs().max() < 1e-5


@pytest.mark.slow
def test_mistral_large_3s_own_layout_reads_as_its_transformers_model(tmp_path):
    """params.json, consolidated.safetensors under Mistral's names: what Mistral publishes Mistral
    Large 3 as. The Megatron ranks read it through the same model folder record as the FSDP2 ones
    and give the logits of transformers' `mistral4` built from it."""
    from rlvr.models.tiny import build_tiny_mistral_folder
    from rlvr.quant.skeleton import Skeleton

    path = build_tiny_mistral_folder(
        tmp_path / "model", hidden_size=64, num_heads=4, num_layers=3, intermediate_size=128
    )
    assert (path / "params.json").exists() and not (path / "config.json").exists()
    skeleton = Skeleton.from_checkpoint(path, torch.float32)
    skeleton.keep_initialized(skeleton.model)
    skeleton.fill(skeleton.model, "cpu")
    sequences = [[t % 250 + 3 for t in s] for s in LONG_SEQUENCES]
    with torch.no_grad():
        want = torch.cat([skeleton.model.eval()(torch.tensor([s])).logits[0] for s in sequences])
    for rank, got in run_ranks(_megatron_logits, 2, str(path), None, "expert_parallel", sequences).items():
        assert (got - want).abs().max() / want.abs().max() < 1e-5, rank


@pytest.mark.slow
def test_an_nvfp4_deepseek_v3_is_read_dequantized(tmp_path):
    """Every expert, MLA and shared-expert projection packed: the Megatron ranks compute with the
    values the engine serves from it (its dequantized view), not the float folder's."""
    from rlvr.quant import quantize_checkpoint, write_dequantized_checkpoint

    nvfp4 = quantize_checkpoint(moe_folder(tmp_path / "deepseek_v3"), tmp_path / "nvfp4")
    view = AutoModelForCausalLM.from_pretrained(write_dequantized_checkpoint(nvfp4, tmp_path / "view"))
    with torch.no_grad():
        want = torch.cat([view.float()(torch.tensor([s])).logits[0] for s in SEQUENCES])
    for rank, got in run_ranks(_megatron_logits, 2, str(nvfp4), None, "expert_parallel").items():
        error = (got - want).abs().max() / want.abs().max()
        assert error < 1e-5, (rank, float(error))


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        ({"rope_interleave": False}, "rope_interleave: true"),
        ({"num_experts_per_tok": 4, "topk_group": 1}, "top 2 experts"),
        ({"norm_topk_prob": False}, "normalises the chosen experts' weights"),
        ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}, "no 'linear' rotary"),
        ({"model_type_override": "mistral4", "n_group": 2, "topk_group": 1}, "one expert group"),
        ({"model_type_override": "mistral4", "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "YaRN"),
        ({"model_type_override": "qwen3_moe"}, "converts MLA models of deepseek_v3, mistral4"),
    ],
)
def test_an_mla_model_megatron_would_compute_otherwise_is_refused_in_one_line(change, refusal):
    """What megatron-core's MLA and router do differently from transformers' model is refused at
    the rank's start, naming the config.json key, rather than trained as another model."""
    from rlvr.models.tiny import tiny_config
    from rlvr.training.megatron.mla import LatentShape

    sizes = {k: v for k, v in change.items() if k != "model_type_override"}
    arch = change.get("model_type_override", "deepseek_v3")
    config = tiny_config(arch, vocab_size=128, hidden_size=64, num_heads=4, num_layers=3, **sizes)
    with pytest.raises(ValueError, match=refusal) as error:
        LatentShape.of(config)
    assert "\n" not in str(error.value) and "config.json" in str(error.value)
