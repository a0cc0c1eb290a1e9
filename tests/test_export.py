"""`rlvr quantize` and `rlvr export`: real CLI processes, real FSDP2 ranks, real files.

The exported folder must compute exactly what the trainer computed at the checkpoint: for a
LoRA run on an NVFP4 base (adapter merged into the dequantized base) and for full fine-tuning.
"""

import json
import subprocess
import sys

import pytest
import torch
import yaml
from _floats import assert_close_scaled
from engine_fixtures import random_train_batch, rank_spec, reference_logprobs
from transformers import AutoModelForCausalLM

from rlvr.checkpoint.peft_files import save_adapter
from rlvr.checkpoint.store import CheckpointStore
from rlvr.models.tiny import build_tiny_model
from rlvr.quant.checkpoint import load_quantized_model
from rlvr.quant.formats import is_quantized_checkpoint
from rlvr.training.trainer import Trainer

LORA = dict(rank=4, alpha=8.0, dropout=0.0, target_modules="all-linear")


def _rlvr(*args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "rlvr.cli", *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


def _train_and_checkpoint(base: str, run_dir, lora):
    """Two trainer steps on 2 ranks, a checkpoint as the controller writes it, and the trainer's logprobs."""
    (run_dir).mkdir(parents=True)
    cfg = {
        "run_dir": str(run_dir),
        "model": {"path": base},
        "data": {"train": "gsm8k"},
        "trainer": {"lora": None if lora is None else {k: v for k, v in lora.items()}},
    }
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))
    batch = random_train_batch()
    sequences = [p + c for p, c in zip(batch.prompt_ids, batch.completion_ids)]
    prompt_lens = [len(p) for p in batch.prompt_ids]
    with Trainer(rank_spec(base, lr=5e-2, lora=lora, ranks=2, micro_batch_tokens=14)) as trainer:
        for _ in range(2):
            trainer.train_step(batch)
        adapter = trainer.adapter() if lora else None

        def write_parts(folder):
            (folder / "trainer").mkdir()
            trainer.save(folder / "trainer")
            if adapter is not None:
                save_adapter(adapter, folder / "adapter")

        CheckpointStore(run_dir).save(2, {"step": 2}, write_parts)
        return sequences, prompt_lens, trainer.logprobs(sequences, prompt_lens)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(
        tmp_path_factory.mktemp("m") / "tiny", "qwen2", hidden_size=64, num_layers=2, intermediate_size=128
    )


@pytest.mark.slow
def test_lora_run_on_an_nvfp4_base_exports_to_a_plain_model_that_computes_what_the_trainer_did(tiny, tmp_path):
    done = _rlvr("quantize", tiny, tmp_path / "nvfp4")
    assert done.returncode == 0, done.stdout + done.stderr
    assert is_quantized_checkpoint(tmp_path / "nvfp4")
    load_quantized_model(tmp_path / "nvfp4")  # rlvr's trainer reads what rlvr quantize wrote

    run = tmp_path / "run"
    sequences, prompt_lens, trained = _train_and_checkpoint(str(tmp_path / "nvfp4"), run, LORA)
    done = _rlvr("export", run, tmp_path / "exported")
    assert done.returncode == 0, done.stdout + done.stderr

    config = json.loads((tmp_path / "exported" / "config.json").read_text())
    assert "quantization_config" not in config
    assert not (tmp_path / "exported" / "adapter_config.json").exists()
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "exported", dtype=torch.float32)
    got = reference_logprobs(exported, sequences, prompt_lens)
    assert_close_scaled(sum(got, []), sum(trained, []))
    # training moved the policy: the export is not just the base
    base = reference_logprobs(AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32), sequences, prompt_lens)
    assert max(abs(a - b) for ra, rb in zip(base, got) for a, b in zip(ra, rb)) > 1e-3


@pytest.mark.slow
def test_full_fine_tuning_run_exports_its_sharded_weights(tiny, tmp_path):
    run = tmp_path / "run"
    sequences, prompt_lens, trained = _train_and_checkpoint(str(tiny), run, None)
    done = _rlvr("export", run, tmp_path / "exported", "--checkpoint", "step_000002")
    assert done.returncode == 0, done.stdout + done.stderr
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "exported", dtype=torch.float32)
    assert_close_scaled(sum(reference_logprobs(exported, sequences, prompt_lens), []), sum(trained, []))


def test_export_and_quantize_errors_name_the_folder(tmp_path):
    done = _rlvr("export", tmp_path / "nowhere", tmp_path / "out", timeout=120)
    assert done.returncode == 2 and f"{tmp_path / 'nowhere'}: not a run folder (no config.yaml)" in done.stderr
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("model: {path: m}\ndata: {train: gsm8k}\n")
    done = _rlvr("export", tmp_path / "run", tmp_path / "out", timeout=120)
    assert done.returncode == 2 and "no intact checkpoint" in done.stderr
    done = _rlvr("quantize", tmp_path / "m", tmp_path / "q", "--format", "nvfp4", timeout=120)
    assert done.returncode == 2 and f"MODEL={tmp_path / 'm'}: no such file or folder" in done.stderr
    model = build_tiny_model(tmp_path / "m", "qwen2", hidden_size=64, num_layers=1, intermediate_size=128)
    done = _rlvr("quantize", model, tmp_path / "q", "--format", "nf3", timeout=120)
    assert done.returncode == 2 and "unknown quantization format 'nf3'" in done.stderr
