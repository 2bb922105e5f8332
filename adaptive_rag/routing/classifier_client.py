"""Classifier client: tokenize, call Triton over gRPC, softmax, routing policy -> `RoutingDecision`.

Small on purpose: `tokenizers` (not transformers), `tritonclient[grpc]` and numpy; no torch.

- Every call has a timeout (`client_timeout`). When Triton is unreachable, times out or errors,
  the decision comes from the rules (`fallback_decision`) and is flagged `fallback=True`; after
  a failure the client skips Triton for `retry_after_s` so a dead server costs no timeouts.
- Asyncio callers (`aclassify`, the grpc.aio front door) call Triton with tritonclient's asyncio
  gRPC client on their own event loop: no hop to a thread and no blocked thread per call. With
  `batching=True` the callers of one loop iteration share a request; Triton's dynamic batcher
  merges concurrent requests server-side too.
- Blocking callers (`classify`): with `batching=True` a background thread takes every query
  waiting at that moment (up to `max_batch`) into one Triton request; one caller alone is sent at
  once. Sequences are padded to a multiple of `pad_to_multiple`, so requests from many clients
  share shapes and Triton's dynamic batcher can merge them too.
- An optional LRU cache (`cache_size`) answers repeated queries without a round trip.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from adaptive_rag.contracts import CLASSIFIER_INPUTS, CLASSIFIER_MODEL, CLASSIFIER_OUTPUT, RoutingDecision
from adaptive_rag.errors import AdaptiveRagError
from adaptive_rag.routing.policy import PolicyThresholds, RoutingPolicy, fallback_decision


class ClassifierUnavailableError(AdaptiveRagError):
    """Triton could not be reached, timed out or failed."""


def softmax_rows(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    exps = np.exp(shifted)
    return exps / exps.sum(axis=-1, keepdims=True)


class QueryTokenizer:
    """`tokenizer.json` through the `tokenizers` library: ids and mask as INT64, bucket-padded."""

    def __init__(self, tokenizer_path: Path, max_length: int = 128, pad_to_multiple: int = 16) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=max_length)
        self.max_length = max_length
        self.pad_to_multiple = max(1, pad_to_multiple)
        pad_id = self.tokenizer.token_to_id("[PAD]")
        if pad_id is None:
            pad_id = self.tokenizer.token_to_id("<pad>")
        self.pad_id = int(pad_id or 0)

    def __call__(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        encodings = self.tokenizer.encode_batch(list(texts))
        longest = max((len(e.ids) for e in encodings), default=1)
        width = min(self.max_length, -(-longest // self.pad_to_multiple) * self.pad_to_multiple)
        width = max(width, longest)
        ids = np.full((len(encodings), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(encodings), width), dtype=np.int64)
        for row, encoding in enumerate(encodings):
            n = len(encoding.ids)
            ids[row, :n] = encoding.ids
            mask[row, :n] = 1
        return ids, mask


class TritonClassifier:
    """Routes queries with the complexity model served by Triton; rules when it is unavailable."""

    def __init__(
        self,
        tokenizer_path: Path,
        url: str = "127.0.0.1:8001",
        model_name: str = CLASSIFIER_MODEL,
        model_version: str = "",
        policy: RoutingPolicy | None = None,
        timeout_s: float = 0.5,
        max_length: int = 128,
        max_batch: int = 32,
        batching: bool = True,
        pad_to_multiple: int = 16,
        retry_after_s: float = 1.0,
        cache_size: int = 0,
    ) -> None:
        import tritonclient.grpc as grpcclient

        self._grpc = grpcclient
        self.url = url
        self.model_name = model_name
        self.model_version = model_version
        self.policy = policy or RoutingPolicy()
        self.timeout_s = timeout_s
        self.max_batch = max_batch
        self.retry_after_s = retry_after_s
        self.tokenize = QueryTokenizer(tokenizer_path, max_length, pad_to_multiple)
        self.client = grpcclient.InferenceServerClient(url)
        self._down_until = 0.0
        self._cache: OrderedDict[str, tuple[np.ndarray, str]] = OrderedDict()
        self._cache_size = cache_size
        self._cache_lock = threading.Lock()
        self._queue: queue.Queue | None = None
        self._worker: threading.Thread | None = None
        self._closed = False
        # tritonclient's asyncio client and the loop it belongs to (made on the first `aclassify`).
        self._aio = None
        self._aio_loop: asyncio.AbstractEventLoop | None = None
        self._pending: list[tuple[str, asyncio.Future]] = []  # this loop iteration's callers
        self._batches: set[asyncio.Task] = set()
        if batching:
            self._queue = queue.Queue()
            self._worker = threading.Thread(target=self._batch_loop, name="triton-batcher", daemon=True)
            self._worker.start()

    @classmethod
    def from_version(cls, version, url: str, **kwargs) -> TritonClassifier:
        """A client for an exported `ModelVersion`: its tokenizer, max length and thresholds (the
        configured model's client: `model_repository.open_classifier`)."""
        kwargs.setdefault("policy", RoutingPolicy(version.thresholds()))
        kwargs.setdefault("max_length", version.max_length)
        return cls(version.tokenizer_path, url=url, model_name=version.name, **kwargs)

    # --- health ----------------------------------------------------------------------------------

    def is_ready(self) -> bool:
        try:
            return bool(
                self.client.is_server_ready(client_timeout=self.timeout_s)
                and self.client.is_model_ready(self.model_name, self.model_version,
                                               client_timeout=self.timeout_s)
            )
        except Exception:  # noqa: BLE001 - any failure means "not ready"
            return False

    # --- inference -------------------------------------------------------------------------------

    def _inputs(self, queries: Sequence[str]) -> list:
        """The tokenized batch as Triton inputs; `ClassifierUnavailableError` right after a failure."""
        if time.monotonic() < self._down_until:
            raise ClassifierUnavailableError("classifier unavailable (recent failure, retry later)")
        ids, mask = self.tokenize(queries)
        inputs = [
            self._grpc.InferInput(name, list(ids.shape), "INT64") for name in CLASSIFIER_INPUTS
        ]
        inputs[0].set_data_from_numpy(ids)
        inputs[1].set_data_from_numpy(mask)
        return inputs

    def _failed(self, exc: BaseException) -> ClassifierUnavailableError:
        """Skip Triton for `retry_after_s` after a failure (a dead server costs no timeouts)."""
        self._down_until = time.monotonic() + self.retry_after_s
        return ClassifierUnavailableError(f"Triton at {self.url}: {_short(exc)}")

    @staticmethod
    def _logits_of(result, n: int) -> tuple[np.ndarray, str]:
        logits = result.as_numpy(CLASSIFIER_OUTPUT)
        if logits is None or logits.shape != (n, 3):
            raise ClassifierUnavailableError(f"unexpected logits shape {getattr(logits, 'shape', None)}")
        return logits.astype(np.float32), result.get_response().model_version

    def _request(self, queries: Sequence[str]) -> dict[str, Any]:
        """The `infer` arguments of both clients: pinned version, one output, the timeout."""
        return {"model_name": self.model_name, "inputs": self._inputs(queries),
                "model_version": self.model_version, "client_timeout": self.timeout_s,
                "outputs": [self._grpc.InferRequestedOutput(CLASSIFIER_OUTPUT)]}

    def logits(self, queries: Sequence[str]) -> tuple[np.ndarray, str]:
        """Raw logits [n, 3] and the served model version; raises `ClassifierUnavailableError`."""
        request = self._request(queries)
        try:
            result = self.client.infer(**request)
        except Exception as exc:  # noqa: BLE001 - unreachable, timeout, server error
            raise self._failed(exc) from exc
        return self._logits_of(result, len(queries))

    async def alogits(self, queries: Sequence[str]) -> tuple[np.ndarray, str]:
        """`logits` through the asyncio client, on the running event loop."""
        request = self._request(queries)
        try:
            result = await self._aio_client().infer(**request)
        except Exception as exc:  # noqa: BLE001 - unreachable, timeout, server error
            raise self._failed(exc) from exc
        return self._logits_of(result, len(queries))

    def _aio_client(self):
        """The asyncio client of the running loop (a grpc.aio channel belongs to one loop)."""
        loop = asyncio.get_running_loop()
        if self._aio is None or self._aio_loop is not loop:
            import tritonclient.grpc.aio as aioclient

            self._aio, self._aio_loop = aioclient.InferenceServerClient(self.url), loop
        return self._aio

    def _cached(self, queries: Sequence[str]) -> dict[int, tuple[np.ndarray, str]]:
        """Probabilities and version of the queries the LRU holds, by position."""
        cached: dict[int, tuple[np.ndarray, str]] = {}
        if self._cache_size:
            with self._cache_lock:
                for i, q in enumerate(queries):
                    key = cache_key(q)
                    if key in self._cache:
                        self._cache.move_to_end(key)
                        cached[i] = self._cache[key]
        return cached

    def _remember(self, queries: Sequence[str], todo: list[int], logits: np.ndarray, version: str,
                  cached: dict[int, tuple[np.ndarray, str]]) -> None:
        probs = softmax_rows(logits)
        for row, i in enumerate(todo):
            cached[i] = (probs[row], version)
            if self._cache_size:
                with self._cache_lock:
                    self._cache[cache_key(queries[i])] = cached[i]
                    while len(self._cache) > self._cache_size:
                        self._cache.popitem(last=False)

    def _decisions(self, queries: Sequence[str], cached: dict[int, tuple[np.ndarray, str]],
                   failure: ClassifierUnavailableError | None = None) -> list[RoutingDecision]:
        """The policy's decisions; a query Triton did not answer gets the flagged rules fallback."""
        return [
            self._decision(*cached[i]) if i in cached else fallback_decision(q, str(failure))
            for i, q in enumerate(queries)
        ]

    def _decide(self, queries: Sequence[str]) -> list[RoutingDecision]:
        cached = self._cached(queries)
        todo = [i for i in range(len(queries)) if i not in cached]
        try:
            if todo:
                self._remember(queries, todo, *self.logits([queries[i] for i in todo]), cached)
        except ClassifierUnavailableError as exc:
            return self._decisions(queries, cached, exc)
        return self._decisions(queries, cached)

    async def _adecide(self, queries: Sequence[str]) -> list[RoutingDecision]:
        cached = self._cached(queries)
        todo = [i for i in range(len(queries)) if i not in cached]
        try:
            if todo:
                self._remember(queries, todo, *await self.alogits([queries[i] for i in todo]), cached)
        except ClassifierUnavailableError as exc:
            return self._decisions(queries, cached, exc)
        return self._decisions(queries, cached)

    def _decision(self, probabilities: np.ndarray, served_version: str) -> RoutingDecision:
        """The policy's decision, naming the model and the version Triton says answered."""
        version = int(served_version) if served_version.isdigit() else None
        if version is None and self.model_version.isdigit():
            version = int(self.model_version)
        return self.policy.decide(probabilities.tolist(), self.model_name, version)

    def classify_many(self, queries: Sequence[str]) -> list[RoutingDecision]:
        """One Triton request for all `queries` (split at `max_batch`)."""
        decisions: list[RoutingDecision] = []
        for start in range(0, len(queries), self.max_batch):
            decisions.extend(self._decide(queries[start:start + self.max_batch]))
        return decisions

    def classify(self, query: str) -> RoutingDecision:
        """The routing decision for one query (batched with concurrent callers when enabled)."""
        if self._queue is None or self._closed:
            return self._decide([query])[0]
        future: Future = Future()
        self._queue.put((query, future))
        try:
            return future.result(timeout=self.timeout_s * 4 + 1.0)
        except Exception as exc:  # noqa: BLE001 - the batcher never answered
            return fallback_decision(query, f"batcher: {_short(exc)}")

    async def aclassify(self, query: str) -> RoutingDecision:
        """`classify` for asyncio callers (the grpc.aio front door): the asyncio Triton client on
        the caller's loop, never blocking it. A closed client (replaced by a newer version, calls
        in flight finishing) answers through its blocking path."""
        if self._closed:
            return await asyncio.to_thread(self.classify, query)
        if self._queue is None:
            return (await self._aroute([query]))[0]
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        if not self._pending:  # the first caller of this iteration: the others join its request
            loop.call_soon(self._send_pending)
        self._pending.append((query, future))
        return await future

    async def _aroute(self, queries: Sequence[str]) -> list[RoutingDecision]:
        try:
            return await self._adecide(queries)
        except Exception as exc:  # noqa: BLE001 - tokenizer or policy bug: never fail the call
            return [fallback_decision(q, f"classifier error: {_short(exc)}") for q in queries]

    def _send_pending(self) -> None:
        """One request per `max_batch` of the callers gathered in this loop iteration."""
        pending, self._pending = self._pending, []
        for start in range(0, len(pending), self.max_batch):
            batch = pending[start:start + self.max_batch]
            task = asyncio.ensure_future(self._answer(batch))
            self._batches.add(task)
            task.add_done_callback(self._batches.discard)

    async def _answer(self, batch: list[tuple[str, asyncio.Future]]) -> None:
        decisions = await self._aroute([q for q, _ in batch])
        for (_, future), decision in zip(batch, decisions):
            if not future.done():  # its caller may have left
                future.set_result(decision)

    def _batch_loop(self) -> None:
        assert self._queue is not None
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch = [item]
            while len(batch) < self.max_batch:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)
                    break
                batch.append(nxt)
            try:
                decisions = self._decide([q for q, _ in batch])
            except Exception as exc:  # noqa: BLE001 - never let the batcher die
                decisions = [fallback_decision(q, f"classifier error: {_short(exc)}") for q, _ in batch]
            for (_, future), decision in zip(batch, decisions):
                future.set_result(decision)

    def close(self) -> None:
        """Stop the batcher and close both clients (the asyncio one on its own loop)."""
        if self._closed:
            return
        self._closed = True
        if self._queue is not None:
            self._queue.put(None)
            if self._worker is not None:
                self._worker.join(timeout=2)
        try:
            self.client.close()
        except Exception:  # noqa: BLE001
            pass
        aio, loop, self._aio, self._aio_loop = self._aio, self._aio_loop, None, None
        if aio is not None and loop is not None and not loop.is_closed():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                loop.create_task(aio.close())
            else:
                asyncio.run_coroutine_threadsafe(aio.close(), loop)

    def __enter__(self) -> TritonClassifier:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def cache_key(query: str) -> str:
    """Queries that differ only in case and spacing share a cache entry (the tokenizer is uncased
    and splits on whitespace: they get the same decision)."""
    return " ".join(query.split()).casefold()


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200]}"


__all__ = [
    "ClassifierUnavailableError", "PolicyThresholds", "QueryTokenizer", "TritonClassifier",
    "softmax_rows",
]
