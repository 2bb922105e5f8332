"""Pieces the demo, the end-to-end tests and the queue benchmark use to run the whole service: the
settings of every component in one bundle (`StackSettings`, handed to child processes through
their environment) and the front door (`python -m services.frontdoor`) as a subprocess.

Every child runs in its own session (process group), so stopping it also stops whatever it
started, and nothing is left behind after an error or Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from pydantic_settings import BaseSettings

from adaptive_rag.settings import ClassifierSettings, Settings
from services.frontdoor.settings import FrontDoorSettings
from workers.pools import process_env
from workers.settings import WorkerSettings

REPO = Path(__file__).resolve().parents[2]
READY_MARK = "READY"


@dataclass(frozen=True)
class StackSettings:
    """The settings of every component of one running stack (each read from the environment)."""

    library: Settings = field(default_factory=Settings)
    classifier: ClassifierSettings = field(default_factory=ClassifierSettings)
    frontdoor: FrontDoorSettings = field(default_factory=FrontDoorSettings)
    workers: WorkerSettings = field(default_factory=WorkerSettings)

    def _parts(self) -> list[BaseSettings]:
        return [getattr(self, f.name) for f in fields(self)]

    def configured(self, name: str) -> bool:
        """True when the field came from the environment (or .env), not from its default."""
        return any(name in part.model_fields_set for part in self._parts())

    def updated(self, **values: Any) -> StackSettings:
        """A copy with `values` set on whichever component owns each field (marked as set, so
        child processes inherit them); mappings are merged into the current ones."""
        changes: dict[str, BaseSettings] = {}
        for f in fields(self):
            part = getattr(self, f.name)
            mine = {k: v for k, v in values.items() if k in type(part).model_fields}
            if mine:
                merged = {k: ({**getattr(part, k), **v} if isinstance(v, dict) else v) for k, v in mine.items()}
                changes[f.name] = type(part).model_validate({**part.model_dump(include=part.model_fields_set), **merged})
        unknown = set(values) - {k for part in self._parts() for k in type(part).model_fields}
        if unknown:
            raise KeyError(f"no component has the setting(s) {sorted(unknown)}")
        return replace(self, **changes)

    def env(self, base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
        """The environment of a child process that reads these settings back."""
        return process_env(*self._parts(), base=base, extra=extra)


class FrontDoorProcess:
    """`python -m services.frontdoor` on `listen`, ready once it prints READY; a context manager."""

    def __init__(
        self, env: Mapping[str, str], log_path: Path, listen: str, timeout_s: float = 120.0,
        wrap: Callable[[list[str]], list[str]] | None = None,
    ) -> None:
        """`wrap`: how the command runs elsewhere (another host's network namespace:
        `infra.local.hosts.Host.wrap`; it must exec the command, so `pid` stays the front door's)."""
        self.listen = listen
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("w")
        command = [sys.executable, "-m", "services.frontdoor", "--listen", listen]
        self.process = subprocess.Popen(
            wrap(command) if wrap is not None else command, cwd=REPO,
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
