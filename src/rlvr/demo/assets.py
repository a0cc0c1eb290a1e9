"""What `rlvr demo` builds before it trains, from the `demo:` section of its config.

1. the task: synthetic arithmetic split by seed into the train and test files the config names;
2. the model: a tiny random causal LM with a character tokenizer (rlvr.models.tiny);
3. the warm start: a short supervised phase on boxed answers, so RL starts from rewards that
   are neither zero nor saturated; with `base_format: nvfp4` (or `nf4`) the result is then
   quantized to an NVFP4 compressed-tensors (or NF4 bitsandbytes) checkpoint, the frozen base
   LoRA trains on.
Each is skipped when its output already exists, so a second `make demo` goes straight to RL.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rlvr.config import RunConfig
from rlvr.data.datasets import is_named_source


def ensure_demo_assets(cfg: RunConfig, console) -> None:
    spec = cfg.demo
    train_file, test_file = Path(cfg.data.train), Path(cfg.data.test or "")
    # the demo's task is written where data.train and data.test name files; a named source (a
    # built-in set, a reasoning-gym task) is used as it is, and no file is written under its name
    named = any(is_named_source(source) for source in (cfg.data.train, cfg.data.test) if source)
    if not named and (not train_file.is_file() or not test_file.is_file()):
        from rlvr.data.synthetic import arithmetic_problems, write_jsonl

        train, test = arithmetic_problems(seed=cfg.seed, **spec.task.model_dump())
        write_jsonl(train, train_file)
        write_jsonl(test, test_file)
        console.print(f"task: {len(train)} train / {len(test)} test problems -> {train_file.parent}")

    model_dir = Path(cfg.model.path)
    if not (model_dir / "config.json").is_file():
        _build_model(cfg, model_dir, console)
        return
    built = json.loads((model_dir / "config.json").read_text()).get("model_type")
    if built != spec.model.arch:  # a folder built for another arch would be trained silently instead
        from rlvr.config import ConfigError

        raise ConfigError(f"{model_dir} holds a {built} model, not demo.model.arch={spec.model.arch}: give the demo "
                          f"its own model.path (e.g. model.path=artifacts/demo_{spec.model.arch}/model) or delete the folder")


def _worked_example(problem, tokenizer, cfg: RunConfig, use_tool: bool) -> tuple[list[int], list[int], list[int]]:
    """(prompt ids, target ids, target loss mask) of one warm-start example: the worked answer;
    with `use_tool`, a call of the calculator, its answer (rendered as a trajectory renders it,
    masked out of the loss) and the boxed result, as the calculator environment plays it."""
    from rlvr.data.synthetic import solution_text
    from rlvr.envs.builtin import Calculator
    from rlvr.rollout.prompts import Renderer, encode_prompt

    prompt = encode_prompt(problem, tokenizer, cfg.data)
    answer = tokenizer(solution_text(problem.question, problem.answer), add_special_tokens=False).input_ids
    if not use_tool:
        return prompt, answer + [tokenizer.eos_token_id], [1] * (len(answer) + 1)
    if cfg.env.name != "calculator":
        raise ValueError(f"demo.warm_start.tool_calls needs env.name: calculator, not {cfg.env.name!r}")
    expression = problem.question.removeprefix("What is ").split("?")[0]
    call = tokenizer(f"<calc>{expression}</calc>", add_special_tokens=False).input_ids  # stopped at </calc>: no EOS
    observation = Renderer(tokenizer, cfg.data).observation(
        [{"role": cfg.env.observation_role, "content": Calculator.evaluate(expression)}], ended_turn=False)
    final = tokenizer(f"\\boxed{{{problem.answer}}}", add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    return prompt, call + observation + final, [1] * len(call) + [0] * len(observation) + [1] * len(final)


def _build_model(cfg: RunConfig, model_dir: Path, console) -> None:
    from rich.progress import Progress
    from transformers import AutoTokenizer

    from rlvr.data.datasets import load_problems
    from rlvr.models.tiny import build_tiny_model
    from rlvr.training.sft import warm_start

    spec = cfg.demo
    staging = model_dir.with_name(model_dir.name + ".building")
    shutil.rmtree(staging, ignore_errors=True)
    m = spec.model
    build_tiny_model(
        staging,
        m.arch,
        seed=cfg.seed,
        hidden_size=m.hidden_size,
        num_layers=m.num_layers,
        num_heads=m.num_heads,
        num_kv_heads=m.num_kv_heads,
        intermediate_size=m.intermediate_size,
        max_position_embeddings=m.max_position_embeddings,
    )
    tokenizer = AutoTokenizer.from_pretrained(staging)
    problems = load_problems(str(cfg.data.train), limit=spec.warm_start.examples)
    w = spec.warm_start
    pairs = [_worked_example(p, tokenizer, cfg, use_tool=k < w.tool_calls * len(problems)) for k, p in enumerate(problems)]
    done = 0

    def advance(loss: float) -> None:
        nonlocal done
        done += 1
        bar.update(task, advance=1, description=f"warm start, loss {loss:.3f}")
        if not console.is_terminal and done % max(1, w.steps // 10) == 0:  # a log file gets a line every 10%
            console.print(f"warm start: step {done}/{w.steps}, loss {loss:.3f}", highlight=False)

    with Progress(console=console) as bar:
        task = bar.add_task(f"warm start ({len(pairs)} examples)", total=w.steps)
        losses = warm_start(staging, pairs, steps=w.steps, batch_size=w.batch_size, lr=w.lr, seed=cfg.seed,
                            pad_id=tokenizer.pad_token_id, progress=advance)
    shutil.rmtree(model_dir, ignore_errors=True)  # a half-built folder without config.json
    if spec.base_format != "hf":
        from rlvr.quant import quantize_checkpoint

        float_dir = model_dir.with_name(model_dir.name + ".float")
        shutil.rmtree(float_dir, ignore_errors=True)
        staging.replace(float_dir)
        quantize_checkpoint(float_dir, staging, format=spec.base_format)
    staging.replace(model_dir)
    warm = f"warm-started {w.steps} steps (final loss {losses[-1]:.3f})" if losses else "random weights"
    console.print(f"model: {m.arch} tiny, {warm}, {spec.base_format} -> {model_dir}")
