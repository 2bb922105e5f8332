"""Fixtures of the end-to-end tests: the whole serving stack (see `e2e_stack.py`) on loopback.

`redis_url` / `postgres_url` come from the root conftest. `lab` is the lab's stack on them, one
per test module (Triton serving `model_repository`, pools A, B and C, the front door, the help
centre in tenant acme's knowledge base); `stack` is a client of its front door. Tests must leave it as they found it. A test that needs a new model version or a stopped
Triton starts a front door and Triton of its own with `own_frontdoor`, sharing only Redis,
PostgreSQL and the worker pools.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from e2e_stack import C_QUEUE_LIMIT, E2E_SETTINGS, Stack, client_of, publish_version

from infra.local.servers import free_port
from lab.harness.stack import TIER_POOLS, LabStack, Parts, lab_stack


@pytest.fixture(scope="module")
def model_repository(tmp_path_factory) -> Path:
    """A model repository holding version 1 of the length router (C from 21 tokens)."""
    repo = tmp_path_factory.mktemp("model-repository")
    publish_version(repo, 1, c_bias=-20.0)
    return repo


@pytest.fixture(scope="module")
def lab(redis_url, postgres_url, model_repository, tmp_path_factory) -> Iterator[LabStack]:
    parts = Parts(broker="redis", records="postgres", classifier="triton", retriever="tantivy", llm="embedded")
    # The C queue's limit is checked on a fresh read of its depth: the default estimate (read at
    # most every 50 ms, never counting fewer than this replica queued since) errs towards refusing,
    # and tasks that abstain in a millisecond would then look queued to the tests' arithmetic.
    settings = {**E2E_SETTINGS, "redis_url": redis_url, "database_url": postgres_url,
                "max_queue_depth": {"C": C_QUEUE_LIMIT}, "queue_depth_max_age_s": 0}
    with lab_stack(tmp_path_factory.mktemp("frontdoor-e2e"), parts, pools=TIER_POOLS, settings=settings,
                   model_repository=model_repository, tenants=("acme",), dotenv=False) as running:
        yield running


@pytest.fixture(scope="module")
def stack(lab: LabStack) -> Iterator[Stack]:
    client = client_of(lab, lab.api_key("acme"))
    yield client
    client.channel.close()


@pytest.fixture
def own_frontdoor(stack: Stack, tmp_path: Path) -> Iterator[Callable[[], Stack]]:
    """Factory: a second front door with its own model repository (version 1 of the length router)
    and its own Triton, on the module's Redis, PostgreSQL and worker pools. Its Triton is
    `.extra["triton"]`, its repository `.extra["model_repository"]`; all stopped afterwards."""
    lab = stack.lab
    started: list[Callable[[], None]] = []

    def make() -> Stack:
        name = f"own-{uuid.uuid4().hex[:6]}"
        repo = tmp_path / f"model-repository-{name}"
        publish_version(repo, 1, c_bias=-20.0)
        server = lab.start_triton(f"triton-{name}", repo)
        started.append(server.stop)
        settings = lab.settings.updated(model_repository=repo, triton_grpc_url=server.url,
                                        metrics_port=free_port(), grpc_listen=f"127.0.0.1:{free_port()}")
        door = lab.start_frontdoor(f"frontdoor-{name}", settings=settings)
        started.append(door.stop)
        built = client_of(lab, dict(stack.auth)["authorization"].removeprefix("Bearer "),
                          settings=settings, log_path=door.log_path)
        started.append(built.channel.close)
        built.extra.update(triton=server, model_repository=repo)
        built.wait_for_model_version(1)
        return built

    yield make
    for stop in reversed(started):
        stop()
