"""The placement plan and memory estimate of `rlvr train CFG --dry-run`: the shipped scale
configs pass with the right world sizes, the figures match hand computations and real
checkpoints, and plans that cannot run stop with one line."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from rlvr.config import load_config
from rlvr.planning.architecture import GB, GiB, read_architecture
from rlvr.planning.plan import PlanError, make_plan
from rlvr.planning.rank_memory import rank_bytes
from rlvr.planning.sections import PlanSections

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SMALL = CONFIGS / "gsm8k_qwen2.5_0.5b_1gpu.yaml"
MEDIUM = CONFIGS / "math_7b_8gpu.yaml"
LARGE = CONFIGS / "aime_mistral_large2_dense_nvfp4_ray.yaml"


def sections(config: Path, overrides: list[str] | None = None) -> PlanSections:
    """A config's plan sections, as `rlvr train --dry-run` reads them."""
    return PlanSections.of(load_config(config, overrides or []))


def plan_of(config: Path, *overrides: str):
    return make_plan(sections(config, list(overrides)))


@pytest.mark.parametrize("config", [SMALL, MEDIUM, LARGE], ids=lambda p: p.stem)
def test_shipped_config_passes_dry_run(config):
    out = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "train", str(config), "--dry-run"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "GB per device" in out.stdout and "fits placement.gpu_memory_gb=" in out.stdout


def test_one_gpu_plan_colocates_engine_and_the_single_rank():
    plan = plan_of(SMALL)
    (device,) = plan.devices
    assert (plan.fsdp_world, plan.engine_tp, plan.gpus_used) == (1, 1, 1)
    assert (device.node, device.gpu, device.engine_rank, device.trainer_rank) == (0, 0, 0, 0)
    assert {"engine weights", "KV cache", "base shard", "activations"} <= set(device.memory)


def test_eight_gpu_plan_splits_tp4_engine_from_four_ranks():
    plan = plan_of(MEDIUM)
    assert (plan.fsdp_world, plan.engine_tp, plan.gpus_used) == (4, 4, 8)
    assert [(d.gpu, d.engine_rank, d.trainer_rank) for d in plan.devices] == [
        (0, 0, None),
        (1, 1, None),
        (2, 2, None),
        (3, 3, None),
        (4, None, 0),
        (5, None, 1),
        (6, None, 2),
        (7, None, 3),
    ]


def test_colocated_engine_shares_the_first_ranks_gpus():
    # local processes: on Ray a colocated engine shares one rank's bundle, so one GPU (TP 1)
    plan = plan_of(MEDIUM, "placement.colocate=true", "placement.backend=local", "trainer.ranks=8")
    assert [(d.gpu, d.engine_rank, d.trainer_rank) for d in plan.devices] == [
        (g, g if g < 4 else None, g) for g in range(8)
    ]
    shared, alone = plan.devices[0], plan.devices[4]
    assert shared.total == alone.total + sum(shared.memory[k] for k in ("engine weights", "KV cache", "LoRA slot"))


def test_eight_node_plan_puts_the_engine_on_node_0_and_56_ranks_on_nodes_1_to_7():
    plan = plan_of(LARGE)
    assert (plan.fsdp_world, plan.engine_tp, plan.gpus_used, plan.nodes) == (56, 8, 64, 8)
    engine = [d for d in plan.devices if d.engine_rank is not None]
    ranks = [d for d in plan.devices if d.trainer_rank is not None]
    assert {d.node for d in engine} == {0} and [d.engine_rank for d in engine] == list(range(8))
    assert {d.node for d in ranks} == set(range(1, 8)) and sorted(d.trainer_rank for d in ranks) == list(range(56))
    assert all(d.engine_rank is None or d.trainer_rank is None for d in plan.devices)


def test_qwen2_5_0_5b_weights_by_hand():
    arch = read_architecture(sections(SMALL))
    # per layer: q 896x896, k and v 896x128, o 896x896, gate/up/down 3x896x4864, two norms
    layer = 896 * 896 * 2 + 896 * 128 * 2 + 3 * 896 * 4864 + 2 * 896
    params = 24 * layer + 151936 * 896 + 896  # tied embedding, final norm
    assert params == arch.params == 494_005_120  # Qwen reports 494,032,768: the 24 x 1,152 q/k/v biases
    assert arch.weight_bytes(2) == 2 * params
    assert round(arch.weight_bytes(2) / GB, 2) == 0.99


def test_qwen2_5_7b_weights_match_the_published_sizes():
    arch = read_architecture(sections(MEDIUM))
    # Qwen reports 7.61B parameters; per layer 29,360,128 in attention and 203,685,888 in the MLP
    assert arch.packed_params == 28 * (29_360_128 + 203_685_888)  # every Linear of the 28 blocks
    assert round(arch.weight_bytes(2) / GB, 2) == 15.23  # "a 7B model is ~15 GB in bf16"
    plan = plan_of(MEDIUM)
    assert plan.devices[0].memory["engine weights"] == arch.weight_bytes(2) / 4  # TP 4 splits it


def test_nvfp4_bytes_and_per_device_figures_by_hand():
    cfg = sections(LARGE)
    arch = read_architecture(cfg)
    linear = 88 * (12288 * 12288 * 2 + 12288 * 1024 * 2 + 3 * 12288 * 28672)
    rest = 2 * 32768 * 12288 + 88 * 2 * 12288 + 12288  # embedding + lm_head, norms: bf16
    assert arch.weight_bytes(2) == linear * 4.5 / 8 + rest * 2
    plan = make_plan(cfg)
    engine = plan.devices[0].memory
    assert engine["engine weights"] == arch.weight_bytes(2) / 8
    assert engine["KV cache"] == 120 * GiB
    rank = plan.devices[8].memory
    # FSDP2 over 56 ranks: rank 0 holds ceil(rows / 56) rows of every tensor (dim 0 = out features)
    row = {rows: -(-rows // 56) for rows in (12288, 1024, 28672, 32768, 32)}
    nvfp4 = 9 / 16  # packed values + FP8 scales per weight
    block = (2 * row[12288] * 12288 + 2 * row[1024] * 12288 + 2 * row[28672] * 12288 + row[12288] * 28672) * nvfp4
    block += 2 * row[12288] * 2  # the two norms, bf16
    root = 2 * row[32768] * 12288 * 2 + row[12288] * 2
    assert rank["base shard"] == 88 * block + root
    # LoRA in float32: A [32, in] (one row on rank 0), B [out, 32]
    pairs = [
        (12288, 12288),
        (12288, 1024),
        (12288, 1024),
        (12288, 12288),
        (12288, 28672),
        (12288, 28672),
        (28672, 12288),
    ]
    lora = 88 * sum(row[32] * inputs + row[outputs] * 32 for inputs, outputs in pairs) * 4
    assert rank["trainable"] == rank["optimizer"] == 2 * lora  # value + gradient; AdamW's two moments
    lora_block = sum(32 * (inputs + outputs) for inputs, outputs in pairs) * 2  # gathered in bf16
    assert rank["gathered"] == 2 * (
        (12288 * 12288 * 2 + 12288 * 1024 * 2 + 3 * 12288 * 28672) * nvfp4 + 2 * 12288 * 2 + lora_block
    )
    # checkpointed: block inputs for every layer + one block's saved tensors
    tokens = 18432
    one_block = 2 * (6 * 12288 + 3 * 12288 + 3 * 1024 + 4 * 28672)
    assert rank["activations"] == tokens * 88 * 12288 * 2 + tokens * one_block
    # the LM head: 512 MB over a token's bf16 logits and two float32 copies = 1562 tokens at a time
    assert rank["logits"] == 1562 * 32768 * (2 + 8) <= 512e6


def test_config_json_wins_and_matches_the_real_model(tmp_path):
    from transformers import AutoModelForCausalLM

    from rlvr.models.tiny import build_tiny_model
    from rlvr.quant.checkpoint import quantize_checkpoint

    path = build_tiny_model(
        tmp_path / "llama", "llama", hidden_size=128, num_layers=2, intermediate_size=256, tie_word_embeddings=False
    )
    arch = read_architecture(sections(SMALL, [f"model.path={path}"]))  # config.json over model.estimate
    assert arch.source.endswith("config.json") and arch.hidden == 128 and not arch.nvfp4
    assert arch.params == AutoModelForCausalLM.from_pretrained(path).num_parameters()

    packed = quantize_checkpoint(path, tmp_path / "nvfp4")
    arch = read_architecture(sections(SMALL, [f"model.path={packed}"]))
    assert arch.nvfp4
    stored = _tensor_bytes(Path(packed) / "model.safetensors")
    assert abs(arch.weight_bytes(4) - stored) / stored < 0.01  # float32 rest; per-tensor global scales not counted


def _tensor_bytes(path: Path) -> int:
    from safetensors.torch import load_file

    return sum(t.numel() * t.element_size() for t in load_file(path).values())


def test_missing_architecture_prints_placement_without_memory():
    plan = plan_of(CONFIGS / "demo.yaml", "model.path=/nonexistent")
    assert plan.architecture is None and "no model.estimate" in plan.unknown
    assert [d.trainer_rank for d in plan.devices] == [None, 0, 1] and all(not d.memory for d in plan.devices)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["trainer.ranks=60"], "need 68 GPUs; nodes=8 x gpus_per_node=8 has 64"),
        (
            ["placement.gpu_memory_gb=80"],
            "node 0 GPU 0 needs ~137.8 GB (KV cache 128.8, engine weights 8.8, LoRA slot 0.1)",
        ),
        (
            ["placement.gpu_memory_gb=60", "engine.kv_cache_gb=40", "trainer.ranks=2"],
            "node 1 GPU 0 needs ~91.5 GB (activations 48.3, base shard 35.1, trainable 2.2), over placement.gpu_memory_gb=60",
        ),
        (
            ["placement.engine_gpus=4"],
            "placement.engine_gpus=4 must equal engine.replicas x engine.tensor_parallel_size = 1 x 8",
        ),
        (
            ["engine.replicas=2"],
            "placement.engine_gpus=8 must equal engine.replicas x engine.tensor_parallel_size = 2 x 8",
        ),
        (
            ["engine.replicas=2", "placement.engine_gpus=16", "trainer.ranks=49"],
            "placement: 49 trainer ranks + 16 engine GPUs need 65 GPUs; nodes=8 x gpus_per_node=8 has 64",
        ),
        (
            ["engine.replicas=2", "placement.backend=local", "placement.nodes=1"],
            "engine.replicas=2: vLLM replicas run as Ray actors",
        ),
        (["engine.tensor_parallel_size=16", "placement.engine_gpus=16"], "a TP group stays on one node"),
        # on Ray a colocated engine shares one trainer rank's bundle: one GPU, one rank each
        (["placement.colocate=true"], "engine.tensor_parallel_size=8: the engine's slot has 1 GPU(s) (colocated"),
        (
            ["placement.colocate=true", "engine.tensor_parallel_size=1", "engine.replicas=3", "trainer.ranks=2"],
            "engine.replicas=3: colocated, each engine shares a trainer rank's bundle, and trainer.ranks=2",
        ),
        (["placement.backend=local"], "the local backend runs on one machine"),
        (["trainer.micro_batch_tokens=8192"], "trainer.micro_batch_tokens=8192 < the longest sequence"),
        (
            ["engine.max_model_len=4096"],
            "a prompt of data.max_prompt_tokens=2048 has 2048 prompt tokens: with "
            "rollout.sampling.max_tokens=16384 that is 18432, more than engine.max_model_len=4096",
        ),
    ],
)
def test_plans_that_cannot_run_are_refused(overrides, message):
    with pytest.raises(PlanError, match=re.escape(message)):
        plan_of(LARGE, *overrides)


def test_tp_must_divide_the_heads():
    with pytest.raises(PlanError, match="tensor_parallel_size=3 does not divide the model's 14 attention heads"):
        plan_of(SMALL, "engine.tensor_parallel_size=3", "placement.gpus_per_node=4")


def test_cli_reports_a_plan_error_in_one_line_with_exit_2():
    out = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "train", str(LARGE), "--dry-run", "trainer.ranks=60"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    (line,) = [text for text in out.stderr.splitlines() if "plan error" in text]
    assert line.startswith(f"plan error: {LARGE}: placement: 60 trainer ranks + 8 engine GPUs need 68 GPUs")


SEED = CONFIGS / "aime_mistral_large3_nvfp4_ray.yaml"


def test_seed_moe_config_plans_experts_mla_and_fits_8_nodes_of_4_gb200():
    out = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "train", str(SEED), "--dry-run"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "673.42B parameters" in out.stdout and "39.95B active per token" in out.stdout
    assert "MLA, KV latent 512 + RoPE key 64" in out.stdout and "fits placement.gpu_memory_gb=186" in out.stdout
    assert "32 whole experts per GPU" in out.stdout and "over 4 ranks, 32 of 128 per rank" in out.stdout
    assert "fits placement.host_memory_gb=960" in out.stdout and "balance: split" in out.stdout
    plan = plan_of(SEED)
    assert (plan.fsdp_world, plan.engine_tp, plan.engine_replicas, plan.gpus_used, plan.nodes, plan.gpus_per_node) == (
        8,
        4,
        6,
        32,
        8,
        4,
    )
    # one engine per node on nodes 0-5, the trainer's two HSDP replicas on nodes 6 and 7
    assert [(d.node, d.gpu, d.engine_replica, d.engine_rank) for d in plan.devices if d.engine_rank is not None] == [
        (node, gpu, node, gpu) for node in range(6) for gpu in range(4)
    ]
    assert [(d.node, d.gpu) for d in plan.devices if d.trainer_rank is not None] == [
        (n, g) for n in (6, 7) for g in range(4)
    ]
    assert "engines 0-5, TP rank 0-3" in out.stdout and "generate 912 s (6 engines of TP 4" in out.stdout


def test_the_seed_layout_is_faster_than_one_engine_more_or_one_fewer():
    """The layout the seed config's header argues for: 6 engines + 8 ranks against its neighbours."""
    from rlvr.planning.step_time import step_time

    def step(replicas: int, ranks: int) -> float:
        cfg = sections(
            SEED, [f"engine.replicas={replicas}", f"trainer.ranks={ranks}", f"placement.engine_gpus={4 * replicas}"]
        )
        t = step_time(cfg, read_architecture(cfg))
        return max(t.generate, t.train + t.sync)  # split, generating one step ahead

    assert step(6, 8) < min(step(5, 12), step(7, 4))
    assert step(1, 28) / step(6, 8) > 5  # the one-engine layout the seed config had
    out = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "train", str(SEED), "--dry-run"], capture_output=True, text=True
    )
    (balance,) = [line for line in out.stdout.splitlines() if line.startswith("balance:")]
    assert balance.endswith(
        f"with engine.replicas=7 and trainer.ranks=4 (placement.engine_gpus=28) a step would take ~{step(7, 4):,.0f} s"
    )


@pytest.mark.parametrize("shard_ranks, base_shard_gb, experts_per_rank", [("4", 95.39, 32), ("null", 47.70, 16)])
def test_seed_base_shard_follows_trainer_shard_ranks(shard_ranks, base_shard_gb, experts_per_rank):
    """HSDP shards each parameter over shard_ranks ranks, each replica a whole copy: 4 ranks hold
    a quarter of the 382 GB base; FSDP over all 8 an eighth (16 of 128 experts)."""
    out = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "train", str(SEED), "--dry-run", f"trainer.shard_ranks={shard_ranks}"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{experts_per_rank} of 128 per rank" in out.stdout
    (row,) = [line for line in out.stdout.splitlines() if line.startswith("base shard")]
    assert float(row.split()[-1]) == base_shard_gb
    assert (
        round(rank_bytes(sections(SEED, [f"trainer.shard_ranks={shard_ranks}"]), 0)["base_shard"] / GB, 2)
        == base_shard_gb
    )


def test_host_memory_too_small_exits_2_with_one_line():
    out = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "train", str(SEED), "--dry-run", "placement.host_memory_gb=400"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    (line,) = [text for text in out.stderr.splitlines() if "plan error" in text]
    # nodes 6-7: 4 ranks x (95.39 GB shard + one 23.1 GB block)
    assert line == (
        f"plan error: {SEED}: node 6 needs ~474.0 GB of host memory while loading (4 trainer ranks), "
        "over placement.host_memory_gb=400"
    )


def test_moe_estimate_counts_as_transformers_builds_the_model():
    """The seed config's numbers, built by transformers' DeepseekV3 on the meta device."""
    from rlvr.models.estimate import estimate_config
    from rlvr.models.params import parameter_counts

    config = estimate_config(sections(SEED).model.estimate)
    assert type(config).__name__ == "DeepseekV3Config"
    counts = parameter_counts(config)
    arch = read_architecture(sections(SEED))
    assert (arch.params, arch.active_params) == (counts.total, counts.active)
    assert arch.routed_params == counts.routed_experts
    # MLA's cache: the latent and the RoPE key, per layer, on every GPU of the TP group
    assert arch.kv_bytes_per_token(tp=4, dtype_bytes=2) == 61 * (512 + 64) * 2


@pytest.mark.parametrize("arch_name", ["deepseek_v3", "qwen3_moe", "mixtral"])
def test_moe_config_json_counts_match_transformers(tmp_path, arch_name):
    from transformers import AutoModelForCausalLM

    from rlvr.models.params import count_parameters
    from rlvr.models.tiny import build_tiny_model
    from rlvr.quant.checkpoint import quantize_checkpoint

    path = build_tiny_model(tmp_path / arch_name, arch_name)
    arch = read_architecture(sections(SMALL, [f"model.path={path}"]))
    counts = count_parameters(AutoModelForCausalLM.from_pretrained(path))
    assert arch.routed_params == counts.routed_experts
    assert arch.params - arch.active_params == counts.total - counts.active
    assert abs(arch.params - counts.total) / counts.total < 1e-3  # Qwen3's per-head q/k norms are left out

    packed = quantize_checkpoint(path, tmp_path / "nvfp4")
    arch = read_architecture(sections(SMALL, [f"model.path={packed}"]))
    stored = sum(_tensor_bytes(f) for f in Path(packed).glob("*.safetensors"))
    assert arch.nvfp4 and abs(arch.weight_bytes(4) - stored) / stored < 0.02  # per-tensor global scales not counted


def _measured_rank_bytes(model, rank: int, shards: int, dtype_bytes: int) -> dict[str, float]:
    """A rank's bytes on the real module tree by FSDP2's rule (dim 0 split as torch.chunk splits it)."""
    from rlvr.planning.rank_memory import shard_rows
    from rlvr.training.policy import decoder_blocks

    local = {False: 0.0, True: 0.0}
    for param in {id(p): p for p in model.parameters()}.values():
        rows = shard_rows(param.shape[0], shards, rank % shards)
        local[param.requires_grad] += rows * param.nbytes / param.shape[0]
    gathered = max(
        sum(p.numel() * dtype_bytes if p.requires_grad else p.nbytes for p in block.parameters())
        for block in decoder_blocks(model)
    )
    return {
        "base_shard": local[False],
        "gathered": 2 * gathered,
        "trainable": 2 * local[True],
        "optimizer": 2 * local[True],
    }


@pytest.mark.parametrize(
    "arch_name, quantized, lora",
    [
        ("deepseek_v3", True, ["lora.target_modules=all-linear"]),
        (
            "deepseek_v3",
            True,
            ["lora.target_modules=[q_b_proj,kv_a_proj_with_mqa,down_proj]", "lora.target_experts=true"],
        ),
        ("llama", False, ["lora.target_modules=[q_proj,v_proj,up_proj]"]),
        ("llama", False, []),
    ],
    ids=["moe-nvfp4-all-linear", "moe-nvfp4-experts", "dense-lora", "dense-full"],
)
def test_rank_bytes_match_the_real_module_tree(tmp_path, arch_name, quantized, lora):
    """The plan's per-rank bytes against the module tree the trainer builds (the real loader, peft's
    LoRA), at world sizes where trailing ranks get short or empty chunks (8 experts over 5 ranks:
    2, 2, 2, 2, 0; LoRA A's 4 rows over 3 ranks: 2, 2, 0)."""
    import torch

    from rlvr.models.tiny import build_tiny_model
    from rlvr.planning.lora import with_engine_lora_targets
    from rlvr.quant.checkpoint import quantize_checkpoint
    from rlvr.quant.skeleton import Skeleton
    from rlvr.training.policy import apply_lora

    path = build_tiny_model(
        tmp_path / arch_name, arch_name, hidden_size=64, num_layers=3, intermediate_size=128, tie_word_embeddings=False
    )
    if quantized:
        path = quantize_checkpoint(path, tmp_path / "nvfp4")
    lora_keys = [f"trainer.{item}" for item in ["lora.rank=4", "lora.dropout=0", *lora]] if lora else []
    for ranks, shard_ranks in [(5, "null"), (3, "null"), (6, "2"), (1, "null")]:
        cfg = sections(
            SMALL,
            [
                f"model.path={path}",
                "model.dtype=bfloat16",
                f"trainer.ranks={ranks}",
                f"trainer.shard_ranks={shard_ranks}",
                "trainer.lora=null" if not lora else "trainer.lora.rank=4",
                *lora_keys,
            ],
        )
        model = Skeleton.from_checkpoint(path, torch.bfloat16).model  # on meta: shapes and dtypes only
        # as the run resolves them: MLA's all-linear drops kv_b_proj
        cfg = replace(cfg, trainer=with_engine_lora_targets(cfg.model, cfg.trainer))
        if cfg.trainer.lora:
            model = apply_lora(model, **cfg.trainer.lora.model_dump())
        shards = cfg.trainer.shard_ranks or ranks
        for rank in range(ranks):
            measured = _measured_rank_bytes(model, rank, shards, dtype_bytes=2)
            assert rank_bytes(cfg, rank) == measured, (ranks, shard_ranks, rank)


def test_gpu_kinds_in_the_config_are_those_of_the_table():
    from typing import get_args

    from rlvr.config import PlacementConfig
    from rlvr.planning.accelerators import ACCELERATORS

    assert set(get_args(get_args(PlacementConfig.model_fields["gpu"].annotation)[0])) == set(ACCELERATORS)


def test_train_and_sync_time_by_hand():
    """Qwen2.5-7B, LoRA, 4 ranks on H100s, one update per step (pi_old is the policy itself):
    forward, recomputation and an input-gradient backward per token, causal attention, at 989
    TFLOP/s per GPU; with two mini-batches pi_old's forward and the one after the updates too."""
    from rlvr.planning.step_time import step_time

    cfg = sections(MEDIUM, ["placement.gpu=h100"])
    arch = read_architecture(cfg)
    sequences, length = 128 * 8, 1536 + 4096
    multiplied = arch.active_params - 152064 * 3584  # the input embedding is a lookup
    linear = 2 * multiplied * sequences * length * 3
    attention = 2 * 28 * (128 + 128) * length**2 / 2 * 28 * sequences * (1 + 1 + 2)
    t = step_time(cfg, arch)
    assert t.train_compute == pytest.approx((linear + attention) / (4 * 1979e12 / 2), rel=1e-12)
    two = step_time(sections(MEDIUM, ["placement.gpu=h100", "trainer.mini_batches=2"]), arch)
    assert two.train_compute == pytest.approx(
        t.train_compute
        + (2 * multiplied * sequences * length * 2 + 2 * 28 * 256 * length**2 / 2 * 28 * sequences * 2)
        / (4 * 1979e12 / 2),
        rel=1e-12,
    )
    # the adapter in float32 over one 400 Gb/s NIC
    assert t.sync == pytest.approx(arch.adapter_params(cfg.trainer.lora) * 4 / 50e9, rel=1e-12)
    assert t.generate > 0 and t.waves == -(-sequences // t.decoded_at_once)


CPU = [
    "placement.gpus_per_node=0",
    "model.dtype=float32",
    "trainer.micro_batch_tokens=4096",
    "trainer.gradient_checkpointing=false",
]


def test_a_cpu_rank_counts_its_logits_chunk_and_its_process():
    """On a CPU machine (the 0.5B of SMALL in float32) a rank's logits are read 280 scored tokens
    at a time (512 MB over 151,936 x (4 + 8) bytes a token), whatever the micro-batch; the
    budget sets the chunk. Its process counts too: on a CPU that is the rank's memory."""
    from rlvr.planning.rank_memory import CPU_RANK_PROCESS_BYTES

    def rank(*overrides):
        (memory,) = [d.memory for d in plan_of(SMALL, *CPU, *overrides).devices if d.trainer_rank is not None]
        return memory

    assert rank()["logits"] == 280 * 151936 * 12
    assert rank("trainer.logits_chunk_mb=64")["logits"] == 35 * 151936 * 12
    assert rank("model.dtype=bfloat16")["logits"] == 336 * 151936 * 10
    assert rank()["rank process"] == CPU_RANK_PROCESS_BYTES
    assert "rank process" not in plan_of(SMALL).devices[0].memory  # a GPU's memory holds no process


def test_a_cpu_run_that_would_not_fit_this_machine_is_refused_in_one_line():
    plan = plan_of(SMALL, *CPU)
    need = sum(d.total for d in plan.devices)
    too_small = f"placement.host_memory_gb={int(need / GB) - 1}"
    out = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "train", str(SMALL), "--dry-run", *CPU, too_small],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    (line,) = [text for text in out.stderr.splitlines() if "plan error" in text]
    assert re.fullmatch(
        rf"plan error: {re.escape(str(SMALL))}: the run's processes on this machine need ~{need / GB:.1f} GB "
        rf"\(activations [\d.]+, KV cache [\d.]+, [a-z ]+ [\d.]+\), over {too_small.replace('.', '[.]')}",
        line,
    )
    fits = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlvr.cli",
            "train",
            str(SMALL),
            "--dry-run",
            *CPU,
            f"placement.host_memory_gb={int(need / GB) + 1}",
        ],
        capture_output=True,
        text=True,
    )
    assert fits.returncode == 0 and f"All processes {need / GB:.1f} GB: fits placement.host_memory_gb" in fits.stdout


def _rates(threads: int):
    """Rates a test gives the plan instead of measuring: each side's proportional to its threads."""
    from rlvr.hardware import CpuRates

    return CpuRates(threads, 50e9 * threads, 250e9 * threads, 5e9 * threads, 2e9)


def test_cpu_step_time_by_hand(monkeypatch):
    """The 0.5B recipe on an 8-core CPU, 2 ranks and a 3-thread engine: one pool of cores, so the
    ranks run at the peak measured on their 8 threads together (not 2 x), the engine at its 3
    threads' rates on dequantized bf16 weights; gloo traffic adds to the compute; the sync merges
    the adapter into every adapted weight."""
    from rlvr.planning.step_time import step_time

    monkeypatch.setattr("rlvr.planning.step_time.allowed_cores", lambda: list(range(8)))
    asked = []
    cpu = sections(
        SMALL, ["placement.gpus_per_node=0", "placement.gpu=null", "trainer.ranks=2", "engine.num_threads=3"]
    )
    arch = read_architecture(cpu)
    t = step_time(cpu, arch, lambda threads: asked.append(threads) or _rates(threads))
    assert sorted(asked) == [3, 8] and (t.engine_threads, t.trainer_threads) == (3, 8)
    n = 494_005_120  # tied: the embedding is the LM head
    kv = 2 * 24 * 2 * 64 * 2  # keys and values, 2 KV heads of 64, bf16
    at_once = min(512, 6 * GiB // (kv * 1536), 256)  # vLLM's CPU default max_num_seqs: 256
    assert (t.decoded_at_once, t.waves) == (256, 2)
    memory, peak = 5e9 * 3, 250e9 * 3
    step = max((2 * n + at_once * 1024 * kv) / memory, (2 * n * at_once + 4 * 14 * 64 * 24 * 1024 * at_once) / peak)
    assert t.generate == pytest.approx(2 * n * 64 * 512 / peak + 2 * 1024 * step, rel=1e-12)
    gpu = step_time(sections(SMALL, ["trainer.ranks=2", "placement.gpus_per_node=2", "placement.gpu=h100"]), arch)
    assert t.train_compute == pytest.approx(gpu.train_compute * 2 * 989.5e12 / (250e9 * 8), rel=1e-12)
    # both ranks' FSDP2 traffic through one loopback instead of each over its own NVLink
    assert t.train_communication == pytest.approx(2 * gpu.train_communication * 450e9 / 2e9, rel=1e-12)
    assert t.train == t.train_compute + t.train_communication
    adapted = 24 * (896 * 896 * 2 + 896 * 128 * 2 + 3 * 896 * 4864)
    merge = max(adapted * (4 + 3 * 2) / memory, 2 * 32 * adapted / peak)
    assert t.sync == pytest.approx(arch.adapter_params(cpu.trainer.lora) * 4 / 2e9 + merge, rel=1e-12)
    assert t.sync_load == pytest.approx(merge, rel=1e-12)


def test_cpu_plan_is_timed_only_with_rates_and_says_it_is_the_bound():
    import io

    from rich.console import Console

    from rlvr.planning.plan_report import print_plan

    cfg = sections(SMALL, ["placement.gpus_per_node=0", "placement.gpu=null"])
    assert make_plan(cfg).step is None  # nothing measured: the memory check of `rlvr serve` stays instant
    plan = make_plan(cfg, cpu_rates=_rates)
    assert plan.step.generate > 0 and plan.step.train > 0 and plan.step.sync > 0
    out = io.StringIO()
    print_plan(plan, cfg, Console(file=out, width=400))
    (line,) = [line for line in out.getvalue().splitlines() if line.startswith("time per step")]
    assert "at this CPU's measured peaks" in line and "the bound" in line
    assert f"generate {plan.step.generate:.2f} s" in line and f"sync {plan.step.sync:.2f} s" in line
    assert "balance: the engine and the ranks share the cores" in out.getvalue()
    half = make_plan(
        sections(SMALL, ["placement.gpus_per_node=0", "placement.gpu=null", "model.dtype=float16"]), cpu_rates=_rates
    )
    assert half.step is None and any("only float32 and bfloat16" in note for note in half.notes)


def test_cpu_split_cores_time_each_side_on_its_own_and_overlap(monkeypatch):
    """placement.engine_cpus=2 of 8 cores, generating one step ahead: the engine is timed on its 2
    cores, the 2 ranks on the 6 others, and a step takes the longer side, not the sum."""
    import io

    from rich.console import Console

    from rlvr.planning.plan_report import print_plan

    monkeypatch.setattr("rlvr.planning.step_time.allowed_cores", lambda: list(range(8)))
    monkeypatch.setattr("rlvr.planning.plan.allowed_cores", lambda: list(range(8)))
    cfg = sections(
        SMALL,
        [
            "placement.gpus_per_node=0",
            "placement.gpu=null",
            "placement.colocate=false",
            "placement.engine_gpus=0",
            "placement.engine_cpus=2",
            "trainer.ranks=2",
            "rollout.max_staleness=1",
        ],
    )
    asked = []
    plan = make_plan(cfg, cpu_rates=lambda threads: asked.append(threads) or _rates(threads))
    t = plan.step
    assert sorted(asked) == [2, 6] and (t.engine_threads, t.trainer_threads) == (2, 6)
    out = io.StringIO()
    print_plan(plan, cfg, Console(file=out, width=400))
    (balance,) = [line for line in out.getvalue().splitlines() if line.startswith("balance:")]
    assert balance.startswith(
        f"balance: split cores (placement.engine_cpus), generating one step ahead: a step takes "
        f"~{max(t.generate, t.train + t.sync):.2f} s"
    )
