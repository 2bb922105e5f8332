"""The CI skip guard of tests/conftest.py (`tests/ci_skip_guard.py`), on small pytest runs of its own
(pytester): under CI=true a skip fails the run unless allow-listed; without CI a skip is a skip."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

ALLOWED_ID = "tests/integration/test_allowed.py::test_waits_for_hardware"

CONFTEST = f'''
from ci_skip_guard import SkipGuard, ci_enabled

ALLOWED = {{"{ALLOWED_ID}": "needs a GPU the CI machine does not have"}}


def pytest_configure(config):
    config.pluginmanager.register(SkipGuard(ALLOWED, ci_enabled()), "ci-skip-guard")
'''

SKIPPING_INTEGRATION_TEST = '''
import pytest


def test_runs():
    assert True


def test_needs_a_server():
    pytest.skip("no server on this machine")
'''

ALLOWED_TEST = '''
import pytest


def test_waits_for_hardware():
    pytest.skip("no GPU")
'''


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.mkdir("tests")
    pytester.mkdir("tests/integration")
    pytester.mkdir("tests/unit")
    return pytester


def write(pytester: pytest.Pytester, path: str, source: str) -> None:
    (pytester.path / path).write_text(source)


def test_under_ci_a_skipped_integration_test_fails_the_run(project, monkeypatch) -> None:
    monkeypatch.setenv("CI", "true")
    write(project, "tests/integration/test_server.py", SKIPPING_INTEGRATION_TEST)
    result = project.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "*CI=true: skipped tests fail the run*",
        "SKIPPED (not allowed under CI) tests/integration/test_server.py::test_needs_a_server: "
        "no server on this machine",
    ])


def test_under_ci_a_data_missing_skip_in_a_fixture_and_a_module_skip_fail_too(project, monkeypatch) -> None:
    monkeypatch.setenv("CI", "true")
    write(project, "tests/unit/test_data.py", '''
import pytest


@pytest.fixture
def data():
    pytest.skip("benchmark data not found in ../shared/data")


def test_reads(data):
    pass
''')
    write(project, "tests/integration/test_module.py", '''
import pytest

pytest.importorskip("a_package_that_is_not_installed")


def test_never_collected():
    pass
''')
    result = project.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines_random([
        "SKIPPED (not allowed under CI) tests/unit/test_data.py::test_reads: "
        "benchmark data not found in ../shared/data",
        "SKIPPED (not allowed under CI) tests/integration/test_module.py: "
        "*a_package_that_is_not_installed*",
    ])


def test_under_ci_an_allow_listed_skip_does_not_fail_the_run(project, monkeypatch) -> None:
    monkeypatch.setenv("CI", "true")
    write(project, "tests/integration/test_allowed.py", ALLOWED_TEST)
    result = project.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(skipped=1)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([f"skipped, allow-listed: {ALLOWED_ID}: no GPU*"])
    result.stdout.no_fnmatch_line("*not allowed under CI*")


def test_under_ci_an_allow_listed_skip_next_to_another_still_fails(project, monkeypatch) -> None:
    monkeypatch.setenv("CI", "true")
    write(project, "tests/integration/test_allowed.py", ALLOWED_TEST)
    write(project, "tests/integration/test_server.py", SKIPPING_INTEGRATION_TEST)
    result = project.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*tests/integration/test_server.py::test_needs_a_server*"])
    result.stdout.no_fnmatch_line("*not allowed under CI*test_allowed.py*")


@pytest.mark.parametrize("ci", [None, "false", ""])
def test_without_ci_a_skip_is_just_a_skip(project, monkeypatch, ci) -> None:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    write(project, "tests/integration/test_server.py", SKIPPING_INTEGRATION_TEST)
    result = project.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=1)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.no_fnmatch_line("*CI=true*")


def test_xfail_is_not_a_skip(project, monkeypatch) -> None:
    monkeypatch.setenv("CI", "true")
    write(project, "tests/integration/test_xfail.py", '''
import pytest


@pytest.mark.xfail(reason="known bug", strict=True)
def test_known_bug():
    assert False
''')
    result = project.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(xfailed=1)
    assert result.ret == pytest.ExitCode.OK


def test_the_suite_registers_the_guard_with_an_allow_list_that_gives_reasons(pytestconfig) -> None:
    from ci_skip_guard import SkipGuard

    guard = pytestconfig.pluginmanager.get_plugin("ci-skip-guard")
    assert isinstance(guard, SkipGuard)
    assert all(reason.strip() for reason in guard.allowed.values())
    with pytest.raises(ValueError, match="need a reason"):
        SkipGuard({"tests/x.py::test_y": " "}, enabled=True)
