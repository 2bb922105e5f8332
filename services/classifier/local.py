"""Start and stop the local Triton (`serve.py`, the real `tritonserver` from `nvidia-pytriton`) as a
subprocess on free loopback ports, for the demo and the tests. A repository with no version yet
gets one from `arag model bootstrap` (an untrained MiniLM-L6; needs the `train` extras: torch)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from infra.local.servers import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVE = REPO_ROOT / "services" / "classifier" / "serve.py"
START_TIMEOUT_S = 180
# serve.py's own line (Triton's model table also says READY, before the health check passed)
READY_LINE = re.compile(r"^READY model ", re.MULTILINE)


class TritonProcess:
    """`serve.py` on `repository` (EXPLICIT model control: the versions config.pbtxt names, or
    exactly `version`); ready when it prints its READY line. `threads`: ONNX Runtime intra-op
    threads of each loaded version; `extra_env`: added to its environment."""

    def __init__(
        self, repository: Path, log_path: Path, timeout_s: float = START_TIMEOUT_S,
        grpc_port: int | None = None, version: int | None = None, threads: int | None = None,
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        # A given gRPC port restarts Triton where its clients already point (new model version).
        self.grpc_port = grpc_port or free_port()
        ports = [str(self.grpc_port), str(free_port()), str(free_port())]
        self.log_path = log_path
        self.log = log_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVE), "--repository", str(repository), "--grpc-port", ports[0],
             "--http-port", ports[1], "--metrics-port", ports[2],
             *(["--version", str(version)] if version is not None else []),
             *(["--threads", str(threads)] if threads is not None else [])],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO_ROOT,
            env={**os.environ, **(extra_env or {}), "PYTHONUNBUFFERED": "1"},
        )
        deadline = time.monotonic() + timeout_s
        while not READY_LINE.search(log_path.read_text()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"serve.py did not become ready:\n{log_path.read_text()[-4000:]}")
            time.sleep(0.2)

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if not self.log.closed:
            self.log.close()

    def __enter__(self) -> TritonProcess:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
