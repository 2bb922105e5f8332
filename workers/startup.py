"""The start-up checks of the processes that serve (front door, worker pools): a configuration
that can never work fails at start with a precise message, not at the first request.

- `DATABASE_URL`: some host accepts writes (a list of standbys only, or several hosts without
  `target_session_attrs=read-write`, is refused; see `adaptive_rag.storage.db.check_writable`);
- `REDIS_URL` with Sentinel: a Sentinel answers and names a primary that answers
  (`workers.redis_connections.check_reachable`).

Servers that merely do not answer (one PostgreSQL host or one Redis down) are outages, not bad
configuration: the processes start and wait for them, as before.
"""

from __future__ import annotations

from adaptive_rag.storage.db import check_writable
from workers.redis_connections import check_reachable, parse


def check_backing_services(database_url: str, redis_url: str | None) -> dict[str, str]:
    """What the checks found, per part (`ConfigurationError` when the configuration cannot
    work)."""
    if redis_url:
        parse(redis_url)  # a malformed URL fails here, before anything is asked
    records = check_writable(database_url)
    broker = check_reachable(redis_url)
    return {"records": records or "not checked (SQLite, or no host answered yet)",
            "broker": broker or ("not checked (one Redis: waited for)" if redis_url else "server-less")}
