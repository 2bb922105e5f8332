"""The local-server harness (`infra.local.servers`, `infra.local.opensearch`, the command
`python -m infra.local`) with real redis-server, PostgreSQL and an OpenSearch node: data written before a clean restart or a crash is
there again on the same port, and the command-line helper stopped with SIGTERM leaves no server
process and no directory behind.

Run: `.venv/bin/python -m pytest -q tests/integration/test_local_servers.py`
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis

from infra.local.servers import LocalPostgres, LocalRedis, _family, _processes, free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A directory PostgreSQL's account can reach when the tests run as root (unlike tmp_path,
    whose parent is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="arag-test-servers-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def still_running(pids: list[int]) -> list[int]:
    """Those of `pids` that run (a zombie no one reaps does not)."""
    table = _processes()
    return [pid for pid in pids if pid in table and table[pid][1] != "Z"]


def redis_value(url: str, key: str) -> bytes | None:
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        return client.get(key)
    finally:
        client.close()


def rows(server: LocalPostgres) -> list[tuple[str]]:
    with psycopg.connect(server.url.replace("+psycopg", ""), connect_timeout=5) as conn:
        return conn.execute("SELECT note FROM notes ORDER BY note").fetchall()


@pytest.mark.parametrize("mode", ["fast", "kill"])
def test_redis_keeps_its_data_over_a_restart_on_the_same_port(workdir: Path, mode: str) -> None:
    with LocalRedis(workdir) as server:
        url, port, first_pid = server.url, server.port, server.pid
        redis.Redis.from_url(url).set("answer", "42")
        processes = _family(first_pid)
        server.stop(mode)
        assert still_running(processes) == []
        with pytest.raises(redis.ConnectionError):
            redis_value(url, "answer")
        server.start()
        assert (server.port, server.url) == (port, url) and server.pid != first_pid
        assert redis_value(url, "answer") == b"42"
    assert workdir.exists(), "a directory given to the server is the caller's"


def test_redis_without_persistence_comes_back_empty(workdir: Path) -> None:
    with LocalRedis(workdir, persistent=False) as server:
        redis.Redis.from_url(server.url).set("answer", "42")
        server.restart()
        assert redis_value(server.url, "answer") is None


@pytest.mark.parametrize("mode", ["fast", "immediate", "kill"])
def test_postgres_keeps_committed_rows_over_a_restart_on_the_same_port(workdir: Path, mode: str) -> None:
    with LocalPostgres(workdir, durability="server-crash") as server:
        url, port = server.url, server.port
        with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as conn:
            conn.execute("CREATE TABLE notes (note text)")
            conn.execute("INSERT INTO notes VALUES ('before')")
        processes = _family(server.pid)
        assert len(processes) > 1  # the postmaster and its background processes
        server.stop(mode)
        assert still_running(processes) == []
        with pytest.raises(psycopg.OperationalError):
            rows(server)
        server.start()
        assert (server.port, server.url) == (port, url)
        assert rows(server) == [("before",)]
        server.restart()  # and once more, after the recovery
        assert rows(server) == [("before",)]


def test_postgres_in_a_given_directory_serves_the_same_data_to_the_next_server(workdir: Path) -> None:
    with LocalPostgres(workdir, database="kept") as first:
        with psycopg.connect(first.url.replace("+psycopg", ""), autocommit=True) as conn:
            conn.execute("CREATE TABLE notes (note text)")
            conn.execute("INSERT INTO notes VALUES ('kept')")
        port = first.port
    with LocalPostgres(workdir, port, database="kept") as second:  # no initdb, no CREATE DATABASE again
        assert rows(second) == [("kept",)]


def test_a_temporary_directory_is_deleted_on_close() -> None:
    with LocalRedis() as server:
        assert server.workdir.is_dir()
    assert not server.workdir.exists()


def test_an_unknown_stop_mode_is_refused(workdir: Path) -> None:
    server = LocalRedis(workdir)
    with pytest.raises(ValueError, match="immediate"):
        server.stop("immediate")


@pytest.mark.parametrize("kind", ["redis", "postgres"])
def test_the_helper_stopped_with_sigterm_leaves_no_server_and_no_directory(kind: str) -> None:
    helper = subprocess.Popen([sys.executable, "-m", "infra.local", kind], cwd=REPO,
                              env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = helper.stdout.readline().strip()  # printed once the server serves
        assert url.startswith(("redis://", "postgresql+psycopg://")), helper.stderr.read()
        announced = next(line for line in helper.stderr if "data in " in line)
        directory = Path(announced.split("data in ", 1)[1].split(" ", 1)[0].rstrip(","))
        assert directory.is_dir()
        server_pid = int(announced.split("(pid ", 1)[1].split(")", 1)[0])
        processes = _family(server_pid)
        assert server_pid in still_running(processes)
        helper.send_signal(signal.SIGTERM)
        assert helper.wait(timeout=120) == 0, helper.stderr.read()
    finally:
        if helper.poll() is None:
            helper.kill()
            helper.wait()
    assert still_running(processes) == [], f"{kind} still runs"
    assert not directory.exists()


def test_the_helper_with_a_port_and_a_directory_keeps_them(workdir: Path) -> None:
    """Run twice with the same --port and --dir: the second run serves what the first wrote."""
    port = free_port()
    for run, expected in ((1, None), (2, b"first run")):
        helper = subprocess.Popen(
            [sys.executable, "-m", "infra.local", "redis", "--port", str(port), "--dir", str(workdir)],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert helper.stdout.readline().strip() == f"redis://127.0.0.1:{port}/0", helper.stderr.read()
            assert redis_value(f"redis://127.0.0.1:{port}/0", "note") == expected, f"run {run}"
            redis.Redis.from_url(f"redis://127.0.0.1:{port}/0").set("note", "first run")
            helper.send_signal(signal.SIGINT)
            assert helper.wait(timeout=60) == 0, helper.stderr.read()
        finally:
            if helper.poll() is None:
                helper.kill()
                helper.wait()
        assert workdir.is_dir()


def test_an_opensearch_node_keeps_its_index_over_a_crash_on_the_same_port(workdir: Path) -> None:
    from infra.local.opensearch import OpenSearchNode

    with OpenSearchNode(workdir, heap="256m") as node:
        url, port = node.url, node.port
        node.request("PUT", "/notes/_doc/1?refresh=true", {"note": "before"})
        processes = _family(node.pid)
        node.kill()
        assert still_running(processes) == []
        node.start()
        assert (node.port, node.url) == (port, url)
        assert node.request("GET", "/notes/_doc/1")["_source"] == {"note": "before"}
