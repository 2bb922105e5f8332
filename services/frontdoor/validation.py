"""Input checks of the front door: each failure is one `InvalidArgument` with a precise message
(the server turns it into INVALID_ARGUMENT). Query rules are the library's `validate_query`."""

from __future__ import annotations

from adaptive_rag.errors import InvalidQueryError
from adaptive_rag.validation import validate_query

MAX_CLIENT_REQUEST_ID = 128
MAX_FEEDBACK_TEXT = 10_000
RATINGS = (-1, 0, 1)


class InvalidArgument(ValueError):
    """A request field is unusable; the message says which and why."""


def decode_query(raw: bytes, max_chars: int) -> str:
    """UTF-8 bytes -> the validated, stripped query text."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidArgument(
            f"query is not valid UTF-8: byte 0x{raw[exc.start]:02X} at offset {exc.start} ({exc.reason})"
        ) from None
    try:
        return validate_query(text, max_chars)
    except InvalidQueryError as exc:
        raise InvalidArgument(str(exc)) from None


def check_client_request_id(value: str) -> str:
    """An idempotency key: 1-128 printable characters without spaces."""
    if not value:
        raise InvalidArgument("client_request_id is empty; omit the field for no idempotency key")
    if len(value) > MAX_CLIENT_REQUEST_ID:
        raise InvalidArgument(
            f"client_request_id is {len(value)} characters; the limit is {MAX_CLIENT_REQUEST_ID}"
        )
    for position, char in enumerate(value):
        if not char.isprintable() or char.isspace():
            raise InvalidArgument(
                f"client_request_id contains U+{ord(char):04X} at position {position}; "
                "use printable characters without spaces"
            )
    return value


def check_request_id(value: str) -> str:
    if not value.strip():
        raise InvalidArgument("request_id is empty")
    return value.strip()


def check_feedback(rating: int, correct_answer: str | None, comment: str | None) -> None:
    if rating not in RATINGS:
        raise InvalidArgument(f"rating must be -1 (wrong), 0 (no verdict) or 1 (right), got {rating}")
    for name, text in (("correct_answer", correct_answer), ("comment", comment)):
        if text is not None and len(text) > MAX_FEEDBACK_TEXT:
            raise InvalidArgument(f"{name} is {len(text)} characters; the limit is {MAX_FEEDBACK_TEXT}")
