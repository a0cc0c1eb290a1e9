"""What a run must remember to continue exactly where it stopped, and its checkpoints.

    RunState(step, data_position, eval_before)   the loop's own state, in each checkpoint's state.json
    RunCheckpoints.save(state)                   trainer shards + adapter(s) + state, atomically
    RunCheckpoints.restore()                     the newest intact checkpoint, loaded into the trainer

What a run keeps of its rollouts, its rollout source says (rlvr.rollout.source): generated one
step ahead, the position before them and the adapter that generated them; fully asynchronous,
the drained stream's groups and the next step's batch as data, in rollouts.pt (their tokens came
from several policy versions, which no single adapter regenerates).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from rlvr.checkpoint.store import CheckpointStore, read_state
from rlvr.config import RunConfig
from rlvr.rollout.source import SavedRollouts
from rlvr.sync.weights import WeightSync
from rlvr.tracking.timing import StepTimer


@dataclass
class RunState:
    step: int = 0  # the last step whose update is in the trainer's weights
    data_position: int = 0  # the prompt sampler's position the next step draws from
    eval_before: dict | None = None  # the headline of the evaluation before RL (summary.json)


ROLLOUTS_FILE = "rollouts.pt"


class RunCheckpoints:
    def __init__(self, cfg: RunConfig, timer: StepTimer, log=print):
        self.cfg, self.timer, self.log = cfg, timer, log
        self.store = CheckpointStore(cfg.run_dir, keep=cfg.checkpoint.keep, log=log)

    def due(self, step: int, stopping: bool) -> bool:
        """Every checkpoint.every steps, after the last step, and before a requested stop."""
        every = self.cfg.checkpoint.every
        return (bool(every) and step % every == 0) or step == self.cfg.steps or stopping

    def save(self, state: RunState, trainer, sync: WeightSync, rollouts: SavedRollouts) -> None:
        """The trainer, the served adapter, and what the rollout source keeps (`rollouts`)."""

        def write_parts(folder: Path) -> None:
            (folder / "trainer").mkdir()
            trainer.save(folder / "trainer")
            sync.save(folder, with_in_flight=rollouts.in_flight_adapter)
            if rollouts.data is not None:
                torch.save(rollouts.data, folder / ROLLOUTS_FILE)

        with self.timer("checkpoint"):
            folder = self.store.save(state.step, asdict(state), write_parts)
        self.log(f"checkpoint after step {state.step}: {folder}")

    def resumable(self) -> Path:
        """The newest intact checkpoint (asked before anything starts), or a one-line error."""
        folder = self.store.latest()
        if folder is None:
            raise ValueError(f"{self.cfg.run_dir}: no intact checkpoint to resume from")
        return folder

    @staticmethod
    def restore(folder: Path, trainer) -> RunState:
        """Load the checkpoint in `folder` into the trainer; the run's state at that point."""

        trainer.load(folder / "trainer")
        return RunState(**read_state(folder))

    @staticmethod
    def saved_rollouts(folder: Path) -> dict | None:
        """The rollouts `save` kept as data, if any (the manifest's digest checked them when the folder was chosen)."""
        path = folder / ROLLOUTS_FILE
        return torch.load(path, weights_only=False) if path.is_file() else None  # the run's own file, digest-checked

    def latest(self) -> Path | None:
        return self.store.latest(verbose=False)
