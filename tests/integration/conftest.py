"""Fixtures shared by the integration tests (the servers themselves are in tests/conftest.py)."""

from __future__ import annotations

import pytest

from adaptive_rag.storage import RecordStore, make_engine, upgrade_database


@pytest.fixture(scope="module")
def store(postgres_url: str) -> RecordStore:
    """The records on the session's PostgreSQL, migrated to the latest schema."""
    upgrade_database(postgres_url)
    return RecordStore(make_engine(postgres_url))
