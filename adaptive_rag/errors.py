"""Precise exceptions raised by the library; entry points map them to messages or status codes."""


class AdaptiveRagError(Exception):
    """Base class of every error the library raises on purpose."""


class ConfigurationError(AdaptiveRagError, ValueError):
    """Settings are missing or inconsistent."""


class IndexNotFoundError(AdaptiveRagError):
    """The retrieval index (directory or OpenSearch index) does not exist."""


class RetrieverUnavailableError(AdaptiveRagError):
    """The retrieval backend cannot be reached."""


class LLMUnavailableError(AdaptiveRagError):
    """The LLM backend cannot be reached or failed after retries."""


class InvalidQueryError(AdaptiveRagError):
    """A query is empty, too long or otherwise unusable."""


class DuplicateRequestError(AdaptiveRagError):
    """A request with this (tenant, client request id) or request id is already recorded."""


class RequestNotFoundError(AdaptiveRagError):
    """No such request, or it belongs to another tenant (both look the same to a caller)."""
