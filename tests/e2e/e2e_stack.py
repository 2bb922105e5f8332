"""Helpers of the end-to-end tests (the fixtures are in `conftest.py`).

The whole serving stack on loopback, the lab's stack (`lab.harness.stack.lab_stack`) with real
Redis, PostgreSQL, Triton, Celery worker pools (embedded Gemma model, the demo help centre in
tenant acme's knowledge base) and the gRPC front door (`python -m services.frontdoor`). The
classifier served is `publish_length_router`: a real ONNX graph whose routing the tests can rely
on (logits from the token count: short -> A, medium -> B, long -> C, MiniLM tokenizer). `Stack`
is a gRPC client of one of its front doors.
"""

from __future__ import annotations

import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from adaptive_rag.storage import RecordStore
from lab.harness.models import publish_length_router
from lab.harness.stack import LabStack
from services.demo.stack import StackSettings
from services.frontdoor.stubs import pb2, pb2_grpc
from workers.pools import WorkerPools

REPO = Path(__file__).resolve().parents[2]
ANSWER_TIMEOUT_S = 240.0  # the embedded model on 2 shared cores
C_QUEUE_LIMIT = 2
# The e2e stacks' settings (besides the servers): short timeouts, small retrieval, one process per pool.
E2E_SETTINGS: dict[str, Any] = dict(
    classifier_timeout_s=2.0, model_poll_s=1.0, concurrency={"A": 1, "B": 1, "C": 1}, top_k=3,
    max_passages=4, max_steps=2, max_query_chars=500, task_retry_backoff_s=0.5,
)


def publish_version(repo: Path, version: int, c_bias: float) -> Path:
    return publish_length_router(repo, version, c_bias)


@dataclass
class Stack:
    settings: StackSettings
    store: RecordStore
    pools: WorkerPools
    stub: pb2_grpc.AdaptiveRagStub
    channel: grpc.Channel
    auth: tuple[tuple[str, str], ...]
    metrics_url: str
    log_path: Path
    lab: LabStack
    extra: dict = field(default_factory=dict)

    def answer(self, query: str | bytes, timeout: float = ANSWER_TIMEOUT_S, auth=None, **fields):
        raw = query.encode() if isinstance(query, str) else query
        return self.stub.Answer.with_call(
            pb2.AnswerRequest(query=raw, **fields), metadata=self.auth if auth is None else auth,
            timeout=timeout)

    def get_result(self, request_id: str, timeout: float = 30.0):
        return self.stub.GetResult(pb2.GetResultRequest(request_id=request_id), metadata=self.auth,
                                   timeout=timeout)

    def metrics(self) -> str:
        return urllib.request.urlopen(self.metrics_url, timeout=10).read().decode()

    def wait_for_model_version(self, version: int, within_s: float = 90.0) -> None:
        """Until the front door's metrics say it routes with classifier `version`."""
        deadline = time.monotonic() + within_s
        while f'arag_classifier_model_version{{model="complexity"}} {version:.1f}' not in self.metrics():
            assert time.monotonic() < deadline, f"the front door never switched to version {version}"
            time.sleep(0.5)

    def wait_for_result(self, request_id: str, within_s: float = ANSWER_TIMEOUT_S):
        deadline = time.monotonic() + within_s
        while True:
            try:
                return self.get_result(request_id)
            except grpc.RpcError as exc:
                if exc.code() is not grpc.StatusCode.FAILED_PRECONDITION or time.monotonic() > deadline:
                    raise
            time.sleep(0.5)


def client_of(lab: LabStack, key: str, *, settings: StackSettings | None = None,
              log_path: Path | None = None) -> Stack:
    """A `Stack` on a front door of `lab` (default: the stack's own; else the one started on
    `settings`, logging to `log_path`), authenticated with `key`; close its `channel` after."""
    settings = settings or lab.settings
    channel = grpc.insecure_channel(settings.frontdoor.grpc_listen)
    return Stack(settings, lab.store, lab.pools, pb2_grpc.AdaptiveRagStub(channel), channel,
                 (("authorization", f"Bearer {key}"),),
                 f"http://127.0.0.1:{settings.frontdoor.metrics_port}/metrics",
                 log_path or lab.frontdoor.log_path, lab)
