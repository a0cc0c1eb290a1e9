"""What RUN_DIR/logs/run.log keeps of an error that ends a run: a bug's traceback; of a user error or
a named stop (a dead trainer rank: TrainerError with user_error), nothing beyond the one line the
terminal shows, unless it carries a rank's own traceback (`details`)."""

import subprocess
import sys

from rlvr.tracking.terminal import LOG_FILE

CASES = {  # run folder -> (the error raised inside run_output, whether the log holds a traceback)
    "bug": ('RuntimeError("a bug")', True),
    "stop": ('Stop("trainer rank 1 died (exit code -9); the run stops")', False),
    "user": ('ValueError("reward.timeout_s: must be positive")', False),
    "rank_traceback": ('Stop("trainer rank 0 failed: ValueError: bad row", "Traceback (rank 0)")', True),
}
RAISE_IN_RUNS = f"""
import sys
from pathlib import Path
from rlvr.tracking.terminal import run_output

class Stop(RuntimeError):  # as rlvr.training.trainer.TrainerError marks what is not a bug
    user_error = True
    def __init__(self, message, details=""):
        super().__init__(message)
        self.details = details

for name, (error, _) in {CASES!r}.items():
    try:
        with run_output(Path(sys.argv[1]) / name):
            raise eval(error)
    except Exception:
        pass
"""


def test_only_a_bug_or_a_ranks_own_traceback_reaches_the_log(tmp_path):
    done = subprocess.run([sys.executable, "-c", RAISE_IN_RUNS, str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for name, (_, traced) in CASES.items():
        log = (tmp_path / name / LOG_FILE).read_text()
        assert ("Traceback" in log) == traced, (name, log)
