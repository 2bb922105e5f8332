"""Giving a tenant's fair-share slot back once its request's work ended (`ports.FairShare`).

A slot is taken at admission; it is given back when the answer arrived (without holding up the
reply), when nothing was queued, or, if the caller stopped waiting, when the work that still runs
ends. Giving back never raises: a slot not given back ends with the tier's lease.
"""

from __future__ import annotations

import structlog

from adaptive_rag.contracts import task_id_for
from adaptive_rag.serving.commands import AdmitRequest
from adaptive_rag.serving.context import Serving

LOG = structlog.get_logger("serving.slots")
DEFAULT_LEASE_S = 600.0  # a tier without a lease of its own


def release_now(serving: Serving, request: AdmitRequest) -> None:
    """Give the slot back (blocking)."""
    if serving.fair_share is None:
        return
    try:
        serving.fair_share.release(request.tenant, request.tier, request.request_id)
    except Exception as exc:  # noqa: BLE001 - the lease expires on its own
        LOG.warning("fair_share_release_failed", error=str(exc))


async def release(serving: Serving, request: AdmitRequest) -> None:
    """`release_now` on an I/O thread."""
    if serving.fair_share is not None:
        await serving.io(release_now, serving, request)


def release_soon(serving: Serving, request: AdmitRequest) -> None:
    """`release_now` on an I/O thread, not awaited: the reply does not wait for it."""
    if serving.fair_share is not None:
        serving.io_soon(release_now, serving, request)


def release_when_done(serving: Serving, request: AdmitRequest) -> None:
    """Give the slot back when the work that still runs ends (in the background: the caller's
    deadline passed or it left); if no result comes within the lease, the lease ends it."""
    if serving.fair_share is None:
        return

    async def when_done() -> None:
        lease_s = serving.config.slot_lease_s.get(request.tier, DEFAULT_LEASE_S)
        try:
            await serving.waiter.wait(task_id_for(request.request_id), lease_s)
        except Exception:  # noqa: BLE001 - no result within the lease: the lease frees the slot
            return
        await release(serving, request)

    serving.watch(when_done(), name=f"release-{request.request_id}")
