"""Fair share against a real redis-server: the Lua script and the in-memory twin must agree.

The behaviour table runs against both `RedisFairShare` and `InMemoryFairShare` on real time (the
script reads the server's clock), so rates are slow (no refill within a test) or sleeps are short.
Every test uses its own key prefix, so tests never see each other's buckets or leases.

Run: `.venv/bin/python -m pytest tests/integration/test_fair_share_redis.py -q`
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from adaptive_rag.contracts import Tier
from adaptive_rag.errors import OverShareError
from infra.local.servers import LocalRedis, free_port
from services.frontdoor.fair_share import (
    FairShareConfig, FairShareLimits, InMemoryFairShare, RedisFairShare,
)

pytestmark = pytest.mark.integration

LEASES = {Tier.A: 30.0, Tier.B: 30.0, Tier.C: 30.0}
SLOW = 0.001  # tokens per second: no refill worth a token within a test
IMPLEMENTATIONS = ["redis", "memory"]


def limits(rate: float = 0.0, burst: int = 0, slots: dict | None = None,
           lease_s: dict | None = None) -> FairShareLimits:
    return FairShareLimits(rate_per_s=rate, burst=burst, slots=slots or {},
                           lease_s=lease_s or LEASES)


def client_for(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)


@pytest.fixture
def prefix() -> str:
    return f"test:fair:{uuid.uuid4().hex}"


@pytest.fixture
def rclient(redis_url):
    client = client_for(redis_url)
    yield client
    client.close()


Factory = Callable[..., RedisFairShare | InMemoryFairShare]


@pytest.fixture(params=IMPLEMENTATIONS)
def make_share(request, prefix) -> Factory:
    """Builds the implementation under test from limits (default, then `tenant=limits`)."""

    def build(default: FairShareLimits, **tenants: FairShareLimits):
        config = FairShareConfig(default, tenants)
        if request.param == "memory":
            return InMemoryFairShare(config)
        client = request.getfixturevalue("rclient")
        return RedisFairShare(client, config, key_prefix=prefix)

    return build


def outcome(fs, tenant: str, tier: Tier, request_id: str) -> str:
    try:
        fs.acquire(tenant, tier, request_id)
    except OverShareError as exc:
        return "slots" if "slots in use" in str(exc) else "rate"
    return "ok"


C, B, A = Tier.C, Tier.B, Tier.A

# name -> (default limits, overrides, steps); a step is ("acquire", tenant, tier, id, expected) or
# ("release", tenant, tier, id).
TABLE: dict[str, tuple[FairShareLimits, dict[str, FairShareLimits], list[tuple]]] = {
    "burst then rate": (limits(rate=SLOW, burst=2), {}, [
        ("acquire", "t", A, "r1", "ok"), ("acquire", "t", C, "r2", "ok"),
        ("acquire", "t", B, "r3", "rate"),
    ]),
    "slots per tier": (limits(slots={C: 2}), {}, [
        ("acquire", "t", C, "r1", "ok"), ("acquire", "t", C, "r2", "ok"),
        ("acquire", "t", C, "r3", "slots"), ("acquire", "t", B, "r4", "ok"),
    ]),
    "replay takes nothing": (limits(rate=SLOW, burst=2, slots={C: 1}), {}, [
        ("acquire", "t", C, "r1", "ok"), ("acquire", "t", C, "r1", "ok"),
        ("acquire", "t", C, "r1", "ok"), ("acquire", "t", B, "r2", "ok"),
        ("acquire", "t", B, "r3", "rate"), ("acquire", "t", C, "r1", "ok"),
    ]),
    "release frees the slot": (limits(slots={C: 1}), {}, [
        ("acquire", "t", C, "r1", "ok"), ("acquire", "t", C, "r2", "slots"),
        ("release", "t", C, "unknown"), ("release", "t", B, "r1"), ("release", "u", C, "r1"),
        ("acquire", "t", C, "r2", "slots"), ("release", "t", C, "r1"),
        ("acquire", "t", C, "r2", "ok"),
    ]),
    "refusal takes no token": (limits(rate=SLOW, burst=2, slots={C: 1}), {}, [
        ("acquire", "t", C, "r1", "ok"), ("acquire", "t", C, "r2", "slots"),
        ("acquire", "t", C, "r2", "slots"), ("release", "t", C, "r1"),
        ("acquire", "t", C, "r2", "ok"), ("release", "t", C, "r2"),
        ("acquire", "t", C, "r3", "rate"),
    ]),
    "overrides": (limits(rate=SLOW, burst=1, slots={C: 1}),
                  {"vip": limits(rate=SLOW, burst=3, slots={C: 2})}, [
        ("acquire", "vip", C, "v1", "ok"), ("acquire", "vip", C, "v2", "ok"),
        ("acquire", "vip", C, "v3", "slots"), ("acquire", "vip", B, "v4", "ok"),
        ("acquire", "vip", B, "v5", "rate"),
        ("acquire", "std", C, "s1", "ok"), ("acquire", "std", B, "s2", "rate"),
    ]),
    "tenants are isolated": (limits(rate=SLOW, burst=2, slots={C: 1}), {}, [
        ("acquire", "flood", C, "f1", "ok"), ("acquire", "flood", C, "f2", "slots"),
        ("acquire", "flood", B, "f3", "ok"), ("acquire", "flood", B, "f4", "rate"),
        ("acquire", "quiet", C, "f1", "ok"), ("acquire", "quiet", B, "q2", "ok"),
        ("release", "quiet", C, "f1"), ("acquire", "flood", C, "f2", "slots"),
    ]),
    "unlimited": (limits(rate=0.0, burst=0, slots={C: 0}), {}, [
        ("acquire", "t", tier, f"r{i}{tier}", "ok") for i in range(40) for tier in (A, B, C)
    ]),
    "awkward tenant names": (limits(rate=SLOW, burst=1), {}, [
        ("acquire", name, A, "r1", "ok") for name in ("a:b", "a%3Ab", "a}{b", "", "ü 🙂", "*")
    ] + [("acquire", "a:b", A, "r2", "rate")]),
}


@pytest.mark.parametrize("scenario", list(TABLE))
def test_behaviour_table(make_share, scenario):
    default, overrides, steps = TABLE[scenario]
    fs = make_share(default, **overrides)
    for number, step in enumerate(steps):
        if step[0] == "release":
            fs.release(*step[1:])
        else:
            _, tenant, tier, request_id, expected = step
            assert outcome(fs, tenant, tier, request_id) == expected, f"step {number}: {step}"


def test_retry_after_hints(make_share):
    fs = make_share(limits(rate=0.5, burst=1, slots={C: 1}))
    fs.acquire("t", C, "r1")
    with pytest.raises(OverShareError) as slots:
        fs.acquire("t", C, "r2")
    assert slots.value.retry_after_s == pytest.approx(5.0)  # about one C run, not the 30 s lease
    assert "tenant over its share of tier C (1 of 1 slots in use); retry after" in str(slots.value)
    with pytest.raises(OverShareError) as rate:
        fs.acquire("t", B, "r3")
    assert 1.5 < rate.value.retry_after_s <= 2.0
    assert "rate limit (0.5 queries/s, burst 1)" in str(rate.value)


def test_tokens_refill_with_time(make_share):
    fs = make_share(limits(rate=10.0, burst=1))
    fs.acquire("t", A, "r1")
    with pytest.raises(OverShareError) as info:
        fs.acquire("t", A, "r2")
    time.sleep(info.value.retry_after_s + 0.02)
    fs.acquire("t", A, "r2")


def test_short_leases_expire(make_share):
    fs = make_share(limits(slots={C: 1}, lease_s={**LEASES, C: 0.3}))
    fs.acquire("t", C, "r1")
    with pytest.raises(OverShareError) as info:
        fs.acquire("t", C, "r2")
    assert 0 < info.value.retry_after_s <= 0.3
    time.sleep(0.35)
    fs.acquire("t", C, "r2")  # r1 never released: its lease ran out


# --- concurrency ----------------------------------------------------------------------------------


def race(fs, threads: int, attempt: Callable[[int], bool]) -> list[bool]:
    start = threading.Barrier(threads)

    def run(i: int) -> bool:
        start.wait()
        return attempt(i)

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(run, range(threads)))


@pytest.mark.parametrize("slots, burst, admitted", [(4, 10, 4), (0, 6, 6)])
def test_sixteen_threads_never_exceed_slots_or_burst(make_share, slots, burst, admitted):
    fs = make_share(limits(rate=SLOW, burst=burst, slots={C: slots}))

    def attempt(i: int) -> bool:
        return outcome(fs, "t", C, f"r{i}") == "ok"

    assert sum(race(fs, 16, attempt)) == admitted
    if isinstance(fs, RedisFairShare):
        held = fs._client.zcard(fs.slots_key("t", C))
        assert held == admitted
        tokens = float(fs._client.hget(fs.bucket_key("t"), "tokens"))
        assert 0 <= tokens < burst - admitted + 0.01


def test_sixteen_threads_churning_never_hold_more_than_slots(make_share):
    fs = make_share(limits(slots={C: 3}))
    lock = threading.Lock()
    holding, most = 0, 0

    def attempt(i: int) -> bool:
        nonlocal holding, most
        admitted = 0
        for n in range(25):
            request_id = f"r{i}-{n}"
            if outcome(fs, "t", C, request_id) != "ok":
                continue
            admitted += 1
            with lock:
                holding += 1
                most = max(most, holding)
            time.sleep(0.001)
            with lock:
                holding -= 1
            fs.release("t", C, request_id)
        return admitted > 0

    race(fs, 16, attempt)
    assert 1 <= most <= 3


# --- Redis only: replicas, expiry of keys, outages ------------------------------------------------


def test_two_front_door_replicas_share_the_limits(redis_url, prefix):
    config = FairShareConfig(limits(rate=SLOW, burst=3, slots={C: 2}))
    one = RedisFairShare(client_for(redis_url), config, key_prefix=prefix)
    two = RedisFairShare(client_for(redis_url), config, key_prefix=prefix)
    one.acquire("t", C, "r1")
    two.acquire("t", C, "r2")
    assert outcome(one, "t", C, "r3") == "slots"
    two.acquire("t", C, "r1")  # a replay through the other replica: free
    one.release("t", C, "r2")  # released where it was not acquired
    two.acquire("t", C, "r3")
    assert outcome(one, "t", B, "r4") == "rate"  # 3 tokens taken over both replicas
    one.acquire("u", C, "u1")


def test_keys_expire_so_idle_tenants_leave_nothing_behind(rclient, prefix):
    fs = RedisFairShare(rclient, FairShareConfig(limits(rate=20.0, burst=2, slots={C: 1},
                                                        lease_s={**LEASES, C: 0.4})),
                        key_prefix=prefix)
    fs.acquire("t", C, "r1")
    assert 0 < rclient.pttl(fs.slots_key("t", C)) <= 400
    assert 0 < rclient.pttl(fs.bucket_key("t")) <= 2 * 1000 // 20 + 1000
    fs.release("t", C, "r1")
    assert not rclient.exists(fs.slots_key("t", C))  # the last lease gone: the set is gone
    time.sleep(1.2)
    assert rclient.keys(f"{prefix}:*") == []


def test_redis_unreachable_fails_open_and_warns_once(caplog):
    closed = f"redis://127.0.0.1:{free_port()}/0"
    config = FairShareConfig(limits(rate=SLOW, burst=1, slots={C: 1}))
    fs = RedisFairShare(client_for(closed), config, key_prefix="test:fair:down")
    with caplog.at_level(logging.WARNING, logger="services.frontdoor.fair_share"):
        for i in range(5):
            fs.acquire("t", C, f"r{i}")  # over both limits, yet admitted
        fs.release("t", C, "r0")
    warnings = [r for r in caplog.records if r.name == "services.frontdoor.fair_share"]
    assert len(warnings) == 1 and "admitting without limits" in warnings[0].getMessage()

    strict = RedisFairShare(client_for(closed), config, key_prefix="test:fair:down",
                            fail_open=False)
    with pytest.raises(redis.ConnectionError):
        strict.acquire("t", C, "r1")
    strict.release("t", C, "r1")  # never raises: the lease would expire anyway


def test_limits_apply_again_when_redis_comes_back(tmp_path, caplog):
    server = LocalRedis(tmp_path, persistent=False)
    fs = RedisFairShare(client_for(server.url), FairShareConfig(limits(rate=SLOW, burst=1)))
    with caplog.at_level(logging.WARNING, logger="services.frontdoor.fair_share"):
        with server:
            fs.acquire("t", A, "r1")
            assert outcome(fs, "t", A, "r2") == "rate"
        fs.acquire("t", A, "r3")  # the server is gone: admitted
        assert "admitting without limits" in caplog.text
        with server:  # back on its port, empty (no persistence), script cache empty too
            fs.acquire("t", A, "r4")
            assert outcome(fs, "t", A, "r5") == "rate"
    assert "Redis answers again" in caplog.text
