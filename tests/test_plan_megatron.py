"""A trainer rank's bytes under Megatron's layout (rlvr.planning.rank_memory.megatron_rank_bytes)
by hand on tiny shapes (tensor parallel halves each split tensor, expert parallel the experts,
pipeline stages the blocks, the embeddings and the head), against the real Megatron module tree
a rank builds, and in `--dry-run` beside FSDP2's."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr.config import load_config
from rlvr.planning.architecture import read_architecture
from rlvr.planning.plan import PlanError, make_plan
from rlvr.planning.rank_memory import megatron_rank_bytes
from rlvr.planning.sections import PlanSections

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SMALL = CONFIGS / "gsm8k_qwen2.5_0.5b_1gpu.yaml"
MEDIUM = CONFIGS / "math_7b_8gpu.yaml"
H, LAYERS, HEADS, KV_HEADS, FFN, V, R = 64, 4, 4, 2, 128, 256, 8  # head_dim 16: q 64 wide, k and v 32
DENSE = [
    "model.path=/nonexistent",
    "model.dtype=bfloat16",
    *(
        f"model.estimate.{key}={value}"
        for key, value in dict(
            hidden_size=H,
            num_layers=LAYERS,
            num_heads=HEADS,
            num_kv_heads=KV_HEADS,
            intermediate_size=FFN,
            vocab_size=V,
            tie_word_embeddings="false",
        ).items()
    ),
    "trainer.backend=megatron",
    "trainer.lora.rank=8",
    "trainer.lora.dropout=0",
    "trainer.lora.target_modules=[q_proj,o_proj]",
]
MOE = [
    "model.estimate.num_experts=4",
    "model.estimate.num_experts_per_tok=2",
    "model.estimate.moe_intermediate_size=32",
    "model.estimate.first_dense_layers=1",
]


def sections(config: Path, overrides: list[str]) -> PlanSections:
    return PlanSections.of(load_config(config, overrides))


def megatron(*overrides: str):
    return sections(SMALL, [*DENSE, *overrides])


def test_tensor_parallel_2_holds_half_of_each_split_tensor_and_all_of_the_rest():
    cfg = megatron("trainer.ranks=2", "trainer.megatron.tensor_parallel=2")
    b = 2  # bfloat16 on the config's GPU
    # column-parallel q, k, v, gate, up by output rows, row-parallel o and down by input columns,
    # embeddings and head by vocabulary: half each; the two norms a layer and the final one whole
    split = LAYERS * (H * H + 2 * H * 32 + H * H + 3 * H * FFN) + 2 * V * H
    whole = LAYERS * 2 * H + H
    # LoRA (float32): q's A [8, 64] whole and B [64, 8] half; o's A half (its input), B whole
    lora = LAYERS * (R * H + H * R // 2 + R * H // 2 + H * R) * 4
    for rank in (0, 1):
        held = megatron_rank_bytes(cfg, rank)
        assert held == {"base_shard": (split / 2 + whole) * b, "trainable": 2 * lora, "optimizer": 2 * lora}
    one = megatron_rank_bytes(megatron("trainer.ranks=2"), 0)  # tensor parallel 1: two whole replicas
    assert one["base_shard"] == read_architecture(cfg).weight_bytes(b) == (split + whole) * b


def test_expert_parallel_2_holds_half_of_the_routed_experts():
    arch = read_architecture(megatron(*MOE))
    routed = arch.routed_bytes(2)
    assert routed == 3 * 4 * 3 * H * 32 * 2  # 3 MoE layers of 4 experts, gate/up/down [32 x 64] in bf16
    whole = megatron_rank_bytes(megatron(*MOE, "trainer.ranks=2"), 0)
    for rank in (0, 1):
        halves = megatron_rank_bytes(megatron(*MOE, "trainer.ranks=2", "trainer.megatron.expert_parallel=2"), rank)
        assert whole["base_shard"] - halves["base_shard"] == routed / 2
        assert halves["trainable"] == whole["trainable"]  # attention's LoRA is not the experts'
    # with tensor parallel 2 as well, each expert rank's experts are split in two again (expert tensor parallel)
    both = megatron(*MOE, "trainer.ranks=4", "trainer.megatron.expert_parallel=2", "trainer.megatron.tensor_parallel=2")
    tp_only = megatron(*MOE, "trainer.ranks=4", "trainer.megatron.tensor_parallel=2")
    for rank in range(4):
        assert megatron_rank_bytes(tp_only, rank)["base_shard"] - megatron_rank_bytes(both, rank)["base_shard"] == (
            routed / 4
        )


@pytest.mark.parametrize("tied", ["false", "true"])
def test_pipeline_stages_hold_their_blocks_the_first_the_embeddings_the_last_the_head(tied):
    cfg = megatron(
        *MOE, "trainer.ranks=4", "trainer.megatron.pipeline_parallel=2", f"model.estimate.tie_word_embeddings={tied}"
    )
    arch, b = read_architecture(cfg), 2
    units = {u.name: u for u in arch.units(b, cfg.trainer.lora)}
    frozen = {name: sum(p.bytes for p in u.params if not p.trainable) for name, u in units.items()}
    embedding, norm = V * H * b, H * b
    # ranks 0-1 stage 0 (layers 0-1: the dense one and an MoE one), ranks 2-3 stage 1 (two MoE layers)
    first = frozen["dense block"] + frozen["MoE block"] + embedding
    last = 2 * frozen["MoE block"] + norm + embedding  # the head; tied, a copy of the embeddings
    assert [megatron_rank_bytes(cfg, r)["base_shard"] for r in range(4)] == [first, first, last, last]
    copy = embedding if tied == "true" else 0
    assert first + last == arch.weight_bytes(b) + copy


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["trainer.megatron.tensor_parallel=8"],
            "trainer.megatron.tensor_parallel=8 must divide the model's attention heads (4)",
        ),
        (
            ["trainer.megatron.pipeline_parallel=8"],
            "trainer.megatron.pipeline_parallel=8 must divide the model's decoder layers (4)",
        ),
        (
            [*MOE, "trainer.megatron.expert_parallel=8"],
            "trainer.megatron.expert_parallel=8 must divide the model's routed experts (4)",
        ),
    ],
)
def test_a_layout_megatron_core_refuses_is_a_plan_error(overrides, message):
    cfg = megatron("trainer.ranks=8", "placement.gpus_per_node=8", "placement.gpu_memory_gb=null", *overrides)
    with pytest.raises(PlanError, match=re.escape(message)):
        make_plan(cfg)


def test_dry_run_of_a_gpu_config_with_pipeline_and_sequence_parallel_prints_both_backends():
    layout = ["trainer.megatron.tensor_parallel=2", "trainer.megatron.pipeline_parallel=2"]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlvr.cli",
            "train",
            str(MEDIUM),
            "--dry-run",
            "trainer.backend=megatron",
            "trainer.lora.dropout=0",
            "trainer.megatron.sequence_parallel=true",
            *layout,
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Megatron: tensor parallel 2, expert parallel 1, pipeline 2, sequence parallel" in out.stdout
    assert "trainer ranks 0-1" in out.stdout and "trainer ranks 2-3" in out.stdout  # the two stages apart
    cfg = sections(MEDIUM, ["trainer.backend=megatron", "trainer.lora.dropout=0", *layout])
    fsdp2 = make_plan(sections(MEDIUM, [])).devices[4].memory
    (line,) = [text for text in out.stdout.splitlines() if text.startswith("FSDP2 instead")]
    assert f"each trainer rank {sum(fsdp2.values()) / 1e9:.2f} GB" in line
    rank = make_plan(cfg).devices[4].memory
    assert "gathered" not in rank and rank["base shard"] == megatron_rank_bytes(cfg, 0)["base_shard"]


def _held_bytes(rank: int, world_size: int, path: str, adapter: dict) -> dict[str, float]:
    """What a Megatron rank's module tree holds: its frozen base and its LoRA factors (value and gradient)."""
    import torch

    from rlvr.config import MegatronConfig
    from rlvr.models.folder import read_model_folder
    from rlvr.training.megatron.lora import attach_lora
    from rlvr.training.megatron.parallel import start_model_parallel, stop_model_parallel
    from rlvr.training.megatron.policy import MegatronPolicy

    start_model_parallel(MegatronConfig(tensor_parallel=world_size), use_cuda=False)
    try:
        policy = MegatronPolicy(read_model_folder(path), torch.float32, logits_chunk_mb=64)
        for p in policy.parameters():
            p.requires_grad_(False)
        attach_lora(policy.gpt, adapter, policy.shape, scaling=2.0)
        held = {False: 0.0, True: 0.0}
        for p in policy.parameters():
            held[p.requires_grad] += p.numel() * p.element_size()
        return {"base_shard": held[False], "trainable": 2 * held[True], "optimizer": 2 * held[True]}
    finally:
        stop_model_parallel()


@pytest.mark.slow
@pytest.mark.parametrize("tied", [False, True])
def test_megatron_rank_bytes_are_those_of_the_module_tree_a_rank_builds(tmp_path, tied):
    """Tensor parallel 2 over gloo: each rank's GPTModel (read from a tiny Llama folder) with PEFT's
    all-linear adapter on its fused parallel linears holds what the plan says, to the byte."""
    import torch
    from megatron_fixtures import dense_folder, run_ranks
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    path = dense_folder(tmp_path / "llama", "llama", tied=tied)
    peft = get_peft_model(
        AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
        LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"),
    )
    adapter = {n.replace(".default.", "."): p.detach() for n, p in peft.named_parameters() if p.requires_grad}
    cfg = sections(
        SMALL,
        [
            f"model.path={path}",
            "model.dtype=float32",
            "placement.gpus_per_node=0",
            "trainer.backend=megatron",
            "trainer.ranks=2",
            "trainer.megatron.tensor_parallel=2",
            "trainer.lora.rank=4",
            "trainer.lora.dropout=0",
        ],
    )
    for rank, measured in run_ranks(_held_bytes, 2, str(path), adapter).items():
        assert megatron_rank_bytes(cfg, rank) == measured, rank


def test_the_seed_headers_megatron_figures_are_the_plans():
    """The seed config's header compares Megatron's TP 4 x EP 2 with FSDP2 over the same 8 ranks
    from this command's output: a Megatron rank holds the NVFP4 base dequantized, over the GPU."""
    seed = CONFIGS / "aime_mistral_large3_nvfp4_ray.yaml"
    layout = ["trainer.megatron.tensor_parallel=4", "trainer.megatron.expert_parallel=2"]
    overrides = ["trainer.backend=megatron", "trainer.shard_ranks=null", "trainer.routing_replay=false", *layout]
    out = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "train", str(seed), "--dry-run", *overrides], capture_output=True, text=True
    )
    assert out.returncode == 2, out.stdout + out.stderr
    header = seed.read_text()
    assert " ".join(f"`--dry-run {' '.join(overrides)}`".split()) in " ".join(header.replace("# ", "").split())
    assert out.stderr.splitlines()[-1].endswith(
        "node 6 GPU 0 needs ~197.1 GB (base shard 174.7, activations 20.0, trainable 0.9), over placement.gpu_memory_gb=186"
    )
    assert "Megatron TP 4 x EP 2            197.1  base 174.7" in header
    fsdp2 = make_plan(sections(seed, ["trainer.shard_ranks=null"]))
    trainer = [device.total for device in fsdp2.devices if device.trainer_rank is not None]
    assert f"{max(trainer) / 1e9:.1f}" == "92.4" and "FSDP2 over all 8                 92.4" in header
