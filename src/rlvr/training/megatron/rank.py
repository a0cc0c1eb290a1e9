"""A trainer rank of trainer.backend=megatron: the same commands as the FSDP2 rank
(rlvr.training.worker.Rank), the same losses and metrics, on a Megatron policy.

The controller plans micro-batches for every rank alike (rlvr.training.trainer), but the ranks of
one tensor-parallel group must run the same tokens together. So they pool their shares: each runs
the whole group's micro-batches, and the group's first rank alone reports their sums. Gradients
of the LoRA factors add up over the data-parallel replicas (the groups); each group's loss is
its share of the update's, as the FSDP2 ranks' are.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from rlvr.hardware import compute_dtype
from rlvr.quant.skeleton import Skeleton
from rlvr.training.commands import (
    Adapter,
    Command,
    FullWeights,
    Load,
    Logprobs,
    LoraConfigOf,
    MiniBatch,
    Save,
    StepInput,
    SumLossInput,
)
from rlvr.training.megatron.checkpoint import load_rank, save_rank
from rlvr.training.megatron.lora import adapters_off, attach_lora, peft_factors, peft_tensors
from rlvr.training.megatron.parallel import start_model_parallel
from rlvr.training.megatron.policy import MegatronPolicy
from rlvr.training.packing import MicroBatch
from rlvr.training.rank_routing import RankRouting
from rlvr.training.rank_weights import lora_config
from rlvr.training.report import ForwardBackwardReport, TrainReport
from rlvr.training.worker import Rank, RankSpec


class MegatronRank(Rank):
    def __init__(self, rank: int, world_size: int, spec: RankSpec, use_cuda: bool):
        # not Rank.__init__: that builds and shards the FSDP2 policy; this sets what Rank's methods read
        self.rank, self.world_size, self.spec = rank, world_size, spec
        self.device = torch.device("cuda", rank % torch.cuda.device_count()) if use_cuda else torch.device("cpu")
        if use_cuda:
            torch.cuda.set_device(self.device)
        config = spec.trainer
        if config.lora is None:
            raise ValueError("trainer.backend=megatron trains a LoRA adapter: set trainer.lora")
        if config.gradient_checkpointing:  # the plan may still count it: a GPU layout is planned with it
            raise ValueError(
                "trainer.gradient_checkpointing: the Megatron rank does not recompute blocks yet; set it false"
            )
        # planned (--dry-run, rlvr rehearse) but not built: every rank would hold the whole decoder
        # and every token, and train as if the layout were tensor and expert parallel alone
        if config.megatron.pipeline_parallel > 1:
            raise ValueError(
                f"trainer.megatron.pipeline_parallel={config.megatron.pipeline_parallel}: the Megatron rank does not "
                "build pipeline stages yet (--dry-run and rlvr rehearse plan them); set it 1"
            )
        if config.megatron.sequence_parallel:
            raise ValueError(
                "trainer.megatron.sequence_parallel: the Megatron rank does not split tokens over the tensor-parallel "
                "ranks yet (--dry-run and rlvr rehearse plan it); set it false"
            )
        compute = compute_dtype(spec.dtype, self.device.type).torch
        start_model_parallel(config.megatron, use_cuda)
        # PEFT's factors for this seed, drawn as an FSDP2 rank draws them, on a base never read
        torch.manual_seed(spec.seed)
        skeleton = Skeleton.from_checkpoint(spec.folder, compute)
        peft, factors = peft_factors(skeleton.model, config.lora)
        self.peft_config = lora_config(peft)
        self.megatron = MegatronPolicy(spec.folder, compute, config.logits_chunk_mb)
        for p in self.megatron.parameters():
            p.requires_grad_(False)
        attach_lora(self.megatron.gpt, factors, self.megatron.shape, scaling=config.lora.alpha / config.lora.rank)
        self.policy = self.megatron.to(self.device)
        self.base_format, self.packed_attention, self.adapted = skeleton.base_format, True, None
        self.routing = RankRouting(self.megatron.moe_layers(), config.routing_replay, self.device)
        self.trainable = [(n, p) for n, p in self.policy.named_parameters() if p.requires_grad]
        self.trainable_params = _global_numel(p for _, p in self.trainable)
        self.total_params = _global_numel(self.policy.parameters())
        self._start_optimizer()
        self.loss_scale = 1  # gradients are summed over the replicas (_clip_gradients)
        self.tensor_group = parallel_state.get_tensor_model_parallel_group()
        self.first_in_group = parallel_state.get_tensor_model_parallel_rank() == 0

    def handle(self, command: Command):
        match command:
            case StepInput():
                report = self.train(self._pooled_step(command))
                return report if self.first_in_group else _unsummed(report)
            case SumLossInput():
                work = self._pooled(command)
                pooled = SumLossInput(
                    [mb for w in work for mb in w.micro_batches],
                    command.loss,
                    {i: x for w in work for i, x in w.inputs.items()},
                    command.clip_thresholds,
                    command.backward,
                )
                answer = self.forward_backward(pooled)
                return answer if self.first_in_group else ForwardBackwardReport(answer.logprobs, 0.0)
            case Logprobs(micro_batches, temperature):
                return self.logprobs(self._pooled_micro_batches(micro_batches), temperature)
            case Adapter():
                tensors = peft_tensors(self.megatron.gpt)  # every tensor-parallel group gathers its own
                return tensors if self.rank == 0 else {}
            case LoraConfigOf():
                return self.peft_config
            case FullWeights():
                raise ValueError("trainer.backend=megatron trains a LoRA adapter: it has no full weights to give")
            case Save(folder):
                return save_rank(folder, self.rank, self.trainable, self.optimizer, self.scheduler)
            case Load(folder, optimizer):
                return load_rank(folder, self.rank, self.trainable, self.optimizer, self.scheduler, optimizer)
        return super().handle(command)

    # ------------------------------------------------------------------ pooling

    def _pooled(self, share):
        """Every rank's `share` in the tensor-parallel group, in rank order."""
        shares: list = [None] * dist.get_world_size(self.tensor_group)
        dist.all_gather_object(shares, share, group=self.tensor_group)
        return shares

    def _pooled_micro_batches(self, micro_batches: list[MicroBatch]) -> list[MicroBatch]:
        return [mb for share in self._pooled(micro_batches) for mb in share]

    def _pooled_step(self, step: StepInput) -> StepInput:
        """The group's steps as one: each mini-batch holds every rank's micro-batches of it (its
        loss denominators are the whole mini-batch's already)."""
        steps: list[StepInput] = self._pooled(step)
        minis = [
            MiniBatch(
                [mb for s in steps for mb in s.mini_batches[k].micro_batches], mini.num_tokens, mini.num_sequences
            )
            for k, mini in enumerate(step.mini_batches)
        ]
        masks = None if step.loss_masks is None else {i: m for s in steps for i, m in (s.loss_masks or {}).items()}
        routes = None if step.routes is None else {i: r for s in steps for i, r in (s.routes or {}).items()}
        return StepInput(
            mini_batches=minis,
            epochs=step.epochs,
            advantages={i: a for s in steps for i, a in s.advantages.items()},
            sampler_logprobs={i: lp for s in steps for i, lp in s.sampler_logprobs.items()},
            loss_masks=masks,
            max_len=step.max_len,
            temperature=step.temperature,
            routes=routes,
        )

    # ------------------------------------------------------------------ gradients

    def _clip_gradients(self, max_grad_norm: float) -> float:
        """Sum the gradients over the data-parallel replicas, then clip them to the global norm:
        a factor split over the tensor-parallel ranks counts each rank's part, a routed expert's
        each expert-parallel rank's own experts, a whole one once. A routed expert's replicas are
        the ranks holding the same experts (megatron-core's expert data-parallel group)."""
        grads = [(p, p.grad) for _, p in self.trainable if p.grad is not None]
        for p, g in grads:
            group = (
                parallel_state.get_data_parallel_group()
                if _replicated(p)
                else parallel_state.get_expert_data_parallel_group()
            )
            if dist.get_world_size(group) > 1:
                dist.all_reduce(g, group=group)

        def squares(kind: str) -> torch.Tensor:
            parts = [g.float().square().sum() for p, g in grads if _kind(p) == kind]
            return torch.stack(parts).sum() if parts else torch.zeros((), device=self.device)

        split, expert, whole = squares("split"), squares("expert"), squares("whole")
        dist.all_reduce(split, group=self.tensor_group)
        dist.all_reduce(expert, group=parallel_state.get_expert_model_parallel_group())
        norm = float((split + expert + whole).sqrt())
        factor = min(1.0, max_grad_norm / (norm + 1e-6))  # torch's clip_grad_norm_; a non-finite norm skips the update
        for _, g in grads:
            g.mul_(factor)
        return norm

    def _base_only(self) -> AbstractContextManager:
        return adapters_off(self.megatron.gpt)


def _split(p: torch.Tensor) -> bool:
    return bool(getattr(p, "tensor_model_parallel", False))


def _kind(p: torch.Tensor) -> str:
    return "split" if _split(p) else "whole" if _replicated(p) else "expert"


def _replicated(p: torch.Tensor) -> bool:
    """Held by every data-parallel replica, not a routed expert's (megatron-core's `allreduce=False`)."""
    return bool(getattr(p, "allreduce", True))


def _global_numel(params) -> int:
    """Elements of the whole model: a split tensor's parts added up over the tensor-parallel ranks,
    a routed expert's over the expert-parallel ones (megatron-core marks those `allreduce=False`)."""
    ranks = parallel_state.get_tensor_model_parallel_world_size()
    experts = parallel_state.get_expert_model_parallel_world_size()
    return sum(p.numel() * (ranks if _split(p) else 1) * (1 if _replicated(p) else experts) for p in params)


def _unsummed(report: TrainReport) -> TrainReport:
    """What a rank other than its group's first reports: the update's figures, none of the sums
    (the first rank reports the group's)."""
    return TrainReport(
        grad_norm=report.grad_norm, skipped=report.skipped, updates=report.updates, lr=report.lr, seconds=report.seconds
    )
