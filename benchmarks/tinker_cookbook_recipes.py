"""tinker-cookbook's other recipes, unmodified, against `rlvr serve`: each one's curve and time.

    flock /tmp/rlvr-heavy.lock .venv/bin/python benchmarks/tinker_cookbook_recipes.py --recipe sl_loop \
        --out runs/bench/tinker_cookbook_sl_loop.json --model artifacts/qwen2.5-coder-0.5b/nvfp4 \
        --set trainer.gradient_checkpointing=true

The recipes, as tinker-cookbook 0.6.1 ships them (`python -m MODULE key=value ...`, their own
options only):

- `sl_loop` (recipes/sl_loop.py, the minimal supervised loop): cross-entropy on chat data,
  linear learning-rate decay; the curve is each step's train_mean_nll.
- `rl_loop` (recipes/rl_loop.py, the minimal RL loop): GSM8K with a one-shot prefix, reward 1 for
  the right \\boxed{} number, GRPO-centred advantages; the curve is each step's reward.
  `loss_fn=importance_sampling`: its default, stable_reinforce, is not served.
- `sl_basic` (recipes/sl_basic.py, the supervised recipe on the cookbook's train loop): its own
  `dataset_builder` option swapped to FromConversationFileBuilder on the cookbook's own
  example_data/conversations.jsonl, as the recipe's comment shows; the curve is train_mean_nll.
- `distillation` (recipes/distillation/on_policy_distillation.py, dataset=deepmath): the student
  samples, the teacher scores the samples (compute_logprobs), the loss is their reverse KL; the
  curve is teacher_kl. The teacher is the served base itself (the recipe's `teacher_model`).

Offline. The hub is out of reach, so each dataset the recipe loads by name is put into the
`datasets` library's own cache (HF_HOME in the run's folder, HF_HUB_OFFLINE=1), from which
`load_dataset` answers as it would after a download:
- `openai/gsm8k` (rl_loop): the real rows, openai/grade-school-math's train and test files (the
  hub's copy is the same 7473 + 1319 rows), as rlvr ships them.
- `HuggingFaceH4/no_robots` (sl_loop): a STAND-IN, as no copy of No Robots is here and the
  recipe takes no dataset option: GSM8K's train set as chats (the question as the user's turn,
  the worked answer as the assistant's), in No Robots' `messages` layout.
- `zwhe99/DeepMath-103K` (distillation): ROLL's 4994-row subset of DeepMath-103K (rlvr's
  deepmath5k), its `prompt` as the dataset's `question`.

The model's name. sl_loop, rl_loop and sl_basic pick their renderer from the cookbook's table of
known models by `model_name` (and take no renderer option), and the table has no Qwen2.5. So the
served base is put in the catalog under CATALOG_NAME, a known model whose renderer
(`qwen3_instruct`: ChatML, stopping on `<|im_end|>`) is the 0.5B's own chat format, and the
recipe runs in a folder where that name is a link to the model's folder, so that the tokenizer
the recipe loads by that name is the served model's own (offline, a folder is what it loads).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tinker_cookbook
from _cookbook import planned, quarters, run_recipe, served_arguments, serving
from _ledger import append_line, provenance, write_result

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "src/rlvr/datasets"
CATALOG_NAME = "Qwen/Qwen3-4B-Instruct-2507"
RENDERER = "qwen3_instruct"
EXAMPLE_CONVERSATIONS = Path(tinker_cookbook.__file__).parent / "example_data/conversations.jsonl"


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def gsm8k_chats() -> list[dict]:
    return [
        {"messages": [{"role": "user", "content": r["question"]}, {"role": "assistant", "content": r["answer"]}]}
        for r in jsonl(DATA / "gsm8k_train.jsonl")
    ]


# name on the hub -> (config, split -> rows): what each recipe loads, from what is here
HUB_DATA: dict[str, Callable[[], tuple[str, dict[str, list[dict]]]]] = {
    "openai/gsm8k": lambda: (
        "main",
        {"train": jsonl(DATA / "gsm8k_train.jsonl"), "test": jsonl(DATA / "gsm8k_test.jsonl")},
    ),
    "HuggingFaceH4/no_robots": lambda: ("default", {"train": gsm8k_chats()}),
    "zwhe99/DeepMath-103K": lambda: (
        "default",
        {"train": [{"question": r["prompt"]} for r in jsonl(DATA / "deepmath_roll_5k.jsonl")]},
    ),
}


def offline_hub(folder: Path, repo: str) -> dict[str, str]:
    """`repo`'s rows in a `datasets` cache under FOLDER/hf, laid out as load_dataset(repo, config)
    leaves a download; the environment that makes the recipe read it there and nowhere else."""
    import datasets

    config, splits = HUB_DATA[repo]()
    cache = folder / "hf" / "datasets"
    work = Path(tempfile.mkdtemp(dir=folder))
    files = {}
    for split, rows in splits.items():
        files[split] = str(work / f"{split}.jsonl")
        Path(files[split]).write_text("".join(json.dumps(row) + "\n" for row in rows))
    builder = datasets.load_dataset_builder("json", data_files=files, cache_dir=str(work / "cache"))
    builder.download_and_prepare()
    built = Path(builder.cache_dir)
    info = json.loads((built / "dataset_info.json").read_text())
    (built / "dataset_info.json").write_text(json.dumps({**info, "config_name": config}))
    *namespace, name = repo.split("/")
    stem = datasets.naming.camelcase_to_snakecase(name)
    # the cache's layout: NAMESPACE___NAME/CONFIG/VERSION/HASH/NAME-SPLIT.arrow
    target = cache / "___".join([*namespace, stem]) / config / built.parts[-2] / built.parts[-1]
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(built), str(target))
    for arrow in target.glob("json-*.arrow"):
        arrow.rename(target / arrow.name.replace("json", stem, 1))
    shutil.rmtree(work)
    return {"HF_HOME": str(folder / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@dataclass(frozen=True)
class Recipe:
    module: str
    hub: str | None  # the dataset it loads by name, None: a file it is given
    data: str  # what that dataset is here, as the ledger says it
    curve: str  # the metric the curve follows
    options: Callable[[argparse.Namespace], list[str]]
    serve: tuple[str, ...] = ()  # served-config keys it needs


RECIPES = {
    "sl_loop": Recipe(
        "tinker_cookbook.recipes.sl_loop",
        "HuggingFaceH4/no_robots",
        "GSM8K's train set as chats, standing in for HuggingFaceH4/no_robots",
        "train_mean_nll",
        lambda a: [f"batch_size={a.batch}", f"learning_rate={a.lr}", "max_length=512", "save_every=0"],
    ),
    "rl_loop": Recipe(
        "tinker_cookbook.recipes.rl_loop",
        "openai/gsm8k",
        "openai/gsm8k (grade-school-math's own train file)",
        "reward/total",
        lambda a: [
            f"batch_size={a.batch}",
            f"group_size={a.group_size}",
            f"learning_rate={a.lr}",
            f"max_tokens={a.max_tokens}",
            "loss_fn=importance_sampling",
            "save_every=0",
        ],
        ("engine.max_model_len=640",),  # the one-shot prompt and a question, then max_tokens
    ),
    "sl_basic": Recipe(
        "tinker_cookbook.recipes.sl_basic",
        None,
        "the cookbook's example_data/conversations.jsonl (128 chats)",
        "train_mean_nll",
        lambda a: [
            "dataset_builder=tinker_cookbook.supervised.data:FromConversationFileBuilder",
            f"dataset_builder.file_path={EXAMPLE_CONVERSATIONS}",
            f"dataset_builder.common_config.model_name_for_tokenizer={CATALOG_NAME}",
            f"dataset_builder.common_config.renderer_name={RENDERER}",
            f"dataset_builder.common_config.batch_size={a.batch}",
            "dataset_builder.common_config.max_length=512",
            "dataset_builder.common_config.train_on_what=all_assistant_messages",
            f"learning_rate={a.lr}",
            "eval_every=0",
            "save_every=0",
        ],
    ),
    "distillation": Recipe(
        "tinker_cookbook.recipes.distillation.on_policy_distillation",
        "zwhe99/DeepMath-103K",
        "ROLL's 4994-question subset of zwhe99/DeepMath-103K",
        "teacher_kl",
        lambda a: [
            f"teacher_model={CATALOG_NAME}",
            "dataset=deepmath",
            f"renderer_name={RENDERER}",
            f"groups_per_batch={a.batch}",
            f"group_size={a.group_size}",
            f"learning_rate={a.lr}",
            f"max_tokens={a.max_tokens}",
            "eval_every=0",
            "save_every=0",
            "behavior_if_log_dir_exists=delete",
        ],
        ("engine.max_model_len=640",),
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", choices=sorted(RECIPES), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default=str(ROOT / "artifacts/qwen2.5-coder-0.5b/nvfp4"))
    parser.add_argument("--steps", type=int, default=12, help="max_steps")
    parser.add_argument("--batch", type=int, default=8, help="sequences (sl) or prompts (rl) a step")
    parser.add_argument("--group-size", type=int, default=4, help="samples a prompt (rl_loop, distillation)")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--max-tokens", type=int, default=256, help="sampled tokens (rl_loop, distillation)")
    args = served_arguments(parser, port=18932)
    recipe = RECIPES[args.recipe]
    options = [
        f"model_name={CATALOG_NAME}",
        f"lora_rank={args.rank}",
        f"max_steps={args.steps}",
        *recipe.options(args),
    ]
    settings = [*recipe.serve, *args.settings]
    with serving(
        f"tinker_cookbook_{args.recipe}_", args.port, {CATALOG_NAME: args.model}, args.alpha, settings
    ) as served:
        plan_rank, _, dtype = planned(served.config, args.model, args.rank)
        named = served.folder / CATALOG_NAME
        named.parent.mkdir(parents=True)
        named.symlink_to(Path(args.model).resolve())
        env = offline_hub(served.folder, recipe.hub) if recipe.hub else {"HF_HUB_OFFLINE": "1"}
        wall, logged = run_recipe(served, recipe.module, options, env=env)
        memory = served.memory_result()
        server_log = served.server_lines()
    steps = [s for s in logged if recipe.curve in s]
    curve = [round(s[recipe.curve], 4) for s in steps]
    result = {
        **provenance(),
        "recipe": args.recipe,
        "module": recipe.module,
        "options": options,
        "dataset": recipe.data,
        "model": args.model,
        "catalog_name": CATALOG_NAME,
        "curve_metric": recipe.curve,
        "curve": curve,
        "quarters": quarters(curve),
        "steps": len(curve),
        "wall_s": round(wall, 1),
        "s_per_step": round(wall / max(1, len(curve)), 1),
        "served_settings": settings,
        "compute_dtype": dtype,
        **memory,
        "plan_rank_gb": round(plan_rank / 1e9, 3),
        "server_log": server_log,
    }
    write_result(args.out, result)
    q = result["quarters"]
    append_line(
        f"tinker-cookbook {args.recipe} ({recipe.module}), unmodified, against `rlvr serve` ({Path(args.model).parent.name} "
        f"{Path(args.model).name}, {dtype}, LoRA r{args.rank}, data {result['dataset']}, lr {args.lr:g}): {recipe.curve} "
        f"**{q['first_quarter']:.3f} -> {q['last_quarter']:.3f}** (first vs last quarter of {len(curve)} steps, "
        f"{q['rise']:+.3f} +- {q['se']:.3f}); {wall:.0f} s ({result['s_per_step']} s a step); peak private memory: trainer "
        f"rank {max(result['rank_peak_private_gb'], default=0):.2f} GB, server process {result['server_peak_private_gb']:.2f} GB",
        result,
    )


if __name__ == "__main__":
    main()
