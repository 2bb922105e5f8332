"""Fair share between tenants at admission: a token bucket per tenant, a share of each tier queue.

One tenant's flood must not starve the others: before a query is enqueued, the front door takes a
token of the tenant's bucket (its rate, all tiers together) and one of its slots on the routed tier
(how many of that tier's queued + running tasks it may hold). Over either limit the tenant gets
`OverShareError` with a retry-after hint; other tenants are not affected.

- `RedisFairShare`: one Lua script per admission, shared by every front-door replica.
- `InMemoryFairShare`: the same semantics in one process (one front door, the embedded default).

A slot is a lease: the front door releases it when the answer arrives, and a lease that is never
released (a crashed front door, a lost result) expires after the tier's `lease_s`, so a tenant's
share cannot leak away.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from urllib.parse import quote

import redis

from adaptive_rag.contracts import TIERS, Tier
from adaptive_rag.errors import ConfigurationError, OverShareError

from services.frontdoor.settings import FrontDoorSettings
from workers import redis_connections

log = logging.getLogger(__name__)

# Shortest retry-after hint: a hint of 0 s invites a busy loop.
MIN_RETRY_AFTER_S = 0.001
DEFAULT_SLOT_RETRY_S = {Tier.A: 1.0, Tier.B: 2.0, Tier.C: 5.0}


@dataclass(frozen=True)
class FairShareLimits:
    """One tenant's limits.

    - `rate_per_s`: token bucket refill (admissions per second, all tiers together); 0 = no rate
      limit (`burst` is then ignored).
    - `burst`: bucket size, the admissions a tenant idle long enough may make at once; >= 1 when
      `rate_per_s` > 0. A tenant seen for the first time starts with a full bucket.
    - `slots[tier]`: how many of the tier's queued + running tasks the tenant may hold at once
      (its share of that tier queue); 0, or a tier left out, = no limit on that tier.
    - `lease_s[tier]`: a slot not released expires after this (the tier's time limit plus a
      margin); required for every tier, because a lease is also what makes a replayed admission
      free when the tier's slots are unlimited.

    Tier keys may be given as `Tier` or as their names ("A", "B", "C").
    """

    rate_per_s: float
    burst: int
    slots: Mapping[Tier, int]
    lease_s: Mapping[Tier, float]
    # The retry-after hint when a tier's slots are full: about one run of the tier, when a slot
    # is likely free again (a lease's expiry would be minutes: the worst case, not the likely one).
    slot_retry_s: Mapping[Tier, float] = field(default_factory=lambda: dict(DEFAULT_SLOT_RETRY_S))

    def __post_init__(self) -> None:
        if not (self.rate_per_s >= 0 and math.isfinite(self.rate_per_s)):
            raise ConfigurationError(f"rate_per_s must be a finite number >= 0: {self.rate_per_s}")
        if self.rate_per_s > 0 and self.burst < 1:
            raise ConfigurationError(f"burst must be >= 1 when rate_per_s > 0: {self.burst}")
        slots = _by_tier(self.slots, "slots")
        lease_s = _by_tier(self.lease_s, "lease_s")
        if any(n < 0 for n in slots.values()):
            raise ConfigurationError(f"slots must be >= 0 (0 = unlimited): {slots}")
        missing = [t.value for t in TIERS if t not in lease_s]
        if missing:
            raise ConfigurationError(f"lease_s needs every tier; missing: {', '.join(missing)}")
        if not all(v > 0 and math.isfinite(v) for v in lease_s.values()):
            raise ConfigurationError(f"lease_s must be finite and > 0: {lease_s}")
        retry = {**DEFAULT_SLOT_RETRY_S, **_by_tier(self.slot_retry_s, "slot_retry_s")}
        if not all(v > 0 and math.isfinite(v) for v in retry.values()):
            raise ConfigurationError(f"slot_retry_s must be finite and > 0: {retry}")
        object.__setattr__(self, "slot_retry_s", MappingProxyType(retry))
        object.__setattr__(self, "slots", MappingProxyType({t: slots.get(t, 0) for t in TIERS}))
        object.__setattr__(self, "lease_s", MappingProxyType(lease_s))

    @property
    def rate_limited(self) -> bool:
        return self.rate_per_s > 0


def _by_tier(values: Mapping, what: str) -> dict[Tier, float]:
    try:
        return {Tier(key): value for key, value in values.items()}
    except ValueError as exc:
        raise ConfigurationError(f"{what}: unknown tier in {dict(values)}") from exc


@dataclass(frozen=True)
class FairShareConfig:
    """The limits every tenant gets (`default`), and whole-limit overrides for named tenants."""

    default: FairShareLimits
    tenants: Mapping[str, FairShareLimits] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tenants", MappingProxyType(dict(self.tenants)))

    def limits_for(self, tenant: str) -> FairShareLimits:
        return self.tenants.get(tenant, self.default)


def _over_share(limits: FairShareLimits, tier: Tier, reason: str, retry_after_s: float,
                in_use: int) -> OverShareError:
    """The refusal the client sees: which limit, the tenant's values and when to retry."""
    retry_after_s = max(retry_after_s, MIN_RETRY_AFTER_S)
    hint = f"retry after {math.ceil(retry_after_s * 10) / 10:.1f} s"
    if reason == "slots":
        message = (f"tenant over its share of tier {tier.value} "
                   f"({in_use} of {limits.slots[tier]} slots in use); {hint}")
    else:
        message = (f"tenant over its rate limit ({limits.rate_per_s:g} queries/s, "
                   f"burst {limits.burst}); {hint}")
    return OverShareError(message, retry_after_s)


# --- Redis: shared by every front door ------------------------------------------------------------

# KEYS[1]: the tenant's bucket (hash: tokens, ts in ms); KEYS[2]: its leases on the tier (sorted
# set: request id -> expiry in ms). ARGV: request id, rate per s (0 = none), burst, slots (0 = none),
# lease in ms, slot retry hint in ms. Returns {status, wait_ms, slots_in_use}: status "ok" (token and
# slot taken), "replay"
# (this request already holds its slot: nothing taken), "slots" or "rate" (nothing taken; wait_ms as
# a string, Lua numbers would be truncated to integers). Time comes from the server (TIME) so every
# replica agrees; scripts replicate by their effects (Redis >= 5), so TIME before writes is fine.
ACQUIRE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local id = ARGV[1]
local rate = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local slots = tonumber(ARGV[4])
local lease = tonumber(ARGV[5])
local slot_retry = tonumber(ARGV[6])

redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if redis.call('ZSCORE', KEYS[2], id) then
  return {'replay', '0', 0}
end

local reason = false
local wait = 0
local in_use = 0
if slots > 0 then
  in_use = redis.call('ZCARD', KEYS[2])
  if in_use >= slots then
    local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    reason = 'slots'
    wait = math.min(tonumber(first[2]) - now, lease, slot_retry)
  end
end

local tokens = burst
if rate > 0 then
  local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
  if state[1] and state[2] then
    local elapsed = math.max(0, now - tonumber(state[2]))
    tokens = math.min(burst, tonumber(state[1]) + elapsed * rate / 1000)
  end
  if tokens < 1 then
    reason = reason or 'rate'
    wait = math.max(wait, (1 - tokens) * 1000 / rate)
  end
end

if reason then
  return {reason, tostring(wait), in_use}
end

if rate > 0 then
  redis.call('HSET', KEYS[1], 'tokens', tokens - 1, 'ts', now)
  redis.call('PEXPIRE', KEYS[1], math.ceil(burst * 1000 / rate) + 1000)
end
redis.call('ZADD', KEYS[2], now + lease, id)
if redis.call('PTTL', KEYS[2]) < lease then
  redis.call('PEXPIRE', KEYS[2], math.ceil(lease))
end
return {'ok', '0', in_use + 1}
"""


class RedisFairShare:
    """`FairShare` over Redis: every front-door replica sees the same buckets and leases.

    Keys (`{prefix}:{t:<tenant>}:rate`, `{prefix}:{t:<tenant>}:slots:<tier>`) carry the tenant
    percent-encoded, so any tenant name is one safe key segment, inside a hash tag, so a tenant's
    keys share one Redis Cluster slot as the script needs. Every key expires once it holds
    nothing useful (a full bucket, no live lease): idle tenants leave nothing behind.

    Redis unreachable (or failing): with `fail_open` (the default) the query is admitted and a
    warning logged once per outage, because a limiter that is down must not take the support
    backend down with it; with `fail_open=False` the Redis error propagates from `acquire`.
    `release` never raises (an unreleased lease expires). Any `redis.RedisError` counts, a failing
    script included. Give the client short socket timeouts: an admission waits for it.
    """

    def __init__(self, client: redis.Redis, config: FairShareConfig, key_prefix: str = "arag:fair",
                 fail_open: bool = True) -> None:
        self._client = client
        self._config = config
        self._prefix = key_prefix
        self._fail_open = fail_open
        self._script = client.register_script(ACQUIRE_LUA)
        self._degraded = False
        self._lock = threading.Lock()

    def _tenant_key(self, tenant: str) -> str:
        return f"{self._prefix}:{{t:{quote(tenant, safe='')}}}"

    def bucket_key(self, tenant: str) -> str:
        return f"{self._tenant_key(tenant)}:rate"

    def slots_key(self, tenant: str, tier: Tier) -> str:
        return f"{self._tenant_key(tenant)}:slots:{Tier(tier).value}"

    def acquire(self, tenant: str, tier: Tier, request_id: str) -> None:
        tier = Tier(tier)
        limits = self._config.limits_for(tenant)
        try:
            status, wait_ms, in_use = self._script(
                keys=[self.bucket_key(tenant), self.slots_key(tenant, tier)],
                args=[request_id, repr(float(limits.rate_per_s)), limits.burst,
                      limits.slots[tier], repr(limits.lease_s[tier] * 1000.0),
                      repr(limits.slot_retry_s[tier] * 1000.0)],
            )
        except redis.RedisError as exc:
            if not self._fail_open:
                raise
            self._unavailable(exc, "admitting without limits")
            return
        self._available()
        status = status.decode() if isinstance(status, bytes) else status
        if status in ("ok", "replay"):
            return
        wait_ms = wait_ms.decode() if isinstance(wait_ms, bytes) else wait_ms
        raise _over_share(limits, tier, status, float(wait_ms) / 1000.0, int(in_use))

    def release(self, tenant: str, tier: Tier, request_id: str) -> None:
        try:
            self._client.zrem(self.slots_key(tenant, tier), request_id)
        except redis.RedisError as exc:
            # Never raises: the lease expires by itself, failing the caller's answer helps nobody.
            self._unavailable(exc, "unreleased slots expire with their lease")
            return
        self._available()

    def _unavailable(self, exc: redis.RedisError, consequence: str) -> None:
        """Log the first failure of an outage only: every admission would repeat it."""
        with self._lock:
            first, self._degraded = not self._degraded, True
        if first:
            log.warning("fair share: Redis failed (%s: %s); %s until it answers again",
                        type(exc).__name__, exc, consequence)

    def _available(self) -> None:
        if self._degraded:
            with self._lock:
                was, self._degraded = self._degraded, False
            if was:
                log.warning("fair share: Redis answers again; limits apply")


# --- in memory: one front door --------------------------------------------------------------------

# Idle tenants are swept from memory every this many acquisitions.
SWEEP_EVERY = 1024


class InMemoryFairShare:
    """`FairShare` in one process, thread-safe: the same semantics as `RedisFairShare`, with time
    from `clock` (seconds, monotonic; tests pass a fake one)."""

    def __init__(self, config: FairShareConfig,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # tenant -> (tokens, at)
        self._leases: dict[tuple[str, Tier], dict[str, float]] = {}  # -> request id -> expiry
        self._calls = 0

    def acquire(self, tenant: str, tier: Tier, request_id: str) -> None:
        tier = Tier(tier)
        limits = self._config.limits_for(tenant)
        lease_s = limits.lease_s[tier]
        with self._lock:
            now = self._clock()
            self._calls += 1
            if self._calls % SWEEP_EVERY == 0:
                self._sweep(now)
            leases = self._live_leases((tenant, tier), now)
            if request_id in leases:
                return
            reason, wait, in_use = None, 0.0, 0
            slots = limits.slots[tier]
            if slots > 0:
                in_use = len(leases)
                if in_use >= slots:
                    reason, wait = "slots", min(min(leases.values()) - now, lease_s,
                                                limits.slot_retry_s[tier])
            tokens = float(limits.burst)
            if limits.rate_limited:
                tokens = self._tokens(tenant, limits, now)
                if tokens < 1:
                    reason = reason or "rate"
                    wait = max(wait, (1 - tokens) / limits.rate_per_s)
            if reason is not None:
                raise _over_share(limits, tier, reason, wait, in_use)
            if limits.rate_limited:
                self._buckets[tenant] = (tokens - 1, now)
            self._leases.setdefault((tenant, tier), {})[request_id] = now + lease_s

    def release(self, tenant: str, tier: Tier, request_id: str) -> None:
        key = (tenant, Tier(tier))
        with self._lock:
            leases = self._leases.get(key)
            if leases is not None:
                leases.pop(request_id, None)
                if not leases:
                    del self._leases[key]

    def _live_leases(self, key: tuple[str, Tier], now: float) -> dict[str, float]:
        leases = self._leases.get(key, {})
        for request_id in [r for r, expiry in leases.items() if expiry <= now]:
            del leases[request_id]
        if not leases:
            self._leases.pop(key, None)
        return leases

    def _tokens(self, tenant: str, limits: FairShareLimits, now: float) -> float:
        state = self._buckets.get(tenant)
        if state is None:
            return float(limits.burst)
        tokens, at = state
        return min(float(limits.burst), tokens + max(0.0, now - at) * limits.rate_per_s)

    def _sweep(self, now: float) -> None:
        """Forget full buckets and expired leases, so idle tenants cost no memory."""
        for tenant in list(self._buckets):
            limits = self._config.limits_for(tenant)
            if not limits.rate_limited or self._tokens(tenant, limits, now) >= limits.burst:
                del self._buckets[tenant]
        for key in list(self._leases):
            self._live_leases(key, now)


def config_from_settings(settings: FrontDoorSettings) -> FairShareConfig:
    """The limits of `settings` (tenant_rate_per_s, tenant_burst, tenant_slots, tenant_lease_s),
    with each `tenant_limits` override applied over them field by field."""
    default = FairShareLimits(settings.tenant_rate_per_s, settings.tenant_burst,
                              settings.tenant_slots, settings.tenant_lease_s,
                              settings.tenant_slot_retry_s)
    tenants = {}
    for tenant, override in settings.tenant_limits.items():
        unknown = set(override) - {"rate_per_s", "burst", "slots", "lease_s", "slot_retry_s"}
        if unknown:
            raise ConfigurationError(
                f"ARAG_TENANT_LIMITS[{tenant!r}]: unknown field(s) {sorted(unknown)}; "
                "use rate_per_s, burst, slots, lease_s, slot_retry_s")
        merged = {**override}
        for name in ("slots", "lease_s", "slot_retry_s"):
            if name in merged:
                merged[name] = {**getattr(default, name), **_by_tier(merged[name], name)}
        tenants[tenant] = replace(default, **merged)
    return FairShareConfig(default, tenants)


def open_fair_share(settings: FrontDoorSettings) -> RedisFairShare | InMemoryFairShare:
    """Shared by every replica through Redis when REDIS_URL is set; else this process's own."""
    config = config_from_settings(settings)
    if not settings.redis_url:
        return InMemoryFairShare(config)
    # Short timeouts and no retries: a limiter that fails open must not stall admission.
    # (with Sentinel: the current primary, asked again at every new connection)
    client = redis_connections.sync_client(settings.redis_url, socket_timeout=0.25, socket_connect_timeout=0.25,
                                           retry=None)
    return RedisFairShare(client, config)
