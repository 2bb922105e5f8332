"""Helpers of the end-to-end tests (the fixtures are in `conftest.py`).

The whole serving stack on loopback: real Redis, PostgreSQL, Triton, Celery worker pools (embedded
Gemma model, the demo help centre in tenant acme's knowledge base) and the gRPC front door
(`python -m services.frontdoor`). The classifier served is `publish_length_router`: a real ONNX
graph whose routing the tests can rely on (logits from the token count: short -> A, medium -> B,
long -> C, MiniLM tokenizer).
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from adaptive_rag.storage import RecordStore
from services.demo.stack import FrontDoorProcess, StackSettings
from services.frontdoor.stubs import pb2, pb2_grpc
from lab.harness.models import publish_length_router
from workers.pools import WorkerPools

REPO = Path(__file__).resolve().parents[2]
ANSWER_TIMEOUT_S = 240.0  # the embedded model on 2 shared cores
C_QUEUE_LIMIT = 2


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


def frontdoor_stack(
    settings: StackSettings, pools: WorkerPools, store: RecordStore, auth, log_path: Path,
) -> tuple[Stack, Callable[[], None]]:
    """A front door for `settings` (its own process, channel and metrics port) as a `Stack`."""
    listen = settings.frontdoor.grpc_listen
    frontdoor = FrontDoorProcess(settings.env(), log_path, listen)
    channel = grpc.insecure_channel(listen)

    def stop() -> None:
        channel.close()
        frontdoor.stop()

    stack = Stack(settings, store, pools, pb2_grpc.AdaptiveRagStub(channel), channel, auth,
                  f"http://127.0.0.1:{settings.frontdoor.metrics_port}/metrics", frontdoor.log_path)
    return stack, stop
