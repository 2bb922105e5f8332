"""Pieces the demo and the queue benchmark start as real processes: the front door
(`python -m services.frontdoor`) as a subprocess, and a gRPC client for it.

Every child runs in its own session (process group), so stopping it also stops whatever it
started, and nothing is left behind after an error or Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
READY_MARK = "READY"


class FrontDoorProcess:
    """`python -m services.frontdoor` on `listen`, ready once it prints READY; a context manager."""

    def __init__(
        self, env: Mapping[str, str], log_path: Path, listen: str, timeout_s: float = 120.0,
    ) -> None:
        self.listen = listen
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "services.frontdoor", "--listen", listen], cwd=REPO,
            env={**env, "PYTHONUNBUFFERED": "1"}, stdin=subprocess.DEVNULL, stdout=self._log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise

    @property
    def pid(self) -> int:
        return self.process.pid

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while READY_MARK not in self.log_path.read_text(errors="replace"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the front door did not start (log {self.log_path}):\n"
                    f"{self.log_path.read_text(errors='replace')[-4000:]}"
                )
            time.sleep(0.1)

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM (graceful: in-flight calls finish), then SIGKILL to the whole group."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.process.poll() is None:
            self.process.wait(timeout=10)
        if not self._log.closed:
            self._log.close()

    def __enter__(self) -> FrontDoorProcess:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
