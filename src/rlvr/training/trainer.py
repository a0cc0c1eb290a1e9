"""The controller's handle on the trainer ranks: start them, feed them, read them, stop them.

    spec = RankSpec(folder=folder, dtype=cfg.model.dtype, trainer=cfg.trainer, ...)  # folder: the run's ModelFolder
    with Trainer(spec) as trainer:   # cfg.trainer.ranks ranks
        metrics = trainer.train_step(batch, temperature=1.0)
        adapter = trainer.adapter()

The user never calls torchrun: by default the ranks are local processes this class spawns;
`launch` puts them elsewhere (Ray actors: rlvr.orchestration.ray_placement). Either way a
rank is a handle with send/receive, and all command and gather logic lives here. A rank that
dies or raises stops the run with its traceback; the others are torn down with it.
"""

from __future__ import annotations

import multiprocessing as mp
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

import torch

from rlvr.affinity import allowed_cores, rank_threads
from rlvr.records import LoraAdapter, TrainBatch
from rlvr.training import commands, wire
from rlvr.training.commands import Command, MiniBatch, StepInput, SumLossInput
from rlvr.training.packing import plan, split_by_group
from rlvr.training.rank_host import run_rank
from rlvr.training.report import OptimizerUpdate, step_metrics
from rlvr.training.worker import RankSpec, RankStarted


class TrainerError(RuntimeError):
    """A rank that failed or died; one line, with the rank's traceback in `details`."""

    def __init__(self, message: str, details: str = "", user_error: bool = False):
        super().__init__(message)
        self.details, self.user_error = details, user_error


class RankDied(Exception):
    """Whatever hosted a rank is gone; the message says how (exit code, Ray's account)."""


class RankHandle(Protocol):
    """The controller's end of one rank: how commands reach it, whatever hosts it."""

    def send(self, command: Command) -> None: ...

    def receive(self, timeout_s: float | None) -> tuple[str, Any]:
        """("ok", value) or ("error", traceback); raises RankDied, or TimeoutError after timeout_s."""
        ...

    def stop(self) -> None:
        """Ask the rank to leave (all ranks are asked before any is waited for)."""
        ...

    def wait_stopped(self) -> None:
        """Wait a while for it to go, then force it."""
        ...


Launch = Callable[[int, RankSpec], list[RankHandle]]


class Trainer:
    def __init__(self, spec: RankSpec, launch: Launch | None = None):
        ranks = spec.trainer.ranks
        self.spec, self.world_size, self.micro_batch_tokens = spec, ranks, spec.trainer.micro_batch_tokens
        self._adapter_version = 0
        self._lora_config: dict | None = None  # fixed for the trainer's life: asked once
        self._training = False
        threads = spec.threads or rank_threads(len(allowed_cores()), ranks)
        self._ranks: list[RankHandle] = (launch or spawn_ranks)(ranks, replace(spec, threads=threads))
        self._started: RankStarted | None = None  # rank 0's report, once every rank has loaded its shard

    def wait_started(self) -> RankStarted:
        """Rank 0's report once every rank has loaded its shard (a TrainerError if one could not).

        The ranks load in the background from the moment the Trainer exists, so that a run builds
        its engine meanwhile: both are mostly imports and reads, seconds each, on cores of their own.
        Anything that needs the ranks waits here first."""
        if self._started is None:
            self._started = self._gather(timeout_s=self.spec.trainer.start_timeout_s)[0]
        return self._started

    @property
    def share_prompts(self) -> bool:
        """One copy of a prompt for all its samples, which needs rlvr's packed attention on the model."""
        return self.spec.trainer.share_prompts and self.wait_started().packed_attention

    # ------------------------------------------------------------------ commands

    def train_step(self, batch: TrainBatch, temperature: float = 1.0) -> dict[str, float]:
        self.start_train_step(batch, temperature)
        return self.finish_train_step()

    def start_train_step(self, batch: TrainBatch, temperature: float = 1.0) -> None:
        """Hand the step to the ranks and return while they compute (the controller generates
        the next batch meanwhile); finish_train_step() waits for them. No other command may
        come in between: the ranks answer in order.

        The rollouts are split into trainer.mini_batches mini-batches of whole prompt groups,
        each an optimizer update; trainer.epochs passes go over them."""
        sequences = [p + c for p, c in zip(batch.prompt_ids, batch.completion_ids)]
        prompt_lens = [len(p) for p in batch.prompt_ids]
        trained = batch.loss_mask or [[1] * len(c) for c in batch.completion_ids]
        per_rank: list[list[MiniBatch]] = [[] for _ in range(self.world_size)]
        for members in split_by_group(batch.group.tolist(), self.spec.trainer.mini_batches):
            planned = self._plan([sequences[i] for i in members], [prompt_lens[i] for i in members])
            for rank, micro_batches in enumerate(planned):
                for mb in micro_batches:
                    mb.sequences = [members[j] for j in mb.sequences]
                per_rank[rank].append(MiniBatch(micro_batches, sum(sum(trained[i]) for i in members), len(members)))
        advantages = batch.advantages.tolist()
        inputs = []
        for minis in per_rank:
            mine = [i for mini in minis for mb in mini.micro_batches for i in mb.sequences]
            inputs.append(
                StepInput(
                    mini_batches=minis,
                    epochs=self.spec.trainer.epochs,
                    advantages={i: advantages[i] for i in mine},
                    sampler_logprobs={i: batch.sampler_logprobs[i] for i in mine},
                    loss_masks={i: batch.loss_mask[i] for i in mine} if batch.loss_mask is not None else None,
                    max_len=max(len(c) for c in batch.completion_ids),
                    temperature=temperature,
                    routes={i: batch.routes[i] for i in mine} if batch.routes is not None else None,
                )
            )
        self._send_each(inputs)
        self._training = True

    def finish_train_step(self) -> dict[str, float]:
        """The step's metrics, once every rank has finished it; `time/train` is the slowest
        rank's own compute time. Per-token metrics are means over every trained token of every
        update; loss and grad_norm are the mean update's."""
        self._training = False
        return step_metrics(self._gather())

    def logprobs(
        self, sequences: list[list[int]], prompt_lens: list[int], temperature: float = 1.0
    ) -> list[list[float]]:
        """The trainer's logprob of every token after each prompt (no gradient)."""
        per_rank = self._plan(sequences, prompt_lens)
        merged: dict[int, list[float]] = {}
        for part in self._call_each([commands.Logprobs(mbs, temperature) for mbs in per_rank]):
            merged.update(part)
        return [merged[i] for i in range(len(sequences))]

    def forward_backward(
        self,
        inputs: list[list[int]],
        targets: list[list[int]],
        loss: str,
        loss_inputs: list[dict[str, torch.Tensor]],
        clip_thresholds: tuple[float, float],
        backward: bool = True,
    ) -> tuple[list[torch.Tensor], float]:
        """The Tinker API's forward_backward: `inputs[i][t]` predicts `targets[i][t]`; the loss
        (rlvr.algorithms.sum_losses) is a sum over every token of every datum, and its gradient
        adds up over calls until optim_step(). Returns each datum's logprobs and the loss."""
        # each datum is scored as a completion after its first token; the targets it scores are
        # the datum's own, whatever its next input token is
        sequences = [list(x) + [y[-1]] for x, y in zip(inputs, targets)]
        per_rank = plan(sequences, [1] * len(sequences), self.world_size, self.micro_batch_tokens, share_prompts=False)
        payloads = []
        for micro_batches in per_rank:
            for mb in micro_batches:
                mb.score_targets = (
                    torch.cat([torch.as_tensor(targets[i], dtype=mb.score_targets.dtype) for i in mb.sequences])
                    if mb.sequences
                    else mb.score_targets
                )
            mine = [i for mb in micro_batches for i in mb.sequences]
            payloads.append(
                SumLossInput(micro_batches, loss, {i: loss_inputs[i] for i in mine}, clip_thresholds, backward)
            )
        merged: dict[int, torch.Tensor] = {}
        total = 0.0
        for part in self._call_each(payloads):
            merged.update(part.logprobs)
            total += part.loss
        return [merged[i] for i in range(len(sequences))], total

    def optim_step(
        self, lr: float, betas: tuple[float, float], eps: float, weight_decay: float, max_grad_norm: float
    ) -> OptimizerUpdate:
        """Apply the gradient forward_backward() accumulated with these AdamW settings."""
        return self._call_all(commands.OptimStep(lr, betas, eps, weight_decay, max_grad_norm))[0]

    def adapter(self) -> LoraAdapter:
        if not self.spec.trainer.lora:
            raise TrainerError("adapter(): this trainer runs full fine-tuning; use weights()")
        parts = self._call_all(commands.Adapter())  # each rank's dim-0 shards, or rank 0's whole tensors
        tensors = {name: torch.cat([part[name] for part in parts if name in part]) for name in parts[0]}
        if self._lora_config is None:
            self._lora_config = self._call_all(commands.LoraConfigOf())[0]
        config = self._lora_config
        self._adapter_version += 1
        return LoraAdapter(tensors=tensors, config=config, version=self._adapter_version)

    def weights(self) -> dict[str, torch.Tensor]:
        return self._call_all(commands.FullWeights())[0]

    def placement(self) -> list[dict]:
        """Each rank's cores (where its threads may run, as the kernel says) and torch threads."""
        return self._call_all(commands.Placement())

    def packed_base_bytes(self) -> list[int]:
        """Bytes of packed (quantized) base weights each rank holds between steps: its shards."""
        return self._call_all(commands.PackedBaseBytes())

    def save(self, folder: str) -> None:
        """Every rank writes its shard of the trainable state into `folder` (which must exist)."""
        self._call_all(commands.Save(str(folder)))

    def load(self, folder: str, optimizer: bool = True) -> None:
        """Put back what `save` wrote (with `optimizer` False: the trainable weights alone, a fresh optimizer)."""
        self._call_all(commands.Load(str(folder), optimizer))

    def use_adapter(self, name: str) -> None:
        """Train, read and save LoRA adapter `name` from now on, each adapter with its own weights,
        gradient, optimizer state and RNG (rlvr.training.adapter_slots); a new name starts as the
        ranks did."""
        self._call_all(commands.AdapterSlot(name))

    def forget_adapter(self, name: str) -> None:
        self._call_all(commands.AdapterSlot(name, forget=True))

    def close(self) -> None:
        ranks, self._ranks = self._ranks, []
        for rank in ranks:
            rank.stop()
        for rank in ranks:
            rank.wait_stopped()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ plumbing

    def _plan(self, sequences: list[list[int]], prompt_lens: list[int]):
        return plan(sequences, prompt_lens, self.world_size, self.micro_batch_tokens, self.share_prompts)

    def _call_all(self, command: Command) -> list:
        return self._call_each([command] * self.world_size)

    def _call_each(self, commands: Sequence[Command]) -> list:
        self._send_each(commands)
        return self._gather()

    def _send_each(self, commands: Sequence[Command]) -> None:
        if self._training:
            raise TrainerError(
                f"{type(commands[0]).__name__}: a train step is in flight; call finish_train_step() first"
            )
        self.wait_started()  # the ranks answer in order: their start report comes first
        for rank, command in zip(self._ranks, commands):
            rank.send(command)

    def _gather(self, timeout_s: float | None = None) -> list:
        """Every rank's answer to the last command, or a TrainerError naming the rank at fault.

        Ranks are polled together, not in turn: when one dies, the others' collectives fail
        ("connection reset") or hang, and the death, not its echo, is what the error must name."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        answers: dict[int, tuple[str, Any]] = {}
        failed_at = None
        while len(answers) < len(self._ranks):
            for index, rank in enumerate(self._ranks):
                if index in answers:
                    continue
                try:
                    answers[index] = rank.receive(_POLL_S)
                except RankDied as died:
                    self.close()
                    # a death is the machine's (the OOM killer, a lost node, an operator), not a bug to
                    # trace: the line says all there is, and a scheduler restarts the run from its checkpoint
                    raise TrainerError(f"trainer rank {index} died ({died}); the run stops", user_error=True) from None
                except TimeoutError:
                    pass
            errors = [index for index, (status, _) in sorted(answers.items()) if status == "error"]
            if errors:
                # A peer's death shows up in the survivors' collectives first; wait a moment for it.
                failed_at = failed_at or time.monotonic()
                if len(answers) == len(self._ranks) or time.monotonic() - failed_at > _DEATH_GRACE_S:
                    self.close()
                    failure = answers[errors[0]][1]
                    raise TrainerError(
                        f"trainer rank {errors[0]} failed: {failure.line}", failure.traceback, failure.user_error
                    )
            elif deadline is not None and time.monotonic() > deadline:
                late = min(set(range(len(self._ranks))) - answers.keys())
                self.close()
                raise TrainerError(f"trainer rank {late} did not answer in time")
        return [answers[index][1] for index in range(len(self._ranks))]


_POLL_S = 1.0
_DEATH_GRACE_S = 5.0


# ---------------------------------------------------------------------- local processes


class RankProcess:
    """A rank in a local process of its own, spoken to over a pipe."""

    def __init__(self, context, rank: int, world_size: int, port: int, spec: RankSpec):
        self._conn, child = context.Pipe()
        self._process = context.Process(target=run_rank, args=(rank, world_size, port, spec, child), daemon=True)
        self._process.start()
        child.close()

    def send(self, command: Command) -> None:
        try:
            wire.send(self._conn, command)
        except (BrokenPipeError, OSError):
            pass  # it died: receive says how

    def receive(self, timeout_s: float | None) -> tuple[str, Any]:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._conn.poll(1.0 if deadline is None else min(1.0, max(0.0, deadline - time.monotonic()))):
            if not self._process.is_alive():
                raise RankDied(f"exit code {self._process.exitcode}")
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError
        try:
            return wire.receive(self._conn)
        except (EOFError, OSError):  # the pipe closed under us: the process is going
            self._process.join(timeout=5)
            raise RankDied(f"exit code {self._process.exitcode}") from None

    def stop(self) -> None:
        if self._process.is_alive():
            self.send(commands.Close())

    def wait_stopped(self) -> None:
        self._process.join(timeout=30)
        if self._process.is_alive():
            self._process.kill()


def spawn_ranks(world_size: int, spec: RankSpec) -> list[RankHandle]:
    """The default launch: one process per rank, meeting on a loopback port.

    The ranks are forked from a fork server (a fresh interpreter, so none of the controller's
    threads or engine state) that imported the rank's stack once: spawn would import torch,
    transformers and peft again in every rank (~5 s of CPU each, as much as a tiny run's steps),
    and again for a rank restarted after a failure."""
    context = mp.get_context("forkserver")
    # __main__ too: a child of the server that imported the main script does not import it again
    context.set_forkserver_preload(["__main__", "rlvr.training.rank_host"])
    port = free_port()
    return [RankProcess(context, rank, world_size, port, spec) for rank in range(world_size)]


def free_port() -> int:
    """A TCP port free on every interface of this machine, for rank 0 to listen on."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
