"""A run's stop signals (SIGTERM, Ctrl-C) unwind it even when the kernel hands the signal to a
thread other than the main one while the main thread waits in a long blocking call."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# The main thread sleeps for a minute; a helper thread takes the signal itself (a thread-directed
# signal stands for the kernel's choice of thread), so only the relay can wake the main thread.
RUN = """
import signal, sys, threading, time
from services.demo.local import Interrupted, install_stop_signals
install_stop_signals()
def helper():
    time.sleep(0.5)  # the main thread is in its sleep by then
    signal.pthread_kill(threading.get_ident(), int(sys.argv[1]))
    time.sleep(120)
threading.Thread(target=helper, daemon=True).start()
started = time.monotonic()
try:
    time.sleep(60)
except (Interrupted, KeyboardInterrupt) as exc:
    print(type(exc).__name__, f"{time.monotonic() - started:.1f}", flush=True)
    sys.exit(3)
"""


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_caught_by_another_thread_still_wakes_the_main_thread(stop: int) -> None:
    run = subprocess.Popen([sys.executable, "-c", RUN, str(int(stop))], cwd=REPO, stdout=subprocess.PIPE,
                           text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert run.wait(timeout=30) == 3, "the main thread slept through the signal"
        name, seconds = run.stdout.read().split()
    finally:
        if run.poll() is None:
            run.kill()
    assert name == ("KeyboardInterrupt" if stop == signal.SIGINT else "Interrupted")
    assert float(seconds) < 30


def test_a_wakeup_fd_set_before_stays_its_owners() -> None:
    """An event loop's wakeup fd is not taken over: the relay stands aside."""
    run = subprocess.run([sys.executable, "-c", """
import signal, socket
from services.demo.local import install_stop_signals
theirs, _ = socket.socketpair()
theirs.setblocking(False)
signal.set_wakeup_fd(theirs.fileno())
install_stop_signals()
print(signal.set_wakeup_fd(-1) == theirs.fileno())
"""], cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert run.stdout.strip() == "True", run.stderr
