"""Sampling the calls of several LoRA adapters on one base, as `rlvr serve` does for the models of
one base: in one vLLM batch (each adapter in a LoRA slot, each request naming its own: the path
where adapters are not merged, the GPU default) against one adapter after another, on this CPU.

    flock /tmp/rlvr-heavy.lock .venv/bin/python benchmarks/lora_slots.py --out runs/bench/lora_slots.json \
        --model artifacts/smollm2/nvfp4 --adapters 4

Each adapter: rank 8 on all seven linear targets, random (benchmarks/adapter_push.py's). Each adapter's call:
--prompts prompts x --n samples of --tokens tokens each (ignore_eos, seeded). Timed, each after one
untimed pass, best of --repeats:

- slots, one batch: an engine with --adapters LoRA slots (merge_lora false), every adapter's call
  submitted at once (BaseHost.sample_many on such an engine);
- slots, one after another: the same engine, each adapter's call submitted and run to its end in turn;
- merged, one after another: an engine with merge_lora (the CPU default), each adapter merged into
  the base and reloaded (update_lora) before its call, as BaseHost switches adapters there.

Tokens/s counts the sampled tokens. The two slot timings must draw the same tokens (same seeds).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from _ledger import append_line, provenance, write_result
from adapter_push import random_adapter

ROOT = Path(__file__).resolve().parents[1]
RANK = 8
TEXTS = ["Question: What is 17 + 25?\nAnswer:", "def add(a, b):\n", "The capital of France is", "Once upon a time"]


def drain(engine, requests) -> dict:
    engine.submit(requests, ignore_eos=True)
    drawn: dict = {}
    while engine.pending:
        drawn.update(engine.poll())
    return drawn


def best(run, repeats: int) -> tuple[float, dict]:
    """The shortest of `repeats` timed runs, after an untimed one; and what the last drew."""
    drawn = run()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        drawn = run()
        times.append(time.perf_counter() - started)
    return min(times), drawn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default=str(ROOT / "artifacts" / "smollm2" / "nvfp4"), help="a model folder")
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per adapter's call (up to 4)")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt")
    parser.add_argument("--tokens", type=int, default=32, help="tokens per sample")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    if not Path(args.model, "config.json").is_file():
        raise SystemExit(f"--model {args.model}: not a model folder (make smollm2 builds the default)")

    from transformers import AutoTokenizer

    from rlvr.config import EngineConfig, ModelConfig
    from rlvr.engines import make_engine, served_folder
    from rlvr.hardware import compute_dtype
    from rlvr.models.folder import read_model_folder
    from rlvr.records import Request, Sampling

    model = ModelConfig(path=args.model)
    folder = read_model_folder(args.model)
    served = str(served_folder(folder, native_nvfp4=False).path)
    tokenizer = AutoTokenizer.from_pretrained(served)
    prompts = [tokenizer.encode(text) for text in TEXTS[: args.prompts]]
    adapters = [random_adapter(served, version, RANK) for version in range(1, args.adapters + 1)]
    sampling = Sampling(temperature=1.0, max_tokens=args.tokens, seed=3)

    def call(version: int, named: bool) -> list[Request]:
        return [
            Request((version, i), prompt, args.n, sampling, adapter=version if named else None)
            for i, prompt in enumerate(prompts)
        ]

    def tokens(drawn: dict) -> int:
        return sum(len(r.completion_ids) for rollouts in drawn.values() for r in rollouts)

    engine_cfg = dict(max_model_len=256, kv_cache_gb=0.5)
    result: dict = {
        **provenance(),
        "model": args.model,
        **{k: getattr(args, k) for k in ("adapters", "prompts", "n", "tokens")},
        "dtype": compute_dtype(model.dtype, "cpu").name,
    }
    with make_engine(
        folder,
        EngineConfig(**engine_cfg, merge_lora=False),
        dtype=model.dtype,
        seed=0,
        lora_rank=RANK,
        max_loras=args.adapters,
    ) as engine:
        for adapter in adapters:
            engine.add_lora(adapter)
        batched_s, together = best(
            lambda: drain(engine, [r for a in adapters for r in call(a.version, True)]), args.repeats
        )

        def in_turn() -> dict:
            drawn: dict = {}
            for a in adapters:
                drawn.update(drain(engine, call(a.version, True)))
            return drawn

        in_turn_s, apart = best(in_turn, args.repeats)
    same = {k: [r.completion_ids for r in v] for k, v in together.items()} == {
        k: [r.completion_ids for r in v] for k, v in apart.items()
    }
    with make_engine(
        folder, EngineConfig(**engine_cfg, merge_lora=True), dtype=model.dtype, seed=0, lora_rank=RANK
    ) as engine:
        pushes = iter(range(1000, 10**6))  # each push a new version, as every switch is

        def merged() -> dict:
            drawn: dict = {}
            for a in adapters:
                engine.update_lora(type(a)(tensors=a.tensors, config=a.config, version=next(pushes)))
                drawn.update({(a.version, k[1]): v for k, v in drain(engine, call(a.version, False)).items()})
            return drawn

        merged_s, merged_drawn = best(merged, args.repeats)
    count = tokens(together)
    result.update(
        sampled_tokens=count,
        slots_one_batch={"s": round(batched_s, 3), "tokens_per_s": round(count / batched_s, 1)},
        slots_one_after_another={"s": round(in_turn_s, 3), "tokens_per_s": round(tokens(apart) / in_turn_s, 1)},
        merged_one_after_another={"s": round(merged_s, 3), "tokens_per_s": round(tokens(merged_drawn) / merged_s, 1)},
        batched_vs_in_turn=round(in_turn_s / batched_s, 2),
        batched_vs_merged=round(merged_s / batched_s, 2),
        same_tokens_batched_and_in_turn=same,
    )
    write_result(args.out, result)
    append_line(
        f"{args.adapters} LoRA adapters' sampling calls on one base ({Path(args.model).parent.name}/"
        f"{Path(args.model).name}, {result['dtype']}, rank {RANK}, each {args.prompts} prompts x {args.n} x "
        f"{args.tokens} tokens): **one batch over {args.adapters} LoRA slots {result['slots_one_batch']['tokens_per_s']} "
        f"tokens/s** vs one adapter after another {result['slots_one_after_another']['tokens_per_s']} (x"
        f"{result['batched_vs_in_turn']}), and merged into the base one after another (the CPU default) "
        f"{result['merged_one_after_another']['tokens_per_s']} (batched x{result['batched_vs_merged']} of it); "
        f"batched and in turn drew {'the same' if same else 'DIFFERENT'} tokens",
        result,
    )


if __name__ == "__main__":
    main()
