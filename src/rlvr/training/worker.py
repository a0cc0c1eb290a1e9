"""One trainer rank: a process that owns a shard of the policy and answers the controller.

The controller (rlvr.training.trainer.Trainer) starts N of these itself, as local processes
(rlvr.training.rank_host) or as Ray actors (rlvr.orchestration.ray_placement); each joins a
torch.distributed group (gloo on CPU, NCCL on GPU), builds the same model, shards it with
FSDP2 and then answers the controller's commands until told to close. Every rank receives every
command (with its own micro-batches) because FSDP2's collectives need all ranks in step.

Mixture-of-experts policies get the engine's routes with the step (rlvr.models.routing): with
`trainer.routing_replay` every forward routes each token to the experts the engine chose for
it, else the trainer's routers choose. Either way the step's π_old pass also runs the other way,
once, without gradient, so that the moe/ metrics show what replay changes.
"""

from __future__ import annotations

import math
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial

import torch

from rlvr.affinity import process_cores
from rlvr.algorithms.sum_losses import sum_loss
from rlvr.config import AlgorithmConfig, TrainerConfig
from rlvr.hardware import compute_dtype
from rlvr.models.folder import ModelFolder
from rlvr.models.moe import moe_layers
from rlvr.quant.experts import packed_base_bytes
from rlvr.quant.skeleton import Skeleton
from rlvr.training.adapter_slots import AdapterSlots
from rlvr.training.attention import use_packed_attention
from rlvr.training.commands import (
    Adapter,
    AdapterSlot,
    Command,
    FullWeights,
    Load,
    Logprobs,
    LoraConfigOf,
    MiniBatch,
    OptimStep,
    PackedBaseBytes,
    Placement,
    Save,
    StepInput,
    SumLossInput,
)
from rlvr.training.packing import MicroBatch, unpack
from rlvr.training.policy import TokenLogprobs, apply_lora, shard_and_load
from rlvr.training.rank_checkpoint import load_rank, load_rank_weights, save_rank
from rlvr.training.rank_loss import (
    k3_sum,
    loss_mask,
    micro_batch_loss,
    padded,
    record_micro_batch,
    sampler_logprobs,
    update_share,
)
from rlvr.training.rank_routing import RankRouting
from rlvr.training.rank_weights import adapter_part, full_weights, lora_config
from rlvr.training.report import ForwardBackwardReport, OptimizerUpdate, TrainReport


@dataclass
class RankSpec:
    """Everything a rank needs to build its policy: the model folder the run opened, and the run's
    typed config sections (they pickle), sent once at start. Every default lives in rlvr.config."""

    folder: ModelFolder
    dtype: str  # model.dtype
    trainer: TrainerConfig
    algorithm: AlgorithmConfig
    seed: int
    total_steps: int  # the learning-rate schedule's length
    threads: int = 0  # torch threads per rank; 0: the cores divided among the ranks (Trainer decides)
    cores: list[list[int]] | None = None  # per rank, the cores it runs on (placement.engine_cpus); None: any


def lr_factor(trainer: TrainerConfig, total_steps: int, step: int) -> float:
    """The learning-rate multiplier after `step` optimizer steps: linear warm-up over steps
    1..warmup_steps, then constant, linear or cosine decay to 0 at total_steps."""
    if step < trainer.warmup_steps:
        return (step + 1) / trainer.warmup_steps
    progress = min(1.0, (step - trainer.warmup_steps) / max(1, total_steps - trainer.warmup_steps))
    if trainer.schedule == "cosine":
        return 0.5 * (1 + math.cos(math.pi * progress))
    if trainer.schedule == "linear":
        return 1.0 - progress
    return 1.0


@dataclass(frozen=True)
class RankStarted:
    """What the controller learns once from a rank, when it has loaded its shard."""

    trainable_params: int
    total_params: int
    base_format: str  # what the rank loaded: "nvfp4" or "hf"
    packed_attention: bool  # False where the model has no AttentionInterface: transformers' own, no shared prompts


class Rank:
    def __init__(self, rank: int, world_size: int, spec: RankSpec, use_cuda: bool):
        from torch.distributed.device_mesh import init_device_mesh

        self.rank, self.world_size, self.spec = rank, world_size, spec
        self.device = torch.device("cuda", rank % torch.cuda.device_count()) if use_cuda else torch.device("cpu")
        if use_cuda:
            torch.cuda.set_device(self.device)  # FSDP2 and NCCL place this rank's tensors on the current device
        config = spec.trainer
        compute = compute_dtype(spec.dtype, self.device.type).torch
        torch.manual_seed(spec.seed)
        # What trains is kept in float32 and what is frozen in the compute dtype, as FSDP2's mixed
        # precision does on GPUs: it casts each unit's parameters to `compute` for the forward and
        # reduces gradients in float32, so AdamW's moments and an update smaller than a bf16 ulp of
        # the weight are not rounded away. A LoRA run's base is frozen: it stays in `compute`.
        stored = compute if config.lora else torch.float32
        # on the meta device: no rank reads a tensor before FSDP2 has said which rows it holds
        skeleton = Skeleton.from_checkpoint(spec.folder, stored)
        base, self.base_format = skeleton.model, skeleton.base_format
        self.packed_attention = config.attention == "packed" and use_packed_attention(base)
        if config.gradient_checkpointing:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        # the LoRA-wrapped policy, whose frozen base is the KL term's reference (None: full fine-tuning)
        self.adapted = apply_lora(base, **config.lora.model_dump()) if config.lora else None
        lm = base if self.adapted is None else self.adapted
        self.lm = lm
        self.policy: torch.nn.Module = TokenLogprobs(lm, config.logits_chunk_mb)
        shard_ranks = config.shard_ranks or world_size
        # FSDP2 on a 1-D mesh shards over every rank; on a 2-D one (replicas x shards) it is HSDP
        mesh = (
            init_device_mesh(self.device.type, (world_size,))
            if shard_ranks == world_size
            else init_device_mesh(
                self.device.type, (world_size // shard_ranks, shard_ranks), mesh_dim_names=("replicate", "shard")
            )
        )
        self.first_replica = rank < shard_ranks  # ranks are laid out replica by replica
        # each rank reads its rows of each tensor straight into its shard on the device: neither
        # host nor device ever holds more than the shards and one tensor's rows
        shard_and_load(self.policy, skeleton, mesh, param_dtype=compute, device=self.device)
        self.routing = RankRouting(moe_layers(lm), config.routing_replay, self.device)  # the modules as loaded
        self.trainable = [(n, p) for n, p in self.policy.named_parameters() if p.requires_grad]
        self.trainable_params = sum(_numel(p) for _, p in self.trainable)
        self.total_params = sum(_numel(p) for p in self.policy.parameters())
        self._start_optimizer()
        # FSDP2 averages gradients over the ranks: this factor on each rank's loss makes that their sum
        self.loss_scale = world_size

    def _start_optimizer(self) -> None:
        """AdamW over the trainable tensors, its learning-rate schedule, and the adapter slots that
        park both per adapter (every backend's rank calls this once its trainable tensors exist)."""
        config, params = self.spec.trainer, [p for _, p in self.trainable]
        # foreach: one op over all (DTensor) parameters instead of a Python loop over them, which
        # torch picks for CPU tensors by default: 3.8 vs 11 ms a step on a demo rank, same values
        self.optimizer = torch.optim.AdamW(
            params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay, foreach=True
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, partial(lr_factor, config, self.spec.total_steps)
        )
        self.adapters = AdapterSlots(params, self.optimizer, self.scheduler, self.device)

    def info(self) -> RankStarted:
        """What the controller learns once, when the rank is up."""
        return RankStarted(self.trainable_params, self.total_params, self.base_format, self.packed_attention)

    def handle(self, command: Command):
        """The answer to one command (rlvr.training.commands says what each returns)."""
        match command:
            case StepInput():
                return self.train(command)
            case SumLossInput():
                return self.forward_backward(command)
            case Logprobs(micro_batches, temperature):
                return self.logprobs(micro_batches, temperature)
            case OptimStep():
                return self.optim_step(command)
            case Adapter():
                return adapter_part(self.trainable, self.rank, self.first_replica, self._alone)
            case FullWeights():
                return full_weights(self.policy, self.rank, self._alone)
            case LoraConfigOf():
                return lora_config(self.lm)
            case Placement():
                return self.placement()
            case PackedBaseBytes():
                return packed_base_bytes(self.policy)
            case Save(folder):
                return save_rank(
                    folder, self.rank, self.policy, self.optimizer, self.scheduler, self.device, self._alone
                )
            case AdapterSlot(name) if not self.spec.trainer.lora:
                raise ValueError(f"adapter {name!r}: this rank trains the full model, not LoRA adapters")
            case AdapterSlot(name, forget):
                return self.adapters.forget(name) if forget else self.adapters.use(name)
            case Load(folder, optimizer):
                if not optimizer:
                    return load_rank_weights(folder, self.policy, self.optimizer, self._alone)
                return load_rank(
                    folder, self.rank, self.policy, self.optimizer, self.scheduler, self.device, self._alone
                )
        raise TypeError(f"{command!r}: not a trainer rank command")

    def placement(self) -> dict:
        """Where this rank's threads may run, read back from the kernel, and its torch threads."""
        return {"cores": process_cores(), "threads": torch.get_num_threads()}

    # ------------------------------------------------------------------ commands

    def logprobs(self, micro_batches: list[MicroBatch], temperature: float) -> dict[int, list[float]]:
        out: dict[int, list[float]] = {}
        with torch.no_grad():
            for mb in micro_batches:
                lp, _ = self._forward(mb, temperature)
                for i, values in zip(mb.sequences, unpack(lp, mb)):
                    out[i] = values.tolist()
        return out

    def train(self, step: StepInput) -> TrainReport:
        """The step's updates: `epochs` passes over the mini-batches, one optimizer step each.

        With one update, π_old is the policy itself (its logprobs, detached); with more, π_old
        is the policy before the first update, from one no-grad forward over the step, and after
        the last update a second one measures how far the updates moved: policy/approx_kl."""
        started = time.perf_counter()
        updates = [mini for _ in range(step.epochs) for mini in step.mini_batches]
        if self.spec.trainer.routing_replay and step.routes is None:
            raise ValueError(
                "trainer.routing_replay: the engine returned no routes (engine.backend: hf records them; "
                "vllm only on GPU)"
            )
        report = TrainReport()  # a rank whose micro-batches are all empty adds nothing
        old = self._step_logprobs(step, measure=report) if len(updates) > 1 else None
        for mini in updates:
            for mb in mini.micro_batches:
                self._train_micro_batch(mb, mini, step, old, report, measure=old is None)
            update = self._optimizer_step(self.spec.trainer.grad_clip)
            report.grad_norm += update.grad_norm
            report.skipped += float(update.skipped)
        self.scheduler.step()  # the schedule counts RL steps: N mini-batches x E epochs share one rate
        report.loss /= len(updates)  # the mean update's loss
        report.grad_norm /= len(updates)
        report.updates, report.lr = float(len(updates)), float(self.scheduler.get_last_lr()[0])
        if old is not None:
            after = self._step_logprobs(step)
            report.approx_kl_after_sum = float(sum(k3_sum(old[i], after[i]) for i in old))
            report.approx_kl_after_tokens = float(sum(len(lp) for lp in old.values()))
        report.seconds = time.perf_counter() - started  # this rank's compute, for the overlap figures
        return report

    def forward_backward(self, work: SumLossInput) -> ForwardBackwardReport:
        """Every sequence's logprobs and the loss summed over the rank's tokens; with `backward`,
        its gradient is added to what earlier calls left, for optim_step to apply."""

        logprobs_out: dict[int, torch.Tensor] = {}
        total = 0.0
        with torch.set_grad_enabled(work.backward):
            for mb in work.micro_batches:
                logprobs, _ = self._forward(mb, 1.0)
                if mb.is_empty:
                    if work.backward:  # keeps this rank in step with the others' collectives
                        (logprobs.sum() * 0.0).backward()
                    continue
                rows = unpack(logprobs, mb)
                lp = padded(rows)
                inputs = {
                    key: padded([work.inputs[i][key] for i in mb.sequences]).to(self.device, lp.dtype)
                    for key in work.inputs[mb.sequences[0]]
                }
                loss = sum_loss(
                    work.loss,
                    lp,
                    inputs,
                    padded([torch.ones(len(r)) for r in rows]).bool().to(self.device),
                    work.clip_thresholds,
                )
                if work.backward:
                    (loss * self.loss_scale).backward()
                total += loss.item()
                logprobs_out.update((i, row.detach().float().cpu()) for i, row in zip(mb.sequences, rows))
        return ForwardBackwardReport(logprobs_out, total)

    def optim_step(self, adam: OptimStep) -> OptimizerUpdate:
        """Apply the gradient forward_backward calls accumulated, with this call's AdamW settings
        (lr, betas, eps, weight_decay; max_grad_norm, inf: no clip); the gradient is cleared."""
        for group in self.optimizer.param_groups:
            group.update(lr=adam.lr, betas=adam.betas, eps=adam.eps, weight_decay=adam.weight_decay)
        return self._optimizer_step(adam.max_grad_norm)

    def _train_micro_batch(
        self, mb: MicroBatch, mini: MiniBatch, step: StepInput, old: dict | None, report: TrainReport, measure: bool
    ) -> None:
        """Forward and backward of one micro-batch, its loss scaled to its share of the update's;
        `measure`: this forward is π_old's, the one the moe/ metrics describe."""
        # the routes stay replayed through backward, which recomputes checkpointed forwards
        with self.routing.routed(mb, step) as routing:
            logprobs, entropy = self._forward(mb, step.temperature)
            if mb.is_empty:  # keeps this rank in step with the others' collectives
                (logprobs.sum() * 0.0).backward()
            else:
                lp = padded(unpack(logprobs, mb))
                mask = loss_mask(mb, step, self.device)
                old_lp = lp.detach() if old is None else padded([old[i] for i in mb.sequences])
                sampler = sampler_logprobs(mb, step, lp.dtype, self.device)
                adv = torch.tensor([step.advantages[i] for i in mb.sequences], dtype=lp.dtype, device=self.device)
                trained = micro_batch_loss(
                    self.spec.algorithm,
                    lp,
                    old_lp,
                    sampler,
                    adv,
                    mask,
                    step.max_len,
                    partial(self._reference_logprobs, mb, step.temperature),
                )
                weight, denominator = update_share(self.spec.algorithm.agg, trained.kept, mb, mini)
                # gradients add up over the ranks (loss_scale), so the update's loss is normalised
                # once, by the mini-batch's global denominator
                (trained.loss * (weight / denominator) * self.loss_scale).backward()
        if measure and routing is not None:
            self.routing.measure(
                lambda: self._forward(mb, step.temperature)[0], mb, step, routing, logprobs.detach(), report
            )
        if not mb.is_empty:
            entropy = padded(unpack(entropy, mb))
            record_micro_batch(
                report, self.spec.algorithm, trained, (weight, denominator), mask, entropy, old_lp, sampler
            )

    def _step_logprobs(self, step: StepInput, measure: TrainReport | None = None) -> dict[int, torch.Tensor]:
        """The current policy's logprob of every completion token of the step (no gradient);
        with `measure`, this is π_old: its moe/ metrics are added there."""
        out: dict[int, torch.Tensor] = {}
        with torch.no_grad():
            for mini in step.mini_batches:
                for mb in mini.micro_batches:
                    with self.routing.routed(mb, step) as routing:
                        logprobs, _ = self._forward(mb, step.temperature)
                    if measure is not None and routing is not None:
                        self.routing.measure(
                            lambda: self._forward(mb, step.temperature)[0], mb, step, routing, logprobs, measure
                        )
                    out.update(zip(mb.sequences, unpack(logprobs, mb)))
        return out

    def _optimizer_step(self, max_grad_norm: float) -> OptimizerUpdate:
        """Clip and step, unless the gradient is not finite (then the update is skipped)."""
        grad_norm = self._clip_gradients(max_grad_norm)
        skipped = not math.isfinite(grad_norm)
        if not skipped:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return OptimizerUpdate(grad_norm, skipped)

    def _clip_gradients(self, max_grad_norm: float) -> float:
        """Scale the gradients to at most `max_grad_norm` in global 2-norm; the norm before."""
        norm = torch.nn.utils.clip_grad_norm_([p for _, p in self.trainable], max_grad_norm)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    @property
    def _alone(self) -> bool:
        # One rank has nobody to agree a plan with; and DCP's collectives over gloo leave a
        # single rank's later steps ~1.5x slower (small ops slow to start their OpenMP
        # threads; measured 0.75 s -> 1.15 s a step), so one rank saves without them.
        return self.world_size == 1

    # ------------------------------------------------------------------ internals

    def _forward(self, mb: MicroBatch, temperature: float):
        return self.policy(
            mb.input_ids.to(self.device),
            mb.position_ids.to(self.device),
            mb.score_positions.to(self.device),
            mb.score_targets.to(self.device),
            temperature,
            layout=mb.layout.to(self.device),
        )

    def _reference_logprobs(self, mb: MicroBatch, temperature: float) -> torch.Tensor:
        with torch.no_grad(), self._base_only():
            ref, _ = self._forward(mb, temperature)
        return padded(unpack(ref, mb))

    def _base_only(self) -> AbstractContextManager:
        """While active, the policy is its frozen base: the KL term's reference."""
        if self.adapted is None:
            raise ValueError(
                "algorithm.kl needs a reference model: it is supported with trainer.lora (the frozen base)"
            )
        return self.adapted.disable_adapter()


def _numel(p: torch.Tensor) -> int:
    return p.numel()  # a DTensor reports its global size
