"""Precise exceptions raised by the library; entry points map them to messages or status codes."""

from __future__ import annotations

from adaptive_rag.contracts import CALL_ERROR_FOR_WORKER_ERROR, CallError, ErrorCode


class AdaptiveRagError(Exception):
    """Base class of every error the library raises on purpose.

    `reason`: what a remote caller is told (a stable code and its message, `CallError`); the
    exception's own text is for logs and operators (it may name hosts, paths, classes). Each class
    has a default; a raise site may name a more precise one."""

    reason: CallError = CallError.INTERNAL

    def __init__(self, *args: object, reason: CallError | None = None) -> None:
        super().__init__(*args)
        if reason is not None:
            self.reason = reason


class ConfigurationError(AdaptiveRagError, ValueError):
    """Settings are missing or inconsistent."""


class IndexNotFoundError(AdaptiveRagError):
    """The retrieval index (directory or OpenSearch index) does not exist."""


class RetrieverUnavailableError(AdaptiveRagError):
    """The retrieval backend cannot be reached."""


class LLMUnavailableError(AdaptiveRagError):
    """The LLM backend cannot be reached or failed after retries."""


class InvalidRequestError(AdaptiveRagError, ValueError):
    """A request field is unusable; the message says which and why."""

    reason = CallError.INVALID_REQUEST


class InvalidQueryError(InvalidRequestError):
    """A query is empty, too long or otherwise unusable."""


class InvalidDocumentError(InvalidRequestError):
    """A knowledge-base document (or document id) the service cannot store or address."""

    reason = CallError.INVALID_DOCUMENT


class DuplicateRequestError(AdaptiveRagError):
    """A request with this (tenant, client request id) or request id is already recorded."""


class RequestNotFoundError(AdaptiveRagError):
    """No such request, or it belongs to another tenant (both look the same to a caller)."""

    reason = CallError.REQUEST_NOT_FOUND


class ConversationNotFoundError(RequestNotFoundError):
    """No such conversation for the caller's tenant: unknown, another tenant's, or every turn
    older than the retention (all three look the same to a caller)."""

    reason = CallError.CONVERSATION_NOT_FOUND


# --- serving: what a use case can refuse; each entry point maps these to its own status table ---


class UnauthenticatedError(AdaptiveRagError):
    """Missing, malformed, unknown or revoked API key (the message never echoes the key)."""

    reason = CallError.UNAUTHENTICATED


class ClientRequestIdReusedError(AdaptiveRagError):
    """A client_request_id already used for a different query of the same tenant."""

    reason = CallError.CLIENT_REQUEST_ID_REUSED


class QueueFullError(AdaptiveRagError):
    """The routed tier's queue holds its limit of tasks; nothing runs (the client may resend)."""

    reason = CallError.QUEUE_FULL


class AnswerTimeoutError(AdaptiveRagError):
    """No result within the caller's deadline; the work continues under `request_id`."""

    def __init__(self, message: str, request_id: str) -> None:
        super().__init__(message, reason=CallError.DEADLINE_EXCEEDED if request_id else CallError.NOT_RECORDED)
        self.request_id = request_id


class RequestNotFinishedError(AdaptiveRagError):
    """The request is still in flight, or never ran (rejected, expired): no result to read yet."""

    reason = CallError.NOT_FINISHED


class AnswerFailedError(AdaptiveRagError):
    """The worker recorded an error for this request instead of an answer."""

    def __init__(self, message: str, code: ErrorCode) -> None:
        super().__init__(message, reason=CALL_ERROR_FOR_WORKER_ERROR[code])
        self.code = code


class PermissionDeniedError(AdaptiveRagError):
    """The API key is valid but lacks the scope this call needs."""

    reason = CallError.PERMISSION_DENIED


class KnowledgeBaseMissingError(AdaptiveRagError):
    """The tenant has no knowledge base yet: nothing to retrieve from (import one first)."""

    reason = CallError.KNOWLEDGE_BASE_MISSING


class OverShareError(QueueFullError):
    """The tenant is over its rate limit or its share of a tier queue; others are not.

    `retry_after_s` is when a retry may be admitted (the front door sends it as a hint).
    """

    reason = CallError.OVER_SHARE

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class KnowledgeBaseBusyError(AdaptiveRagError):
    """Another writer holds this tenant's knowledge base (an import or rebuild is running)."""

    reason = CallError.KNOWLEDGE_BASE_BUSY


class DependencyUnavailableError(AdaptiveRagError):
    """A service the call needs (the records database, the task queue) is unreachable right now;
    nothing was lost and the same call may be sent again (with its client_request_id)."""

    reason = CallError.DEPENDENCY_UNAVAILABLE


class DatabaseUnavailableError(DependencyUnavailableError):
    """The records database does not answer (connection refused or lost, server gone): what the
    storage adapters raise instead of their driver's errors (`storage.db.map_database_errors`);
    the call may be tried again once the database is back."""


def short_error(exc: BaseException, limit: int, *, with_type: bool = False) -> str:
    """`exc` on one line, at most `limit` characters (for records, verdicts and log fields)."""
    text = " ".join((f"{type(exc).__name__}: {exc}" if with_type else str(exc)).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
