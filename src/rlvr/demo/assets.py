"""What `rlvr demo` builds before it trains, from the `demo:` section of its config.

1. the task: synthetic arithmetic split by seed into the train and test files the config names;
2. the model: a tiny random causal LM with a character tokenizer (rlvr.models.tiny);
3. the warm start: a supervised phase on worked answers that runs until the model can do what
   RL needs (rlvr.demo.warm_start): it answers in the verifier's format, copies operands and
   tool results, and its base accuracy lies in a window, so RL starts from rewards that are
   neither zero nor saturated; with `base_format: nvfp4` (or `nf4`) the result is then
   quantized to an NVFP4 compressed-tensors (or NF4 bitsandbytes) checkpoint, the frozen base
   LoRA trains on. What it reached is written beside the model (warm_start.json).
Each is skipped when its output already exists, so a second `make demo` goes straight to RL.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rlvr.config import ConfigError, RunConfig
from rlvr.data.datasets import is_named_source, load_problems
from rlvr.data.synthetic import arithmetic_problems, question_expression, solution_text, write_jsonl
from rlvr.demo.warm_start import warm_start_until_ready
from rlvr.envs.builtin import Calculator
from rlvr.models.tiny import build_tiny_model
from rlvr.models.tokenizer import load_tokenizer
from rlvr.quant import quantize_checkpoint
from rlvr.rollout.prompts import Renderer, encode_prompt


def ensure_demo_assets(cfg: RunConfig, console) -> dict | None:
    """Build what is missing; returns the warm start's record (warm_start.json, for summary.json),
    None where the model folder was not built by the demo."""
    spec = cfg.demo
    train_file, test_file = Path(cfg.data.train), Path(cfg.data.test or "")
    # the demo's task is written where data.train and data.test name files; a named source (a
    # built-in set, a reasoning-gym task) is used as it is, and no file is written under its name
    named = any(is_named_source(source) for source in (cfg.data.train, cfg.data.test) if source)
    if not named and (not train_file.is_file() or not test_file.is_file()):
        train, test = arithmetic_problems(seed=cfg.seed, **spec.task.model_dump())
        write_jsonl(train, train_file)
        write_jsonl(test, test_file)
        console.print(f"task: {len(train)} train / {len(test)} test problems -> {train_file.parent}")

    model_dir = Path(cfg.model.path)
    if not (model_dir / "config.json").is_file():
        _build_model(cfg, model_dir, console)
    built = json.loads((model_dir / "config.json").read_text()).get("model_type")
    if built != spec.model.arch:  # a folder built for another arch would be trained silently instead
        raise ConfigError(
            f"{model_dir} holds a {built} model, not demo.model.arch={spec.model.arch}: give the demo "
            f"its own model.path (e.g. model.path=artifacts/demo_{spec.model.arch}/model) or delete the folder"
        )
    record = _record_path(model_dir)
    return json.loads(record.read_text()) if record.is_file() else None


def _record_path(model_dir: Path) -> Path:
    return model_dir.with_name(model_dir.name + ".warm_start.json")


def _worked_example(problem, tokenizer, cfg: RunConfig, use_tool: bool) -> tuple[list[int], list[int], list[int]]:
    """(prompt ids, target ids, target loss mask) of one warm-start example: the worked answer;
    with `use_tool`, a call of the calculator, its answer (rendered as a trajectory renders it,
    masked out of the loss) and the boxed result, as the calculator environment plays it."""

    prompt = encode_prompt(problem, tokenizer, cfg.data)
    answer = tokenizer(solution_text(problem.question, problem.answer), add_special_tokens=False).input_ids
    if not use_tool:
        return prompt, answer + [tokenizer.eos_token_id], [1] * (len(answer) + 1)
    if cfg.env.name != "calculator":
        raise ValueError(f"demo.warm_start.tool_calls needs env.name: calculator, not {cfg.env.name!r}")
    expression = question_expression(problem.question)
    call = tokenizer(f"<calc>{expression}</calc>", add_special_tokens=False).input_ids  # stopped at </calc>: no EOS
    observation = Renderer(tokenizer, cfg.data).observation(
        [{"role": cfg.env.observation_role, "content": Calculator.evaluate(expression)}], ended_turn=False
    )
    final = tokenizer(f"\\boxed{{{problem.answer}}}", add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    return prompt, call + observation + final, [1] * len(call) + [0] * len(observation) + [1] * len(final)


def _build_model(cfg: RunConfig, model_dir: Path, console) -> None:

    spec = cfg.demo
    staging = model_dir.with_name(model_dir.name + ".building")
    m, w = spec.model, spec.warm_start

    def build(folder: Path, seed: int) -> None:
        build_tiny_model(
            folder,
            m.arch,
            seed=seed,
            hidden_size=m.hidden_size,
            num_layers=m.num_layers,
            num_heads=m.num_heads,
            num_kv_heads=m.num_kv_heads,
            intermediate_size=m.intermediate_size,
            max_position_embeddings=m.max_position_embeddings,
        )

    build(staging, cfg.seed)
    tokenizer = load_tokenizer(staging)
    problems = load_problems(str(cfg.data.train))
    # the check samples train rows the warm start never sees: the last check.rows of the file
    held_out = w.check.rows if w.check is not None and w.steps else 0
    if held_out >= len(problems):
        raise ConfigError(
            f"demo.warm_start.check.rows={held_out} leaves none of data.train's {len(problems)} rows "
            f"({cfg.data.train}) for the warm start"
        )
    examples = problems[: min(w.examples, len(problems) - held_out)]
    pairs = [
        _worked_example(p, tokenizer, cfg, use_tool=k < w.tool_calls * len(examples)) for k, p in enumerate(examples)
    ]
    copy_pairs = (
        [_worked_example(p, tokenizer, cfg, use_tool=True) for p in examples] if w.tool_calls and w.copy_first else None
    )
    if w.steps:
        record = warm_start_until_ready(
            cfg, build, pairs, copy_pairs, tokenizer, problems[len(problems) - held_out :], staging, console
        )
    else:
        record = {"ready": None, "steps": 0, "seed": cfg.seed}
    shutil.rmtree(model_dir, ignore_errors=True)  # a half-built folder without config.json
    if spec.base_format != "hf":
        float_dir = model_dir.with_name(model_dir.name + ".float")
        shutil.rmtree(float_dir, ignore_errors=True)
        staging.replace(float_dir)
        quantize_checkpoint(float_dir, staging, format=spec.base_format)
    _record_path(model_dir).write_text(json.dumps(record, indent=2) + "\n")
    staging.replace(model_dir)
    warm = f"warm-started {record['steps']} steps" if w.steps else "random weights"
    console.print(f"model: {m.arch} tiny, {warm}, {spec.base_format} -> {model_dir}", highlight=False)
