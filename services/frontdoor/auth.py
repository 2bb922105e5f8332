"""API-key authentication: `authorization: Bearer <key>` metadata -> the key's tenant.

Keys are stored hashed (`RecordStore.tenant_for_key`, called by `AnswerService.authenticate`);
one tenant per key.
"""

from __future__ import annotations

from collections.abc import Iterable

from adaptive_rag.errors import UnauthenticatedError


def bearer_token(metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
    """The key of the `authorization: Bearer <key>` entry; raises `UnauthenticatedError`."""
    values = [v for k, v in (metadata or ()) if k.lower() == "authorization"]
    if not values:
        raise UnauthenticatedError("missing `authorization: Bearer <api key>` metadata")
    value = values[0].decode("latin-1") if isinstance(values[0], bytes) else values[0]
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise UnauthenticatedError("authorization metadata must be `Bearer <api key>`")
    return token.strip()
