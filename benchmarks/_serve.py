"""`rlvr serve` as a benchmark starts it: a subprocess on a port, logging to FOLDER/server.log, up
once /healthz answers."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def start_server(folder: Path, port: int, config: Path, wait_s: float = 300) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-m", "rlvr.cli", "serve", "--port", str(port), "--config", str(config)],
        stdout=open(folder / "server.log", "w"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + wait_s
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/healthz", timeout=2).close()
            return process
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"rlvr serve did not start:\n{(folder / 'server.log').read_text()[-2000:]}")
            time.sleep(1)
