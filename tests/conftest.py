"""Root conftest of the whole suite (unit, integration, e2e).

1. The CI skip guard (`ci_skip_guard.py`): with `CI=true` (CI runs `CI=true bash .ci/run`) any
   skipped test fails the run unless its node id is on `CI_ALLOWED_SKIPS` below, with its reason.
   A missing dependency, server or data file must make CI red, not quietly shorter.
2. Fixtures that start real backing services, shared by tests/integration (one or a few real
   services) and tests/e2e (the whole stack through gRPC):

   - `opensearch_url`: a real single-node OpenSearch (`infra.local.opensearch.OpenSearchNode`; its
     first start builds the launcher with Maven) on a free loopback port with a temporary data
     directory, stopped at the end of the session. With `OPENSEARCH_URL` set, that cluster is used
     instead and nothing is started.
   - `redis_url`: a real redis-server on a free loopback port (`ARAG_TEST_REDIS_URL`: that one).
   - `postgres_url`: a real PostgreSQL on a free loopback port (`ARAG_TEST_POSTGRES_URL`: that one).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from ci_skip_guard import SkipGuard, ci_enabled

# Skips that may stay skips under CI=true: node id (or test id without its `[...]`) -> reason.
# Keep this short: every entry is a test CI does not run. Empty on purpose.
CI_ALLOWED_SKIPS: dict[str, str] = {}


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SkipGuard(CI_ALLOWED_SKIPS, ci_enabled()), "ci-skip-guard")


# The suite checks mechanics, so it runs the smallest reader (about 5x faster than the default
# qwen-1.5b on 2 cores), in this process and in every server or worker it starts.
# tests/integration/test_default_reader.py runs the configured default reader itself.
TEST_READER = "gemma-270m"
os.environ.setdefault("ARAG_READER", TEST_READER)


@pytest.fixture(scope="session")
def opensearch_url() -> Iterator[str]:
    """A real single-node OpenSearch on a free loopback port (`OPENSEARCH_URL` set: that one)."""
    external = os.environ.get("OPENSEARCH_URL")
    if external:
        yield external.rstrip("/")
        return
    from infra.local.opensearch import OpenSearchNode

    with OpenSearchNode() as node:
        yield node.url


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A real redis-server on a free loopback port (`ARAG_TEST_REDIS_URL` set: that one instead)."""
    external = os.environ.get("ARAG_TEST_REDIS_URL")
    if external:
        yield external
        return
    from infra.local.servers import local_redis

    with local_redis() as url:
        yield url


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A real PostgreSQL (`infra.local.servers.LocalPostgres`) on a free loopback port, database `arag`, no schema yet.

    With `ARAG_TEST_POSTGRES_URL` set, that database is used instead and nothing is started.
    """
    external = os.environ.get("ARAG_TEST_POSTGRES_URL")
    if external:
        yield external
        return
    from infra.local.servers import local_postgres

    with local_postgres() as url:
        yield url
