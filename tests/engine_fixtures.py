"""Models, batches and reference computations shared by the engine and trainer tests (imported, not a conftest)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from rlvr.config import AlgorithmConfig, EngineConfig, TrainerConfig
from rlvr.engines import make_engine
from rlvr.models.folder import read_model_folder
from rlvr.models.tiny import build_tiny_model
from rlvr.records import Sampling, TrainBatch
from rlvr.training.worker import RankSpec

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Random tiny models give near-uniform next-token distributions, where greedy decoding flips
# on rounding noise. Scaling the (tied) embedding scales the logits: peaked distributions
# with wide margins between the first and second choice.
LOGIT_SCALE = 3.0


def start_engine(
    backend: str,
    model_path,
    *,
    seed: int = 0,
    lora_rank: int | None = None,
    max_loras: int = 1,
    placement=None,
    dtype: str = "float32",
    **options,
):
    """`make_engine` for a model folder; `options` are EngineConfig fields. float32 unless asked: the
    engine tests compare logprobs with transformers' and the trainer's to float32 rounding."""
    return make_engine(
        read_model_folder(model_path),
        EngineConfig(backend=backend, **options),
        dtype=dtype,
        seed=seed,
        lora_rank=lora_rank,
        max_loras=max_loras,
        placement=placement,
    )


def rank_spec(
    model_path, *, seed: int = 0, total_steps: int = 1, dtype: str = "float32", algorithm: dict | None = None, **trainer
) -> RankSpec:
    """A trainer's spec from typed sections; `trainer` are TrainerConfig fields (lora as a dict)."""
    return RankSpec(
        folder=read_model_folder(model_path),
        dtype=dtype,
        trainer=TrainerConfig(**trainer),
        algorithm=AlgorithmConfig(**(algorithm or {})),
        seed=seed,
        total_steps=total_steps,
    )


def build_peaked_model(out_dir: Path, seed: int = 0) -> Path:
    path = build_tiny_model(out_dir, "qwen2", seed=seed, hidden_size=128, num_layers=2, intermediate_size=256)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(LOGIT_SCALE)
    model.save_pretrained(path)
    return path


def random_lora(model, seed: int, rank: int = 8):
    """A PEFT model around `model` whose adapter visibly changes the output (B is not zero)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=LORA_TARGETS)
    peft_model = get_peft_model(model, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    return peft_model.eval(), config


@torch.no_grad()
def reference_logprobs(model, sequences: list[list[int]], prompt_lens: list[int], temperature: float = 1.0):
    """transformers' logprobs of each sequence's completion tokens, at `temperature`."""
    out = []
    for seq, start in zip(sequences, prompt_lens, strict=True):
        logits = model(torch.tensor([seq])).logits[0, start - 1 : len(seq) - 1] / temperature
        lp = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(seq[start:]).unsqueeze(-1))
        out.append(lp.squeeze(-1).tolist())
    return out


@torch.no_grad()
def reference_greedy(model, prompt: list[int], max_tokens: int, eos: int) -> list[int]:
    ids = model.generate(
        torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False, eos_token_id=eos, pad_token_id=0
    )
    return ids[0, len(prompt) :].tolist()


def random_train_batch() -> TrainBatch:
    """Two groups of two samples (each group's prompt the same, as in GRPO), fixed random tokens,
    uneven lengths, mixed-sign advantages."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, 200, (n,), generator=g).tolist() for n in (5, 7)]
    prompts = [prompts[0], prompts[0], prompts[1], prompts[1]]
    completions = [torch.randint(4, 200, (n,), generator=g).tolist() for n in (4, 2, 6, 3)]
    return TrainBatch(
        prompt_ids=prompts,
        completion_ids=completions,
        sampler_logprobs=[[-1.0] * len(c) for c in completions],
        advantages=torch.tensor([1.0, -0.5, 0.25, -0.75]),
        group=torch.tensor([0, 0, 1, 1]),
    )


def grpo_train_batch(groups: int, samples: int = 4, seed: int = 0) -> TrainBatch:
    """`groups` prompts of `samples` completions each (a GRPO step's shape), random tokens of
    uneven lengths, group-centred advantages."""
    g = torch.Generator().manual_seed(seed)
    prompts, completions, group = [], [], []
    for k in range(groups):
        prompt = torch.randint(4, 200, (int(torch.randint(3, 8, (1,), generator=g)),), generator=g).tolist()
        for _ in range(samples):
            prompts.append(prompt)
            completions.append(
                torch.randint(4, 200, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g).tolist()
            )
            group.append(k)
    rewards = torch.rand(len(group), generator=g)
    centred = rewards - rewards.view(groups, samples).mean(-1).repeat_interleave(samples)
    return TrainBatch(
        prompt_ids=prompts,
        completion_ids=completions,
        sampler_logprobs=[[-1.0] * len(c) for c in completions],
        advantages=centred / centred.std(),
        group=torch.tensor(group),
    )


def assert_stop_token_cuts_the_same_draws(engine, prompts) -> None:
    """A stop token ends each completion at its first place (kept), with the same draws as without it."""
    free = engine.generate(prompts, 4, Sampling(temperature=1.0, max_tokens=16, seed=3))
    stop = next(r.completion_ids[3] for r in free if len(r.completion_ids) > 4)  # a token the samples do produce
    stopped = engine.generate(prompts, 4, Sampling(temperature=1.0, max_tokens=16, seed=3, stop_token_ids=(stop,)))
    for before, after in zip(free, stopped):
        if stop in before.completion_ids:
            assert after.completion_ids == before.completion_ids[: before.completion_ids.index(stop) + 1]
            assert after.finish_reason == "stop"
        else:
            assert after.completion_ids == before.completion_ids


def assert_top_k_one_is_greedy(engine, prompts) -> None:
    greedy = [r.completion_ids for r in engine.generate(prompts, 1, Sampling(temperature=0.0, max_tokens=8))]
    top1 = engine.generate(prompts, 3, Sampling(temperature=1.0, top_k=1, max_tokens=8, seed=4))
    assert [r.completion_ids for r in top1] == [ids for ids in greedy for _ in range(3)]
    assert max(abs(lp) for r in top1 for lp in r.logprobs) < 1e-5  # the only token left in the distribution
