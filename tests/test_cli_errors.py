"""Every user error ends in one line naming its cause and exit code 2, with no traceback;
--debug shows the traceback. The cases a new user meets first: a model path that is wrong in
each way it can be, bad data, a bad config, a full disk."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlvr.models.tiny import build_tiny_model


def rlvr(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlvr.cli", *map(str, args)], capture_output=True, text=True, timeout=300, cwd=cwd
    )


def one_line_error(done: subprocess.CompletedProcess) -> str:
    output = (done.stdout + done.stderr).strip()
    assert done.returncode == 2, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    lines = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, output[-3000:]
    return lines[0]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build_tiny_model(
        tmp_path_factory.mktemp("m") / "tiny", "qwen2", hidden_size=64, num_layers=1, intermediate_size=128
    )


@pytest.fixture
def config(tmp_path, tiny) -> Path:
    """The demo config pointed at the tiny model and a two-row task in tmp_path."""
    rows = [{"problem": "1+1", "answer": "2"}, {"problem": "2+2", "answer": "4"}]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = yaml.safe_load(open("configs/demo.yaml"))
    cfg.pop("demo")
    cfg.update(run_dir=str(tmp_path / "run"), steps=1)
    cfg["model"]["path"] = str(tiny)
    cfg["data"] = {"train": str(tmp_path / "train.jsonl")}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def model_folder_variant(tiny: Path, tmp_path: Path, variant: str) -> Path:
    folder = tmp_path / variant
    if variant == "missing":
        return folder
    if variant == "gguf":
        folder.with_suffix(".gguf").write_bytes(b"GGUF\x03\x00\x00\x00")
        return folder.with_suffix(".gguf")
    shutil.copytree(tiny, folder)
    if variant == "no_config":
        (folder / "config.json").unlink()
    elif variant == "no_tokenizer":
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
            (folder / name).unlink(missing_ok=True)
    elif variant == "unknown_architecture":
        config = json.loads((folder / "config.json").read_text()) | {"model_type": "qwen9_hyper"}
        (folder / "config.json").write_text(json.dumps(config))
    elif variant == "damaged_weights":
        (folder / "model.safetensors").write_bytes(b"\xff" * 64)
    elif variant == "no_weights":
        (folder / "model.safetensors").unlink()
    return folder


MODEL_CASES = {
    "missing": "no such file or folder",
    "gguf": "a GGUF file, not a model folder; convert it first: rlvr import",
    "no_config": "not a Hugging Face model folder (no config.json)",
    "no_tokenizer": "no tokenizer files",
    "unknown_architecture": "model_type 'qwen9_hyper' is not an architecture transformers",
    "damaged_weights": "unreadable safetensors file",
    "no_weights": "no weights (*.safetensors)",
}


@pytest.mark.parametrize("variant", list(MODEL_CASES))
def test_a_bad_model_path_is_one_line_naming_it(tmp_path, tiny, config, variant):
    path = model_folder_variant(tiny, tmp_path, variant)
    line = one_line_error(rlvr("train", config, f"model.path={path}"))
    assert MODEL_CASES[variant] in line and (str(path) in line or "config.json" in line), line


def test_rlvr_eval_checks_the_model_folder_too(tmp_path, tiny):
    path = model_folder_variant(tiny, tmp_path, "no_config")
    line = one_line_error(rlvr("eval", path, "--dataset", "gsm8k"))
    assert f"MODEL={path}: not a Hugging Face model folder" in line


def test_bad_data_names_file_line_and_field(tmp_path, config):
    (tmp_path / "train.jsonl").write_text('{"problem": "1+1", "answer": "2"}\n{"problem": "2+2"}\n')
    line = one_line_error(rlvr("train", config))
    assert f"{tmp_path / 'train.jsonl'}:2" in line and "answer" in line, line


def test_bad_config_names_the_key(config):
    line = one_line_error(rlvr("train", config, "trainer.lrr=1e-3"))
    assert "unknown key 'trainer.lrr'; did you mean trainer.lr?" in line


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "engine.replicas=2",
            "rollout.mode=async streams from one engine; engine.replicas=2 runs mode: sync or one_step_off",
        ),
    ],
)
def test_what_async_mode_cannot_stream_is_refused_in_one_line(config, override, message):
    line = one_line_error(rlvr("train", config, "rollout.mode=async", "rollout.max_staleness=2", override))
    assert message in line, line


def test_resume_of_a_folder_that_is_not_a_run(tmp_path):
    line = one_line_error(rlvr("train", "--resume", tmp_path))
    assert f"--resume {tmp_path}: not a run folder (no config.yaml)" in line


def test_debug_shows_the_traceback(config):
    done = rlvr("train", config, "model.path=/nonexistent", "--debug")
    assert done.returncode == 2 and "Traceback" in done.stderr and "error: model.path=/nonexistent" in done.stderr


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux unshare for a private tmpfs")
def test_a_full_disk_is_one_line(tmp_path, tiny):
    """The output folder on a 48 KiB tmpfs (mounted in a private mount namespace): the NVFP4
    checkpoint does not fit."""
    full = tmp_path / "full"
    full.mkdir()
    command = [sys.executable, "-m", "rlvr.cli", "quantize", str(tiny), str(full / "out"), "--format", "nvfp4"]
    done = subprocess.run(
        [
            "unshare",
            "--mount",
            "--map-root-user",
            "sh",
            "-c",
            'mount -t tmpfs -o size=48k tmpfs "$0" && exec "$@"',
            str(full),
            *command,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = one_line_error(done)
    assert "No space left on device" in line, line


def test_a_demo_model_folder_of_another_arch_is_one_line(tmp_path, tiny):
    """`rlvr demo demo.model.arch=X` would otherwise train the folder built earlier for another arch."""
    task = tmp_path / "task"
    task.mkdir()
    for name in ("train.jsonl", "test.jsonl"):
        (task / name).write_text(json.dumps({"problem": "1+1", "answer": "2"}) + "\n")
    line = one_line_error(
        rlvr(
            "demo",
            f"model.path={tiny}",
            f"data.train={task / 'train.jsonl'}",
            f"data.test={task / 'test.jsonl'}",
            "demo.model.arch=deepseek_v3",
        )
    )
    assert f"{tiny} holds a qwen2 model, not demo.model.arch=deepseek_v3" in line, line


@pytest.mark.parametrize(
    "args, named",
    [(["frobnicate"], "No such command 'frobnicate'"), (["train", "--bogus", "x"], "No such option: --bogus")],
)
def test_an_unknown_subcommand_or_option_is_one_line_and_exit_2(args, named):
    done = rlvr(*args)
    assert done.returncode == 2 and named in one_line_error(done) and "internal error" not in done.stdout + done.stderr
