"""The rehearsal's sharding half: the trainer's policy built from `model.estimate` on the meta
device and sharded by FSDP2 under the fake process group holds, rank by rank, what the plan says
(the rehearsal refuses beyond 2%; these small shapes must agree exactly)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlvr.config import load_config
from rlvr.planning.rank_memory import rank_bytes
from rlvr.planning.sections import PlanSections
from rlvr.training.sharding_rehearsal import measure_ranks

SEED = Path(__file__).parent.parent / "configs" / "aime_mistral_large3_nvfp4_ray.yaml"
# the seed's architecture at a size that builds in a second: MLA, 8 routed experts, a dense first layer
SMALL_MOE = [
    "model.path=/nonexistent",
    "model.estimate.hidden_size=256",
    "model.estimate.num_layers=3",
    "model.estimate.num_heads=4",
    "model.estimate.num_kv_heads=4",
    "model.estimate.intermediate_size=512",
    "model.estimate.vocab_size=1024",
    "model.estimate.num_experts=8",
    "model.estimate.num_experts_per_tok=2",
    "model.estimate.moe_intermediate_size=128",
    "model.estimate.first_dense_layers=1",
    "model.estimate.kv_lora_rank=64",
    "model.estimate.q_lora_rank=96",
    "model.estimate.qk_nope_head_dim=32",
    "model.estimate.qk_rope_head_dim=16",
    "model.estimate.v_head_dim=32",
    "trainer.lora.rank=4",
]


@pytest.mark.parametrize(
    "layout",
    [
        ["trainer.ranks=5", "trainer.shard_ranks=null"],
        ["trainer.ranks=6", "trainer.shard_ranks=2"],
        ["trainer.ranks=3", "trainer.shard_ranks=null", "trainer.lora=null", "model.estimate.weight_format=float"],
    ],
    ids=["fsdp-5", "hsdp-3x2", "full-ft-3"],
)
def test_measured_rank_bytes_are_the_plans(layout):
    from rlvr.planning.lora import with_engine_lora_targets

    # LoRA as the run resolves it (the plan counts it so): MLA's all-linear without kv_b_proj
    cfg = load_config(SEED, [*SMALL_MOE, *layout])
    cfg = cfg.model_copy(update={"trainer": with_engine_lora_targets(cfg.model, cfg.trainer)})
    ranks = sorted({0, cfg.trainer.ranks // 2, cfg.trainer.ranks - 1})
    for rank, measured in zip(ranks, measure_ranks(cfg, ranks)):
        planned = rank_bytes(PlanSections.of(cfg), rank)
        assert measured == {name: int(value) for name, value in planned.items()}, rank
