"""Input checks shared by every entry point (CLI, gRPC front door): each failure raises one
`InvalidRequestError` (a query: `InvalidQueryError`) with a message that says precisely what is
wrong and where (for the CLI and the logs), and a `reason` that a remote client is told instead."""

from __future__ import annotations

import unicodedata

from adaptive_rag.contracts import CallError
from adaptive_rag.errors import InvalidQueryError, InvalidRequestError

MAX_CLIENT_REQUEST_ID = 128
MAX_REQUEST_ID = 64
MAX_FEEDBACK_TEXT = 10_000
RATINGS = (-1, 0, 1)  # answer wrong / no verdict / answer right
ALLOWED_CONTROLS = "\t\n\r"  # the line structure of pasted text


def first_control_character(text: str) -> int | None:
    """Position of the first control character (or lone surrogate) other than tab and line
    breaks: text no record, log line or terminal should hold (PostgreSQL text cannot hold U+0000)."""
    for position, char in enumerate(text):
        if unicodedata.category(char) in ("Cc", "Cs") and char not in ALLOWED_CONTROLS:
            return position
    return None


def validate_query(text: str, max_chars: int) -> str:
    """Return the stripped query or raise `InvalidQueryError` saying precisely what is wrong."""
    if not isinstance(text, str):
        raise InvalidQueryError("query must be text", reason=CallError.QUERY_EMPTY)
    stripped = text.strip()
    if not stripped:
        raise InvalidQueryError("query is empty", reason=CallError.QUERY_EMPTY)
    if len(stripped) > max_chars:
        raise InvalidQueryError(f"query is {len(stripped)} characters; the limit is {max_chars}",
                                reason=CallError.QUERY_TOO_LONG)
    position = first_control_character(stripped)
    if position is not None:
        raise InvalidQueryError(
            f"query contains control character U+{ord(stripped[position]):04X} at position {position}",
            reason=CallError.QUERY_CONTROL_CHARACTER,
        )
    return stripped


def decode_query(raw: bytes, max_chars: int) -> str:
    """UTF-8 bytes -> the validated, stripped query text."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidQueryError(
            f"query is not valid UTF-8: byte 0x{raw[exc.start]:02X} at offset {exc.start} ({exc.reason})",
            reason=CallError.QUERY_NOT_UTF8,
        ) from None
    return validate_query(text, max_chars)


def check_client_request_id(value: str) -> str:
    """An idempotency key: 1-128 printable characters without spaces."""
    reason = CallError.INVALID_CLIENT_REQUEST_ID
    if not value:
        raise InvalidRequestError("client_request_id is empty; omit the field for no idempotency key",
                                  reason=reason)
    if len(value) > MAX_CLIENT_REQUEST_ID:
        raise InvalidRequestError(
            f"client_request_id is {len(value)} characters; the limit is {MAX_CLIENT_REQUEST_ID}",
            reason=reason,
        )
    for position, char in enumerate(value):
        if not char.isprintable() or char.isspace():
            raise InvalidRequestError(
                f"client_request_id contains U+{ord(char):04X} at position {position}; "
                "use printable characters without spaces", reason=reason,
            )
    return value


def check_request_id(value: str) -> str:
    value, reason = value.strip(), CallError.INVALID_REQUEST_ID
    if not value:
        raise InvalidRequestError("request_id is empty", reason=reason)
    if len(value) > MAX_REQUEST_ID:
        raise InvalidRequestError(f"request_id is {len(value)} characters; the limit is {MAX_REQUEST_ID}",
                                  reason=reason)
    for position, char in enumerate(value):
        if not char.isprintable():
            raise InvalidRequestError(
                f"request_id contains U+{ord(char):04X} at position {position}; request ids are printable text",
                reason=reason,
            )
    return value


def check_conversation_id(value: str) -> str:
    """A conversation id: what an Answer returned (1-64 printable characters without spaces)."""
    reason = CallError.INVALID_CONVERSATION_ID
    if not value:
        raise InvalidRequestError("conversation_id is empty; omit the field to start a new conversation",
                                  reason=reason)
    if len(value) > MAX_REQUEST_ID:
        raise InvalidRequestError(f"conversation_id is {len(value)} characters; the limit is {MAX_REQUEST_ID}",
                                  reason=reason)
    for position, char in enumerate(value):
        if not char.isprintable() or char.isspace():
            raise InvalidRequestError(
                f"conversation_id contains U+{ord(char):04X} at position {position}; conversation "
                "ids are printable text without spaces", reason=reason,
            )
    return value


def check_feedback(rating: int, correct_answer: str | None, comment: str | None) -> None:
    reason = CallError.INVALID_FEEDBACK
    if rating not in RATINGS:
        raise InvalidRequestError(f"rating must be -1 (wrong), 0 (no verdict) or 1 (right), got {rating}",
                                  reason=reason)
    for name, text in (("correct_answer", correct_answer), ("comment", comment)):
        if text is None:
            continue
        if len(text) > MAX_FEEDBACK_TEXT:
            raise InvalidRequestError(f"{name} is {len(text)} characters; the limit is {MAX_FEEDBACK_TEXT}",
                                      reason=reason)
        position = first_control_character(text)
        if position is not None:
            raise InvalidRequestError(
                f"{name} contains control character U+{ord(text[position]):04X} at position {position}",
                reason=reason,
            )
