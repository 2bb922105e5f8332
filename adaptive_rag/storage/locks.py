"""PostgreSQL session advisory locks: one holder across every process, container and pod (a
crashed holder's session ends and frees the lock)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sqlalchemy import text
from sqlalchemy.engine import Engine


def advisory_key(name: str) -> int:
    """A signed 64-bit key for PostgreSQL's advisory locks, from a lock name."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


@contextmanager
def advisory_lock(
    engine: Engine, name: str, busy: Callable[[], Exception], wait_s: float = 0.0
) -> Iterator[None]:
    """Hold the advisory lock `name` (PostgreSQL only); `busy()` is raised when another session
    still holds it after `wait_s` seconds."""
    key = advisory_key(name)
    deadline = time.monotonic() + wait_s
    with engine.connect() as conn:
        while not conn.scalar(text("SELECT pg_try_advisory_lock(:key)"), {"key": key}):
            if time.monotonic() >= deadline:
                raise busy()
            time.sleep(0.2)
        conn.commit()
        try:
            yield
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": key})
            conn.commit()
