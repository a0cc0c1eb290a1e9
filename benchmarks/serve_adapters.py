"""Two tenants' adapters on one base in `rlvr serve`: the memory the server holds, against the same
two models on two separate bases, and each adapter's training against training alone.

    flock /tmp/rlvr-heavy.lock .venv/bin/python benchmarks/serve_adapters.py --out runs/bench/serve_adapters.json \
        --model artifacts/smollm2/nvfp4

Two phases, each a fresh server with the model in its catalog and two tenants, each tenant one
LoRA model trained for --steps steps (forward_backward on its own sequence, optim_step, a
sampler saved and sampled), the two tenants' calls interleaved:

- one host: both models with seed 5, so they share the base's engine and trainer ranks;
- two hosts: tenant a's with seed 5, tenant b's with seed 6, so each loads the base for itself.

Tenant a's model trains the same sequence with the same seed in both phases: in the first beside
another tenant's adapter on the same ranks and engine, in the second alone on its own. Its
logprobs after each step must be bit-equal. Memory: the private memory (RssAnon, /proc) of the
server's process tree, the controller with its engines and every trainer rank, once both models
have trained and sampled.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
from _ledger import append_line, provenance, write_result
from _proc import status_bytes
from _serve import start_server

ROOT = Path(__file__).resolve().parents[1]
KEYS = {"a": "tml-tenant-a", "b": "tml-tenant-b"}
GB = 1e9


def tree_private_bytes(pid: int) -> int:
    """RssAnon of a process and all its descendants (private pages: a page two share is in neither)."""
    processes = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    return sum(status_bytes(p.pid).get("RssAnon", 0) for p in processes)


def run_phase(folder: Path, model: str, seeds: dict[str, int], steps: int, ranks: int, port: int) -> dict:
    import tinker
    from tinker import types

    folder.mkdir(parents=True)
    config = {
        "checkpoint_dir": str(folder / "checkpoints"),
        "log_file": str(folder / "libraries.log"),
        "log_every_s": 600,
        "models": {"base": model},
        "tenants": {name: {"api_keys": [key]} for name, key in KEYS.items()},
        "engine": {"max_model_len": 256, "kv_cache_gb": 0.5},
        "trainer": {"ranks": ranks},
    }
    (folder / "serve.yaml").write_text(json.dumps(config))
    server = start_server(folder, port, folder / "serve.yaml")
    try:
        url = f"http://127.0.0.1:{port}"
        started = time.monotonic()
        clients = {
            name: tinker.ServiceClient(base_url=url, api_key=KEYS[name]).create_lora_training_client(
                base_model="base", rank=8, seed=seeds[name]
            )
            for name in KEYS
        }
        training = {name: future.result() for name, future in clients.items()}
        built_s = time.monotonic() - started
        sequences = {"a": list(range(100, 140)), "b": list(range(300, 340))}

        def datum(tokens: list[int]):
            return types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={
                    "target_tokens": np.array(tokens[1:], dtype=np.int64),
                    "weights": np.ones(len(tokens) - 1, np.float32),
                },
            )

        def logprobs(name: str) -> list[float]:
            out = training[name].forward([datum(sequences[name])], "cross_entropy").result()
            return out.loss_fn_outputs[0]["logprobs"].tolist()

        trajectory, started = [logprobs("a")], time.monotonic()
        for _ in range(steps):
            for name in KEYS:
                training[name].forward_backward([datum(sequences[name])], "cross_entropy").result()
            for name in KEYS:
                training[name].optim_step(types.AdamParams(learning_rate=1e-3)).result()
            for name in KEYS:
                sampler = training[name].save_weights_and_get_sampling_client().result()
                prompt = types.ModelInput.from_ints(sequences[name][:8])
                sampler.sample(prompt, 2, types.SamplingParams(max_tokens=8, seed=1)).result()
            trajectory.append(logprobs("a"))
        trained_s = time.monotonic() - started
        private = tree_private_bytes(server.pid)
        log = (folder / "server.log").read_text().splitlines()
    finally:
        server.terminate()
        server.wait(timeout=120)
    return {
        "seeds": seeds,
        "hosts_loaded": sum(line.startswith("rlvr serve: loaded ") for line in log),
        "private_gb": round(private / GB, 3),
        "models_built_s": round(built_s, 1),
        "steps_s": round(trained_s, 1),
        "a_logprobs": trajectory,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default=str(ROOT / "artifacts" / "smollm2" / "nvfp4"), help="a model folder")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=2, help="trainer ranks of each host")
    parser.add_argument("--port", type=int, default=18941)
    args = parser.parse_args()
    if not Path(args.model, "config.json").is_file():
        raise SystemExit(f"--model {args.model}: not a model folder (make smollm2 builds the default)")

    folder = Path(tempfile.mkdtemp(prefix="serve_adapters_"))
    shared = run_phase(folder / "one_host", args.model, {"a": 5, "b": 5}, args.steps, args.ranks, args.port)
    apart = run_phase(folder / "two_hosts", args.model, {"a": 5, "b": 6}, args.steps, args.ranks, args.port)
    bit_equal = shared["a_logprobs"] == apart["a_logprobs"]
    moved = shared["a_logprobs"][-1] != shared["a_logprobs"][0]
    result = {
        **provenance(),
        "model": args.model,
        "steps": args.steps,
        "trainer_ranks": args.ranks,
        "one_host": {k: v for k, v in shared.items() if k != "a_logprobs"},
        "two_hosts": {k: v for k, v in apart.items() if k != "a_logprobs"},
        "memory_ratio": round(shared["private_gb"] / apart["private_gb"], 3),
        "a_bit_equal_to_alone": bit_equal,
        "a_trained": moved,
        "a_max_abs_difference": float(np.max(np.abs(np.array(shared["a_logprobs"]) - np.array(apart["a_logprobs"])))),
    }
    write_result(args.out, result)
    append_line(
        f"`rlvr serve`, two tenants' LoRA adapters (r8) on one base ({Path(args.model).parent.name}/"
        f"{Path(args.model).name}, {args.ranks} trainer ranks): the server's processes hold "
        f"**{shared['private_gb']} GB** private memory on one shared host against {apart['private_gb']} GB on two "
        f"(ratio {result['memory_ratio']}); hosts loaded {shared['hosts_loaded']} vs {apart['hosts_loaded']}; tenant "
        f"a's logprobs after each of {args.steps} steps interleaved with tenant b's "
        f"{'bit-equal' if bit_equal else 'NOT equal'} to training alone (max |diff| {result['a_max_abs_difference']})",
        result,
    )


if __name__ == "__main__":
    main()
