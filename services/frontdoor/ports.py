"""What the front door needs from records and queues, as Protocols: the real `RecordStore` and
`workers.dispatch` satisfy them; unit tests pass small fakes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, is_dataclass
from typing import Any, Protocol


class Store(Protocol):
    """The part of `adaptive_rag.storage.records.RecordStore` the front door calls."""

    def tenant_for_key(self, key: str) -> str | None: ...
    def find_request(self, tenant: str, client_request_id: str) -> Any | None: ...
    def get_request(self, request_id: str) -> Any | None: ...
    def create_request(self, request_id: str, tenant: str, client_request_id: str | None, query: str) -> Any: ...
    def record_decision(
        self, request_id: str, tier: str, strategy: str, probabilities: dict[str, float] | None,
        model_name: str, model_version: int | None, fallback: bool, reason: str, classify_ms: float,
    ) -> None: ...
    def set_status(self, request_id: str, status: str) -> None: ...
    def get_result(self, request_id: str, kind: str = "primary") -> Any | None: ...
    def decision_for(self, request_id: str) -> Any | None: ...
    def add_feedback(
        self, request_id: str, tenant: str, rating: int, correct_answer: str | None, comment: str | None,
    ) -> int: ...


class Dispatcher(Protocol):
    """The queue side: `workers.dispatch` functions, bundled (see `dispatcher.CeleryDispatcher`).

    Optional extras the server uses when present: `async start()` / `async stop()` (run on the
    server's event loop) and, with `awaits_results` true, `async await_result(handle, timeout)`
    instead of the blocking `wait_result`.
    """

    queue_for_tier: Mapping[str, str]

    def enqueue(self, request_id: str, query: str, tier: str, strategy: str, kind: str = "primary") -> Any: ...
    def queue_depth(self, queue: str) -> int: ...
    def wait_result(self, handle: Any, timeout: float) -> dict: ...
    def handle_for(self, request_id: str, kind: str = "primary") -> Any | None: ...


def as_mapping(view: Any) -> Mapping[str, Any]:
    """A dataclass view (or a dict) as a mapping, so replies are built the same way from both."""
    if view is None:
        return {}
    if isinstance(view, Mapping):
        return view
    if is_dataclass(view):
        return asdict(view)
    return vars(view)
