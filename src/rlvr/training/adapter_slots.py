"""Many LoRA adapters trained by one set of ranks on one frozen base, one at a time.

    slots = AdapterSlots(trainable, optimizer, scheduler)
    slots.use("alice:train:0")     # the first name keeps what the rank holds now
    slots.use("bob:train:0")       # alice's state parked; bob starts as the rank started
    slots.forget("alice:train:0")  # her parked state freed

An adapter's state is everything a step reads or writes besides the frozen base: the trainable
tensors' values, the gradient accumulated since its last optimizer step (a client may call
forward_backward, let another tenant's calls run, then call optim_step), AdamW's moments and step
count, the hyperparameters optim_step set, the schedule and the RNG (LoRA dropout draws from it).
Parking moves the gradient and optimizer tensors by reference and copies only the values (the
parameters themselves are the ones FSDP2 and the optimizer hold), so a switch costs one copy of
the adapter, and each adapter trains exactly as it would alone: the same values in, the same ops.
A new adapter starts from the state the rank had at the first `use`, when nothing has trained yet.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class AdapterState:
    values: list[torch.Tensor]
    grads: list[torch.Tensor | None]
    moments: list[dict[str, Any] | None]  # the optimizer's state of each trainable tensor (None: none yet)
    hyperparameters: list[dict[str, Any]]  # each param group's settings but its params
    schedule: dict[str, Any]
    rng: torch.Tensor
    cuda_rng: torch.Tensor | None


class AdapterSlots:
    def __init__(
        self, params: Sequence[torch.Tensor], optimizer: torch.optim.Optimizer, scheduler, device: torch.device
    ):
        self.params, self.optimizer, self.scheduler, self.device = params, optimizer, scheduler, device
        self.active: str | None = None
        self._fresh: AdapterState | None = None  # what a new adapter starts from
        self._parked: dict[str, AdapterState] = {}

    def use(self, name: str) -> None:
        """Make `name` the adapter the rank trains, reads and saves; a name not seen before starts fresh."""
        if name == self.active:
            return
        if self._fresh is None:  # the first adapter: what the rank holds is its state, and the fresh one
            self._fresh = self._capture()
            self.active = name
            return
        if self.active is not None:
            self._parked[self.active] = self._capture()
        self._restore(self._parked.pop(name) if name in self._parked else self._fresh)
        self.active = name

    def forget(self, name: str) -> None:
        """Free an adapter's state (its model closed). The active one's tensors stay in the
        parameters until another is used, but nothing parks them."""
        self._parked.pop(name, None)
        if name == self.active:
            self.active = None

    def _capture(self) -> AdapterState:
        state = self.optimizer.state
        return AdapterState(
            values=[p.detach().clone() for p in self.params],
            grads=[p.grad for p in self.params],
            moments=[state[p] if p in state else None for p in self.params],
            hyperparameters=[
                {k: v for k, v in group.items() if k != "params"} for group in self.optimizer.param_groups
            ],
            schedule=self.scheduler.state_dict(),
            rng=torch.get_rng_state(),
            cuda_rng=torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None,
        )

    def _restore(self, saved: AdapterState) -> None:
        """Put `saved` in place. The fresh state is restored many times: its tensors are copied in,
        never handed over (a gradient or moment object handed over would be written in place)."""
        fresh = saved is self._fresh
        with torch.no_grad():
            for p, value, grad, moments in zip(self.params, saved.values, saved.grads, saved.moments):
                p.detach().copy_(value)
                p.grad = None if grad is None else (grad.clone() if fresh else grad)
                if moments is None:
                    self.optimizer.state.pop(p, None)
                else:
                    self.optimizer.state[p] = _cloned(moments) if fresh else moments
        for group, settings in zip(self.optimizer.param_groups, saved.hyperparameters):
            group.update(settings)
        self.scheduler.load_state_dict(saved.schedule)
        torch.set_rng_state(saved.rng)
        if saved.cuda_rng is not None:
            torch.cuda.set_rng_state(saved.cuda_rng, self.device)


def _cloned(moments: dict[str, Any]) -> dict[str, Any]:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in moments.items()}
