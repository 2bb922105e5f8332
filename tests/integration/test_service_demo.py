"""`python -m services.demo` (what `make demo` runs) end to end, as a user runs it: local Triton,
the tier worker pools on the server-less filesystem broker, SQLite, the embedded index and LLM,
the gRPC front door; questions of every expected tier answered through gRPC; everything stopped
afterwards, also on Ctrl-C.

No server may be configured for this: the test removes REDIS_URL, DATABASE_URL, OPENSEARCH_URL,
TRITON_URL/TRITON_GRPC_URL and LLM_BASE_URL from the demo's environment. The demo marks every
process it starts with `ARAG_DEMO_RUN=<id>`; the test looks for that id in /proc afterwards.

Run: `.venv/bin/pytest -q tests/integration/test_service_demo.py` (2-4 minutes on 2 busy cores)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("pytriton", reason="nvidia-pytriton not installed")

pytestmark = [pytest.mark.integration, pytest.mark.model]

REPO = Path(__file__).resolve().parents[2]
SERVER_SETTINGS = ("REDIS_URL", "DATABASE_URL", "OPENSEARCH_URL", "TRITON_URL", "TRITON_GRPC_URL",
                   "LLM_BASE_URL", "ARAG_RETRIEVER", "ARAG_INDEX_DIR", "ARAG_BROKER_DIR")
RUN_TIMEOUT_S = 900


def demo_env(marker: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SERVER_SETTINGS}
    env.update(ARAG_DEMO_RUN=marker, PYTHONUNBUFFERED="1", COLUMNS="200")
    return env


def marked_processes(marker: str) -> list[str]:
    """Command lines of live processes started by the demo run `marker`."""
    needle = f"ARAG_DEMO_RUN={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return found


def test_demo_answers_every_tier_through_grpc_and_leaves_nothing_running(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    rows_path = tmp_path / "rows.json"
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "services.demo", "--per-tier", "1", "--workdir", str(tmp_path / "demo"),
         "--json-out", str(rows_path)],
        cwd=REPO, env=demo_env(marker), capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    # Parts started here, not configured servers.
    assert "filesystem broker" in output and "SQLite" in output and "local Triton" in output
    assert "front door on 127.0.0.1:" in output
    assert "3 questions through gRPC" in output
    rows = json.loads(rows_path.read_text())["rows"]
    assert [r["expected"] for r in rows] == ["A", "B", "C"]
    for row in rows:
        assert row["status"] == "OK", row
        assert row["tier"] in {"A", "B", "C"}, row
        assert row["strategy"] in {"no_retrieval", "single_step", "ircot", "decompose"}, row
        assert row["request_id"] and isinstance(row["answer"], str)
        assert row["fallback"] or row["model_version"] >= 1, row
        assert row["timings_ms"]["total"] > 0
        # The printed line of each query: tier, status, latency, question.
        assert f"{row['tier']} OK" in output and row["question"] in output
        for source in row["sources"]:  # help-center passages (a greeting may match none)
            assert source["id"].startswith("kb-") and source["title"], source
    assert any(r["answer"].strip() for r in rows)
    assert "3/3 answered" in output
    assert "no process left" in output
    assert marked_processes(marker) == []
    print(f"demo took {time.monotonic() - started:.1f} s")


def test_ctrl_c_stops_everything_it_started(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    log_path = tmp_path / "demo.log"
    with log_path.open("w") as log:
        # Its own process group, signalled as a terminal's Ctrl-C would (the whole group).
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.demo", "--workdir", str(tmp_path / "demo")],
            cwd=REPO, env=demo_env(marker), stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        try:
            deadline = time.monotonic() + RUN_TIMEOUT_S
            while "questions through gRPC" not in log_path.read_text():
                assert proc.poll() is None, log_path.read_text()[-4000:]
                assert time.monotonic() < deadline, "the demo never got to its questions"
                time.sleep(0.5)
            assert len(marked_processes(marker)) >= 6  # Triton, 4 pools (+children), front door
            os.killpg(proc.pid, signal.SIGINT)
            assert proc.wait(timeout=120) == 130, log_path.read_text()[-4000:]
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    output = log_path.read_text()
    assert "interrupted" in output
    assert marked_processes(marker) == []
