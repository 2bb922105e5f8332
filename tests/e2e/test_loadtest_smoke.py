"""A short headless locust run (`lab/loadtest/locustfile.py`) against the end-to-end stack.

The module's `stack` (conftest.py: Redis, PostgreSQL, Triton serving the length router, the tier
worker pools with the embedded model, the gRPC front door) is loaded by `python -m locust ...
--headless` for 25 s with two users (two, so at most one C task waits in its queue, under the
stack's C queue limit of 2: the default profile provokes no failure on purpose). The run must end
with exit code 0 and no failure at all; locust's stats CSV must have rows per tier the replies
report (`Answer tier=A`, ...) and requests made; the per-call log and the queue/metrics samples
must be written, and the report must build from them.

Run: `.venv/bin/python -m pytest -q tests/e2e/test_loadtest_smoke.py`
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.model]

REPO = Path(__file__).resolve().parents[2]
RUN_TIME_S = 25
USERS = 2


def test_headless_locust_run_has_per_tier_rows_and_no_failures(stack, tmp_path: Path) -> None:
    key = dict(stack.auth)["authorization"].removeprefix("Bearer ")
    prefix = tmp_path / "locust"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARAG_LOAD_") and k != "REDIS_URL"}
    env.update(ARAG_API_KEY=key, PYTHONUNBUFFERED="1")
    cmd = [
        sys.executable, "-m", "locust", "-f", "lab/loadtest/locustfile.py", "--headless",
        "--host", stack.settings.frontdoor.grpc_listen, "--users", str(USERS), "--spawn-rate", str(USERS),
        "--run-time", f"{RUN_TIME_S}s", "--csv", str(prefix), "--html", str(tmp_path / "locust.html"),
        "--metrics-url", stack.metrics_url, "--redis-url", stack.settings.workers.redis_url,
        "--sample-interval", "2", "--answer-timeout", "60", "--only-summary",
    ]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=RUN_TIME_S + 60)
    took = time.monotonic() - started
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    assert took < RUN_TIME_S + 30, f"locust took {took:.0f} s"

    with (tmp_path / "locust_stats.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    named = {row["Name"]: row for row in rows if row["Name"] != "Aggregated"}
    tiers = {name for name in named if re.fullmatch(r"Answer tier=[ABC]", name)}
    assert tiers and set(named) == tiers, named.keys()  # every request was an answer of a tier
    assert len(tiers) >= 2, tiers  # the mix sends A, B and C questions; the length router splits them
    total = next(row for row in rows if row["Name"] == "Aggregated")
    assert int(total["Request Count"]) > 0 and int(total["Failure Count"]) == 0, total
    with (tmp_path / "locust_failures.csv").open(newline="") as handle:
        assert list(csv.DictReader(handle)) == []

    calls = [json.loads(line) for line in (tmp_path / "locust_requests.jsonl").read_text().splitlines()]
    # Locust writes its counts as it stops its users; a call a user had in flight may still end
    # and be logged after that (at most one per user), never the other way round.
    assert int(total["Request Count"]) <= len(calls) <= int(total["Request Count"]) + USERS
    assert all(c["ok"] and c["tier"] in "ABC" and c["request_id"] and c["expected_tier"] in "ABC" for c in calls)
    assert len({c["request_id"] for c in calls}) == len(calls)  # a fresh client_request_id each

    samples = [json.loads(line) for line in (tmp_path / "locust_samples.jsonl").read_text().splitlines()]
    assert len(samples) >= 5
    assert all(set(s["queue_depth"]) == {"tier-a", "tier-b", "tier-c", "shadow"} for s in samples), samples[-1]
    last = samples[-1]["frontdoor"]
    assert sum(v for k, v in last["answers"].items() if k.endswith("/OK")) >= len(calls)
    assert not any(s["errors"] for s in samples), [s["errors"] for s in samples if s["errors"]]

    from lab.loadtest.report import write_report

    summary = write_report(tmp_path)
    assert summary["answered"] == len(calls) and not summary["failures"]
    report = (tmp_path / "report.md").read_text()
    assert "| Answer tier=" in report
    print(f"locust took {took:.1f} s: {len(calls)} answers, tiers {sorted(tiers)}")
