"""tinker-cookbook recipes, unmodified, against `rlvr serve` as the benchmarks run them: the served
config, the server and what it holds in memory, a recipe as a subprocess and the metrics it logged."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml
from _proc import status_bytes, trainer_ranks
from _serve import start_server

from rlvr.config import set_dotted

SAMPLE_S = 0.005
# The SDK wants a key that looks like one; a loopback server without tenants takes any.
API_KEY = "tml-dummy"


def serve_config(folder: Path, models: dict[str, str], rank_alpha: float, settings: list[str]) -> Path:
    """The served config: the catalog `models` (name -> folder), the engine's sizes for this
    machine, LoRA's alpha, and each KEY=VALUE of `settings`."""
    config = {
        "checkpoint_dir": str(folder / "checkpoints"),
        "log_file": str(folder / "libraries.log"),
        "models": models,
        "log_every_s": 60,
        "engine": {"max_model_len": 256, "kv_cache_gb": 1, "num_threads": 2},
        "trainer": {"lora": {"alpha": rank_alpha}},
    }
    for setting in settings:
        key, value = setting.split("=", 1)
        set_dotted(config, key, yaml.safe_load(value), source=f"--set {setting}")
    path = folder / "serve.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


class PrivateMemory:
    """Peak private memory (RssAnon) of a server process and of each trainer rank it spawned (its
    children but multiprocessing's resource tracker), sampled every SAMPLE_S from this process."""

    def __init__(self, server_pid: int):
        self.server_pid = server_pid
        self.peaks: dict[int, int] = {}  # pid -> bytes
        self._ranks: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def rank_peaks(self) -> list[int]:
        return [self.peaks.get(pid, 0) for pid in self._ranks]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        listed = 0.0
        while not self._stop.is_set():
            if time.monotonic() - listed > 1.0:  # ranks start (and restart) with the models the client creates
                listed = time.monotonic()
                self._ranks += [pid for pid in trainer_ranks(self.server_pid) if pid not in self._ranks]
            for pid in (self.server_pid, *self._ranks):
                self.peaks[pid] = max(self.peaks.get(pid, 0), status_bytes(pid).get("RssAnon", 0))
            time.sleep(SAMPLE_S)


def planned(config: Path, model: str, rank: int) -> tuple[float, float, str]:
    """The plan's estimate for the served model: (one trainer rank, all its processes together, the compute dtype)."""
    from rlvr.config import ServeConfig, load_config
    from rlvr.hardware import compute_dtype, local_device
    from rlvr.planning.plan import all_devices_bytes, make_plan
    from rlvr.serve.model import served_sections

    sections = served_sections(model, rank, load_config(config, schema=ServeConfig), log=lambda *_: None)
    plan = make_plan(sections)
    rank_total = max(d.total for d in plan.devices if d.trainer_rank is not None)
    return rank_total, all_devices_bytes(plan)[0], compute_dtype(sections.model.dtype, local_device()).name


@dataclass
class Served:
    """A started server: its folder (server.log, serve.yaml, checkpoints), port and memory sampler."""

    folder: Path
    port: int
    config: Path
    memory: PrivateMemory
    server_pid: int

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def server_lines(self) -> list[str]:
        """The server's own lines (request counts, sessions ending), as its terminal shows them."""
        return [
            line for line in (self.folder / "server.log").read_text().splitlines() if line.startswith("rlvr serve:")
        ]

    def sessions_ended(self) -> int:
        return sum(line.startswith("rlvr serve: session ") for line in self.server_lines())

    def wait_sessions_ended(self, count: int, wait_s: float = 300) -> None:
        """Until `count` sessions have ended (their models closed and their memory freed), so the
        next model does not share the machine with the last one."""
        deadline = time.monotonic() + wait_s
        while self.sessions_ended() < count:
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"rlvr serve: {count} sessions not ended in {wait_s:.0f} s:\n" + "\n".join(self.server_lines()[-5:])
                )
            time.sleep(1)

    def memory_result(self) -> dict:
        ranks = [round(b / 1e9, 3) for b in self.memory.rank_peaks()]
        return {
            "rank_peak_private_gb": ranks,
            "server_peak_private_gb": round(self.memory.peaks.get(self.server_pid, 0) / 1e9, 3),
        }


@contextmanager
def serving(prefix: str, port: int, models: dict[str, str], rank_alpha: float, settings: list[str]) -> Iterator[Served]:
    """`rlvr serve` on `port` with the catalog `models`, its memory sampled, stopped on the way out."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    config = serve_config(folder, models, rank_alpha, settings)
    server = start_server(folder, port, config)
    served = Served(folder, port, config, PrivateMemory(server.pid), server.pid)
    try:
        yield served
    finally:
        served.memory.stop()
        server.terminate()
        server.wait(timeout=120)


def run_recipe(
    served: Served, module: str, options: list[str], cwd: Path | None = None, env: dict[str, str] | None = None
) -> tuple[float, list[dict]]:
    """`python -m MODULE base_url=... OPTIONS` against the server (log_path is FOLDER/run), in `cwd`
    with `env` added, until it exits: (its wall time, each line of the metrics.jsonl it logged)."""
    log_path = served.folder / "run"
    command = [sys.executable, "-m", module, f"base_url={served.base_url}", *options, f"log_path={log_path}"]
    start = time.monotonic()
    done = subprocess.run(
        command,
        env={**os.environ, "TINKER_API_KEY": API_KEY, **(env or {})},
        cwd=cwd or served.folder,
        capture_output=True,
        text=True,
    )
    wall = time.monotonic() - start
    (served.folder / "recipe.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"{module} failed (rc {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    metrics = log_path / "metrics.jsonl"
    return wall, [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []


def final_checkpoint(served: Served) -> dict:
    """The last record of the recipe's checkpoints.jsonl (its final save: state_path, sampler_path)."""
    return json.loads((served.folder / "run" / "checkpoints.jsonl").read_text().splitlines()[-1])


def quarters(values: list[float]) -> dict:
    """First vs last quarter of the steps: the means and a two-sample standard error over steps."""
    quarter = max(2, len(values) // 4)
    first, last = values[:quarter], values[-quarter:]
    se = (statistics.variance(first) / len(first) + statistics.variance(last) / len(last)) ** 0.5
    rise = statistics.fmean(last) - statistics.fmean(first)
    return {
        "first_quarter": round(statistics.fmean(first), 4),
        "last_quarter": round(statistics.fmean(last), 4),
        "steps_a_quarter": quarter,
        "rise": round(rise, 4),
        "se": round(se, 4),
        "rise_over_se": round(rise / se, 2) if se else None,
    }


def served_arguments(parser: argparse.ArgumentParser, port: int) -> argparse.Namespace:
    """The command line, with the options every cookbook benchmark has (LoRA's rank and alpha, the
    port, --set KEY=VALUE for the served config); a --model that is not a model folder is refused."""
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--alpha", type=float, default=32.0)
    parser.add_argument("--port", type=int, default=port)
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a key of the served config, e.g. trainer.gradient_checkpointing=true (repeatable)",
    )
    args = parser.parse_args()
    if not Path(args.model, "config.json").is_file():
        parser.exit(
            2, f"--model {args.model}: no model folder (config.json); `make qwen` or `make smollm2` builds one\n"
        )
    return args
