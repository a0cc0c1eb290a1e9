"""Running a run: the loop (loop.py), the components it calls built from the config (builders.py),
what a checkpoint must remember (run_state.py), the evaluation schedule (evaluation.py), where
processes go (ray_placement.py; what each holds is rlvr.planning's) and what keeps the engine
running (engine_supervisor.py)."""

from rlvr.errors import UserError


class RunStopped(UserError, RuntimeError):
    """The run cannot go on (steps that keep going non-finite, an engine that keeps dying);
    the message is one line that says why, and the last checkpoint is left as it was."""
