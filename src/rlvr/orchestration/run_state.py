"""What a run must remember to continue exactly where it stopped, and its checkpoints.

    RunState(step, data_position, eval_before)   the loop's own state, in each checkpoint's state.json
    RunCheckpoints.save(state)                   trainer shards + adapter(s) + state, atomically
    RunCheckpoints.restore()                     the newest intact checkpoint, loaded into the trainer

Rollouts generated ahead (one step off-policy) are not saved: a resumed run generates them again
from the same prompts (the position before them), seed and adapter (saved as rollout_adapter).
Fully asynchronous, the rollout stream is drained at a checkpoint (nothing in flight), and what
it holds (the groups finished and not trained, the next step's batch) is saved as data, in
rollouts.pt: their tokens came from several policy versions, which no single adapter regenerates.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from rlvr.config import RunConfig
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
        from rlvr.checkpoint.store import CheckpointStore

        self.cfg, self.timer, self.log = cfg, timer, log
        self.store = CheckpointStore(cfg.run_dir, keep=cfg.checkpoint.keep, log=log)

    def due(self, step: int, stopping: bool) -> bool:
        """Every checkpoint.every steps, after the last step, and before a requested stop."""
        every = self.cfg.checkpoint.every
        return (bool(every) and step % every == 0) or step == self.cfg.steps or stopping

    def save(self, state: RunState, trainer, sync: WeightSync, rollouts: dict | None = None) -> None:
        """`rollouts`: fully asynchronous, the drained stream's state and the batch taken ahead."""
        def write_parts(folder: Path) -> None:
            (folder / "trainer").mkdir()
            trainer.save(folder / "trainer")
            sync.save(folder, with_in_flight=self.cfg.rollout.mode == "one_step_off")
            if rollouts is not None:
                torch.save(rollouts, folder / ROLLOUTS_FILE)

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
        from rlvr.checkpoint.store import read_state

        trainer.load(folder / "trainer")
        return RunState(**read_state(folder))

    @staticmethod
    def saved_rollouts(folder: Path) -> dict:
        """What `save` was given as `rollouts` (the manifest's digest checked it when the folder was chosen)."""
        path = folder / ROLLOUTS_FILE
        if not path.is_file():
            raise ValueError(f"{folder}: no {ROLLOUTS_FILE}: the checkpoint was not written by a rollout.mode=async run, "
                             "resume it with the mode it ran")
        return torch.load(path, weights_only=False)  # the run's own file, digest-checked

    def latest(self) -> Path | None:
        return self.store.latest(verbose=False)
