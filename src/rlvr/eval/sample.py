"""`rlvr eval`: sample a model (plus an optional adapter) on a dataset and score it.

Prompts come from the one encoder (rlvr.rollout.prompts) with the given `data` section, the
engine from `make_engine` (a 4-bit folder served as training serves it), and the pass itself is
`rlvr.eval.runner.evaluate`, the function the training loop evaluates with. Given a run's own
sections, it therefore renders, samples and scores exactly as the run's evaluation did.
"""

from __future__ import annotations

from pathlib import Path

from rlvr.config import DataConfig, EngineConfig, ModelConfig, RewardConfig
from rlvr.records import Sampling
from rlvr.tracking.progress import RunProgress


def evaluate_model(
    model: ModelConfig,
    engine: EngineConfig,
    data: DataConfig,
    source: str,
    *,
    reward: RewardConfig | None,
    adapter: Path | None,
    n: int,
    ks: list[int],
    sampling: Sampling,
    limit: int | None,
    seed: int,
    samples_path: Path,
    progress: RunProgress | None = None,
) -> dict:
    """`reward` None: the dataset's own verifier (built-in sets name one), else math."""
    from transformers import AutoConfig

    from rlvr.checkpoint.peft_files import load_adapter
    from rlvr.engines import make_engine
    from rlvr.eval.runner import evaluate
    from rlvr.rewards import ScoringPool
    from rlvr.models.tokenizer import load_tokenizer
    from rlvr.rollout.prompts import load_prompt_set

    prompt_set = load_prompt_set(data, source, load_tokenizer(model.path), limit=limit)
    if reward is None:
        reward = RewardConfig(verifier=prompt_set.problems[0].meta.get("verifier", "math"))
    lora = load_adapter(adapter) if adapter else None
    longest = max(map(len, prompt_set.prompts)) + sampling.max_tokens
    # room for the longest prompt and its answer, but never past what the model was built for
    # (vLLM refuses a max_model_len over the model's own; an answer then stops at that limit)
    limit = getattr(AutoConfig.from_pretrained(model.path).get_text_config(), "max_position_embeddings", None)
    max_model_len = max(engine.max_model_len, longest)
    engine = engine.model_copy(update={"max_model_len": min(max_model_len, limit) if limit else max_model_len})
    lora_rank = int(lora.config.get("r", 16)) if lora is not None else None
    with make_engine(model, engine, seed=seed, lora_rank=lora_rank) as served, ScoringPool(
        reward.verifier, workers=reward.workers, timeout_s=reward.timeout_s, memory_limit_mb=reward.memory_limit_mb,
        options=reward.options,
    ) as pool:
        if lora is not None:
            served.update_lora(lora)
        samples_path.parent.mkdir(parents=True, exist_ok=True)
        return evaluate(
            served, pool, prompt_set.problems, prompt_set.prompts, n=n, ks=ks, sampling=sampling,
            samples_path=str(samples_path), progress=progress,
        )
