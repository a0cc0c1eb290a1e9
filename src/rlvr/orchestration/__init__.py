"""The RL loop (controller.py) and what keeps it running (engine_supervisor.py)."""


class RunStopped(RuntimeError):
    """The run cannot go on (steps that keep going non-finite, an engine that keeps dying);
    the message is one line that says why, and the last checkpoint is left as it was."""
