"""What the operator's make targets would run (`make -n`, nothing executed): Triton serves the
shipped router, and a role's setup runs no pip once a set containing it is installed."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def planned(venv: Path, *targets: str) -> str:
    """The commands `make` would run for `targets` with the virtualenv `venv`."""
    done = subprocess.run(["make", "-n", f"VENV={venv}", *targets], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def installed(venv: Path, *stamps: str) -> Path:
    """A virtualenv whose stamps say these sets are installed (newer than what they depend on)."""
    venv.mkdir()
    newer = max((REPO / name).stat().st_mtime for name in ("pyproject.toml", "infra/llama/build.sh")) + 60
    for stamp in (".created", *stamps):
        (venv / stamp).touch()
        os.utime(venv / stamp, (newer, newer))
    return venv


def test_triton_publishes_the_shipped_router_before_serving(tmp_path):
    plan = planned(installed(tmp_path / "venv", ".installed"), "triton")
    assert "model ship" in plan and "model bootstrap" not in plan
    assert plan.index("model ship") < plan.index("services/classifier/serve.py")


def test_workers_and_frontdoor_run_no_pip_after_a_set_containing_them(tmp_path):
    plan = planned(installed(tmp_path / "venv", ".installed"), "workers", "frontdoor", "triton")
    assert "pip install" not in plan and "build.sh" not in plan, plan
    assert "-m workers.pools" in plan and "-m services.frontdoor" in plan


def test_the_demo_set_holds_the_front_door_not_the_embedded_model(tmp_path):
    venv = installed(tmp_path / "venv", ".installed-demo")
    assert "pip install" not in planned(venv, "frontdoor", "triton")
    workers = planned(venv, "workers")  # the in-process model: the wheel of the one llama.cpp build
    assert '-e ".[workers]"' in workers and "build.sh 0.3.36 wheel" in workers


def test_the_demo_installs_no_python_binding_and_builds_llama_cpp_once(tmp_path):
    plan = planned(installed(tmp_path / "venv"), "demo")
    assert '-e ".[demo]"' in plan and "llama-cpp-python" not in plan and " wheel" not in plan, plan
    assert plan.count("infra/llama/build.sh") == 1 and "build.sh 0.3.36 llama-server" in plan
    setup = planned(installed(tmp_path / "full"), "setup")  # the wheel and the server: one script
    assert "build_server" not in setup and "build_wheel" not in setup
    assert "build.sh 0.3.36 wheel" in setup and "--only-binary llama-cpp-python" in setup


def test_a_role_alone_installs_only_its_own_set(tmp_path):
    plan = planned(installed(tmp_path / "venv"), "workers")
    assert '-e ".[workers]"' in plan and '".[all]"' not in plan


def test_a_stale_full_install_is_installed_again(tmp_path):
    venv = installed(tmp_path / "venv", ".installed")
    past = time.time() - 10 * 365 * 86400
    os.utime(venv / ".installed", (past, past))  # pyproject.toml changed since
    assert '-e ".[all]"' in planned(venv, "workers")
