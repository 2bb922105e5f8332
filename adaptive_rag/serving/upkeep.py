"""What the front door does besides calls: publish again the tasks whose publish was lost or whose
message the broker lost on the way to a worker, expire requests left queued, forget cached API keys once a key is revoked, say what keeps it from serving
(health), read the queues' depths (the gauge)."""

from __future__ import annotations

import asyncio

import structlog

from adaptive_rag.contracts import Tier
from adaptive_rag.serving.context import Serving

LOG = structlog.get_logger("serving.upkeep")


async def relay_unpublished(serving: Serving) -> list[str]:
    """Publish again the task of every request still queued and never marked published
    `unpublished_after_s` after it was written (its front door died between the record and the
    enqueue, or the mark was lost), and mark them; returns their ids (empty when none, or the
    relay is off). Every replica runs it; the records hand each row to one of them. A task
    published twice runs at most once more and writes one result (`answering.write_once`)."""
    after_s = serving.config.unpublished_after_s
    if after_s is None:
        return []
    published = await serving.io(serving.records.publish_unpublished, serving.queue.enqueue, after_s)
    if published:
        serving.on_republished(len(published))
        LOG.warning("requests_republished", count=len(published), request_ids=published[:20],
                    unpublished_after_s=after_s)
    return published


async def republish_lost(serving: Serving, confirm_after_s: float = 1.0) -> list[str]:
    """Publish again the task of every request published at least `lost_after_s` ago, never
    delivered, whose message the broker no longer holds (in no queue, reserved by no worker),
    and mark them; returns their ids (empty when none, the check is off, or the broker cannot
    tell).

    Such a message was taken off its queue by a worker host that died before it wrote its
    reserved copy (Redis hands a message over, then the worker records it: a host killed between
    the two takes the message with it). Only a request still undelivered is looked for, and only
    one that the broker misses twice, `confirm_after_s` apart: a live worker records what it took
    within microseconds. A task published twice runs at most once more and writes one result."""
    after_s = serving.config.lost_after_s
    if after_s is None:
        return []
    waiting = await serving.io(serving.records.undelivered, after_s)
    if not waiting:
        return []
    held = await serving.io(serving.queue.held, waiting)
    if held is None:
        return []
    missing = [request_id for request_id in waiting if request_id not in held]
    if not missing:
        return []
    await asyncio.sleep(confirm_after_s)
    held = await serving.io(serving.queue.held, missing)
    if held is None:
        return []
    lost = [request_id for request_id in missing if request_id not in held]
    published = await serving.io(serving.records.publish_lost, serving.queue.enqueue, lost, after_s)
    if published:
        serving.on_republished(len(published))
        LOG.warning("lost_messages_republished", count=len(published), request_ids=published[:20],
                    lost_after_s=after_s)
    return published


async def expire_stale(serving: Serving) -> list[str]:
    """Expire the requests queued longer than `queued_expiry_s` (never started: their message
    was lost, or not picked up before their client's deadline), so GetResult says "never ran;
    send the Answer again" instead of "call again later" forever. Returns their ids (empty
    when another front door is sweeping, or expiry is off)."""
    expiry_s = serving.config.queued_expiry_s
    if not expiry_s:
        return []
    expired = await serving.io(serving.records.expire_queued, expiry_s)
    if expired:
        serving.on_expired(len(expired))
        LOG.warning("requests_expired", count=len(expired), request_ids=expired[:20],
                    queued_expiry_s=expiry_s)
    return expired or []


async def drop_revoked_keys(serving: Serving) -> bool:
    """Forget this replica's cached API keys when the key table changed since the last look: a
    key was revoked (or created, or deleted) by anyone, `arag keys revoke`, another replica's
    operator, a statement on the records. Every replica runs it every `key_revocation_s`, so a
    revoked key is refused everywhere within about that long, with no message to deliver and
    none to lose; while the records do not answer, the cache's own lifetime bounds it. Returns
    whether the cache was dropped."""
    revision = await serving.io(serving.records.api_keys_revision)
    dropped = serving.keys_changed(revision)
    if dropped:
        LOG.info("api_keys_changed", revision=str(revision))
    return dropped


async def dependency_problems(serving: Serving) -> list[str]:
    """What keeps this front door from answering right now (empty: nothing): the records
    database and the task queue are each asked once."""
    queue = serving.queue
    problems = []
    for name, check in (("records database", serving.records.ping),
                        ("task queue", lambda: queue.depth(queue.queue_name(Tier.A)))):
        try:
            await serving.io(check)
        except Exception as exc:  # noqa: BLE001 - any failure means not serving
            problems.append(f"{name}: {exc}")
    return problems


async def queue_depths(serving: Serving, queues: list[str]) -> dict[str, int]:
    """Current depth of each queue (for the queue-depth gauge); unreachable ones are left out."""
    depths: dict[str, int] = {}
    for queue in queues:
        try:
            depths[queue] = await serving.io(serving.queue.depth, queue)
        except Exception as exc:  # noqa: BLE001 - the broker may be briefly away
            LOG.warning("queue_depth_failed", queue=queue, error=str(exc))
    for queue, depth in depths.items():
        serving.on_queue_depth(queue, depth)
    return depths
