"""A revoked API key is refused by every front-door replica, whoever revoked it, with real parts:
two front doors as their own processes (`python -m services.frontdoor`, started by the lab's stack
with no worker pool) on one PostgreSQL records database and one redis-server. Each remembers keys for 10 minutes (`ARAG_KEY_CACHE=600`), so only
the revocation watch (`ARAG_KEY_REVOCATION`, its default of 1 s) can make them refuse a key they
have just accepted: the records read by the watch, not a message one replica could miss.

The probe is GetResult of a request that does not exist: NOT_FOUND while the key is accepted,
UNAUTHENTICATED once it is refused (no worker or LLM is needed).

Run: `.venv/bin/python -m pytest -q tests/integration/test_key_revocation.py`
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack

import grpc
import pytest
from typer.testing import CliRunner

from adaptive_rag.cli import app
from adaptive_rag.storage import RecordStore
from lab.harness.stack import Parts, lab_stack
from services.frontdoor.stubs import pb2, pb2_grpc
from tests.support.redis import redis_db

pytestmark = pytest.mark.integration

UNKNOWN_REQUEST = "0" * 32
KEY_CACHE_S = 600.0  # what a replica would take to forget a key without the watch
REFUSED_WITHIN_S = 30.0  # the test's patience, far below the cache's lifetime
# A new key changes the key table's revision too: the replicas drop their caches once. Past this
# (the watch's interval, 1 s, with room) a key accepted stays cached until it is revoked.
SETTLE_S = 2.5


@pytest.fixture(scope="module")
def replicas(redis_url, store: RecordStore, postgres_url, tmp_path_factory) -> Iterator[list[pb2_grpc.AdaptiveRagStub]]:
    settings = {"redis_url": redis_db(redis_url, 14), "database_url": postgres_url, "router": "rules",
                "health_workers": False, "key_cache_s": KEY_CACHE_S}
    with lab_stack(tmp_path_factory.mktemp("key-revocation"), Parts(broker="redis", records="postgres"),
                   pools=(), frontdoor=False, tenants=(), settings=settings, dotenv=False) as stack, \
            ExitStack() as running:
        stubs = []
        for name in ("replica-1", "replica-2"):
            door = stack.start_frontdoor(name)
            stubs.append(pb2_grpc.AdaptiveRagStub(running.enter_context(grpc.insecure_channel(door.listen))))
        yield stubs


def probe(stub: pb2_grpc.AdaptiveRagStub, key: str) -> grpc.StatusCode:
    """NOT_FOUND: the key was accepted; UNAUTHENTICATED: refused."""
    with pytest.raises(grpc.RpcError) as info:
        stub.GetResult(pb2.GetResultRequest(request_id=UNKNOWN_REQUEST),
                       metadata=(("authorization", f"Bearer {key}"),), timeout=10)
    return info.value.code()


def new_keys(store: RecordStore, count: int = 1) -> list[tuple[str, int]]:
    """`count` new keys of acme with their ids, once the replicas' watch has seen them."""
    keys = []
    for _ in range(count):
        key = store.create_api_key("acme")
        keys.append((key, max(view.id for view in store.list_api_keys())))
    time.sleep(SETTLE_S)
    return keys


def refused_everywhere(replicas: list[pb2_grpc.AdaptiveRagStub], key: str) -> list[float]:
    """Seconds until each replica refused `key` (each is asked until it does)."""
    started, took = time.monotonic(), []
    for stub in replicas:
        while probe(stub, key) is not grpc.StatusCode.UNAUTHENTICATED:
            assert time.monotonic() - started < REFUSED_WITHIN_S, "a replica still accepts the revoked key"
            time.sleep(0.02)
        took.append(time.monotonic() - started)
    return took


def test_a_key_revoked_in_the_records_is_refused_by_both_replicas(replicas, store):
    (key, key_id), (kept, _) = new_keys(store, 2)
    for stub in replicas:  # both accept it, and now hold it in their caches
        assert probe(stub, key) is grpc.StatusCode.NOT_FOUND
        assert probe(stub, kept) is grpc.StatusCode.NOT_FOUND
    assert store.revoke_api_key(key_id)
    took = refused_everywhere(replicas, key)
    print(f"\nrevoked in the records: refused by both replicas after {took[-1]:.2f} s")
    for stub in replicas:
        assert probe(stub, kept) is grpc.StatusCode.NOT_FOUND  # the other key still works


def test_a_key_revoked_with_arag_keys_revoke_is_refused_by_both_replicas(replicas, store, postgres_url):
    [(key, key_id)] = new_keys(store)
    for stub in replicas:
        assert probe(stub, key) is grpc.StatusCode.NOT_FOUND
    revoked = CliRunner().invoke(app, ["keys", "revoke", str(key_id)], env={"DATABASE_URL": postgres_url})
    assert revoked.exit_code == 0, revoked.output
    took = refused_everywhere(replicas, key)
    print(f"\nrevoked with `arag keys revoke`: refused by both replicas after {took[-1]:.2f} s")
