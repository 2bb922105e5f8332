"""InMemoryFairShare with a fake clock: bucket math, slots, leases, overrides, unlimited dimensions.

The same behaviour against Redis (and the Lua script) is in
tests/integration/test_fair_share_redis.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import redis

from adaptive_rag.contracts import Tier
from adaptive_rag.errors import ConfigurationError, OverShareError, QueueFullError
from services.frontdoor import fair_share
from services.frontdoor.fair_share import (
    FairShareConfig, FairShareLimits, InMemoryFairShare, RedisFairShare,
)

LEASES = {Tier.A: 10.0, Tier.B: 20.0, Tier.C: 60.0}


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def limits(rate: float = 0.0, burst: int = 0, slots: dict | None = None,
           lease_s: dict | None = None) -> FairShareLimits:
    return FairShareLimits(rate_per_s=rate, burst=burst, slots=slots or {},
                           lease_s=lease_s or LEASES)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def share(clock: FakeClock, default: FairShareLimits,
          **tenants: FairShareLimits) -> InMemoryFairShare:
    return InMemoryFairShare(FairShareConfig(default, tenants), clock=clock)


def refused(fs: InMemoryFairShare, tenant: str, tier: Tier, request_id: str) -> OverShareError:
    with pytest.raises(OverShareError) as info:
        fs.acquire(tenant, tier, request_id)
    return info.value


# --- token bucket ---------------------------------------------------------------------------------


def test_a_new_tenant_gets_its_burst_then_waits_for_one_token(clock):
    fs = share(clock, limits(rate=2.0, burst=3))
    for i in range(3):
        fs.acquire("acme", Tier.B, f"r{i}")
    err = refused(fs, "acme", Tier.B, "r3")
    assert err.retry_after_s == pytest.approx(0.5)
    assert "rate limit (2 queries/s, burst 3); retry after 0.5 s" in str(err)
    assert isinstance(err, QueueFullError)  # the front door's existing RESOURCE_EXHAUSTED mapping


def test_refill_is_rate_times_elapsed_and_partial_tokens_count(clock):
    fs = share(clock, limits(rate=2.0, burst=3))
    for i in range(3):
        fs.acquire("acme", Tier.A, f"r{i}")
    clock.advance(0.3)  # 0.6 tokens
    assert refused(fs, "acme", Tier.A, "x").retry_after_s == pytest.approx(0.2)
    clock.advance(0.2)  # 1.0 token
    fs.acquire("acme", Tier.A, "r3")
    clock.advance(1.25)  # 2.5 tokens
    fs.acquire("acme", Tier.A, "r4")
    fs.acquire("acme", Tier.A, "r5")
    assert refused(fs, "acme", Tier.A, "x").retry_after_s == pytest.approx(0.25)


def test_the_bucket_never_holds_more_than_burst(clock):
    fs = share(clock, limits(rate=5.0, burst=4))
    clock.advance(3600)
    for i in range(4):
        fs.acquire("acme", Tier.A, f"r{i}")
    assert refused(fs, "acme", Tier.A, "r4").retry_after_s == pytest.approx(0.2)


def test_the_bucket_is_shared_by_all_tiers(clock):
    fs = share(clock, limits(rate=1.0, burst=2))
    fs.acquire("acme", Tier.A, "r1")
    fs.acquire("acme", Tier.C, "r2")
    refused(fs, "acme", Tier.B, "r3")


# --- slots ----------------------------------------------------------------------------------------


def test_slots_cap_what_a_tenant_holds_on_one_tier(clock):
    fs = share(clock, limits(slots={Tier.C: 2}))
    fs.acquire("acme", Tier.C, "r1")
    clock.advance(3.0)
    fs.acquire("acme", Tier.C, "r2")
    err = refused(fs, "acme", Tier.C, "r3")
    assert str(err) == "tenant over its share of tier C (2 of 2 slots in use); retry after 5.0 s"
    assert err.retry_after_s == pytest.approx(5.0)  # about one C run, not the 57 s left on r1's lease
    fs.acquire("acme", Tier.B, "r4")  # another tier's share is separate
    clock.advance(56.0)  # r1's lease has 1 s left: that is sooner than the hint
    assert refused(fs, "acme", Tier.C, "r3").retry_after_s == pytest.approx(1.0)


def test_release_gives_the_slot_back_and_unknown_ids_are_ignored(clock):
    fs = share(clock, limits(slots={Tier.C: 1}))
    fs.acquire("acme", Tier.C, "r1")
    refused(fs, "acme", Tier.C, "r2")
    fs.release("acme", Tier.C, "nope")
    fs.release("acme", Tier.B, "r1")  # wrong tier: not that slot
    fs.release("other", Tier.C, "r1")  # wrong tenant: not that slot
    refused(fs, "acme", Tier.C, "r2")
    fs.release("acme", Tier.C, "r1")
    fs.release("acme", Tier.C, "r1")  # twice is fine
    fs.acquire("acme", Tier.C, "r2")


def test_a_lease_not_released_expires_after_the_tiers_lease(clock):
    fs = share(clock, limits(slots={Tier.A: 1}))
    fs.acquire("acme", Tier.A, "r1")
    clock.advance(9.99)
    assert refused(fs, "acme", Tier.A, "r2").retry_after_s == pytest.approx(0.01)
    clock.advance(0.01)  # exactly at the expiry: gone
    fs.acquire("acme", Tier.A, "r2")


def test_a_refusal_takes_nothing(clock):
    fs = share(clock, limits(rate=0.001, burst=2, slots={Tier.C: 1}))
    fs.acquire("acme", Tier.C, "r1")
    for _ in range(5):
        refused(fs, "acme", Tier.C, "r2")  # slots full: no token taken
    fs.release("acme", Tier.C, "r1")
    fs.acquire("acme", Tier.C, "r2")  # the second token is still there
    fs.release("acme", Tier.C, "r2")
    err = refused(fs, "acme", Tier.C, "r3")
    assert "rate limit" in str(err)


def test_both_limits_hit_reports_slots_and_waits_for_both(clock):
    fs = share(clock, limits(rate=0.1, burst=1, slots={Tier.C: 1}, lease_s={**LEASES, Tier.C: 5.0}))
    fs.acquire("acme", Tier.C, "r1")
    err = refused(fs, "acme", Tier.C, "r2")
    assert "slots in use" in str(err)
    assert err.retry_after_s == pytest.approx(10.0)  # the slot frees in 5 s, the token in 10 s


# --- replays --------------------------------------------------------------------------------------


def test_acquiring_again_for_a_request_holding_its_slot_takes_nothing(clock):
    fs = share(clock, limits(rate=0.001, burst=2, slots={Tier.C: 1}))
    fs.acquire("acme", Tier.C, "r1")
    for _ in range(3):
        fs.acquire("acme", Tier.C, "r1")  # slot full and bucket short: still admitted
    fs.acquire("acme", Tier.B, "r2")  # the replays took no token
    refused(fs, "acme", Tier.B, "r3")


def test_replays_are_free_when_slots_are_unlimited_too(clock):
    fs = share(clock, limits(rate=0.001, burst=1))
    fs.acquire("acme", Tier.A, "r1")
    fs.acquire("acme", Tier.A, "r1")
    refused(fs, "acme", Tier.A, "r2")


def test_a_replay_after_the_lease_expired_is_a_new_admission(clock):
    fs = share(clock, limits(rate=0.001, burst=1, slots={Tier.A: 1}))
    fs.acquire("acme", Tier.A, "r1")
    clock.advance(10.0)
    refused(fs, "acme", Tier.A, "r1")  # its lease is gone and the bucket is empty


# --- unlimited dimensions, overrides, isolation ---------------------------------------------------


def test_rate_zero_means_no_rate_limit_and_burst_is_ignored(clock):
    fs = share(clock, limits(rate=0.0, burst=0))
    for i in range(500):
        fs.acquire("acme", Tier.A, f"r{i}")


def test_slots_zero_or_a_tier_left_out_means_no_share_limit(clock):
    fs = share(clock, limits(slots={Tier.A: 0, Tier.C: 1}))
    for i in range(100):
        fs.acquire("acme", Tier.A, f"a{i}")
        fs.acquire("acme", Tier.B, f"b{i}")
    fs.acquire("acme", Tier.C, "c0")
    refused(fs, "acme", Tier.C, "c1")


def test_per_tenant_overrides_replace_the_default(clock):
    vip = limits(rate=1.0, burst=5, slots={Tier.C: 3})
    fs = share(clock, limits(rate=1.0, burst=1, slots={Tier.C: 1}), vip=vip)
    assert fs._config.limits_for("vip") is vip
    assert fs._config.limits_for("anyone").burst == 1
    for i in range(3):
        fs.acquire("vip", Tier.C, f"v{i}")
    assert "3 of 3 slots" in str(refused(fs, "vip", Tier.C, "v3"))
    fs.acquire("small", Tier.C, "s0")
    refused(fs, "small", Tier.C, "s1")


def test_one_tenant_over_its_share_does_not_affect_another(clock):
    fs = share(clock, limits(rate=1.0, burst=2, slots={Tier.C: 2}))
    fs.acquire("flood", Tier.C, "f0")
    fs.acquire("flood", Tier.C, "f1")
    for i in range(50):
        refused(fs, "flood", Tier.C, f"f{i + 2}")
    fs.acquire("quiet", Tier.C, "q0")
    fs.acquire("quiet", Tier.C, "q1")
    fs.release("flood", Tier.C, "q0")  # same id, other tenant: not quiet's slot
    refused(fs, "quiet", Tier.C, "q2")


def test_idle_tenants_are_forgotten(clock, monkeypatch):
    monkeypatch.setattr(fair_share, "SWEEP_EVERY", 4)
    fs = share(clock, limits(rate=10.0, burst=5, slots={Tier.A: 5}))
    fs.acquire("gone", Tier.A, "r1")
    clock.advance(60.0)  # lease expired, bucket full again
    for i in range(3):
        fs.acquire("busy", Tier.A, f"b{i}")
    assert set(fs._buckets) == {"busy"}
    assert set(fs._leases) == {("busy", Tier.A)}


# --- configuration --------------------------------------------------------------------------------


def test_tier_names_are_accepted_and_missing_slots_read_as_unlimited():
    lim = FairShareLimits(rate_per_s=1, burst=1, slots={"C": 2}, lease_s={"A": 1, "B": 2, "C": 3})
    assert dict(lim.slots) == {Tier.A: 0, Tier.B: 0, Tier.C: 2}
    assert lim.lease_s[Tier.C] == 3
    with pytest.raises(TypeError):
        lim.slots[Tier.A] = 1  # type: ignore[index]


@pytest.mark.parametrize("kwargs, complaint", [
    ({"rate_per_s": 1.0, "burst": 0}, "burst"),
    ({"rate_per_s": -1.0}, "rate_per_s"),
    ({"rate_per_s": float("inf")}, "rate_per_s"),
    ({"slots": {Tier.C: -1}}, "slots"),
    ({"slots": {"D": 1}}, "unknown tier"),
    ({"lease_s": {Tier.A: 1.0, Tier.B: 1.0}}, "missing: C"),
    ({"lease_s": {**LEASES, Tier.B: 0}}, "lease_s"),
])
def test_inconsistent_limits_are_refused(kwargs, complaint):
    base = {"rate_per_s": 0.0, "burst": 0, "slots": {}, "lease_s": LEASES}
    with pytest.raises(ConfigurationError, match=complaint):
        FairShareLimits(**{**base, **kwargs})


def test_overrides_can_start_from_the_default():
    default = limits(rate=1.0, burst=2, slots={Tier.C: 1})
    vip = dataclasses.replace(default, burst=20)
    assert vip.slots == default.slots and vip.burst == 20


# --- Redis keys (no server needed: the client connects lazily) ------------------------------------


def test_redis_keys_carry_any_tenant_name_safely():
    fs = RedisFairShare(redis.Redis(port=1), FairShareConfig(limits()), key_prefix="p")
    names = ["acme", "a:b", "a%3Ab", "a}{b", "a b", "ü🙂", "", "x*?[]", "a\nb"]
    keys = [fs.slots_key(n, Tier.C) for n in names]
    assert len(set(keys)) == len(names)
    assert len({fs.bucket_key(n) for n in names}) == len(names)
    assert fs.slots_key("a:b", Tier.C) == "p:{t:a%3Ab}:slots:C"
    for name in names:
        # One hash tag per tenant, the same for both keys: one Redis Cluster slot for the script.
        bucket, slots = fs.bucket_key(name), fs.slots_key(name, Tier.A)
        tag = bucket[bucket.index("{"): bucket.index("}") + 1]
        assert bucket.count("{") == bucket.count("}") == 1 and tag in slots and len(tag) > 2
        assert "\n" not in bucket and " " not in bucket
