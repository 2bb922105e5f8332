"""Under CI, a skipped test fails the run (a plugin object; `tests/conftest.py` registers it).

A green CI run must mean every test ran: a missing dependency, server or data file that turns a
test into a skip would otherwise pass unnoticed. With `CI=true` in the environment (`.ci/run` is
run as `CI=true bash .ci/run`), every skip (a skip in setup or in the test, a skip mark, a module
skipped at collection) that is not on the allow-list is collected, printed with its reason at the
end of the run, and the exit status becomes "tests failed". Expected failures (xfail) are not
skips. Without CI nothing changes: a skip is just a skip.

The allow-list maps node ids to the reason the skip is acceptable. An entry matches the node id
exactly, or every parametrization of a test when it names the test without its `[...]` part.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import pytest

CI_VALUES = {"true", "1", "yes"}


def ci_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get("CI", "").strip().lower() in CI_VALUES


def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (path, line, "Skipped: reason")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


class SkipGuard:
    """Collects skips not on `allowed`; when `enabled`, they fail the session."""

    def __init__(self, allowed: Mapping[str, str], enabled: bool) -> None:
        missing = [node for node, why in allowed.items() if not str(why).strip()]
        if missing:
            raise ValueError(f"allow-listed skips need a reason: {missing}")
        self.allowed = dict(allowed)
        self.enabled = enabled
        self.refused: list[tuple[str, str]] = []
        self.allowed_seen: list[tuple[str, str]] = []

    def is_allowed(self, nodeid: str) -> bool:
        return nodeid in self.allowed or nodeid.split("[", 1)[0] in self.allowed

    def _record(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        if not report.skipped or hasattr(report, "wasxfail"):
            return
        entry = (report.nodeid, skip_reason(report))
        (self.allowed_seen if self.is_allowed(report.nodeid) else self.refused).append(entry)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._record(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._record(report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.enabled and self.refused and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.enabled or not (self.refused or self.allowed_seen):
            return
        tr = terminalreporter
        if self.refused:
            tr.section("CI=true: skipped tests fail the run", sep="=", red=True, bold=True)
            tr.line("Each skip below hides a test that did not run. Install or start what it needs,")
            tr.line("or, if the skip is really acceptable, add its node id with the reason to the")
            tr.line("allow-list CI_ALLOWED_SKIPS in tests/conftest.py.")
            for nodeid, reason in self.refused:
                tr.line(f"SKIPPED (not allowed under CI) {nodeid}: {reason}", red=True)
        for nodeid, reason in self.allowed_seen:
            tr.line(f"skipped, allow-listed: {nodeid}: {reason} (allowed because: "
                    f"{self.allowed.get(nodeid) or self.allowed[nodeid.split('[', 1)[0]]})")
