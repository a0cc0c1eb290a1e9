"""`rlvr rehearse`, the Ray half: the run's own placement group and actors on a simulated
cluster (`ray.cluster_utils.Cluster`, logical GPUs), each actor saying where Ray put it and, for
the engine, which executor vLLM's own ParallelConfig resolves to inside it.

On the seed config (8 nodes x 4 GPUs, 6 TP-4 engines, 8 trainer ranks) Ray's PACK does not keep
bundle order in node order (bundles 0, 13, 15 and 16 shared a node when this was written), so the
ranks' node order is the placement's doing, not luck's.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr.config import load_config
from rlvr.orchestration.rehearsal import byte_failures, place, placement_failures, rehearsed_ranks, summary_lines

SEED = Path(__file__).parent.parent / "configs" / "aime_mistral_large3_nvfp4_ray.yaml"
RLVR = Path(sys.executable).parent / "rlvr"


def _trainer(node_of_rank: list[int]) -> list[dict]:
    return [
        {"role": "trainer", "rank": rank, "node": node, "bundle": rank, "gpus": [rank % 4], "executor_backend": None}
        for rank, node in enumerate(node_of_rank)
    ]


def test_a_replica_across_nodes_and_an_engine_whose_workers_leave_its_actor_fail_the_placement():
    cfg = load_config(
        SEED,
        [
            "placement.nodes=3",
            "trainer.ranks=4",
            "trainer.shard_ranks=2",
            "engine.replicas=1",
            "placement.engine_gpus=4",
        ],
    )
    engine = {"role": "engine", "rank": 0, "node": 2, "bundle": 4, "gpus": [0, 1, 2, 3], "executor_backend": "mp"}
    assert placement_failures(cfg, _trainer([0, 0, 0, 0]) + [engine]) == []
    straddling = _trainer([0, 1, 1, 1])
    assert placement_failures(cfg, straddling + [engine]) == ["HSDP replica of ranks 0-1 spans nodes [0, 1]"]
    assert (
        placement_failures(cfg, _trainer([1, 0, 0, 0]) + [engine])[0]
        == "trainer ranks are not ordered by node: nodes [1, 0, 0, 0]"
    )
    ray_executor = {**engine, "executor_backend": "ray"}
    assert placement_failures(cfg, _trainer([0, 0, 0, 0]) + [ray_executor]) == [
        "engine 0: vLLM resolves executor 'ray', whose workers leave the engine's actor"
    ]
    two_of_four = {**engine, "gpus": [0, 1]}
    assert placement_failures(cfg, _trainer([0, 0, 0, 0]) + [two_of_four]) == [
        "engine 0: its actor holds GPUs [0, 1] of node 2, not its TP group of 4"
    ]


def test_measured_bytes_pass_within_two_percent_of_the_plan():
    rows = [
        {
            "rank": 0,
            "planned": {"base_shard": 100e9, "trainable": 1e9},
            "measured": {"base_shard": 101.9e9, "trainable": 1e9},
        }
    ]
    assert byte_failures(rows) == []
    rows[0]["measured"]["base_shard"] = 102.1e9
    assert byte_failures(rows) == ["rank 0: base_shard measured 102.100 GB, planned 100.000 GB (beyond 2%)"]
    del rows[0]["measured"]["trainable"]
    assert byte_failures(rows)[1] == "rank 0: trainable was not measured"
    assert rehearsed_ranks(28) == [0, 14, 27] and rehearsed_ranks(1) == [0]


@pytest.mark.slow
def test_a_megatron_run_is_rehearsed_on_megatrons_module_tree():
    """trainer.backend megatron, the seed's dense Mistral Large 2 (123B, 56 ranks) at tensor
    parallel 8: each rehearsed rank's part of megatron-core's model, built on meta, holds what
    megatron_rank_bytes plans (its NVFP4 base read dequantized, as the Megatron rank reads it)."""
    from rlvr.orchestration.rehearsal import compare_bytes
    from rlvr.planning.rank_memory import megatron_rank_bytes
    from rlvr.planning.sections import PlanSections

    dense = SEED.with_name("aime_mistral_large2_dense_nvfp4_ray.yaml")
    cfg = load_config(dense, ["trainer.backend=megatron", "trainer.megatron.tensor_parallel=8"])
    rows = compare_bytes(cfg)
    assert [row["rank"] for row in rows] == [0, 28, 55]
    assert all(row["planned"] == megatron_rank_bytes(PlanSections.of(cfg), row["rank"]) for row in rows)
    assert rows[0]["measured"]["base_shard"] > 8 * 123e9 / 56  # bf16 weights, not 4-bit ones
    assert byte_failures(rows) == []
    report = {"actors": [], "ranks": rows, "ok": True, "failures": []}
    assert summary_lines(report)[0].startswith("bytes of ranks 0, 28, 55 against the plan: largest gap 0.0")


@pytest.mark.slow
def test_the_seeds_mla_moe_model_is_rehearsed_on_megatrons_module_tree_split_by_expert_parallel():
    """The seed's Mistral Large 3 (MLA + MoE, 673B) with expert parallel 8: each rehearsed rank's
    part of megatron-core's MLA/MoE model (its 16 of the 128 routed experts per layer and their
    LoRA pairs, the rest whole, its NVFP4 base read dequantized) holds what megatron_rank_bytes
    plans. Tensor parallel 4
    x expert parallel 2 is a split the rank refuses for MLA/MoE: planned, and the record says why
    it was not measured."""
    from rlvr.orchestration.rehearsal import compare_bytes
    from rlvr.planning.rank_memory import megatron_rank_bytes
    from rlvr.planning.sections import PlanSections

    megatron = ["trainer.backend=megatron", "trainer.shard_ranks=null", "trainer.routing_replay=false"]
    cfg = load_config(SEED, [*megatron, "trainer.megatron.expert_parallel=8", "trainer.lora.target_experts=true"])
    rows = compare_bytes(cfg)
    assert [row["rank"] for row in rows] == [0, 4, 7]
    assert all(row["planned"] == megatron_rank_bytes(PlanSections.of(cfg), row["rank"]) for row in rows)
    assert rows[0]["measured"]["base_shard"] > 2 * 673e9 / 8  # bf16 weights, not 4-bit ones
    assert byte_failures(rows) == []

    cfg = load_config(SEED, [*megatron, "trainer.megatron.tensor_parallel=4", "trainer.megatron.expert_parallel=2"])
    rows = compare_bytes(cfg)
    assert all(
        row["planned"] == megatron_rank_bytes(PlanSections.of(cfg), row["rank"]) and row["measured"] is None
        for row in rows
    )
    assert byte_failures(rows)[0] == (
        "rank 0: bytes not measured: trainer.megatron.tensor_parallel=4: an MLA/MoE model is split by "
        "expert_parallel alone; tensor_parallel must be 1"
    )
    report = {"actors": [], "ranks": rows, "ok": False, "failures": byte_failures(rows)}
    assert summary_lines(report)[0] == "bytes of ranks 0, 4, 7: planned, not measured"


SMALL = [
    "placement.nodes=2",
    "placement.gpus_per_node=2",
    "placement.engine_gpus=1",
    "engine.tensor_parallel_size=1",
    "engine.replicas=1",
    "engine.expert_parallel=false",
    "trainer.ranks=3",
    "trainer.shard_ranks=null",
]


@pytest.mark.slow
def test_a_tp1_engine_gets_one_gpu_and_vllms_single_process_executor():
    actors = place(load_config(SEED, SMALL))
    engine, trainer = actors[-1], actors[:-1]
    assert engine["role"] == "engine" and len(engine["gpus"]) == 1 and engine["executor_backend"] == "uni"
    assert {(a["node"], a["gpus"][0]) for a in actors} == {(0, 0), (0, 1), (1, 0), (1, 1)}  # each GPU once
    assert [a["node"] for a in trainer] == [0, 1, 1]

    colocated = place(load_config(SEED, [*SMALL, "placement.colocate=true"]))
    engine = colocated[-1]
    sharing = next(a for a in colocated[:-1] if a["bundle"] == engine["bundle"])
    assert engine["executor_backend"] == "uni" and engine["gpus"] == sharing["gpus"]


def test_a_colocated_engine_wider_than_one_gpu_is_refused_in_one_line():
    with pytest.raises(
        ValueError,
        match=r"^engine.tensor_parallel_size=2: the engine's slot has 1 GPU\(s\) "
        r"\(colocated, it shares a trainer rank's GPU: use placement.colocate: false",
    ):
        place(
            load_config(
                SEED,
                [
                    *SMALL,
                    "placement.nodes=1",
                    "placement.colocate=true",
                    "engine.tensor_parallel_size=2",
                    "trainer.ranks=2",
                ],
            )
        )


def test_rehearse_stops_with_one_line_and_exit_2_on_a_bad_config_or_plan(tmp_path):
    bad_key = subprocess.run([str(RLVR), "rehearse", str(SEED), "placement.gpus=4"], capture_output=True, text=True)
    assert bad_key.returncode == 2 and len(bad_key.stderr.strip().splitlines()) == 1, bad_key.stderr
    assert "placement.gpus" in bad_key.stderr and not bad_key.stdout
    unplaceable = subprocess.run(
        [str(RLVR), "rehearse", str(SEED), "placement.engine_gpus=2"], capture_output=True, text=True
    )
    assert unplaceable.returncode == 2, unplaceable.stdout + unplaceable.stderr
    assert unplaceable.stderr.strip().splitlines() == [
        f"plan error: {SEED}: placement.engine_gpus=2 must equal engine.replicas x engine.tensor_parallel_size = 6 x 4 "
        "(split placement: each engine's GPUs are its TP group)"
    ]


@pytest.mark.slow
def test_rehearse_places_the_seed_run_and_its_shards_as_planned(tmp_path):
    out = tmp_path / "rehearsal.json"
    done = subprocess.run([str(RLVR), "rehearse", str(SEED), "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    cfg = load_config(SEED)
    assert report["ok"] and report["nodes"] == cfg.placement.nodes and report["failures"] == []
    assert len(report["actors"]) == cfg.trainer.ranks + cfg.engine.replicas
    assert {"role", "rank", "node", "bundle", "gpus", "executor_backend"} <= set(report["actors"][0])
    assert [row["rank"] for row in report["ranks"]] == rehearsed_ranks(cfg.trainer.ranks)
    assert all(set(row["measured"]) >= set(row["planned"]) for row in report["ranks"])
    assert done.stdout.strip().splitlines()[-1] == "ok"
    # the placement, from the report: each TP engine in one actor, the ranks node by node
    ranks, per_node, tp, replicas = (
        cfg.trainer.ranks,
        cfg.placement.gpus_per_node,
        cfg.engine.tensor_parallel_size,
        cfg.engine.replicas,
    )
    assert tp > 1 and replicas > 1 and not cfg.placement.colocate
    actors = report["actors"]
    trainer = [a for a in actors if a["role"] == "trainer"]
    engines = [a for a in actors if a["role"] == "engine"]
    # every engine a whole node's GPUs in one actor (nodes numbered by their lowest bundle: the engines' first)
    assert [(a["rank"], a["node"], a["gpus"]) for a in engines] == [(r, r, list(range(tp))) for r in range(replicas)]
    assert all(a["cuda_visible_devices"] == ",".join(map(str, range(tp))) for a in engines)
    assert {a["executor_backend"] for a in engines} == {"mp"}  # vLLM left alone resolves "ray" in a placement group
    # The ranks fill the nodes after the engines', node after node, GPU after GPU.
    slots = [(node, gpu) for node in range(cfg.placement.nodes) for gpu in range(per_node)][tp * replicas :][:ranks]
    assert [(a["rank"], a["node"], a["gpus"]) for a in trainer] == [(r, n, [g]) for r, (n, g) in enumerate(slots)]
    assert all(a["cuda_visible_devices"] == str(a["gpus"][0]) for a in trainer)
    assert len({a["rendezvous"] for a in trainer}) == 1
    assert sorted(a["bundle"] for a in actors) == list(range(ranks + replicas))
    for shard_ranks in ["null", per_node, per_node // 2]:
        assert placement_failures(load_config(SEED, [f"trainer.shard_ranks={shard_ranks}"]), actors) == []
    assert (
        placement_failures(
            load_config(SEED, ["engine.replicas=7", "placement.engine_gpus=28", "trainer.ranks=4"]), actors
        )[0]
        == "6 engine actor(s) placed for engine.replicas=7"
    )
    doubled = engines[:-1] + [{**engines[-1], "node": engines[0]["node"]}]  # the last engine on the first's GPUs
    assert placement_failures(cfg, trainer + doubled) == ["two actors hold the same GPU"]
    lines = summary_lines({"ok": True, "actors": actors, "ranks": [], "failures": []})
    assert lines[-1 - replicas : -1] == [
        f"engine {r}: node {r}, GPUs {','.join(map(str, range(tp)))}, executor mp" for r in range(replicas)
    ]
    assert (
        lines[0]
        == f"trainer ranks 0-{per_node - 1}: node {replicas}, GPUs 0,1,2,3, rendezvous {trainer[0]['rendezvous']}"
    )
    assert lines[-1] == "ok"
