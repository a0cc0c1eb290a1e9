"""Which errors are the user's to fix, and how each is said in one line.

A user error (a bad config, data row, model folder or checkpoint; a full disk) ends a command
with one line naming the cause and exit code 2; anything else is a bug, reported in one line
that points at the traceback (in the run's log, or on the terminal with --debug), exit code 1.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass

# Causes a user fixes on their side: space, permissions, a read-only or missing path.
USER_OS_ERRORS = {
    errno.ENOSPC,
    errno.EDQUOT,
    errno.EACCES,
    errno.EPERM,
    errno.EROFS,
    errno.ENOENT,
    errno.ENOTDIR,
    errno.EISDIR,
}


class UserError(Exception):
    """Raised (or mixed into an error class) for what the user must fix; the message is one line."""


# Libraries written in Rust (safetensors, tokenizers) raise their own types for I/O failures,
# with the OS error in the text: "I/O error: No space left on device (os error 28)".
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def user_error_line(error: BaseException) -> str | None:
    """The one line to print if `error` (or an error it was raised from) is the user's to fix, else None."""
    if type(error).__name__ == "ValidationError" and hasattr(error, "errors"):  # pydantic's: say what failed
        first = error.errors()[0]
        return f"{error.title}: {first['msg'].removeprefix('Value error, ')}"
    if isinstance(error, (UserError, ValueError)) or getattr(error, "user_error", False):
        lines = str(error).strip().splitlines() or [type(error).__name__]
        return lines[0] + (" (details in the run's logs/run.log)" if len(lines) > 1 else "")
    for cause in _chain(error):
        if isinstance(cause, OSError) and cause.errno in USER_OS_ERRORS:
            where = f": {cause.filename}" if cause.filename else ""
            return f"{cause.strerror or cause}{where}"
        found = _RUST_OS_ERROR.search(str(cause))
        if found and int(found.group(1)) in USER_OS_ERRORS:
            return f"{os.strerror(int(found.group(1)))} ({type(cause).__name__}: {str(cause).splitlines()[0]})"
    return None


@dataclass(frozen=True)
class ExitLine:
    """The line a failed command ends with on stderr: `label: text`."""

    label: str  # "error" (the user's to fix) or "internal error" (a bug)
    text: str
    command_line_error: bool = False  # a bad subcommand, option or argument: no traceback to show


def command_exit(error: Exception) -> tuple[int, ExitLine | None]:
    """(exit code, the one line to print) for an exception that ended a command: an abort 130 and
    silent, a bad command line click's own code and message, a user error 2, anything else 1."""
    # typer 0.29 raises its vendored click's exceptions (typer._click), not click's own: match by name
    kinds = {kind.__name__ for kind in type(error).__mro__}
    if "Abort" in kinds:
        return 130, None
    if "ClickException" in kinds:
        message = f"{error.format_message()} (rlvr --help lists the commands)"  # type: ignore[attr-defined]
        return error.exit_code, ExitLine("error", message, command_line_error=True)  # type: ignore[attr-defined]
    line = user_error_line(error)
    if line is not None:
        return 2, ExitLine("error", line)
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return 1, ExitLine("internal error", f"{type(error).__name__}: {first}")


def _chain(error: BaseException):
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__
