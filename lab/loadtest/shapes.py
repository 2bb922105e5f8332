"""Load profiles: users over time, each bounded in time.

| profile | users over time | default length |
| --- | --- | --- |
| steady | `users` from the start (ramped at `spawn_rate`/s) | 60 s |
| step   | 1, 2, 4, 8, ... up to `max_users`, each held `step_seconds` (finds the knee) | until the last step ends |
| spike  | `users` for a third, `spike_users` for a third, `users` again | 90 s |
| soak   | `users` held for a long time | 30 min |

`--run-time` (when given) ends any profile earlier (or makes steady/spike/soak longer). The
locustfile selects one with `--profile` / `ARAG_LOAD_PROFILE` and its one `LoadTestShape`
(`ProfileShape`) follows it, because locust runs the first shape class a locustfile defines.

Plain schedules, with no locust import on purpose: importing locust monkey-patches the process
with gevent, and the `python -m lab.loadtest` parent, which reads the profile's length, then streams
the knowledge base over a blocking gRPC call whose request thread (a greenlet after the patch)
never runs: the import hangs. Only locust's own processes import locust.

Spike is the one profile that provokes failures on purpose: past the tiers' queue limits
(`ARAG_MAX_QUEUE_DEPTH`) the front door answers RESOURCE_EXHAUSTED, which is what a spike is for;
those are expected (`expected_failures`), every other failure is not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class ProfileOptions:
    users: int = 4
    spawn_rate: float = 2.0
    run_time_s: float | None = None  # None: the profile's own length
    step_seconds: float = 30.0
    max_users: int = 16
    spike_users: int = 16


class Profile:
    """A profile: `at(t)` -> (users, spawn rate) `t` s into the run, or None once it is over."""

    name = ""
    default_run_time_s: float = 60.0
    expected_failures: tuple[str, ...] = ()

    def __init__(self, options: ProfileOptions | None = None) -> None:
        self.options = options or ProfileOptions()

    @property
    def run_time_s(self) -> float:
        return self.options.run_time_s or self.default_run_time_s

    def plan(self, t: float) -> tuple[int, float] | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def at(self, t: float) -> tuple[int, float] | None:
        if t >= self.run_time_s:
            return None
        return self.plan(t)


class SteadyShape(Profile):
    name = "steady"
    default_run_time_s = 60.0

    def plan(self, t: float) -> tuple[int, float]:
        return self.options.users, self.options.spawn_rate


class StepShape(Profile):
    """1, 2, 4, ... `max_users` users, each step held `step_seconds`: where throughput stops
    growing and latency starts to (the knee)."""

    name = "step"

    def steps(self) -> list[int]:
        users, out = 1, []
        while users < self.options.max_users:
            out.append(users)
            users *= 2
        out.append(self.options.max_users)
        return out

    @property
    def default_run_time_s(self) -> float:  # type: ignore[override]
        return len(self.steps()) * self.options.step_seconds

    def plan(self, t: float) -> tuple[int, float]:
        steps = self.steps()
        index = min(int(t // self.options.step_seconds), len(steps) - 1)
        return steps[index], max(float(steps[index]), self.options.spawn_rate)  # reach each step at once


class SpikeShape(Profile):
    name = "spike"
    default_run_time_s = 90.0
    expected_failures = ("RESOURCE_EXHAUSTED",)

    def plan(self, t: float) -> tuple[int, float]:
        third = self.run_time_s / 3
        if third <= t < 2 * third:
            return self.options.spike_users, float(self.options.spike_users)  # all at once
        return self.options.users, float(self.options.spike_users)


class SoakShape(Profile):
    name = "soak"
    default_run_time_s = 30 * 60.0

    def plan(self, t: float) -> tuple[int, float]:
        return self.options.users, self.options.spawn_rate


PROFILES: dict[str, type[Profile]] = {
    shape.name: shape for shape in (SteadyShape, StepShape, SpikeShape, SoakShape)
}


def make_profile(name: str, options: ProfileOptions) -> Profile:
    try:
        return PROFILES[name](options)
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; one of {', '.join(PROFILES)}") from None


_SPAN = re.compile(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


def parse_duration(text: str) -> int:
    """Seconds in a locust `--run-time` (`90`, `20s`, `5m`, `1h30m`), read the way locust reads it."""
    text = text.strip().lower()
    if text.isdigit():
        return int(text)
    match = _SPAN.fullmatch(text)
    if not text or match is None:
        raise ValueError(f"run time {text!r}: give seconds, or e.g. 20s, 5m, 1h30m")
    hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds
