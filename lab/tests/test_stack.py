"""The lab's stack (`lab.harness.stack`) with real processes: the parts it is asked for, what it
hands every process, its restart handles, and nothing left running after it.

One stack on the server-less parts (filesystem broker, SQLite, no classifier, the instant LLM
endpoint), pool A only: a short question the rules send to A is answered before and after the
front door is killed and started again, and after the LLM endpoint went away and came back on
its port.

Run: `.venv/bin/python -m pytest -q lab/tests/test_stack.py`
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from lab.harness.instant_llm import LLM_ANSWER
from lab.harness.stack import LabStack, Parts, lab_stack, stack_logs
from services.demo.local import RUN_MARKER, processes_with_marker
from services.frontdoor.stubs import pb2, pb2_grpc

pytestmark = pytest.mark.integration

QUERY = "capital of France"  # short, no question mark: the rules send it to tier A
PARTS = Parts(broker="filesystem", records="sqlite", classifier="rules", retriever="tantivy", llm="instant")


def answer(stack: LabStack, key: str) -> pb2.AnswerReply:
    with grpc.insecure_channel(stack.address) as channel:
        return pb2_grpc.AdaptiveRagStub(channel).Answer(
            pb2.AnswerRequest(query_text=QUERY), metadata=(("authorization", f"Bearer {key}"),), timeout=60)


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
    return dict(item.split("=", 1) for item in raw if "=" in item)


def test_a_lab_stack_runs_its_parts_restarts_them_and_leaves_nothing(tmp_path: Path) -> None:
    settings = {"llm_api": "completions", "llm_max_retries": 0, "tenant_rate_per_s": 0.0}
    with lab_stack(tmp_path / "stack", PARTS, pools=("A",), settings=settings, env={"ARAG_LAB_PROBE": "seen"},
                   tenants=("acme",), dotenv=False) as stack:
        marker = stack.core.marker
        key = stack.api_key("acme")
        assert answer(stack, key).answer == LLM_ANSWER.rstrip(".")
        # the parts asked for, the settings given over them
        assert stack.settings.workers.redis_url is None and stack.redis is None
        assert stack.settings.library.database_url == f"sqlite:///{stack.workdir / 'arag.db'}"
        assert stack.triton is None and "rules" in stack.using["classifier"]
        assert stack.settings.library.llm_base_url == stack.llm.url and "instant" in stack.using["llm"]
        assert stack.settings.frontdoor.tenant_rate_per_s == 0.0
        # every process it started reads the settings and the extra environment back, marked
        for pid in (stack.frontdoor.pid, stack.pools.pools["A"].pid):
            seen = environ(pid)
            assert seen["ARAG_LAB_PROBE"] == "seen" and seen[RUN_MARKER] == marker
            assert seen["LLM_BASE_URL"] == stack.llm.url
        assert environ(stack.frontdoor.pid)["ARAG_TENANT_RATE"] == "0.0"
        assert set(stack.processes().values()) == {"front door", "worker pool A"}

        killed = stack.frontdoor.pid
        stack.restart_frontdoor()
        assert stack.frontdoor.pid != killed and stack.frontdoor.process.poll() is None
        assert answer(stack, key).answer == LLM_ANSWER.rstrip(".")

        stack.llm.stop()
        stack.llm.start()  # the same port: the workers' setting still points at it
        assert answer(stack, key).answer == LLM_ANSWER.rstrip(".")

        extra = stack.start_frontdoor("second")
        assert extra.listen != stack.address and extra.process.poll() is None
    assert not stack.leftovers, stack.leftovers
    assert not processes_with_marker(marker)
    assert extra.process.poll() is not None and stack.llm.proc is None
    logs = {path.name for path in stack_logs(stack.workdir)}
    assert {"tier-a.log", "frontdoor.log", "frontdoor-2.log", "second.log", "instant_llm.log"} <= logs


DRIVER = """
import faulthandler, signal, sys, time
faulthandler.register(signal.SIGUSR1, all_threads=True)  # where a stuck unwind waits, for the failure message
from pathlib import Path
from lab.harness.stack import Parts, lab_stack
parts = Parts(broker="filesystem", records="sqlite", classifier="rules", retriever="tantivy", llm="instant")
with lab_stack(Path(sys.argv[1]), parts, pools=("A",), dotenv=False) as stack:
    print(stack.core.marker, stack.llm.proc.pid, flush=True)
    time.sleep(600)
"""


def test_a_driver_stopped_by_sigterm_stops_every_process_of_its_stack(tmp_path: Path) -> None:
    """A benchmark killed with SIGTERM (a timeout, an operator) unwinds like Ctrl-C: its front
    door, pools and servers do not outlive it."""
    import contextlib
    import os
    import signal
    import subprocess
    import sys
    import time

    repo = Path(__file__).resolve().parents[2]
    errors = tmp_path / "driver.err"
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path / "stack")], cwd=repo,
                              stdout=subprocess.PIPE, stderr=errors.open("w"), text=True,
                              env={**os.environ, "PYTHONPATH": str(repo)},
                              # as under `nohup`, which ignores SIGHUP: SIGTERM must unwind all the same
                              preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    marker = ""
    try:
        marker, llm_pid = driver.stdout.readline().split()
        assert processes_with_marker(marker), "the stack's processes carry its marker"
        driver.send_signal(signal.SIGTERM)
        # Alone the unwind takes a few seconds; beside the full suite it has taken over 60.
        try:
            assert driver.wait(timeout=180) != 0
        except subprocess.TimeoutExpired:
            driver.send_signal(signal.SIGUSR1)
            time.sleep(2)
            raise AssertionError(f"the driver did not unwind; its stderr ends: {errors.read_text()[-6000:]}")
    finally:
        if driver.poll() is None:
            driver.kill()
            for pid, _ in processes_with_marker(marker) if marker else []:  # leave nothing running
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while processes_with_marker(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = processes_with_marker(marker)
    llm_left = Path(f"/proc/{llm_pid}").exists()
    for pid, _ in [*left, *([(int(llm_pid), "instant LLM")] if llm_left else [])]:  # a failure must not leave the stack running beside the rest of the suite
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"{left}; the driver's stderr ends: {errors.read_text()[-2000:]}"
    assert not llm_left
