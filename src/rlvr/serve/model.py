"""One model a Tinker client trains: a LoRA adapter on a frozen base, on the base's shared host
(rlvr.serve.base_host: one engine and one set of trainer ranks for every adapter on it).

    model = ServedModel("s1:train:0", "Qwen/Qwen3-8B", host)
    logprobs, loss = model.forward_backward(batch)     # gradients add up ...
    metrics = model.optim_step(adam)                   # ... until applied here
    adapter = model.publish()                          # the engine serves the adapter, checked by the sync probe
    rollouts = model.host.sample_many([(adapter, prompt, n, sampling)])  # beside other models' calls

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
from rlvr.config import LoraConfig, ModelConfig, PlacementConfig, ServeConfig
from rlvr.errors import UserError
from rlvr.models.folder import ModelFolder, as_model_folder
from rlvr.planning.lora import with_engine_lora_targets
from rlvr.planning.plan import PlanError, adapter_bytes, all_devices_bytes, make_plan
from rlvr.planning.sections import PlanSections
from rlvr.records import LoraAdapter
from rlvr.serve.base_host import BaseHost
from rlvr.serve.protocol import ForwardBackwardBatch
from rlvr.serve.refusals import BadRequest


@dataclass
class CheckedBatch:
    batch: ForwardBackwardBatch
    targets: list[list[int]]
    loss_inputs: list[dict[str, torch.Tensor]]  # the loss's per-token inputs, float32


def served_sections(folder: ModelFolder | str, rank: int, cfg: ServeConfig, log=print) -> PlanSections:
    """The sections a served model's trainer and engine run with, as a plan reads them: `cfg`'s on
    the model `folder` (placed as a run is by default), LoRA of the requested rank on the targets
    a run would train (resolved against what the engine applies, as `rlvr train` resolves them).
    The client brings its own data, each sequence bounded by engine.max_model_len: no step shape."""
    try:
        lora = LoraConfig.model_validate({**(cfg.trainer.lora or LoraConfig()).model_dump(), "rank": rank})
    except ValueError as error:
        raise UserError(f"lora_config.rank={rank}: {error.errors()[0]['msg']}") from None
    record = as_model_folder(folder)
    model = ModelConfig(path=str(record.path))
    return PlanSections(
        model=model,
        engine=cfg.engine,
        trainer=with_engine_lora_targets(model, cfg.trainer.model_copy(update={"lora": lora}), record, log),
        placement=PlacementConfig(),
        steps=None,
        folder=record,
    )


@dataclass(frozen=True)
class PlannedBytes:
    """The plan's estimate of what a served model's engine and trainer ranks hold (rlvr plan's figures)."""

    total: float
    adapter: float  # of which one adapter's own: what a second model on the same host adds
    parts: str  # the largest parts, in words

    @property
    def base(self) -> float:
        return self.total - self.adapter


def planned_bytes(sections: PlanSections) -> PlannedBytes:
    try:
        plan = make_plan(sections)
    except PlanError as error:
        raise UserError(f"{sections.model.path}: {error}") from None
    total, parts = all_devices_bytes(plan)
    return PlannedBytes(total, adapter_bytes(plan), parts)


class ServedModel:
    def __init__(self, model_id: str, base_model: str, host: BaseHost):
        """`base_model`: the catalog's name for the host's folder, which clients know it by."""
        self.model_id, self.base_model, self.host, self.rank = model_id, base_model, host, host.key.rank

    def forward_backward(self, checked: CheckedBatch) -> tuple[list[np.ndarray], float]:
        """Each datum's logprobs and the loss summed over all tokens; with forward_only, no gradient."""
        batch = checked.batch
        thresholds = (
            batch.config.get("clip_low_threshold", DEFAULT_CLIP_THRESHOLDS[0]),
            batch.config.get("clip_high_threshold", DEFAULT_CLIP_THRESHOLDS[1]),
        )
        logprobs, loss = self.host.use(self.model_id).forward_backward(
            batch.inputs, checked.targets, batch.loss, checked.loss_inputs, thresholds, backward=not batch.forward_only
        )
        return [row.numpy() for row in logprobs], loss

    def optim_step(self, adam) -> dict[str, float]:
        """Apply the accumulated gradient with the request's AdamParams (grad_clip_norm 0: no clip)."""
        for name in ("learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm"):
            value = getattr(adam, name)
            if not math.isfinite(value) or value < 0:
                raise BadRequest(f"optim_step: adam_params.{name} must be a finite number >= 0, got {value}")
        update = self.host.use(self.model_id).optim_step(
            lr=adam.learning_rate,
            betas=(adam.beta1, adam.beta2),
            eps=adam.eps,
            weight_decay=adam.weight_decay,
            max_grad_norm=adam.grad_clip_norm or math.inf,
        )
        return {"grad_norm:mean": update.grad_norm, "skipped:sum": float(update.skipped)}

    def publish(self) -> LoraAdapter:
        """Serve the model's current adapter on the engine; the sync probe checks it arrived."""
        return self.host.publish(self.model_id)

    def save_state(self, folder: Path) -> None:
        """The adapter in PEFT format (folder/adapter) and the trainer's state with its optimizer (folder/trainer)."""
        trainer = self.host.use(self.model_id)
        save_adapter(trainer.adapter(), folder / "adapter")
        (folder / "trainer").mkdir()
        trainer.save(str(folder / "trainer"))

    def load_state(self, folder: Path, optimizer: bool) -> None:
        """Put back what save_state wrote: the adapter, and with `optimizer` the optimizer's state
        (without: the optimizer starts afresh)."""
        self.host.use(self.model_id).load(str(folder / "trainer"), optimizer=optimizer)

    def prompt_logprobs(self, adapter: LoraAdapter | None, prompt: list[int], last_n: int | None) -> np.ndarray:
        """The engine's logprob of each prompt token after the first (temperature 1), NaN where none is
        scored: the first token, and with `last_n` every token before the last n."""
        if last_n is not None and not 1 <= last_n < len(prompt):
            raise BadRequest(
                f"prompt_logprobs_last_n={last_n} must be between 1 and len(prompt) - 1 = {len(prompt) - 1}"
            )
        out = np.full(len(prompt), np.nan, dtype=np.float32)
        if len(prompt) > 1:
            out[1:] = self.host.prompt_logprobs(adapter, prompt)
        if last_n is not None:
            out[: len(prompt) - last_n] = np.nan
        return out

    def check_tokens(self, tokens: list[int], where: str) -> None:
        if not tokens:
            raise BadRequest(f"{where}: no tokens")
        vocab = self.host.vocab_size
        bad = [t for t in tokens if not 0 <= t < vocab]
        if bad:
            raise BadRequest(f"{where}: token id {bad[0]} is outside the vocabulary (0..{vocab - 1})")

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
