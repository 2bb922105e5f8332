"""Fault injection for tests only: a front door made to die at one exact point of an admission.
Never set in production; each fault is a setting read once at start-up (`FrontDoorSettings`)."""

from __future__ import annotations

import os
from collections.abc import Callable

import structlog

from services.frontdoor.settings import FrontDoorSettings

LOG = structlog.get_logger("frontdoor.faults")
# The exit status of a front door that died on purpose (tests tell it from a crash).
FAULT_EXIT_STATUS = 86


def after_record(settings: FrontDoorSettings) -> Callable[[str], None]:
    """What runs once a new request's row is committed, before its task is enqueued: nothing,
    or with `fault_exit_after_record` the process ends at once (`os._exit`: no clean-up, no
    flush, as a SIGKILL would), leaving that request recorded `queued` and never published."""
    if not settings.fault_exit_after_record:
        return lambda request_id: None

    def exit_now(request_id: str) -> None:
        LOG.error("fault_exit_after_record", request_id=request_id)
        os._exit(FAULT_EXIT_STATUS)

    return exit_now
