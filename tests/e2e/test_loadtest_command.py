"""`python -m lab.loadtest` (what `make loadtest` runs) end to end on the embedded defaults.

It starts its own local stack (Triton with the shipped router, the tier worker pools, the gRPC
front door, the help-centre knowledge base streamed in through the KnowledgeBase API), runs a short
headless locust load and writes its report. The parent process once hung at the knowledge-base
import (locust imported there monkey-patched it with gevent): the run must end, on time, with
exit code 0, answers in every run and a report.

The LLM is the instant answering endpoint (a measurement device), so no model is loaded and the
test measures the command, not the reader.

Run: `.venv/bin/python -m pytest -q tests/e2e/test_loadtest_command.py`
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
RUN_TIME_S = 8


def test_python_m_loadtest_starts_its_stack_loads_it_and_reports(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ARAG_LOAD_", "ARAG_TRACES")) and k not in ("REDIS_URL", "DATABASE_URL")}
    env.update(PYTHONUNBUFFERED="1")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "lab.loadtest", "--instant-llm", "--users", "2", "--spawn-rate", "2",
           "--run-time", f"{RUN_TIME_S}s", "--workdir", str(tmp_path / "stack"), "--out", str(out)]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    took = time.monotonic() - started
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    assert "47 help-centre documents" in output, output[-3000:]
    assert "no process left" in output, output[-3000:]
    calls = [json.loads(line) for line in (out / "locust_requests.jsonl").read_text().splitlines()]
    assert calls and all(c["ok"] for c in calls), [c for c in calls if not c["ok"]][:3]
    assert (out / "report.md").is_file() and (out / "locust_stats.csv").is_file()
    print(f"python -m lab.loadtest took {took:.0f} s: {len(calls)} answers")
