"""The plan's seconds per phase (`rlvr train CFG --dry-run` on CPU) against what runs measured.

    python benchmarks/plan_vs_run.py runs/demo runs/machine_speed/auto --out runs/plan_vs_run.json

For each RUN_DIR (its config.yaml and metrics.jsonl), on this machine, which should be the one
that ran it:
- measured: the mean of time/generate, time/train and time/sync over steps 2..N (the first
  warms up: vLLM's first batches, the ranks' first allocations). time/sync holds the sync
  probe's two forwards on the steps that ran it (the first push, engine.sync_check_every);
  they are counted apart where some steps ran without it.
- predicted: rlvr.planning.step_time, the formulas `--dry-run` prints, at the rates
  rlvr.hardware.cpu_rates measured (cached) on the threads the run computed with, but at each
  step's own lengths rather than the config's longest step: its prompts (replayed from the
  sampler as the run drew them, benchmarks/_flops.py) at their mean length, its completions
  at their mean for train and at the step's longest for generate (the engine decodes until its
  last sample ends).
- measured / predicted per phase. The formula trains every sample's prompt; with
  trainer.share_prompts the ranks ran a group's prompt once: `formula_tokens_over_trained`
  says by how much the formula over-counts the run's tokens.
- what the peak (a large square matmul) does not say about decoding: the FLOP/s of one matmul
  at a decode step's MLP shape (the sequences decoded at once x hidden, times hidden x MLP
  width) in the run's dtype on the engine's threads, and its share of the peak.
- where vLLM serves the adapter merged (the CPU default), the merge alone: the code the sync
  runs (rlvr.engines.lora_merge.merged_weights) on the run's served base, with an adapter of
  its rank on every weight it adapts, on the engine's threads (the best of 2), against the
  formula's merge term; the rest of a sync is the adapter's trip from rank 0, vLLM's reload
  of the merged weights and, on the steps that ran it, the probe.
Run it alone (flock /tmp/rlvr-heavy.lock): it measures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _flops import step_shapes  # noqa: E402
from _ledger import append_line, provenance, write_result  # noqa: E402

PHASES = ("generate", "train", "sync")


def shaped(cfg, prompt: int, response: int):
    """`cfg` with its longest step as long as `prompt` + `response` tokens."""
    data = cfg.data.model_copy(update={"max_prompt_tokens": prompt})
    sampling = cfg.rollout.sampling.model_copy(update={"max_tokens": response})
    return cfg.model_copy(update={"data": data, "rollout": cfg.rollout.model_copy(update={"sampling": sampling})})


def merge_seconds(cfg, arch, threads: int) -> float:
    """The sync's merge alone, as the engine runs it, on `threads` threads: the best of 2."""
    import time

    import torch
    from safetensors.torch import load_file

    from rlvr.engines import served_folder
    from rlvr.engines.lora_merge import merged_weights
    from rlvr.engines.lora_targets import engine_lora_targets
    from rlvr.models.folder import read_model_folder
    from rlvr.planning.architecture import planned_dtype

    lora = cfg.trainer.lora
    linears = arch.attention_linears() | arch.mlp_linears(arch.intermediate_size)
    targets = engine_lora_targets(lora.target_modules, linears, uses_mla=arch.mla is not None)[0]
    base = {
        name: tensor
        for f in sorted(served_folder(read_model_folder(cfg.model.path)).path.glob("*.safetensors"))
        for name, tensor in load_file(f).items()
    }
    adapted = [
        name for name in base if name.endswith(".weight") and name.split(".")[-2] in targets and ".layers." in name
    ]
    generator = torch.Generator().manual_seed(0)
    adapter = {}
    for name in adapted:
        module = "base_model.model." + name.removesuffix(".weight")
        out_features, in_features = base[name].shape
        adapter[f"{module}.lora_A.weight"] = torch.randn(lora.rank, in_features, generator=generator) / in_features
        adapter[f"{module}.lora_B.weight"] = torch.randn(out_features, lora.rank, generator=generator) / lora.rank
    config = {"r": lora.rank, "lora_alpha": lora.alpha}
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        best = float("inf")
        for _ in range(2):
            start = time.perf_counter()
            merged_weights(base, adapter, config, planned_dtype(cfg.model, cfg.placement).torch)
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(previous)
    return best


def compare(run_dir: Path) -> dict:
    from rlvr.config import load_config
    from rlvr.hardware import cpu_rates, matmul_flops
    from rlvr.planning.architecture import planned_dtype, read_architecture
    from rlvr.planning.sections import PlanSections
    from rlvr.planning.step_time import step_time

    cfg = load_config(run_dir / "config.yaml")
    if cfg.placement.gpus_per_node:
        raise SystemExit(f"{run_dir}: a GPU run; this compares CPU runs on this machine")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in rows if m.get("step", 0) >= 1 and "time/train" in m]
    if len(steps) < 2:
        raise SystemExit(f"{run_dir}: {len(steps)} RL steps in metrics.jsonl; at least 2 (the first warms up)")
    sections = PlanSections.of(cfg)
    arch = read_architecture(sections)
    shapes = step_shapes(cfg, cfg.model.path, steps)[1:]
    timed = steps[1:]
    per_step = []
    for m, (prompts, completions) in zip(timed, shapes):
        prompt = round(statistics.mean(prompts))
        longest = step_time(PlanSections.of(shaped(cfg, prompt, m["response/length_max"])), arch, cpu_rates)
        typical = step_time(
            PlanSections.of(shaped(cfg, prompt, max(1, round(m["response/length_mean"])))), arch, cpu_rates
        )
        copies = [1 if cfg.trainer.share_prompts else len(cs) for cs in completions]
        trained = sum(p * n for p, n in zip(prompts, copies)) + sum(sum(cs) for cs in completions)
        per_step.append(
            {
                "step": m["step"],
                "measured": {phase: m[f"time/{phase}"] for phase in PHASES},
                "predicted": {"generate": longest.generate, "train": typical.train, "sync": typical.sync},
                "probed": "sync/logprob_gap" in m,
                "decoded_at_once": longest.decoded_at_once,
                "formula_tokens_over_trained": len(prompts)
                * cfg.rollout.samples_per_prompt
                * (prompt + m["response/length_mean"])
                / trained,
            }
        )
    unprobed = [s for s in per_step if not s["probed"]]
    measured = {phase: statistics.mean(s["measured"][phase] for s in per_step) for phase in PHASES}
    if unprobed:  # the sync as the formula sees it: the push alone
        measured["sync"] = statistics.mean(s["measured"]["sync"] for s in unprobed)
    predicted = {phase: statistics.mean(s["predicted"][phase] for s in per_step) for phase in PHASES}
    last = step_time(sections, arch, cpu_rates)
    dtype = planned_dtype(cfg.model, cfg.placement)
    rows = round(statistics.mean(s["decoded_at_once"] for s in per_step))
    decode = matmul_flops(dtype.torch, last.engine_threads, rows, arch.hidden, arch.intermediate_size)
    merges = cfg.trainer.lora and cfg.engine.backend == "vllm" and cfg.engine.merge_lora is not False
    merge = merge_seconds(cfg, arch, last.engine_threads) if merges else None
    return {
        "run_dir": str(run_dir),
        "model": cfg.model.path,
        "compute_dtype": dtype.name,
        "steps": f"2..{steps[-1]['step']}",
        "measured_s": measured,
        "measured_sync_with_probe_s": statistics.mean(s["measured"]["sync"] for s in per_step if s["probed"])
        if len(unprobed) < len(per_step)
        else None,
        "probed_steps": [s["step"] for s in per_step if s["probed"]],
        "predicted_s": predicted,
        "measured_over_predicted": {phase: measured[phase] / predicted[phase] for phase in PHASES},
        "formula_tokens_over_trained": statistics.mean(s["formula_tokens_over_trained"] for s in per_step),
        "prompt_tokens_mean": statistics.mean(statistics.mean(p) for p, _ in shapes),
        "response_tokens_mean": statistics.mean(m["response/length_mean"] for m in timed),
        "response_tokens_max_mean": statistics.mean(m["response/length_max"] for m in timed),
        "threads": {"engine": last.engine_threads, "trainer": last.trainer_threads},
        "rates": {
            "engine_matmul_flops": last.engine_device.matmul_flops,
            "trainer_matmul_flops": last.trainer_device.matmul_flops,
            "memory_bytes_per_s": last.engine_device.memory_bytes_per_s,
            "loopback_bytes_per_s": last.trainer_device.network_bytes_per_s,
        },
        "dry_run_longest_step_s": {"generate": last.generate, "train": last.train, "sync": last.sync},
        "decode_matmul_flops": decode,
        "decode_matmul_share_of_peak": decode / last.engine_device.matmul_flops,
        "decode_matmul_shape": [rows, arch.hidden, arch.intermediate_size],
        "merge_measured_s": merge,
        "merge_predicted_s": last.sync_load if merges else None,
        "per_step": per_step,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    runs = [compare(run_dir) for run_dir in args.run_dirs]
    write_result(args.out, {"runs": runs} | provenance())
    for run in runs:
        print(f"{run['run_dir']} ({run['compute_dtype']}, steps {run['steps']}):")
        for phase in PHASES:
            print(
                f"  {phase:8s} predicted {run['predicted_s'][phase]:8.3f} s  measured {run['measured_s'][phase]:8.3f} s  "
                f"ratio {run['measured_over_predicted'][phase]:6.2f}"
            )
        print(
            f"  a {' x '.join(map(str, run['decode_matmul_shape']))} matmul (a decode step's MLP): "
            f"{run['decode_matmul_flops'] / 1e9:.0f} GFLOP/s, {run['decode_matmul_share_of_peak']:.0%} of the peak"
        )
        if run["merge_measured_s"] is not None:
            print(
                f"  the sync's merge alone {run['merge_measured_s']:.3f} s (the formula's merge term "
                f"{run['merge_predicted_s']:.3f} s)"
            )

    def phases(r: dict) -> str:
        return ", ".join(
            f"{phase} {r['measured_s'][phase]:.2f} s / {r['predicted_s'][phase]:.2f} s = "
            f"{r['measured_over_predicted'][phase]:.1f}x"
            for phase in PHASES
        )

    parts = "; ".join(f"{r['run_dir']} ({r['compute_dtype']}): {phases(r)}" for r in runs)
    append_line(
        f"plan vs run, measured / predicted per phase (step_time at this CPU's measured rates): {parts}",
        {"runs": runs} | provenance(),
    )


if __name__ == "__main__":
    main()
