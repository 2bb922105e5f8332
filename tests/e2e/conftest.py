"""Fixtures of the end-to-end tests: the whole serving stack (see `e2e_stack.py`) on loopback.

`redis_url` / `postgres_url` come from the root conftest. `stack` (with `model_repository` and
`triton`) is one per test module; tests must leave it as they found it. A test that needs a new
model version or a stopped Triton starts a front door and Triton of its own with `own_frontdoor`,
sharing only Redis, PostgreSQL and the worker pools.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from e2e_stack import C_QUEUE_LIMIT, REPO, Stack, frontdoor_stack, publish_version

from adaptive_rag.contracts import Scope
from adaptive_rag.knowledge.importers import import_path
from adaptive_rag.settings import ClassifierSettings, Settings
from adaptive_rag.storage import RecordStore, make_engine
from infra.local.servers import free_port
from services.classifier.local import TritonProcess
from services.demo.stack import StackSettings
from services.frontdoor.knowledge import upload_documents
from services.frontdoor.settings import FrontDoorSettings
from workers.pools import WorkerPools
from workers.settings import WorkerSettings


@pytest.fixture(scope="module")
def model_repository(tmp_path_factory) -> Path:
    """A model repository holding version 1 of the length router (C from 21 tokens)."""
    repo = tmp_path_factory.mktemp("model-repository")
    publish_version(repo, 1, c_bias=-20.0)
    return repo


@pytest.fixture(scope="module")
def triton(model_repository, tmp_path_factory):
    server = TritonProcess(model_repository, tmp_path_factory.mktemp("triton") / "serve.log")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def stack(redis_url, postgres_url, triton, model_repository, tmp_path_factory) -> Iterator[Stack]:
    base = tmp_path_factory.mktemp("frontdoor-e2e")
    ignore_dotenv = {"_env_file": None}
    settings = StackSettings(
        library=Settings(**ignore_dotenv), classifier=ClassifierSettings(**ignore_dotenv),
        frontdoor=FrontDoorSettings(**ignore_dotenv), workers=WorkerSettings(**ignore_dotenv),
    ).updated(
        redis_url=redis_url, database_url=postgres_url,
        kb_dir=base / "kb", model_repository=model_repository,
        triton_grpc_url=triton.url, classifier_timeout_s=2.0, model_poll_s=1.0,
        concurrency={"A": 1, "B": 1, "C": 1},
        top_k=3, max_passages=4, max_steps=2, max_query_chars=500,
        max_queue_depth={"C": C_QUEUE_LIMIT}, metrics_port=free_port(),
        grpc_listen=f"127.0.0.1:{free_port()}", task_retry_backoff_s=0.5,
    )
    pools = WorkerPools(settings.workers, pools=("A", "B", "C"), library=settings.library,
                        log_dir=base / "workers")
    pools.start()
    stop = None
    try:
        store = RecordStore(make_engine(postgres_url))
        key = store.create_api_key("acme")
        built, stop = frontdoor_stack(settings, pools, store, (("authorization", f"Bearer {key}"),),
                                      base / "frontdoor.log")
        # The help centre goes in the way a tenant's client sends it: the KnowledgeBase API.
        writer = store.create_api_key("acme", frozenset({Scope.KB_WRITE}))
        upload_documents(built.channel, writer, import_path(REPO / "demo" / "knowledge_base.jsonl"))
        yield built
    finally:
        if stop is not None:
            stop()
        pools.stop()


@pytest.fixture
def own_frontdoor(stack: Stack, tmp_path: Path) -> Iterator[Callable[[], Stack]]:
    """Factory: a second front door with its own model repository (version 1 of the length router)
    and its own Triton, on the module's Redis, PostgreSQL and worker pools. Its Triton is
    `.extra["triton"]`, its repository `.extra["model_repository"]`; all stopped afterwards."""
    started: list[Callable[[], None]] = []

    def make() -> Stack:
        n = len(started)
        repo = tmp_path / f"model-repository-{n}"
        publish_version(repo, 1, c_bias=-20.0)
        server = TritonProcess(repo, tmp_path / f"serve-{n}.log")
        started.append(server.stop)
        settings = stack.settings.updated(
            model_repository=repo, triton_grpc_url=server.url,
            metrics_port=free_port(), grpc_listen=f"127.0.0.1:{free_port()}",
        )
        built, stop = frontdoor_stack(settings, stack.pools, stack.store, stack.auth,
                                      tmp_path / f"frontdoor-{n}.log")
        started.append(stop)
        built.extra.update(triton=server, model_repository=repo)
        built.wait_for_model_version(1)
        return built

    yield make
    for stop in reversed(started):
        stop()
