"""Query validation shared by every entry point (CLI, gRPC front door)."""

from __future__ import annotations

import unicodedata

from adaptive_rag.errors import InvalidQueryError


def validate_query(text: str, max_chars: int) -> str:
    """Return the stripped query or raise `InvalidQueryError` saying precisely what is wrong."""
    if not isinstance(text, str):
        raise InvalidQueryError("query must be text")
    stripped = text.strip()
    if not stripped:
        raise InvalidQueryError("query is empty")
    if len(stripped) > max_chars:
        raise InvalidQueryError(f"query is {len(stripped)} characters; the limit is {max_chars}")
    for position, char in enumerate(stripped):
        if unicodedata.category(char) in ("Cc", "Cs") and char not in "\t\n\r":
            raise InvalidQueryError(
                f"query contains control character U+{ord(char):04X} at position {position}"
            )
    return stripped
