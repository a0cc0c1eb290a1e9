"""`rlvr eval MODEL --dataset NAME`: sample a model (plus an optional adapter) and score it.

Starts the engine and the scoring pool, renders each problem with the prompt template, and
hands over to `rlvr.eval.runner.evaluate`, the same function the training loop evaluates with.
"""

from __future__ import annotations

from pathlib import Path

from rlvr.tracking.progress import RunProgress


def evaluate_model(
    model: str,
    dataset: str,
    *,
    adapter: Path | None = None,
    n: int,
    ks: list[int],
    temperature: float,
    max_tokens: int,
    template: str,
    verifier: str | None,
    limit: int | None,
    backend: str,
    kv_cache_gb: float,
    seed: int,
    samples_path: Path,
    progress: RunProgress | None = None,
) -> dict:
    from transformers import AutoTokenizer

    from rlvr.checkpoint.peft_files import load_adapter
    from rlvr.data.datasets import load_problems
    from rlvr.data.templates import build_prompt
    from rlvr.engines import make_engine
    from rlvr.eval.runner import evaluate
    from rlvr.records import Sampling
    from rlvr.rewards import ScoringPool

    problems = load_problems(dataset, limit=limit)
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = [tokenizer(build_prompt(p, tokenizer, template), add_special_tokens=False).input_ids for p in problems]
    lora = load_adapter(adapter) if adapter else None
    max_model_len = max(map(len, prompts)) + max_tokens
    options = dict(seed=seed, max_model_len=max_model_len, enable_lora=lora is not None, kv_cache_gb=kv_cache_gb)
    if lora is not None:
        options["max_lora_rank"] = int(lora.config.get("r", 16))
    sampling = Sampling(temperature=temperature, max_tokens=max_tokens, seed=seed)
    with make_engine(backend, model, **options) as engine, ScoringPool(
        verifier or problems[0].meta.get("verifier", "math")
    ) as pool:
        if lora is not None:
            engine.update_lora(lora)
        samples_path.parent.mkdir(parents=True, exist_ok=True)
        return evaluate(
            engine, pool, problems, prompts, n=n, ks=ks, sampling=sampling, samples_path=str(samples_path), progress=progress
        )
