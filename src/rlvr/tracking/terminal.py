"""What a run shows in the terminal, and where everything else it prints goes.

    with run_output(run_dir, verbose=False) as console:
        console.print("rlvr's own line")          # the user's terminal
        print("a library's line")                  # RUN_DIR/logs/run.log
    with quiet_output(log_file) as console: ...    # any command: the same, into log_file

vLLM, transformers, torch and Ray write hundreds of INFO/WARNING lines a run (per step:
"Reloading weights inplace", "Failed to load weights" for RotaryEmbedding ...), from this
process and from every process it starts (trainer ranks, vLLM's engine core, scoring workers,
Ray workers). Redirecting file descriptors 1 and 2, not Python's sys.stdout, catches them all:
children inherit the descriptors, and C extensions write to them directly. rlvr's own lines
(the progress bar, one line per evaluation and checkpoint, warnings in its own words, the
summary) go to a duplicate of the original stdout kept aside. `verbose` leaves both as they are.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console

from rlvr.errors import user_error_line

LOG_FILE = "logs/run.log"
# Rich lays out at 80 columns where it finds no terminal; into a file or pipe, lines are as long as
# they are (soft wrap) and tables as wide as their content (a width no table reaches)
UNBOUNDED_WIDTH = 100_000


def console_for(file=None, *, stderr: bool = False) -> Console:
    """rlvr's console on `file` (None: stdout, or stderr): a terminal's as Rich makes it; into a
    file or pipe, no line broken at 80 columns (grep and log readers see whole lines)."""
    stream = file if file is not None else sys.stderr if stderr else sys.stdout
    # emoji off: rlvr's ids and paths hold `:name:` runs (a served model's SESSION:train:N) that
    # Rich would otherwise print as emoji
    if stream.isatty():
        return Console(file=file, stderr=stderr, emoji=False)
    return Console(file=file, stderr=stderr, soft_wrap=True, width=UNBOUNDED_WIDTH, emoji=False)


def run_output(run_dir: str | Path, verbose: bool = False):
    """A run's output: its own lines on the terminal, everything else in RUN_DIR/logs/run.log."""
    return quiet_output(Path(run_dir) / LOG_FILE, verbose, keep_empty=True)


@contextmanager
def quiet_output(log_path: str | Path, verbose: bool = False, keep_empty: bool = False) -> Iterator[Console]:
    """rlvr's console on the terminal; file descriptors 1 and 2 (every library's and child
    process's output) appended to `log_path` until the block ends; a log left empty is removed
    unless `keep_empty`. `verbose`: both as they are."""
    if verbose:
        yield console_for()
        return
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    terminal = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8", errors="replace")
    with open(log_path, "ab", buffering=0) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield console_for(terminal)
        except BaseException as error:  # a bug's traceback goes to the log; the terminal gets one line (rlvr.cli)
            if user_error_line(error) is None:  # a user error or a named stop (a dead rank) is its one line alone
                traceback.print_exc()
            if getattr(error, "details", ""):  # a trainer rank's own traceback
                print(error.details, file=sys.stderr)
            raise
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)
            terminal.close()
            if not keep_empty and log_path.stat().st_size == 0:
                log_path.unlink()
