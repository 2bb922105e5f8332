"""What a task that died outside its own error handling is recorded and reported as.

Such a task never returned a result: Celery's hard time limit ended it, or its records stayed
away past every retry (`RecordsUnavailable`), or a bug killed it. The worker records the error
(`workers.tasks`) and a waiting client reads it from the result backend (`workers.client`); both
ask `dead_task_error`, by the exception's class name, all a result backend keeps of it.
"""

from __future__ import annotations

from types import MappingProxyType

from celery.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded

from adaptive_rag.contracts import ErrorCode
from adaptive_rag.serving.answering import RecordsUnavailable

TIME_LIMIT_DETAIL = "the strategy did not finish within the worker's time limit"
# Exception class name -> (error code, what the client is told); anything else is `internal`.
DEAD_TASK_ERRORS: MappingProxyType[str, tuple[ErrorCode, str]] = MappingProxyType({
    TimeLimitExceeded.__name__: (ErrorCode.TIME_LIMIT, TIME_LIMIT_DETAIL),
    SoftTimeLimitExceeded.__name__: (ErrorCode.TIME_LIMIT, TIME_LIMIT_DETAIL),
    RecordsUnavailable.__name__: (ErrorCode.DEPENDENCY_UNAVAILABLE, "the records database stayed unreachable"),
})


def dead_task_error(exc_type: str) -> tuple[ErrorCode, str | None]:
    """The error code of a task that died with an exception of class `exc_type`, and what the
    client is told (None: the exception itself): a time limit or the records away by their own
    codes, anything else `internal`."""
    return DEAD_TASK_ERRORS.get(exc_type, (ErrorCode.INTERNAL, None))
