"""The first code that runs inside a sandbox; rlvr never imports it, it passes its text to `python -c`.

Standard input starts with the run's files, framed as: ten ASCII digits (the header's length),
a JSON header `[[name, size], ...]`, then each file's bytes in that order. The files are
written into the working directory (the private /tmp), then `main.py` runs as `__main__`, the
way `python main.py` would run it: its directory first on sys.path, tracebacks without this
script's frames. What follows the files on standard input is the program's own input, read
from the same descriptor: this script reads exactly the framed bytes and no more.
Only the standard library of Python >= 3.9 is used (the interpreter check in isolation.py).
"""

import json
import os
import sys
import types


def _read_exactly(size):
    chunks = []
    while size:
        chunk = os.read(0, min(size, 1 << 20))
        if not chunk:
            sys.exit("rlvr sandbox: the run's files were cut short")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _write_files():
    header = json.loads(_read_exactly(int(_read_exactly(10))))
    for name, size in header:
        data = _read_exactly(size)
        folder = os.path.dirname(name)
        if folder:
            os.makedirs(folder, exist_ok=True)
        with open(name, "wb") as f:
            f.write(data)


def _run_main():
    path = os.path.abspath("main.py")
    with open(path, "rb") as f:
        source = f.read()
    module = types.ModuleType("__main__")
    module.__file__ = path
    sys.modules["__main__"] = module
    sys.argv = [path]
    sys.path.insert(0, os.path.dirname(path))
    try:
        exec(compile(source, path, "exec"), module.__dict__)
    except SystemExit:
        raise
    except BaseException as e:
        import traceback  # only on failure: every import is start-up time of every run

        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != path:
            tb = tb.tb_next
        traceback.print_exception(type(e), e, tb)
        sys.exit(1)


_write_files()
_run_main()
