"""One model a Tinker client trains: LoRA on a frozen base, on rlvr's trainer ranks, sampled by an engine.

    model = ServedModel("s1:train:0", "Qwen/Qwen3-8B", served_run("/models/x", rank=8, cfg=serve_config), seed=0)
    logprobs, loss = model.forward_backward(batch)     # gradients add up ...
    metrics = model.optim_step(adam)                   # ... until applied here
    adapter = model.publish()                          # the engine serves the adapter, checked by the sync probe
    rollouts = model.sample(adapter, prompt, n, sampling)

Every request is checked here before any rank sees it: a rank that fails takes the trainer
down with it (rlvr.training.trainer), so a bad request must never reach one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rlvr.algorithms.sum_losses import DEFAULT_CLIP_THRESHOLDS, SUM_LOSS_INPUTS, SUM_LOSSES
from rlvr.checkpoint.peft_files import save_adapter
from rlvr.config import AlgorithmConfig, DataConfig, LoraConfig, ModelConfig, RunConfig, ServeConfig
from rlvr.engines import make_engine
from rlvr.errors import UserError
from rlvr.hardware import compute_dtype, local_device
from rlvr.models.folder import model_config_dict
from rlvr.models.multimodal import text_config
from rlvr.planning.lora import with_engine_lora_targets
from rlvr.planning.plan import PlanError, all_devices_bytes, make_plan
from rlvr.records import LoraAdapter, Request, Rollout, Sampling
from rlvr.serve.protocol import ForwardBackwardBatch
from rlvr.serve.refusals import BadRequest
from rlvr.sync.check import SyncCheck
from rlvr.sync.weights import WeightSync
from rlvr.tracking.timing import StepTimer
from rlvr.training.trainer import Trainer
from rlvr.training.worker import RankSpec

# The sync check's probe: short exchanges the model reads and answers in its own tokens. Plausible
# tokens, and dozens of them: bf16's rounding moves an unlikely token's logprob most, and the mean
# gap over a handful of arbitrary ids swung past the bf16 threshold on a correctly synced 0.5B.
_PROBE_TEXTS = [
    ("Question: What is 17 + 25?\nAnswer:", " 17 + 25 = 42. The answer is 42."),
    (
        "Question: A box holds 6 rows of 8 eggs. How many eggs are in the box?\nAnswer:",
        " 6 rows of 8 eggs make 6 * 8 = 48 eggs. The answer is 48.",
    ),
    ("def add(a, b):\n", "    return a + b\n"),
]


def sync_probe(model_path: str, max_model_len: int | None) -> list[tuple[list[int], list[int]]]:
    """The probe in the tokens of the model at `model_path`, each exchange cut to `max_model_len`
    (None: the model's own limit, which these few tokens never reach)."""
    from rlvr.models.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(model_path)
    probe = []
    for prompt, completion in _PROBE_TEXTS:
        prompt_ids, completion_ids = (
            tokenizer(prompt).input_ids,
            tokenizer(completion, add_special_tokens=False).input_ids,
        )
        if max_model_len is not None:
            prompt_ids = prompt_ids[: max_model_len // 2]
            completion_ids = completion_ids[: max_model_len - len(prompt_ids) - 1]  # room for the one token sampled
        probe.append((prompt_ids, completion_ids))
    return probe


@dataclass
class CheckedBatch:
    batch: ForwardBackwardBatch
    targets: list[list[int]]
    loss_inputs: list[dict[str, torch.Tensor]]  # the loss's per-token inputs, float32


def served_run(folder: str, rank: int, cfg: ServeConfig, log=print) -> RunConfig:
    """The run a served model's trainer and engine are: `cfg`'s sections on the model `folder`, LoRA of the
    requested rank on the targets a run would train (resolved against what the engine applies,
    as `rlvr train` resolves them), so that the plan estimates it as it estimates a run."""
    try:
        lora = LoraConfig.model_validate({**(cfg.trainer.lora or LoraConfig()).model_dump(), "rank": rank})
    except ValueError as error:
        raise UserError(f"lora_config.rank={rank}: {error.errors()[0]['msg']}") from None
    # the client brings its own data and lengths, which engine.max_model_len bounds: the run's
    # prompt and sampling lengths are set to their least so that the plan's length check passes
    run = RunConfig(
        model=ModelConfig(path=folder),
        data=DataConfig(train="(served: the client's data)", max_prompt_tokens=1),
        rollout={"sampling": {"max_tokens": 1}},
        engine=cfg.engine,
        trainer=cfg.trainer.model_copy(update={"lora": lora}),
        seed=cfg.seed,
    )
    return with_engine_lora_targets(run, log)


def planned_bytes(run: RunConfig) -> tuple[float, str]:
    """The plan's estimate of what the run's engine and trainer ranks hold together (rlvr plan's
    figures), and its largest parts in words; 0 where the architecture cannot be read."""
    try:
        return all_devices_bytes(make_plan(run))
    except PlanError as error:
        raise UserError(f"{run.model.path}: {error}") from None


class ServedModel:
    def __init__(self, model_id: str, base_model: str, run: RunConfig, seed: int):
        """`base_model`: the catalog's name for the folder `run` trains on, which clients know it by."""
        self.model_id, self.base_model, self.rank = model_id, base_model, run.trainer.lora.rank
        self.vocab_size = int(text_config(model_config_dict(run.model.path))["vocab_size"])
        # the schedule is the client's: each optim_step brings its learning rate
        self.trainer = Trainer(
            RankSpec(model=run.model, trainer=run.trainer, algorithm=AlgorithmConfig(), seed=seed, total_steps=1)
        )
        try:
            self.engine = make_engine(run.model, run.engine, seed=seed, lora_rank=self.rank)
        except BaseException:
            self.trainer.close()
            raise
        self.sync = WeightSync(
            self.engine,
            self.trainer,
            sync_probe(run.model.path, run.engine.max_model_len),
            SyncCheck(run.engine.sync_threshold(compute_dtype(run.model.dtype, local_device()).name)),
            StepTimer(),
            lora=True,
        )
        self.published = 0

    def forward_backward(self, checked: CheckedBatch) -> tuple[list[np.ndarray], float]:
        """Each datum's logprobs and the loss summed over all tokens; with forward_only, no gradient."""
        batch = checked.batch
        thresholds = (
            batch.config.get("clip_low_threshold", DEFAULT_CLIP_THRESHOLDS[0]),
            batch.config.get("clip_high_threshold", DEFAULT_CLIP_THRESHOLDS[1]),
        )
        logprobs, loss = self.trainer.forward_backward(
            batch.inputs, checked.targets, batch.loss, checked.loss_inputs, thresholds, backward=not batch.forward_only
        )
        return [row.numpy() for row in logprobs], loss

    def optim_step(self, adam) -> dict[str, float]:
        """Apply the accumulated gradient with the request's AdamParams (grad_clip_norm 0: no clip)."""
        for name in ("learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm"):
            value = getattr(adam, name)
            if not math.isfinite(value) or value < 0:
                raise BadRequest(f"optim_step: adam_params.{name} must be a finite number >= 0, got {value}")
        update = self.trainer.optim_step(
            lr=adam.learning_rate,
            betas=(adam.beta1, adam.beta2),
            eps=adam.eps,
            weight_decay=adam.weight_decay,
            max_grad_norm=adam.grad_clip_norm or math.inf,
        )
        return {"grad_norm:mean": update.grad_norm, "skipped:sum": float(update.skipped)}

    def publish(self) -> LoraAdapter:
        """Serve the trainer's current adapter on the engine; the sync probe checks it arrived."""
        self.published += 1
        self.sync.push(self.published, used_unchecked=True)
        return self.sync.serving

    def save_state(self, folder: Path) -> None:
        """The adapter in PEFT format (folder/adapter) and the trainer's state with its optimizer (folder/trainer)."""
        save_adapter(self.trainer.adapter(), folder / "adapter")
        (folder / "trainer").mkdir()
        self.trainer.save(str(folder / "trainer"))

    def load_state(self, folder: Path, optimizer: bool) -> None:
        """Put back what save_state wrote: the adapter, and with `optimizer` the optimizer's state
        (without: the optimizer starts afresh)."""
        self.trainer.load(str(folder / "trainer"), optimizer=optimizer)

    def sample_many(self, calls: list[tuple[LoraAdapter | None, list[int], int, Sampling]]) -> list[list[Rollout]]:
        """Each call's `n` samples of its prompt from the base with its adapter (a snapshot publish()
        returned; None: the base), the calls that share an adapter in one engine batch; each call
        draws as it would alone (its sampling's seed, the j-th sample with seed + j)."""
        drawn: dict[int, list[Rollout]] = {}
        by_adapter: dict[int, list[int]] = {}
        for index, (adapter, *_) in enumerate(calls):
            by_adapter.setdefault(id(adapter), []).append(index)
        for indices in by_adapter.values():
            self._serve(calls[indices[0]][0])
            self.engine.submit([Request(index, *calls[index][1:]) for index in indices])
            while not drawn.keys() >= set(indices):
                drawn.update(self.engine.poll())
        return [drawn[index] for index in range(len(calls))]

    def prompt_logprobs(self, adapter: LoraAdapter | None, prompt: list[int], last_n: int | None) -> np.ndarray:
        """The engine's logprob of each prompt token after the first (temperature 1), NaN where none is
        scored: the first token, and with `last_n` every token before the last n."""
        self._serve(adapter)
        if last_n is not None and not 1 <= last_n < len(prompt):
            raise BadRequest(
                f"prompt_logprobs_last_n={last_n} must be between 1 and len(prompt) - 1 = {len(prompt) - 1}"
            )
        out = np.full(len(prompt), np.nan, dtype=np.float32)
        if len(prompt) > 1:
            out[1:] = self.engine.score([prompt], [1])[0]
        if last_n is not None:
            out[: len(prompt) - last_n] = np.nan
        return out

    def _serve(self, adapter: LoraAdapter | None) -> None:
        """Put `adapter` on the engine (prompts were checked when their request came)."""
        if adapter is None and self.sync.serving is not None:
            raise BadRequest("sampling the bare base after a save_weights_for_sampler is not supported yet")
        if adapter is not None and adapter is not self.sync.serving:
            self.sync.serve(adapter)  # an older snapshot: checked by the probe when it was published

    def check_tokens(self, tokens: list[int], where: str) -> None:
        if not tokens:
            raise BadRequest(f"{where}: no tokens")
        bad = [t for t in tokens if not 0 <= t < self.vocab_size]
        if bad:
            raise BadRequest(f"{where}: token id {bad[0]} is outside the vocabulary (0..{self.vocab_size - 1})")

    def close(self) -> None:
        self.engine.close()
        self.trainer.close()

    def check(self, batch: ForwardBackwardBatch) -> CheckedBatch:
        """The batch with its targets and per-token loss inputs, if it is valid; BadRequest, naming the datum, otherwise."""
        if batch.loss not in SUM_LOSSES:
            raise BadRequest(f"forward_backward: loss_fn {batch.loss!r} is not supported; choose one of {SUM_LOSSES}")
        if not batch.inputs:
            raise BadRequest("forward_backward: no data")
        unknown = set(batch.config) - {"clip_low_threshold", "clip_high_threshold"}
        if unknown:
            raise BadRequest(f"forward_backward: unknown loss_fn_config key {sorted(unknown)[0]!r}")
        targets, loss_inputs = [], []
        for index, (tokens, given) in enumerate(zip(batch.inputs, batch.loss_inputs)):
            where = f"datum {index}"
            self.check_tokens(tokens, f"{where}: model_input")
            needed = ("target_tokens", *SUM_LOSS_INPUTS[batch.loss])
            missing = [name for name in needed if name not in given]
            if missing:
                raise BadRequest(f"{where}: loss {batch.loss!r} needs loss_fn_inputs[{missing[0]!r}]")
            for name in needed:
                if len(given[name]) != len(tokens):
                    raise BadRequest(
                        f"{where}: loss_fn_inputs[{name!r}] has {len(given[name])} values for "
                        f"{len(tokens)} model_input tokens"
                    )
            target = given["target_tokens"].astype(np.int64).tolist()
            self.check_tokens(target, f"{where}: target_tokens")
            values = {name: torch.from_numpy(given[name].astype(np.float32)) for name in SUM_LOSS_INPUTS[batch.loss]}
            if not all(torch.isfinite(v).all() for v in values.values()):
                raise BadRequest(f"{where}: loss_fn_inputs hold a value that is not finite")
            targets.append(target)
            loss_inputs.append(values)
        return CheckedBatch(batch, targets, loss_inputs)
