"""`python -m services.demo` (what `make demo` runs) end to end, as a user runs it: local Triton,
the tier worker pools on the server-less filesystem broker, SQLite, the embedded index and LLM,
the gRPC front door; questions of every expected tier answered through gRPC; everything stopped
afterwards, also on Ctrl-C.

No server may be configured for this: the test removes REDIS_URL, DATABASE_URL, OPENSEARCH_URL,
TRITON_URL/TRITON_GRPC_URL and LLM_BASE_URL from the demo's environment, and points
ARAG_MODEL_REPOSITORY at a repository with one published classifier version (the length router),
so the queries are routed by the model Triton serves, not by the rules. The demo marks every
process it starts with `ARAG_DEMO_RUN=<id>`; the test looks for that id in /proc afterwards.

Run: `.venv/bin/pytest -q tests/e2e/test_service_demo.py` (2-4 minutes on 2 busy cores)
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import pytriton  # noqa: F401  (a required dependency: the demo's local Triton)

from lab.harness.models import publish_length_router

pytestmark = [pytest.mark.integration, pytest.mark.model]

REPO = Path(__file__).resolve().parents[2]
SERVER_SETTINGS = ("REDIS_URL", "DATABASE_URL", "OPENSEARCH_URL", "TRITON_URL", "TRITON_GRPC_URL",
                   "LLM_BASE_URL", "ARAG_RETRIEVER", "ARAG_INDEX_DIR", "ARAG_BROKER_DIR")
RUN_TIMEOUT_S = 900
STRATEGIES = {"A": {"no_retrieval", "small_talk"}, "B": {"single_step"}, "C": {"evidence"}}


@pytest.fixture(scope="module")
def model_repository(tmp_path_factory) -> Path:
    """A model repository holding one published classifier version (the length router of
    `lab/harness/models.py`), so the demo starts its local Triton and routes with it whatever
    the developer's `var/model_repository` holds (with no version, it routes with the rules)."""
    repo = tmp_path_factory.mktemp("model-repository")
    publish_length_router(repo, 1)
    return repo


def demo_env(marker: str, model_repository: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SERVER_SETTINGS}
    env.update(ARAG_DEMO_RUN=marker, PYTHONUNBUFFERED="1", COLUMNS="200",
               ARAG_MODEL_REPOSITORY=str(model_repository))
    return env


def recorded_decisions(database: Path) -> dict[str, dict]:
    """Per request id, the routing decision and the primary result the demo's SQLite holds."""
    with sqlite3.connect(database) as conn:
        conn.row_factory = sqlite3.Row
        found = conn.execute(
            "SELECT d.request_id, d.tier, d.fallback, d.model_version, r.tier AS result_tier, r.answer"
            " FROM routing_decisions d JOIN results r"
            " ON r.request_id = d.request_id AND r.kind = 'primary'"
        ).fetchall()
    return {row["request_id"]: dict(row) for row in found}


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


def test_demo_answers_every_tier_through_grpc_and_leaves_nothing_running(tmp_path: Path, model_repository) -> None:
    marker = uuid.uuid4().hex
    rows_path = tmp_path / "rows.json"
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "services.demo", "--per-tier", "1", "--workdir", str(tmp_path / "demo"),
         "--json-out", str(rows_path)],
        cwd=REPO, env=demo_env(marker, model_repository), capture_output=True, text=True,
        timeout=RUN_TIMEOUT_S,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    # Parts started here, not configured servers.
    assert "filesystem broker" in output and "SQLite" in output and "local Triton" in output
    assert "front door on 127.0.0.1:" in output
    assert "4 questions through gRPC" in output
    served = re.search(r"Triton serving complexity v(\d+) ", output)
    assert served, output[-6000:]
    served_version = int(served.group(1))
    rows = json.loads(rows_path.read_text())["rows"]
    assert [r["expected"] for r in rows] == ["A", "B", "B", "C"]
    # The follow-up turn continues the first B question's conversation, searched as a standalone question.
    first, follow_up = rows[1], rows[2]
    assert follow_up["follow_up_of"] == first["question"] and follow_up["question"] == "how do I cancel it?"
    assert follow_up["conversation_id"] == first["conversation_id"] == first["request_id"]
    assert follow_up["rewritten_query"] == "How do I cancel the Lumora Plus plan?", follow_up
    decisions = recorded_decisions(tmp_path / "demo" / "arag.db")
    for row in rows:
        assert row["status"] == "OK", row
        assert row["tier"] in STRATEGIES, row
        assert row["strategy"] in STRATEGIES[row["tier"]], row
        assert row["request_id"] and isinstance(row["answer"], str)
        assert row["timings_ms"]["total"] > 0
        if row["fallback"]:
            assert row["routed_by"].startswith("rules fallback"), row
        elif row["strategy"] == "small_talk":  # "hi there!": the small-talk detector, no classifier
            assert row["routed_by"] == "small talk (greeting)" and row["answer"].startswith("Hello"), row
        else:  # routed by the model Triton serves, with its probabilities
            assert row["model_version"] == served_version, row
            assert row["routed_by"] == f"complexity v{served_version}", row
            assert set(row["probabilities"]) == set(STRATEGIES), row
            assert abs(sum(row["probabilities"].values()) - 1.0) < 1e-3, row
        # The printed line of this query: its tier, status, latency and question.
        line = rf"^\s*{row['tier']} OK\s+\d+\.\d+ s\s+{re.escape(row['question'])}\s*$"
        assert re.search(line, output, re.MULTILINE), (line, output[-6000:])
        # The routing decision and the result recorded for the request say the same.
        decision = decisions[row["request_id"]]
        assert decision["tier"] == row["tier"] and bool(decision["fallback"]) == row["fallback"], (decision, row)
        by_model = not row["fallback"] and row["strategy"] != "small_talk"
        assert decision["model_version"] == (served_version if by_model else None), decision
        assert decision["result_tier"] == row["tier"] and decision["answer"] == row["answer"], decision
        for source in row["sources"]:  # help-center passages (a greeting may match none)
            assert source["id"].startswith("kb-") and source["title"], source
    # Triton answered: at least one query was routed by the served model, not all by the rules.
    assert [r for r in rows if not r["fallback"]], rows
    assert any(r["answer"].strip() for r in rows)
    assert "4/4 answered" in output
    assert "no process left" in output
    assert marked_processes(marker) == []
    print(f"demo took {time.monotonic() - started:.1f} s")


def test_ctrl_c_stops_everything_it_started(tmp_path: Path, model_repository) -> None:
    marker = uuid.uuid4().hex
    log_path = tmp_path / "demo.log"
    with log_path.open("w") as log:
        # Its own process group, signalled as a terminal's Ctrl-C would (the whole group).
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.demo", "--workdir", str(tmp_path / "demo")],
            cwd=REPO, env=demo_env(marker, model_repository), stdout=log, stderr=subprocess.STDOUT,
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
