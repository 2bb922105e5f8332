"""Redis helpers shared by the integration tests."""

from __future__ import annotations


def redis_db(url: str, db: int) -> str:
    """`url` pointing at database `db` of the same server: tests sharing one Redis stay apart."""
    return f"{url.rsplit('/', 1)[0]}/{db}"
