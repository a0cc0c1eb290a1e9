"""Faults during a fully asynchronous run: the demo, once clean and once while processes are killed.

    flock /tmp/rlvr-heavy.lock .venv/bin/python benchmarks/chaos.py --out runs/bench/chaos.json

Both runs are `configs/demo.yaml` for `--steps` steps with `rollout.mode=async
rollout.max_staleness=2`, the engine core in its own process (`engine.in_process=false`, so it
can die alone and be restarted), and a checkpoint every `--checkpoint-every` steps. One train
row in `SANDBOX_SHARE` is scored in the sandbox (`sandboxed_math` below: the code verifier runs
a program that checks the boxed answer), so sandboxed programs run during every step's scoring.

The chaos run gets, at seeded random times (after a random step, a random delay into the next):
- `engine`: SIGKILL to vLLM's engine core (the supervisor restarts it in the run);
- `trainer_rank`: SIGKILL to a trainer rank (the run stops, naming the rank);
- `reward_worker`: SIGKILL to a scoring-pool worker (replaced; its item retried once);
- `sandbox_worker`: SIGKILL to a sandboxed program (bubblewrap) the code verifier started;
- `sigterm`: SIGTERM to the controller (it finishes the step, checkpoints, exits 0).
Like a job scheduler's restart policy, the harness runs `rlvr train --resume RUN_DIR` whenever
the run exits before its last step (after the rank's death and the SIGTERM).

The JSON: `completed` (both runs logged every step and their final evaluation), `faults` (per
kind: injected, and the lines of the run's log that name one; each fault must be exactly one
line, and no traceback may appear), `lost_groups` and `duplicated_groups` (from the chain of the
steps' `rollout/groups_from`/`groups_to` draw ranges, which must start at 0 and meet end to
start), `trained_groups` against steps x prompts_per_step, `avg8_clean` and `avg8_chaos` (the
final adapters' held-out avg@8, the runs' own after-evaluations) and `paired_se`, the standard error of
the per-problem difference between them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ledger import append_line, provenance, write_result  # noqa: E402
from _proc import role  # noqa: E402

DEMO_CONFIG = "configs/demo.yaml"
SANDBOX_SHARE = 4  # every 4th train row is scored by a program in the sandbox
FAULT_KINDS = ("engine", "trainer_rank", "reward_worker", "sandbox_worker", "sigterm")
# The one log line each fault must leave (the run's stdout and stderr, every attempt together).
FAULT_LINES = {
    "engine": re.compile(r"restarting the engine \(\d+/\d+\)"),
    "trainer_rank": re.compile(r"trainer rank \d+ died"),
    "reward_worker": re.compile(r"scoring worker \(pid \d+\) died"),
    "sandbox_worker": re.compile(r"sandboxed program killed from outside"),
    "sigterm": re.compile(r"SIGTERM: stopped after step \d+"),
}
MAX_ATTEMPTS = 6  # starts of one run, resumes included

SANDBOXED_MATH = '''
"""The demo's math verifier, its verdict checked by a program in the sandbox (written by benchmarks/chaos.py)."""
from rlvr.records import Score
from rlvr.rewards.verifiers import get_verifier

_math = get_verifier("math")
_code = None


def sandboxed_math(response, answer):
    global _code
    score = _math(response, answer)
    if score.extracted is None:
        return score
    if _code is None:
        _code = get_verifier("code", workers=1)
    program = "```python\\nverdict = " + repr(score.reward == 1.0) + "\\n```"
    checked = _code(program, "assert verdict")
    return Score(checked.reward, checked.status, score.extracted, checked.detail)
'''


@dataclass
class Fault:
    kind: str
    after_step: int  # fired once the run has logged this many steps ...
    delay_s: float  # ... and this long after
    fired_at_s: float | None = None
    pid: int | None = None


def schedule(rng: random.Random, steps: int, kinds: list[str]) -> list[Fault]:
    """One fault of each kind, after distinct steps spread over the run (none in its last 3)."""
    after = rng.sample(range(2, steps - 3), len(kinds))
    return sorted(
        (Fault(kind, step, rng.uniform(0.0, 2.0)) for kind, step in zip(kinds, after)), key=lambda f: f.after_step
    )


def group_chain(rows: list[dict]) -> dict:
    """Lost and duplicated groups from the steps' draw ranges [groups_from, groups_to), in step
    order: a range starting past the previous end lost the groups between; one starting before it
    handed those out twice."""
    lost = duplicated = 0
    end = 0
    for row in sorted(rows, key=lambda r: r["step"]):
        start, stop = int(row["rollout/groups_from"]), int(row["rollout/groups_to"])
        lost += max(0, start - end)
        duplicated += max(0, min(end, stop) - start)
        end = max(end, stop)
    return {"lost_groups": lost, "duplicated_groups": duplicated, "groups_drawn": end}


def step_rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [row for row in rows if "reward/mean" in row]


def steps_logged(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return path.read_text().count('"reward/mean"') if path.exists() else 0


def sandboxed_task(root: Path, train: Path) -> Path:
    """A copy of the demo's train rows where every SANDBOX_SHARE-th names the sandboxed verifier."""
    reward = root / "sandboxed_math.py"
    reward.write_text(SANDBOXED_MATH)
    rows = [json.loads(line) for line in train.read_text().splitlines()]
    for row in rows[::SANDBOX_SHARE]:
        row["verifier"] = f"{reward}:sandboxed_math"
    out = root / "train.jsonl"
    out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return out


# ---------------------------------------------------------------------- the run's processes


def _children(controller: psutil.Process) -> list[psutil.Process]:
    try:
        return controller.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _alive(process: psutil.Process, test) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE and test(process)
    except psutil.NoSuchProcess:
        return False


def _is_engine_core(p: psutil.Process) -> bool:
    return "EngineCore" in p.name() + " ".join(p.cmdline())


def _is_trainer_rank(p: psutil.Process) -> bool:
    return role(p) == "trainer rank"


def _is_reward_worker(p: psutil.Process) -> bool:
    return role(p) == "scoring worker"


def _is_sandbox(p: psutil.Process) -> bool:
    # the outer bubblewrap, a scoring worker's child (its own child, the namespace's init, dies with it)
    return p.name() == "bwrap" and p.parent().name() != "bwrap"


TARGETS = {
    "engine": _is_engine_core,
    "trainer_rank": _is_trainer_rank,
    "reward_worker": _is_reward_worker,
    "sandbox_worker": _is_sandbox,
}


def fire(fault: Fault, controller: psutil.Process, rng: random.Random, started: float) -> bool:
    """Send `fault`'s signal if its target is running now; True once sent."""
    if fault.kind == "sigterm":
        victim = controller
        controller.send_signal(signal.SIGTERM)
    else:
        candidates = [p for p in _children(controller) if _alive(p, TARGETS[fault.kind])]
        if not candidates:
            return False
        victim = rng.choice(sorted(candidates, key=lambda p: p.pid))
        try:
            victim.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            return False
    fault.pid, fault.fired_at_s = victim.pid, round(time.time() - started, 1)
    return True


# ---------------------------------------------------------------------- runs


def run_to_end(command: list[str], run_dir: Path, steps: int, log_file: Path, faults: list[Fault], seed: int) -> dict:
    """`command`, then `rlvr train --resume RUN_DIR` after each exit before the last step, firing
    `faults` on schedule; what happened."""
    rng = random.Random(seed)
    pending = list(faults)
    attempts, exits = 0, []
    started = time.time()
    with log_file.open("w") as log:
        while attempts < MAX_ATTEMPTS:
            attempts += 1
            args = command if attempts == 1 else [sys.executable, "-m", "rlvr.cli", "train", "--resume", str(run_dir)]
            log.write(f"=== chaos harness: attempt {attempts}: {' '.join(args[2:])}\n")
            log.flush()
            process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            controller = psutil.Process(process.pid)
            due_since: float | None = None
            stopping = False  # after the SIGTERM the run is winding down: the next fault waits for the resume
            while process.poll() is None:
                if pending and not stopping and steps_logged(run_dir) >= pending[0].after_step:
                    due_since = due_since or time.time()
                    if time.time() - due_since >= pending[0].delay_s and fire(pending[0], controller, rng, started):
                        log.write(f"=== chaos harness: {pending[0].kind} fault sent to pid {pending[0].pid}\n")
                        log.flush()
                        stopping = pending.pop(0).kind == "sigterm"
                        due_since = None
                time.sleep(0.02)
            exits.append(process.returncode)
            summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
            if process.returncode == 0 and "eval_after" in summary:
                break
            _reap(process.pid)
    return {
        "attempts": attempts,
        "exit_codes": exits,
        "wall_s": round(time.time() - started, 1),
        "unfired": [f.kind for f in pending],
    }


def _reap(session: int) -> None:
    """Kill what the run's session left behind (an engine core or rank orphaned by the exit)."""
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == session and p.pid != os.getpid():
                p.kill()
        except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
            pass


def outcome(run_dir: Path, steps: int, prompts_per_step: int) -> dict:
    rows = step_rows(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
    chain = group_chain(rows) if rows else {"lost_groups": None, "duplicated_groups": None, "groups_drawn": 0}
    dropped = int(sum(row.get("rollout/dropped_stale", 0) for row in rows))
    return {
        "completed": [row["step"] for row in rows] == list(range(1, steps + 1)) and "eval_after" in summary,
        "steps_logged": len(rows),
        **chain,
        "dropped_stale": dropped,
        "trained_groups": chain["groups_drawn"] - dropped,
        "expected_trained_groups": steps * prompts_per_step,
        "staleness_max": max((row["rollout/staleness_max"] for row in rows), default=None),
        "avg8": summary.get("eval_after", {}).get("avg@8"),
        "engine_restarts": rows[-1].get("engine/restarts") if rows else None,
    }


def held_out(run_dir: Path) -> dict[str, float]:
    """The final adapter's per-problem held-out mean rewards (the after-evaluation's), by problem id."""
    path = run_dir / "eval" / "after.json"
    return {p["id"]: p["mean_reward"] for p in json.loads(path.read_text())["problems"]} if path.exists() else {}


def paired_se(a: dict[str, float], b: dict[str, float]) -> float | None:
    """Standard error of the mean per-problem difference between two evaluations of the same problems."""
    differences = [b[k] - a[k] for k in a if k in b]
    return statistics.stdev(differences) / len(differences) ** 0.5 if len(differences) > 1 else None


def fault_lines(*logs: Path) -> dict[str, int]:
    """Lines naming each kind of fault in `logs` (together)."""
    text = "\n".join(log.read_text(errors="replace") for log in logs if log.exists())
    return {kind: sum(1 for line in text.splitlines() if pattern.search(line)) for kind, pattern in FAULT_LINES.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0, help="the faults' times and victims")
    parser.add_argument("--root", type=Path, default=Path("runs/bench/chaos"))
    parser.add_argument("--skip-clean", action="store_true", help="reuse ROOT/clean from an earlier call")
    parser.add_argument(
        "--faults",
        nargs="+",
        choices=FAULT_KINDS,
        default=list(FAULT_KINDS),
        help="the kinds injected (a run with every kind adds a ledger line)",
    )
    args = parser.parse_args()

    import yaml

    demo = yaml.safe_load(open(DEMO_CONFIG))
    args.root.mkdir(parents=True, exist_ok=True)
    train = sandboxed_task(args.root.resolve(), Path(demo["data"]["train"]))
    overrides = [
        f"steps={args.steps}",
        "rollout.mode=async",
        "rollout.max_staleness=2",
        "engine.in_process=false",
        "engine.max_restarts=3",
        f"checkpoint.every={args.checkpoint_every}",
        "checkpoint.keep=2",
        f"data.train={train}",
        "tracking.progress=false",
    ]
    prompts_per_step = demo["rollout"]["prompts_per_step"]
    runs = {}
    for name in ("clean", "chaos"):
        run_dir = args.root / name
        if name == "clean" and args.skip_clean and (run_dir / "summary.json").exists():
            runs[name] = {"harness": json.loads((args.root / "clean.json").read_text())}
        else:
            if run_dir.exists():
                subprocess.run(["rm", "-rf", str(run_dir)], check=True)
            faults = schedule(random.Random(args.seed), args.steps, args.faults) if name == "chaos" else []
            command = [sys.executable, "-m", "rlvr.cli", "train", DEMO_CONFIG, *overrides, f"run_dir={run_dir}"]
            harness = run_to_end(command, run_dir, args.steps, args.root / f"{name}.log", faults, args.seed)
            harness["faults"] = [vars(f) for f in faults]
            (args.root / f"{name}.json").write_text(json.dumps(harness, indent=2))
            runs[name] = {"harness": harness}
        runs[name] |= outcome(run_dir, args.steps, prompts_per_step)
        # the run's log: what it printed (its console lines) and RUN_DIR/logs/run.log (where its
        # processes' own output goes: the scoring pool's, the sandbox's, vLLM's)
        logs = (args.root / f"{name}.log", run_dir / "logs" / "run.log")
        runs[name]["fault_lines"] = fault_lines(*logs)
        runs[name]["tracebacks"] = sum(log.read_text(errors="replace").count("Traceback") for log in logs)
        print(f"{name}: {json.dumps(runs[name])}", flush=True)

    chaos = runs["chaos"]
    injected = {
        kind: sum(f["kind"] == kind and f["pid"] is not None for f in chaos["harness"]["faults"])
        for kind in args.faults
    }
    faults = {kind: {"injected": injected[kind], "log_lines": chaos["fault_lines"][kind]} for kind in args.faults}
    se = paired_se(held_out(args.root / "clean"), held_out(args.root / "chaos"))
    result = provenance() | {
        "steps": args.steps,
        "setting": " ".join(overrides[1:-2]),
        "completed": runs["clean"]["completed"] and chaos["completed"],
        "faults": faults,
        "every_fault_one_line": all(f["injected"] == 1 == f["log_lines"] for f in faults.values()),
        "tracebacks": chaos["tracebacks"],
        "lost_groups": chaos["lost_groups"],
        "duplicated_groups": chaos["duplicated_groups"],
        "trained_groups": chaos["trained_groups"],
        "expected_trained_groups": chaos["expected_trained_groups"],
        "avg8_clean": runs["clean"]["avg8"],
        "avg8_chaos": chaos["avg8"],
        "paired_se": se,
        "avg8_within_2se": None if se is None else abs(runs["clean"]["avg8"] - chaos["avg8"]) <= 2 * se,
        "runs": runs,
    }
    write_result(args.out, result)
    if set(args.faults) != set(FAULT_KINDS):
        return
    seen = ", ".join(f"{k} {v['injected']}/{v['log_lines']}" for k, v in faults.items())
    append_line(
        f"chaos, {args.steps}-step async demo (K=2, engine core out of process, checkpoint every {args.checkpoint_every}): "
        f"completed {result['completed']} in {chaos['harness']['attempts']} starts; faults injected/log lines: {seen}; "
        f"tracebacks {result['tracebacks']}; lost groups {result['lost_groups']}, duplicated {result['duplicated_groups']}, "
        f"trained {result['trained_groups']}/{result['expected_trained_groups']}; held-out avg@8 clean "
        f"{result['avg8_clean']} vs chaos {result['avg8_chaos']} (paired SE {se if se is None else round(se, 4)}, within 2 SE: {result['avg8_within_2se']})",
        result,
    )


if __name__ == "__main__":
    main()
