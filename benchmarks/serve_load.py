"""`rlvr serve` under concurrent clients: throughput, latency, errors and lost requests.

    flock /tmp/rlvr-heavy.lock .venv/bin/python benchmarks/serve_load.py --out runs/bench/serve_load.json

One server on loopback, a tiny model in its catalog, one tenant (and key) per client. Each client
is the real `tinker` SDK's ServiceClient with its own LoRA model on the base, and sends a fixed
number of rounds, each round a forward_backward, an optim_step and a sample, waiting for each
answer as a training loop does. First one client alone, then all of them at once, on the same
server and models: the ratio of the two throughputs is how the server scales with clients.

Written: requests a second, p50 and p99 latency per request kind, errors (any refused or failed
call) and requests lost (sent and never answered before --timeout-s), for each phase.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from _ledger import append_line, provenance, write_result
from _serve import start_server

ROOT = Path(__file__).resolve().parents[1]
TOKENS = list(range(5, 29))


def serve(folder: Path, model: Path, clients: int, port: int) -> subprocess.Popen:
    config = {
        "checkpoint_dir": str(folder / "checkpoints"),
        "log_file": str(folder / "libraries.log"),
        "log_every_s": 30,
        "models": {"tiny": str(model)},
        "tenants": {f"client{i}": {"api_keys": [f"tml-load-{i}"]} for i in range(clients)},
        "engine": {"max_model_len": 128, "kv_cache_gb": 0.25},
    }
    (folder / "serve.yaml").write_text(json.dumps(config))
    return start_server(folder, port, folder / "serve.yaml")


class Client:
    """One SDK client with its own model and sampler, timing each call to its answer."""

    def __init__(self, url: str, index: int):
        import tinker
        from tinker import types

        self.types = types
        service = tinker.ServiceClient(base_url=url, api_key=f"tml-load-{index}")
        self.training = service.create_lora_training_client(base_model="tiny", rank=4, seed=index).result()
        self.sampler = self.training.save_weights_and_get_sampling_client().result()
        self.datum = types.Datum(
            model_input=types.ModelInput.from_ints(TOKENS[:-1]),
            loss_fn_inputs={
                "target_tokens": np.array(TOKENS[1:], dtype=np.int64),
                "weights": np.ones(len(TOKENS) - 1, np.float32),
            },
        )

    def rounds(self, count: int, latencies: dict[str, list[float]], outcome: dict[str, int], lock) -> None:
        types = self.types
        calls = {
            "forward_backward": lambda: self.training.forward_backward([self.datum], "cross_entropy"),
            "optim_step": lambda: self.training.optim_step(types.AdamParams(learning_rate=1e-3)),
            "sample": lambda: self.sampler.sample(
                types.ModelInput.from_ints(TOKENS[:5]), 2, types.SamplingParams(max_tokens=8, seed=1)
            ),
        }
        for _ in range(count):
            for kind, call in calls.items():
                with lock:
                    outcome["sent"] += 1
                start = time.monotonic()
                try:
                    call().result()
                except Exception as error:  # counted, and the client goes on as a training loop would not
                    with lock:
                        outcome["errors"] += 1
                        outcome.setdefault("first_error", f"{kind}: {type(error).__name__}: {error}"[:300])
                    continue
                with lock:
                    outcome["answered"] += 1
                    latencies[kind].append(time.monotonic() - start)


def phase(clients: list[Client], rounds: int, timeout_s: float) -> dict:
    latencies: dict[str, list[float]] = {"forward_backward": [], "optim_step": [], "sample": []}
    outcome = {"sent": 0, "answered": 0, "errors": 0}
    lock = threading.Lock()
    threads = [
        threading.Thread(target=client.rounds, args=(rounds, latencies, outcome, lock), daemon=True)
        for client in clients
    ]
    start = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, timeout_s - (time.monotonic() - start)))
    wall = time.monotonic() - start
    with lock:
        expected = len(clients) * rounds * 3
        result = {
            "clients": len(clients),
            "requests": expected,
            "wall_s": round(wall, 2),
            "requests_per_s": round(outcome["answered"] / wall, 3),
            "errors": outcome["errors"],
            "lost": expected - outcome["answered"] - outcome["errors"],
            **({"first_error": outcome["first_error"]} if "first_error" in outcome else {}),
        }
        for kind, values in latencies.items():
            ordered = sorted(values)
            result[f"{kind}_p50_ms"] = round(1000 * statistics.median(ordered), 1) if ordered else None
            result[f"{kind}_p99_ms"] = (
                round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 1) if ordered else None
            )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=10, help="rounds per client (3 requests each)")
    parser.add_argument(
        "--timeout-s", type=float, default=900.0, help="each phase's bound; what is unanswered by then is lost"
    )
    parser.add_argument("--port", type=int, default=18932)
    args = parser.parse_args()

    from rlvr.models.tiny import build_tiny_model

    folder = Path(tempfile.mkdtemp(prefix="serve_load_"))
    model = build_tiny_model(
        folder / "model", "qwen2", hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128
    )
    server = serve(folder, model, args.clients, args.port)
    try:
        start = time.monotonic()
        clients = [Client(f"http://127.0.0.1:{args.port}", i) for i in range(args.clients)]
        setup_s = time.monotonic() - start
        alone = phase(clients[:1], args.rounds, args.timeout_s)
        together = phase(clients, args.rounds, args.timeout_s)
    finally:
        server.terminate()
        server.wait(timeout=120)
    result = {
        **provenance(),
        "model": "tiny qwen2 (hidden 64, 2 layers)",
        "rounds_per_client": args.rounds,
        "setup_s": round(setup_s, 1),
        "one_client": alone,
        "all_clients": together,
        "throughput_ratio": round(together["requests_per_s"] / alone["requests_per_s"], 3),
        "server_log": [line for line in (folder / "server.log").read_text().splitlines() if "refused" in line],
    }
    write_result(args.out, result)
    append_line(
        f"`rlvr serve` under load: {args.clients} SDK clients (one tenant and LoRA model each, one base), "
        f"{args.rounds} rounds of forward_backward + optim_step + sample each: **{together['requests_per_s']} req/s** "
        f"(1 client alone: {alone['requests_per_s']} req/s; ratio {result['throughput_ratio']}); p50/p99 ms "
        f"forward_backward {together['forward_backward_p50_ms']}/{together['forward_backward_p99_ms']}, optim_step "
        f"{together['optim_step_p50_ms']}/{together['optim_step_p99_ms']}, sample {together['sample_p50_ms']}/"
        f"{together['sample_p99_ms']}; errors {together['errors']}, lost {together['lost']} (alone: {alone['errors']}, "
        f"{alone['lost']}); {args.clients} models built in {setup_s:.0f} s",
        result,
    )


if __name__ == "__main__":
    main()
