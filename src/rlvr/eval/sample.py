"""`rlvr eval`: sample a model (plus an optional adapter) on a dataset and score it.

Prompts come from the one encoder (rlvr.rollout.prompts) with the given `data` section, the
engine from `make_engine` (a 4-bit folder served as training serves it), and the pass itself is
`rlvr.eval.runner.evaluate`, the function the training loop evaluates with. Given a run's own
sections, it therefore renders, samples and scores exactly as the run's evaluation did.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rlvr.checkpoint.peft_files import load_adapter
from rlvr.config import DataConfig, EngineConfig, ModelConfig, RewardConfig
from rlvr.engines import make_engine
from rlvr.eval.runner import evaluate
from rlvr.models.folder import read_model_folder
from rlvr.models.tokenizer import load_tokenizer
from rlvr.records import Sampling
from rlvr.rewards import ScoringPool
from rlvr.rollout.prompts import engine_context, load_prompt_set
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
    answers_fill_model: bool = False,
) -> dict:
    """`reward` None: the dataset's own verifier (built-in sets name one), else math. `answers_fill_model`:
    `sampling.max_tokens` is at most what the model's positions leave after the longest prompt
    (`rlvr eval MODEL` with no --max-tokens, on a model shorter than its default answer)."""

    folder = read_model_folder(model.path)
    prompt_set = load_prompt_set(data, source, load_tokenizer(model.path), limit=limit)
    if reward is None:
        reward = RewardConfig(verifier=prompt_set.problems[0].meta.get("verifier", "math"))
    lora = load_adapter(adapter) if adapter else None
    positions = folder.max_positions
    if answers_fill_model and positions is not None:
        room = positions - prompt_set.longest()[1]
        sampling = replace(sampling, max_tokens=max(1, min(sampling.max_tokens, room)))
    # one answer per prompt (env None): evaluate() samples no later turns
    context = engine_context(
        [prompt_set],
        max_tokens=sampling.max_tokens,
        env=None,
        max_model_len=engine.max_model_len,
        positions=positions,
        model=model.path,
    )
    engine = engine.model_copy(update={"max_model_len": context})
    lora_rank = int(lora.config.get("r", 16)) if lora is not None else None
    with (
        make_engine(folder, engine, dtype=model.dtype, seed=seed, lora_rank=lora_rank) as served,
        ScoringPool(
            reward.verifier,
            workers=reward.workers,
            timeout_s=reward.timeout_s,
            memory_limit_mb=reward.memory_limit_mb,
            options=reward.options,
        ) as pool,
    ):
        if lora is not None:
            served.update_lora(lora)
        samples_path.parent.mkdir(parents=True, exist_ok=True)
        return evaluate(
            served,
            pool,
            prompt_set.problems,
            prompt_set.prompts,
            n=n,
            ks=ks,
            sampling=sampling,
            samples_path=str(samples_path),
            progress=progress,
        )
