"""The pure pieces of benchmarks/vs_trl.py: the statistics it reports, the mapping of rlvr's
config onto TRL's GRPOConfig, and the prompts TRL is given (token for token rlvr's own)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from rlvr.config import load_config
from rlvr.models.tiny import build_char_tokenizer
from rlvr.rollout.prompts import encode_prompt
from rlvr.rollout.sampler import EpochSampler

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
_spec = importlib.util.spec_from_file_location("vs_trl", ROOT / "benchmarks" / "vs_trl.py")
vs_trl = importlib.util.module_from_spec(_spec)
sys.modules["vs_trl"] = vs_trl  # registered before it runs, as its dataclasses need
_spec.loader.exec_module(vs_trl)
from _trl_side import trl_config_kwargs  # noqa: E402


def bench_config(tmp_path, *extra):
    overrides = vs_trl.bench_overrides(str(tmp_path), str(tmp_path / "run"), 8, 16, 8, 256, 4, list(extra))
    return load_config(ROOT / "configs" / "demo.yaml", overrides)


def test_median_and_time_to_target():
    assert vs_trl.median_step_seconds([3.0, 1.0, 2.0, 10.0]) == 2.5
    with pytest.raises(ValueError):
        vs_trl.median_step_seconds([])
    steps = [1.0, 2.0, 3.0, 4.0]
    curve = {0: 0.30, 2: 0.38, 4: 0.45}
    assert vs_trl.time_to_target(steps, curve, 0.30) == 0.0  # the base model already there
    assert vs_trl.time_to_target(steps, curve, 0.35) == 3.0  # first reached at step 2: steps 1 + 2
    assert vs_trl.time_to_target(steps, curve, 0.45) == 10.0
    assert vs_trl.time_to_target(steps, curve, 0.46) is None
    assert vs_trl.time_to_target(steps, {4: 0.5, 2: 0.5}, 0.5) == 3.0  # evaluations in step order


def test_default_target_is_halfway_to_the_lower_final():
    assert vs_trl.default_target(0.30, 0.50, 0.40) == 0.35
    assert vs_trl.default_target(0.30, 0.40, 0.50) == 0.35


def test_overrides_keep_the_demo_settings_and_evaluate_outside_the_run(tmp_path):
    cfg = bench_config(tmp_path, "trainer.lr=1e-3")
    assert cfg.data.test is None and cfg.demo.base_format == "hf"
    assert cfg.rollout.prompts_per_step == 16 and cfg.rollout.samples_per_prompt == 8
    assert cfg.rollout.sampling.max_tokens == 256 and cfg.engine.max_model_len == 128 + 256
    assert cfg.checkpoint.every == 4 and cfg.checkpoint.keep == 8
    assert cfg.trainer.lr == 1e-3  # an extra override wins


@pytest.mark.parametrize("generation", ["vllm", "generate"])
def test_trl_config_matches_rlvr_step(tmp_path, generation):
    from trl import GRPOConfig

    cfg = bench_config(tmp_path)
    args = GRPOConfig(
        **trl_config_kwargs(cfg, steps=8, output_dir=str(tmp_path / "trl"), threads=2, generation=generation)
    )
    assert args.per_device_train_batch_size == 16 * 8 and args.num_generations == 8
    assert args.generation_batch_size == 128 and args.steps_per_generation == 1 and args.num_iterations == 1
    assert args.max_completion_length == 256 and args.temperature == 1.0 and args.top_p == 1.0 and args.top_k == 0
    assert args.loss_type == "dapo" and args.scale_rewards == "group" and args.beta == 0.0
    assert args.epsilon == 0.2 and args.epsilon_high == 0.2
    assert args.learning_rate == cfg.trainer.lr == 2e-3 and args.lr_scheduler_type == cfg.trainer.schedule == "cosine"
    assert args.max_grad_norm == 1.0 and args.max_steps == 8 and not args.shuffle_dataset
    assert args.use_cpu and not args.bf16 and not args.gradient_checkpointing
    assert args.use_vllm == (generation == "vllm") and args.vllm_mode == "colocate"
    # rlvr's engine context, and no importance-sampling correction, as rlvr's step has none
    assert args.vllm_max_model_length == cfg.engine.max_model_len and not args.vllm_importance_sampling_correction


def test_trl_mapping_refuses_settings_it_does_not_cover(tmp_path):
    cfg = bench_config(tmp_path, "algorithm.kl=k3", "algorithm.kl_coef=0.01")
    with pytest.raises(ValueError, match="TRL mapping"):
        trl_config_kwargs(cfg, steps=8, output_dir=str(tmp_path), threads=2, generation="vllm")
    cfg = bench_config(tmp_path, "trainer.warmup_steps=2")
    with pytest.raises(ValueError, match="without warm-up"):
        trl_config_kwargs(cfg, steps=8, output_dir=str(tmp_path), threads=2, generation="vllm")
    cfg = bench_config(tmp_path, "algorithm.tis_cap=2.0")
    with pytest.raises(ValueError, match="off-policy corrections"):
        trl_config_kwargs(cfg, steps=8, output_dir=str(tmp_path), threads=2, generation="vllm")


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
def test_trl_steps_through_the_same_learning_rates(tmp_path, schedule):
    from transformers import get_scheduler

    from rlvr.training.worker import lr_factor

    cfg = bench_config(tmp_path, f"trainer.schedule={schedule}")
    kwargs = trl_config_kwargs(cfg, steps=8, output_dir=str(tmp_path), threads=2, generation="vllm")
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=kwargs["learning_rate"])
    trl = get_scheduler(
        kwargs["lr_scheduler_type"], optimizer, num_warmup_steps=kwargs["warmup_steps"], num_training_steps=8
    )
    for step in range(8):
        assert trl.get_last_lr()[0] == pytest.approx(
            kwargs["learning_rate"] * lr_factor(cfg.trainer, 8, step), abs=1e-12
        )
        optimizer.step()
        trl.step()


@pytest.mark.parametrize("chat", [True, False])
def test_trl_gets_rlvr_prompts_in_rlvr_order(tmp_path, chat):
    from rlvr.data.datasets import load_problems
    from rlvr.data.synthetic import arithmetic_problems, write_jsonl

    train, _ = arithmetic_problems(seed=0, operations=["+"], min_digits=1, max_digits=2, train_size=50, test_size=5)
    write_jsonl(train, tmp_path / "task" / "train.jsonl")
    cfg = bench_config(tmp_path, f"data.chat_template={str(chat).lower()}", "rollout.prompts_per_step=4")
    tokenizer = build_char_tokenizer()
    rows = vs_trl.prompt_rows(cfg, tokenizer, steps=3)
    problems = load_problems(cfg.data.train)
    order = EpochSampler(len(problems), cfg.seed).take(12)
    assert [r["answer"] for r in rows] == [problems[i].answer for i in order]
    for row, i in zip(rows, order):
        # what TRL tokenizes: the chat template applied to the messages, or the string as it is
        if chat:
            ids = tokenizer.apply_chat_template(
                row["prompt"], add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
        else:
            ids = tokenizer(text=[row["prompt"]])["input_ids"][0]
        assert ids == encode_prompt(problems[i], tokenizer, cfg.data)


def test_scaling_points_double_one_axis_at_a_time():
    points = vs_trl.scaling_points(16, 8, 64, doublings=2)
    assert points[0] == {"axis": "base", "prompts": 16, "samples": 8, "max_tokens": 64}
    assert [(p["axis"], p["prompts"], p["samples"], p["max_tokens"]) for p in points[1:]] == [
        ("prompts", 32, 8, 64),
        ("prompts", 64, 8, 64),
        ("samples", 16, 16, 64),
        ("samples", 16, 32, 64),
        ("max_tokens", 16, 8, 128),
        ("max_tokens", 16, 8, 256),
    ]


def test_held_out_set_extends_the_demo_test_split_and_keeps_its_train_split(tmp_path):
    from rlvr.data.datasets import load_problems
    from rlvr.data.synthetic import arithmetic_problems, write_jsonl

    cfg = load_config("configs/demo.yaml", [f"data.train={tmp_path}/train.jsonl"])
    train, test = arithmetic_problems(seed=cfg.seed, **cfg.demo.task.model_dump())
    write_jsonl(train, tmp_path / "train.jsonl")
    held_out = load_problems(vs_trl.held_out_file(cfg, 300, vs_trl.WORKLOADS["demo"]))
    assert len(held_out) == 300
    assert [p.question for p in held_out[: len(test)]] == [p.question for p in test]
    assert not {p.question for p in held_out} & {p.question for p in train}
    write_jsonl(train[1:], tmp_path / "train.jsonl")  # not the seeded draw: refused, not silently mixed
    with pytest.raises(SystemExit, match="not the seeded draw"):
        vs_trl.held_out_file(cfg, 400, vs_trl.WORKLOADS["demo"])


def test_length_summary_uses_nearest_rank_percentiles():
    summary = vs_trl.length_summary([[10, 20, 30, 40, 50, 60, 70, 80, 90, 400]])
    assert summary == {"count": 10, "mean": 85, "p50": 50, "p90": 90, "max": 400}


def test_length_summary_takes_each_steps_percentiles_as_rlvrs_metrics_do():
    # pooled, p90 would be 300 (the 9th of 10); per step 40 and 400, the median over steps 220
    summary = vs_trl.length_summary([[10, 20, 30, 40, 30], [100, 200, 300, 400, 300]])
    assert summary == {"count": 10, "mean": 143, "p50": 165, "p90": 220, "max": 400}


def test_longtail_workload_draws_the_counting_task_and_extends_its_test_split(tmp_path):
    from rlvr.data.datasets import load_problems

    workload = vs_trl.WORKLOADS["longtail"]
    overrides = vs_trl.bench_overrides(
        str(tmp_path), str(tmp_path / "run"), 8, 16, 8, workload.max_tokens, 4, list(workload.overrides)
    )
    cfg = load_config(ROOT / "configs" / "demo.yaml", overrides + [f"data.test={tmp_path}/task/test.jsonl"])
    vs_trl.ensure_task(cfg, workload)
    train = load_problems(cfg.data.train)
    assert len(train) == cfg.demo.task.train_size and all("*" in p.question for p in train)
    assert cfg.rollout.sampling.max_tokens == 512 and cfg.engine.max_model_len == 128 + 512
    held_out = load_problems(vs_trl.held_out_file(cfg, 150, workload))
    assert len(held_out) == 150 and not {p.question for p in held_out} & {p.question for p in train}
    assert [p.question for p in held_out[:100]] == [p.question for p in load_problems(cfg.data.test)]


def test_paired_difference_and_its_standard_error():
    paired = vs_trl.paired_difference([0.30, 0.25, 0.20], [0.26, 0.27, 0.19])
    assert paired["differences"] == pytest.approx([0.04, -0.02, 0.01])
    # differences' mean 0.01, sample std sqrt((0.03² + 0.03² + 0) / 2) = 0.03, over sqrt(3)
    assert paired["mean"] == pytest.approx(0.01) and paired["se"] == pytest.approx(0.03 / 3**0.5)
    assert vs_trl.paired_difference([0.3], [0.2])["se"] is None  # one seed: no noise estimate
    with pytest.raises(ValueError):
        vs_trl.paired_difference([0.3, 0.2], [0.2])


def test_seed_summary_reads_per_seed_results_as_written_to_json():
    def run(base, rlvr, trl, step_ratio):
        # as json.loads gives it back: the curves' step keys are strings
        curves = {"rlvr": {"0": base, "4": rlvr[0], "8": rlvr[1]}, "trl": {"0": base, "4": trl[0], "8": trl[1]}}
        return {
            "step_ratio": step_ratio,
            "rlvr_step_s": 1.0,
            "trl_step_s": step_ratio,
            "base_avg8": base,
            "rlvr_avg8_after": rlvr[1],
            "trl_avg8_after": trl[1],
            "steps": 8,
            "avg8_curves": curves,
            "step_seconds": {"rlvr": [1.0] * 8, "trl": [step_ratio] * 8},
        }

    per_seed = {1: run(0.10, (0.20, 0.30), (0.12, 0.20), 4.0), 0: run(0.10, (0.11, 0.20), (0.15, 0.30), 6.0)}
    summary = vs_trl.seed_summary({s: json.loads(json.dumps(r)) for s, r in per_seed.items()}, target=None)
    assert summary["seeds"] == [0, 1]
    assert summary["step_ratio"] == 5.0 and summary["rlvr_avg8_after"] == 0.25 and summary["trl_avg8_after"] == 0.25
    assert summary["paired_diff"] == pytest.approx(0.0) and summary["paired_se"] == pytest.approx(0.1)
    assert summary["within_paired_noise"]
    # one target for every seed: halfway from the mean base 0.10 to the lower mean final 0.25
    assert summary["target_avg8"] == 0.175
    # seed 0: rlvr reaches 0.175 at step 8 (8 x 1 s), TRL never before step 8 either (8 x 6 s);
    # seed 1: rlvr at step 4 (4 x 1 s), TRL at step 8 (8 x 4 s)
    assert summary["rlvr_time_to_target_s"] == [8.0, 4.0] and summary["trl_time_to_target_s"] == [48.0, 32.0]


def test_seeds_vary_the_run_on_the_one_model_and_task(tmp_path):
    from rlvr.data.synthetic import arithmetic_problems, write_jsonl

    train, _ = arithmetic_problems(seed=0, operations=["+"], min_digits=1, max_digits=2, train_size=50, test_size=5)
    write_jsonl(train, tmp_path / "task" / "train.jsonl")
    overrides = vs_trl.bench_overrides(str(tmp_path), str(tmp_path / "run"), 3, 4, 8, 256, 1, [])
    built = load_config(ROOT / "configs" / "demo.yaml", overrides)
    seeded = {
        s: load_config(ROOT / "configs" / "demo.yaml", vs_trl.seed_run_overrides(overrides, str(tmp_path / "run"), s))
        for s in (0, 1)
    }
    tokenizer = build_char_tokenizer()
    orders = {}
    for s, cfg in seeded.items():
        assert cfg.seed == s and cfg.run_dir == str(tmp_path / "run" / f"seed{s}")
        assert (cfg.model.path, cfg.data.train, cfg.demo) == (built.model.path, built.data.train, built.demo)
        assert trl_config_kwargs(cfg, 3, str(tmp_path), 2, "vllm")["seed"] == s  # TRL's sampling and LoRA init too
        orders[s] = [row["answer"] for row in vs_trl.prompt_rows(cfg, tokenizer, steps=3)]
    assert orders[0] != orders[1]  # each seed draws its own prompt order, given to both sides


def test_accuracy_by_count_buckets_held_out_samples_by_steps(tmp_path):
    from rlvr.data.synthetic import counting_question, write_jsonl
    from rlvr.records import Problem

    problems = [
        Problem(id=f"p{b}", question=counting_question(5, 3, b), answer=str(5 + 3 * b)) for b in (1, 2, 4, 7, 20)
    ]
    write_jsonl(problems, tmp_path / "test.jsonl")
    rewards = {"p1": [1, 1], "p2": [1, 0], "p4": [0, 0], "p7": [1, 0], "p20": [0, 0]}
    (tmp_path / "run.jsonl").write_text(
        "".join(json.dumps({"problem_id": pid, "reward": float(r)}) + "\n" for pid, rs in rewards.items() for r in rs)
    )
    table = vs_trl.accuracy_by_count(str(tmp_path / "test.jsonl"), tmp_path, ["run"])
    assert table == {"run": {"b=1": 1.0, "b=2": 0.5, "b=3-4": 0.0, "b=5-8": 0.5, "b=17-32": 0.0}}  # no b in 9-16


def test_the_real_model_workload_starts_from_the_gsm8k_recipe(tmp_path):
    """gsm8k_qwen: the recipe's model, data and sampling, its float folder, every group trained
    (TRL has no dynamic sampling), evaluated by avg@8; TRL gets the same step."""
    workload = vs_trl.WORKLOADS["gsm8k_qwen"]
    overrides = vs_trl.bench_overrides(
        str(tmp_path), str(tmp_path / "run"), 2, 8, 8, 400, 2, list(workload.overrides), workload
    )
    cfg = load_config(ROOT / workload.config, overrides)
    recipe = load_config(ROOT / workload.config)
    assert cfg.model.path == f"{tmp_path}/hf" and cfg.data.train == recipe.data.train == "gsm8k_train"
    assert cfg.data.test is None and recipe.data.test == "gsm8k"
    assert cfg.engine.max_model_len == recipe.data.max_prompt_tokens + 400
    assert not cfg.rollout.dynamic_sampling and cfg.eval.n == 8 and 8 in cfg.eval.k
    args = trl_config_kwargs(cfg, 2, str(tmp_path / "trl"), 2, "vllm", micro_batch=workload.trl_micro_batch)
    assert (
        args["temperature"] == recipe.rollout.sampling.temperature == 0.7 and args["learning_rate"] == recipe.trainer.lr
    )
    # 64 completions generated at once, trained 2 at a time into one optimizer step
    assert args["per_device_train_batch_size"] == 2 and args["gradient_accumulation_steps"] == 32
    assert args["steps_per_generation"] == 32
    from trl import GRPOConfig

    assert GRPOConfig(**args).generation_batch_size == 64
