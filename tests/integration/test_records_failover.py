"""Records failover with real PostgreSQL: a primary and a streaming replica
(`infra.local.failover.LocalPostgresReplica`, `pg_basebackup -R`), the record store on a
multi-host URL with `target_session_attrs=read-write`. The primary is killed (SIGKILL), the
replica promoted with `pg_ctl promote` (what Patroni does in production), and the same record
store, never restarted, writes again; what was committed and replicated before the crash is there.

Run: `.venv/bin/python -m pytest -q -s tests/integration/test_records_failover.py`
"""

from __future__ import annotations

import time
import uuid

import pytest

from adaptive_rag.contracts import RoutingDecision, Tier
from adaptive_rag.errors import ConfigurationError, DatabaseUnavailableError
from adaptive_rag.storage import RecordStore, make_engine, upgrade_database
from adaptive_rag.storage.db import check_writable
from infra.local.failover import LocalPostgresReplica, multi_host_url
from infra.local.servers import LocalPostgres

pytestmark = pytest.mark.integration

WRITE_AGAIN_S = 15.0


def record(store: RecordStore) -> str:
    request_id = uuid.uuid4().hex
    store.create_request(request_id, "acme", None, "What is the capital of France?",
                         decision=RoutingDecision(tier=Tier.A, fallback=True, reason="test", strategy="no_retrieval"))
    return request_id


def test_the_record_store_writes_again_after_the_replica_is_promoted(capsys):
    # (no directories given: temporary ones the PostgreSQL account can reach, deleted at the end)
    with LocalPostgres() as primary, LocalPostgresReplica(primary) as replica:
        url = multi_host_url([primary, replica])
        upgrade_database(url)
        assert check_writable(url) == f"primary 127.0.0.1:{primary.port}"
        assert replica.in_recovery()
        with pytest.raises(ConfigurationError, match=f"127.0.0.1:{replica.port} is a standby"):
            check_writable(multi_host_url([replica]))  # the start-up check on a replica-only list

        engine = make_engine(url)
        store = RecordStore(engine)
        before = record(store)
        replica.wait_caught_up()

        primary.kill()
        with pytest.raises(DatabaseUnavailableError):  # no host accepts writes until the promotion
            record(store)
        promote_s = replica.promote()
        promoted_at = time.monotonic()
        failures = 0
        while True:
            try:
                after = record(store)
                break
            except DatabaseUnavailableError:  # a pooled connection of the dead primary, once
                failures += 1
                assert time.monotonic() - promoted_at < WRITE_AGAIN_S, "no write after the promotion"
                time.sleep(0.1)
        write_s = time.monotonic() - promoted_at
        assert store.get_request(before) is not None and store.get_request(after) is not None
        assert not replica.in_recovery()
        assert check_writable(url) == f"primary 127.0.0.1:{replica.port}"
        engine.dispose()
        with capsys.disabled():
            print(f"\nrecords failover: pg_ctl promote {promote_s:.1f} s; first write {write_s:.2f} s after it "
                  f"({failures} failed call(s) in between)")
