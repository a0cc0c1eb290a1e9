"""A real 0.5B model's RL step, float32 against model.dtype auto: speeds, shares of the matmul peak, memory.

Each phase's speed and share of the measured matmul peak in the dtype it ran in, its peak memory,
and where the train step's time goes.

    flock /tmp/rlvr-heavy.lock .venv/bin/python benchmarks/machine_speed.py --out runs/machine_speed.json

The recipe is configs/qwen0.5b_gsm8k_cpu.yaml (`make qwen` builds its model):
Qwen2.5-Coder-0.5B-Instruct, NVFP4 base, LoRA r16 on every linear, vLLM rollouts, 8 GSM8K train
problems x 8 samples of up to 256 tokens, one trainer rank, micro-batches of 2048 tokens. No held-out
evaluation (data.test=null), and the sync probe at every push (engine.sync_check_every=1), so that
every step reports sync/logprob_gap beside sync/sampler_trainer_gap; both are recorded, not held to
a threshold (engine.sync_check_threshold=1.0). `rlvr train` runs it with the same seed twice,
model.dtype float32 then auto (bfloat16 on a CPU with AMX: rlvr.hardware), each in its own process.

Per dtype, the mean over steps 2..N (the first warms up):
- generate tokens/s: completion tokens / time/generate; train tokens/s: tokens through the model
  (a prompt once per group where the samples share it, plus every completion) / time/train; the
  sync (time/sync: adapter, merge, engine reload and the probe); the step (time/step less the final
  checkpoint);
- each phase's useful FLOPs (benchmarks/_flops.py: generate = forward_flops of the step's shapes,
  train = train_step_flops, sync = the LoRA merge + the probe's two forwards) per second, as a share
  of the matmul peak in the dtype the phase ran in: the best size x size torch matmul on the
  phase's threads, measured in this process before and after the runs (the better counts);
- peak private memory (RssAnon) per phase of the controller (which holds the in-process vLLM
  engine) and of each trainer rank, sampled every 0.2 s and split by phase from each step's time/*
  metrics and the moment its metrics line appeared; and each process's peak resident set (VmHWM);
- sync/sampler_trainer_gap and sync/logprob_gap of every step;
- the cores other jobs kept busy in each phase (the machine's busy CPU time, /proc/stat, less the
  run's processes'): on a shared machine a phase's time means what it says only where that is ~0.

Then one train step of the auto dtype's last step's first groups (same shapes, random tokens)
under torch's profiler, in this process: the real Trainer with its one rank in-process. The table
says which ops take the time; the matmul ops' own FLOP/s against the peak says what bounds it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _flops import (  # noqa: E402
    forward_flops,
    lora_merge_flops,
    matmul_flops_per_s,
    nominal_peak_flops,
    step_shapes,
    train_step_flops,
)
from _ledger import append_line, provenance, write_result  # noqa: E402
from _proc import role, status_bytes  # noqa: E402

RECIPE = "configs/qwen0.5b_gsm8k_cpu.yaml"
DTYPES = ("float32", "auto")
PHASES = ("generate", "train", "sync")
SAMPLE_S = 0.2
GiB = 1 << 30


# ---------------------------------------------------------------------- memory and step times


def _role(process, root_pid: int) -> str:
    """What a process of the run is: the controller (it runs vLLM in-process on CPU), a trainer
    rank, a scoring worker, or another helper (the ranks' fork server, multiprocessing's tracker)."""
    return "controller" if process.pid == root_pid else role(process)


def _busy_cpu_s() -> float:
    """CPU seconds the whole machine has been busy (every core, /proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as stat:
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in stat.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class RunMonitor:
    """Samples the private memory and CPU time of a run's processes and the machine's busy CPU time,
    and notes when each metrics line appears."""

    def __init__(self, pid: int, metrics_path: Path):
        self.pid, self.metrics_path = pid, metrics_path
        self.samples: list[tuple[float, int, int]] = []  # (monotonic time, pid, RssAnon)
        self.peak_rss: dict[int, int] = {}  # VmHWM, last read
        self.roles: dict[int, str] = {}
        self.cpu: list[tuple[float, float, float]] = []  # (monotonic time, machine busy s, the run's CPU s)
        self._run_cpu: dict[int, float] = {}  # each process's CPU seconds, last read (kept after it exits)
        self.arrivals: list[tuple[float, dict]] = []  # (monotonic time, metrics line)
        self._read, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RunMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._read_metrics(time.monotonic())  # lines written in the last interval

    def _run(self) -> None:
        import psutil

        root = psutil.Process(self.pid)
        while not self._stop.is_set():
            now = time.monotonic()
            self._read_metrics(now)
            try:
                processes = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            for process in processes:
                try:
                    # a scoring worker caps its address space only once it runs: the role is read again
                    self.roles[process.pid] = _role(process, self.pid)
                    values = status_bytes(process.pid)
                except psutil.NoSuchProcess:
                    continue
                if "RssAnon" in values:  # an exited process, not yet reaped, has no memory lines
                    self.samples.append((now, process.pid, values["RssAnon"]))
                    self.peak_rss[process.pid] = max(self.peak_rss.get(process.pid, 0), values["VmHWM"])
                    times = process.cpu_times()
                    self._run_cpu[process.pid] = times.user + times.system
            self.cpu.append((now, _busy_cpu_s(), sum(self._run_cpu.values())))
            self._stop.wait(SAMPLE_S)

    def others_cpu_s(self, low: float, high: float) -> float:
        """CPU seconds that processes outside the run (other jobs on the machine, this benchmark's
        sampling) took between two moments: the machine's busy time less the run's."""
        inside = [c for c in self.cpu if low <= c[0] <= high]
        if len(inside) < 2:
            return 0.0
        (_, busy0, run0), (_, busy1, run1) = inside[0], inside[-1]
        return max(0.0, (busy1 - busy0) - (run1 - run0))

    def _read_metrics(self, now: float) -> None:
        if not self.metrics_path.exists():
            return
        with self.metrics_path.open() as f:
            f.seek(self._read)
            text = f.read()
        complete = text[: text.rfind("\n") + 1]
        self._read += len(complete.encode())
        self.arrivals += [(now, json.loads(line)) for line in complete.splitlines()]

    def labels(self) -> dict[int, str]:
        """Each process's role; trainer ranks numbered in the order they started (rank 0 first)."""
        ranks = sorted(pid for pid, role in self.roles.items() if role == "trainer rank")
        return {
            pid: f"trainer rank {ranks.index(pid)}" if role == "trainer rank" else role
            for pid, role in self.roles.items()
        }


def phase_windows(arrivals: list[tuple[float, dict]]) -> dict[int, dict[str, tuple[float, float]]]:
    """Each RL step's generate (with score), train and sync windows in monotonic time, from the
    moment its metrics line appeared back through its time/* metrics, in the loop's order:
    generate, score, train, sync, checkpoint, then the line."""
    windows = {}
    for seen, m in arrivals:
        if "time/train" not in m:
            continue
        start = seen - m["time/step"]
        sync_end = seen - m.get("time/checkpoint", 0.0)
        sync_start = sync_end - m["time/sync"]
        generated = start + m["time/generate"] + m.get("time/score", 0.0)
        windows[m["step"]] = {
            "generate": (start, generated),
            "train": (generated, sync_start),
            "sync": (sync_start, sync_end),
        }
    return windows


def memory_by_phase(monitor: RunMonitor, windows: dict[int, dict[str, tuple[float, float]]]) -> dict:
    """Peak RssAnon (GiB) of each process role in each phase, over every step and per step; and each
    process's VmHWM over the run."""
    labels = monitor.labels()
    wanted = {pid for pid, label in labels.items() if label == "controller" or label.startswith("trainer rank")}
    per_step: dict[int, dict[str, dict[str, float]]] = {}
    for step, phases in windows.items():
        per_step[step] = {}
        for phase, (low, high) in phases.items():
            peaks: dict[str, float] = {}
            for t, pid, rss in monitor.samples:
                if pid in wanted and low <= t <= high:
                    peaks[labels[pid]] = max(peaks.get(labels[pid], 0.0), rss / GiB)
            per_step[step][phase] = peaks
    over_steps = {
        phase: {
            label: max((per_step[s][phase].get(label, 0.0) for s in per_step), default=0.0)
            for label in sorted({labels[p] for p in wanted})
        }
        for phase in PHASES
    }
    return {
        "private_gib_by_phase": over_steps,
        "private_gib_by_phase_per_step": per_step,
        "peak_rss_gib": {labels[pid]: monitor.peak_rss.get(pid, 0) / GiB for pid in sorted(wanted)},
        "processes": {str(pid): label for pid, label in labels.items()},
    }


def contention_by_phase(
    monitor: RunMonitor, windows: dict[int, dict[str, tuple[float, float]]]
) -> dict[int, dict[str, float]]:
    """The cores that processes outside the run kept busy, on average, in each phase of each step
    (on a shared machine a phase's time is only comparable where this is small)."""
    return {
        step: {phase: monitor.others_cpu_s(low, high) / max(high - low, 1e-9) for phase, (low, high) in phases.items()}
        for step, phases in windows.items()
    }


# ---------------------------------------------------------------------- one dtype's run


def run_dtype(dtype: str, args, log_dir: Path) -> tuple[list[str], RunMonitor, float]:
    """`rlvr train` of the recipe in model.dtype `dtype`, in its own process, watched by a RunMonitor."""
    run_dir = args.run_dir / dtype
    if (run_dir / "metrics.jsonl").exists():
        raise SystemExit(f"{run_dir} holds an earlier run; remove it or give another --run-dir")
    # the gaps are recorded, not held to engine.sync_check_threshold: bf16's probe gap on this model
    # passed 0.05 after the first update (0.055), which would end the run there
    overrides = [
        f"run_dir={run_dir}",
        f"steps={args.steps}",
        f"model.dtype={dtype}",
        "data.test=null",
        "engine.sync_check_every=1",
        "engine.sync_check_threshold=1.0",
        "tracking.progress=false",
        *args.rlvr,
    ]
    log_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    with (log_dir / f"{dtype}.log").open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "rlvr.cli", "train", RECIPE, *overrides], stdout=out, stderr=subprocess.STDOUT
        )
        with RunMonitor(process.pid, run_dir / "metrics.jsonl") as monitor:
            code = process.wait()
    if code != 0:
        tail = (log_dir / f"{dtype}.log").read_text().splitlines()[-15:]
        raise SystemExit(f"rlvr train (model.dtype={dtype}) exited with {code}:\n" + "\n".join(tail))
    return overrides, monitor, time.time() - started


def probe_shape(cfg) -> tuple[list[int], list[list[int]]]:
    """(prompt lengths, completion lengths) of the sync probe: one completion per prompt."""
    from rlvr.models.tokenizer import load_tokenizer
    from rlvr.rollout.prompts import load_prompt_set

    tokenizer = load_tokenizer(cfg.model.path)
    probe = load_prompt_set(cfg.data, cfg.data.train, tokenizer).probe(tokenizer)
    return [len(p) for p, _ in probe], [[len(c)] for _, c in probe]


def summarise(
    dtype: str, overrides: list[str], monitor: RunMonitor, wall_s: float, peaks: dict[tuple[str, int], float]
) -> dict:
    from transformers import AutoConfig

    from rlvr.config import load_config

    cfg = load_config(RECIPE, overrides)
    run_dir = Path(cfg.run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    compute = summary["compute_dtype"]
    rows = [
        m
        for m in (json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines())
        if m.get("step", 0) >= 1 and "time/train" in m
    ]
    config = AutoConfig.from_pretrained(cfg.model.path)
    share_prompts = cfg.trainer.share_prompts and summary["trainer_attention"] == "packed"
    shapes = step_shapes(cfg, cfg.model.path, rows)
    probe_prompts, probe_completions = probe_shape(cfg)
    probe = forward_flops(config, probe_prompts, probe_completions, "completions")["total"]
    merge = lora_merge_flops(config, cfg.trainer.lora.rank)

    rank_threads = max(1, (os.cpu_count() or 1) // cfg.trainer.ranks)
    engine_threads = cfg.engine.num_threads or max(1, (os.cpu_count() or 1) // 2)
    per_step = []
    for m, (prompts, completions) in zip(rows, shapes):
        train = train_step_flops(config, cfg.trainer.lora.rank, prompts, completions, share_prompts)
        generate = forward_flops(config, prompts, completions, "completions")
        sync = merge + (2 * probe if "sync/logprob_gap" in m else 0.0)  # the engine's and the ranks' probe forwards
        step_s = m["time/step"] - m.get("time/checkpoint", 0.0)
        per_step.append(
            {
                "step": m["step"],
                "step_s": step_s,
                "generate_s": m["time/generate"],
                "score_s": m.get("time/score", 0.0),
                "train_s": m["time/train"],
                "sync_s": m["time/sync"],
                "completion_tokens": generate["completion_tokens"],
                "train_tokens": train["tokens"],
                "generate_flops": generate["total"],
                "train_flops": train["total"],
                "sync_flops": sync,
                "sampler_trainer_gap": m["sync/sampler_trainer_gap"],
                "logprob_gap": m.get("sync/logprob_gap"),
                "reward_mean": m["reward/mean"],
                "response_length_mean": m["response/length_mean"],
            }
        )
    timed = per_step[1:]
    windows = phase_windows(monitor.arrivals)
    others = contention_by_phase(monitor, windows)
    mean = {k: statistics.mean(s[k] for s in timed) for k in timed[0] if k not in ("step", "logprob_gap")}
    threads = {"generate": engine_threads, "train": rank_threads, "sync": rank_threads}
    share = {}
    for phase in PHASES:
        flops_per_s = mean[f"{phase}_flops"] / mean[f"{phase}_s"]
        peak = peaks[(compute, threads[phase])]
        share[phase] = {
            "flops_per_s": flops_per_s,
            "peak_flops_per_s": peak,
            "share_of_peak": flops_per_s / peak,
            "threads": threads[phase],
        }
    return {
        "model_dtype": dtype,
        "compute_dtype": compute,
        "compute_dtype_reason": summary["compute_dtype_reason"],
        "trainer_attention": summary["trainer_attention"],
        "step_s": mean["step_s"],
        "generate_s": mean["generate_s"],
        "score_s": mean["score_s"],
        "train_s": mean["train_s"],
        "sync_s": mean["sync_s"],
        "generate_tokens_per_s": mean["completion_tokens"] / mean["generate_s"],
        "train_tokens_per_s": mean["train_tokens"] / mean["train_s"],
        "phase_flops": {p: mean[f"{p}_flops"] for p in PHASES},
        "share_of_measured_peak": share,
        "memory": memory_by_phase(monitor, windows),
        "other_jobs_cores_by_phase": {
            phase: statistics.mean(others[s["step"]][phase] for s in timed) for phase in PHASES
        },
        "other_jobs_cores_by_phase_per_step": others,
        "sampler_trainer_gap": [s["sampler_trainer_gap"] for s in per_step],
        "logprob_gap": [s["logprob_gap"] for s in per_step],
        "per_step": per_step,
        "overrides": overrides,
        "wall_s": round(wall_s, 1),
    }


# ---------------------------------------------------------------------- where the train step's time goes


class InProcessRank:
    """A trainer rank run in this process (a RankHandle): each command is answered as it is sent,
    so that torch's profiler here sees the rank's ops."""

    def __init__(self, spec):
        from rlvr.training.rank_host import join_group
        from rlvr.training.trainer import free_port

        self.worker = join_group(0, 1, "127.0.0.1", free_port(), spec)
        self.reply = ("ok", self.worker.info())

    def send(self, command) -> None:
        from rlvr.training.rank_host import answer

        self.reply = answer(self.worker, command)

    def receive(self, timeout_s: float | None) -> tuple[str, object]:
        return self.reply

    def stop(self) -> None:
        from rlvr.training.rank_host import leave_group

        leave_group()

    def wait_stopped(self) -> None:
        pass


def profile_train_step(overrides: list[str], prompts: list[int], completions: list[list[int]], top: int = 15) -> dict:
    """One profiled train step (after one warm-up step) on these shapes, random tokens, as the run's rank computes it."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoConfig

    from rlvr.config import load_config
    from rlvr.models.folder import read_model_folder
    from rlvr.records import TrainBatch
    from rlvr.training.trainer import Trainer
    from rlvr.training.worker import RankSpec

    cfg = load_config(RECIPE, overrides)
    vocab = AutoConfig.from_pretrained(cfg.model.path).vocab_size
    generator = torch.Generator().manual_seed(cfg.seed)
    prompt_ids, completion_ids, group = [], [], []
    for g, (p, cs) in enumerate(zip(prompts, completions)):
        prompt = torch.randint(4, vocab, (p,), generator=generator).tolist()
        for c in cs:
            prompt_ids.append(prompt)
            completion_ids.append(torch.randint(4, vocab, (round(c),), generator=generator).tolist())
            group.append(g)
    batch = TrainBatch(
        prompt_ids=prompt_ids,
        completion_ids=completion_ids,
        sampler_logprobs=[[-1.0] * len(c) for c in completion_ids],
        advantages=torch.linspace(-1.0, 1.0, len(group)),
        group=torch.tensor(group),
    )
    spec = RankSpec(
        folder=read_model_folder(cfg.model.path),
        dtype=cfg.model.dtype,
        trainer=cfg.trainer,
        algorithm=cfg.algorithm,
        seed=cfg.seed,
        total_steps=cfg.steps,
    )
    with Trainer(spec, launch=lambda world_size, spec: [InProcessRank(spec)]) as trainer:
        trainer.train_step(batch)  # warm-up: first-call allocations, oneDNN primitive creation
        with profile(activities=[ProfilerActivity.CPU], with_flops=True) as profiler:
            metrics = trainer.train_step(batch)
    events = profiler.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    ops = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)
    matmuls = [e for e in events if e.key in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")]
    matmul_s = sum(e.self_cpu_time_total for e in matmuls) / 1e6
    return {
        "sequences": len(group),
        "train_s": metrics["time/train"],
        "profiled_s": total / 1e6,
        "top_ops": [
            {
                "op": e.key,
                "self_s": e.self_cpu_time_total / 1e6,
                "share": e.self_cpu_time_total / total,
                "calls": e.count,
                "flops": e.flops,
            }
            for e in ops[:top]
        ],
        "matmul_s": matmul_s,
        "matmul_share": matmul_s * 1e6 / total,
        "matmul_flops": sum(e.flops for e in matmuls),
        "matmul_flops_per_s": sum(e.flops for e in matmuls) / matmul_s if matmul_s else None,
        "table": events.table(sort_by="self_cpu_time_total", row_limit=top),
    }


# ---------------------------------------------------------------------- the benchmark


def measure_peaks(threads: set[int]) -> dict[tuple[str, int], float]:
    return {(dtype, n): matmul_flops_per_s(n, dtype) for dtype in ("float32", "bfloat16") for n in sorted(threads)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument(
        "--steps", type=int, default=2, help="RL steps per dtype; the first warms up and is not counted"
    )
    parser.add_argument("--run-dir", type=Path, default=Path("runs/machine_speed"))
    parser.add_argument(
        "--rlvr", action="append", default=[], metavar="KEY=VALUE", help="extra rlvr config override, both dtypes"
    )
    parser.add_argument(
        "--profile-groups", type=int, default=2, help="prompt groups of the profiled train step (0: no profile)"
    )
    parser.add_argument("--note", default="", help="what this run measures, for the ledger line")
    args = parser.parse_args()
    if args.steps < 2:
        raise SystemExit("--steps must be at least 2: the first step warms up")

    from rlvr.config import load_config

    cfg = load_config(RECIPE, args.rlvr)
    if not (Path(cfg.model.path) / "config.json").is_file():
        raise SystemExit(f"{cfg.model.path} is not built: `make qwen` (docs/real_models.md)")
    started = time.time()
    threads = {
        max(1, (os.cpu_count() or 1) // cfg.trainer.ranks),
        cfg.engine.num_threads or max(1, (os.cpu_count() or 1) // 2),
    }
    before = measure_peaks(threads)
    print(
        "matmul peaks before the runs (GFLOP/s):",
        {f"{d} x{n}": round(v / 1e9) for (d, n), v in before.items()},
        flush=True,
    )
    runs = {}
    for dtype in DTYPES:
        runs[dtype] = run_dtype(dtype, args, args.run_dir / "logs")
        print(f"model.dtype={dtype}: {runs[dtype][2]:.0f} s", flush=True)
    after = measure_peaks(threads)
    peaks = {key: max(before[key], after[key]) for key in before}
    results = {dtype: summarise(dtype, *runs[dtype], peaks) for dtype in DTYPES}
    auto = results["auto"]
    profile = None
    if args.profile_groups:
        last = auto["per_step"][-1]
        prompts, completions = _last_shape(auto["overrides"], cfg.model.path, last["step"])
        profile = profile_train_step(
            auto["overrides"], prompts[: args.profile_groups], completions[: args.profile_groups]
        )
        print(profile["table"], flush=True)

    nominal = {dtype: nominal_peak_flops(dtype) for dtype in ("float32", "bfloat16")}
    result = {
        "step_time_ratio_float32_over_auto": results["float32"]["step_s"] / auto["step_s"],
        "runs": results,
        "matmul_peak_flops_per_s": {f"{d} x{n} threads": v for (d, n), v in peaks.items()},
        "matmul_peak_before_after": {f"{d} x{n} threads": [before[(d, n)], after[(d, n)]] for (d, n) in peaks},
        "matmul_peak": "best of 3 4096x4096 torch matmuls in the dtype, on the phase's threads, before and after the runs",
        "nominal_peak_flops_per_s": {d: {"flops_per_s": v, "text": t} for d, (v, t) in nominal.items()},
        "train_profile": profile,
        "setting": {
            "recipe": RECIPE,
            "steps": args.steps,
            "timed_steps": f"2..{args.steps}",
            "trainer_ranks": cfg.trainer.ranks,
            "micro_batch_tokens": cfg.trainer.micro_batch_tokens,
        },
        "wall_seconds": round(time.time() - started, 1),
    } | provenance()
    write_result(args.out, result)
    append_line(ledger_text(result, args), result)


def _last_shape(overrides: list[str], model_path: str, step: int) -> tuple[list[int], list[list[int]]]:
    from rlvr.config import load_config

    cfg = load_config(RECIPE, overrides)
    rows = [
        m
        for m in (json.loads(line) for line in (Path(cfg.run_dir) / "metrics.jsonl").read_text().splitlines())
        if m.get("step", 0) >= 1 and "time/train" in m
    ]
    return step_shapes(cfg, model_path, rows)[[m["step"] for m in rows].index(step)]


def ledger_text(result: dict, args) -> str:
    def run(r: dict) -> str:
        share = r["share_of_measured_peak"]
        memory = r["memory"]["private_gib_by_phase"]
        return (
            f"{r['model_dtype']} ({r['compute_dtype']}): **step {r['step_s']:.1f} s**, generate {r['generate_s']:.1f} s "
            f"({r['generate_tokens_per_s']:.0f} tokens/s, {share['generate']['share_of_peak']:.1%} of peak), train "
            f"{r['train_s']:.1f} s ({r['train_tokens_per_s']:.0f} tokens/s, **{share['train']['share_of_peak']:.1%} of "
            f"the {r['compute_dtype']} peak**), sync {r['sync_s']:.2f} s; peak private GiB controller/rank 0: "
            + ", ".join(
                f"{p} {memory[p].get('controller', 0):.2f}/{memory[p].get('trainer rank 0', 0):.2f}" for p in PHASES
            )
            + f"; sampler/trainer gap {max(r['sampler_trainer_gap']):.2g} max, probe gap "
            f"{max(g for g in r['logprob_gap'] if g is not None):.2g} max; other jobs' cores "
            + ", ".join(f"{p} {r['other_jobs_cores_by_phase'][p]:.2f}" for p in PHASES)
        )

    runs, peaks = result["runs"], result["matmul_peak_flops_per_s"]
    profile = result["train_profile"]
    where = ""
    if profile:
        tops = ", ".join(f"{o['op']} {o['share']:.0%}" for o in profile["top_ops"][:5])
        where = (
            f"; auto's train step profiled ({profile['sequences']} sequences): {tops}; matmuls "
            f"{profile['matmul_share']:.0%} of it at {(profile['matmul_flops_per_s'] or 0) / 1e9:.0f} GFLOP/s"
        )
    return (
        f"machine speed, {RECIPE} (Qwen2.5-Coder-0.5B NVFP4 + LoRA r16, vLLM, 8 prompts x 8 samples x <=256 tokens, "
        f"{result['setting']['trainer_ranks']} rank, mean of steps {result['setting']['timed_steps']})"
        f"{', ' + args.note if args.note else ''}: **float32/auto step time {result['step_time_ratio_float32_over_auto']:.2f}x**; "
        + "; ".join(run(runs[d]) for d in DTYPES)
        + "; measured matmul peaks "
        + ", ".join(f"{k} {v / 1e9:.0f}" for k, v in peaks.items())
        + " GFLOP/s"
        + where
    )


if __name__ == "__main__":
    main()
