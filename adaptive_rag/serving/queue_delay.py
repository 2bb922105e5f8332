"""Shedding load when a tier's queue stands: a wait budget, not only a length limit.

A queue-length limit sheds too late when the workers are slow and too early when they are fast:
tier A's 500 tasks were ~4 s of waiting at 120 Answers/s, so past saturation everyone waited
seconds before anyone was refused. This gate watches what matters to the caller, the queue wait of
the tasks that finished, with CoDel's test for a *standing* queue (Nichols and Jacobson,
"Controlling Queue Delay", ACM Queue 10(5), 2012): when even the **shortest** queue wait among the
tasks of the last `interval_s` exceeds the tier's `target_s`, the queue no longer drains between
bursts, and new queries for that tier are refused (RESOURCE_EXHAUSTED) until it does. A burst that
the workers absorb leaves some short waits in the window and is never refused.

The waits come from the finished tasks' own timings, so every front door replica sees the shared
queue's state without asking anyone; a window with fewer than `min_samples` finished tasks (an idle
tier, or one that is shedding everything and has drained) leaves the gate open.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from adaptive_rag.contracts import Tier


@dataclass(frozen=True)
class Standing:
    """A tier's standing queue: the shortest wait in the window, against its target."""

    tier: Tier
    shortest_wait_s: float
    target_s: float
    interval_s: float
    samples: int


class QueueDelayGate:
    """Per tier: the queue waits of the tasks finished in the last `interval_s`; `standing(tier)`
    says whether new work for it should be refused. A target of 0 (or a tier left out) never
    refuses."""

    def __init__(self, targets_s: Mapping[Tier, float], interval_s: float = 1.0, min_samples: int = 3,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.targets_s = {Tier(t): float(v) for t, v in targets_s.items()}
        self.interval_s = interval_s
        self.min_samples = min_samples
        self._clock = clock
        self._waits: dict[Tier, deque[tuple[float, float]]] = {tier: deque() for tier in Tier}
        self._lock = threading.Lock()

    def observe(self, tier: Tier, queue_wait_s: float) -> None:
        """A task of `tier` finished after waiting `queue_wait_s` in its queue."""
        now = self._clock()
        with self._lock:
            waits = self._waits[Tier(tier)]
            waits.append((now, max(0.0, queue_wait_s)))
            self._prune(waits, now)

    def standing(self, tier: Tier) -> Standing | None:
        """The standing queue of `tier`, or None when new work may go in."""
        tier = Tier(tier)
        target = self.targets_s.get(tier, 0.0)
        if target <= 0:
            return None
        with self._lock:
            waits = self._waits[tier]
            self._prune(waits, self._clock())
            if len(waits) < self.min_samples:
                return None
            shortest = min(wait for _, wait in waits)
            samples = len(waits)
        if shortest <= target:
            return None
        return Standing(tier, shortest, target, self.interval_s, samples)

    def _prune(self, waits: deque[tuple[float, float]], now: float) -> None:
        while waits and waits[0][0] < now - self.interval_s:
            waits.popleft()


class DepthEstimate:
    """Each queue's depth as last read, plus the tasks this front door queued since; read again
    once older than `max_age_s` (0: read on every admission).

    At a high rate, reading the depth for every admission is a broker round trip that tells
    little new. The estimate never counts fewer tasks than this replica added since the read (it
    ignores what the workers took meanwhile, so it errs towards refusing), and what other
    replicas queued was never seen before an enqueue anyway: the length limit stays a limit on
    what one replica lets through, checked at most `max_age_s` late for the others. Thread-safe
    (admissions run on I/O threads)."""

    def __init__(self, max_age_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self._known: dict[str, tuple[int, float]] = {}  # queue -> (depth, when read)

    def depth(self, queue: str, read: Callable[[str], int]) -> tuple[int, bool]:
        """The queue's depth and whether it was read just now (`read(queue)`: the broker's)."""
        if self.max_age_s > 0:
            with self._lock:
                known = self._known.get(queue)
                if known is not None and self._clock() - known[1] < self.max_age_s:
                    return known[0], False
        depth = read(queue)
        with self._lock:
            self._known[queue] = (depth, self._clock())
        return depth, True

    def added(self, queue: str) -> None:
        """One task more on `queue` since its last read."""
        with self._lock:
            known = self._known.get(queue)
            if known is not None:
                self._known[queue] = (known[0] + 1, known[1])
