"""One llama.cpp build serves the embedded model and the shared server (`infra/llama/build.sh`).

The installed llama-cpp-python loads exactly the libraries the cached build's llama-server links
(same bytes), the tools find their libraries from wherever the cache directory lies, and a
second call is a cache hit that builds nothing. `make setup` has built it already; if not, the
first call builds it (6-7 minutes on 2 idle cores), hence the timeout.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.local.llama_server import BUILD_SCRIPT, LLAMA_CPP_VERSION

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]


def build(artifact: str) -> tuple[Path, float, str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    start = time.monotonic()
    done = subprocess.run(["bash", str(BUILD_SCRIPT), LLAMA_CPP_VERSION, artifact], capture_output=True,
                          text=True, env=env, stdin=subprocess.DEVNULL, check=True)
    return Path(done.stdout.strip().splitlines()[-1]), time.monotonic() - start, done.stderr


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def server() -> Path:
    return build("llama-server")[0]


def test_the_python_binding_loads_the_libraries_the_server_runs_on(server):
    import llama_cpp

    package_libs = Path(llama_cpp.__file__).parent / "lib"
    for name in ("libllama.so", "libggml.so", "libggml-base.so", "libggml-cpu.so", "libmtmd.so"):
        assert digest(package_libs / name) == digest(server.parent / name), name
    needed = subprocess.run(["ldd", str(server)], capture_output=True, text=True, check=True).stdout
    assert f"{server.parent}/libllama.so" in needed and "not found" not in needed, needed


def test_a_second_call_is_a_cache_hit(server):
    again, seconds, progress = build("llama-server")
    assert again == server and seconds < 5 and "building" not in progress.lower(), (seconds, progress)
    wheel, _, _ = build("wheel")
    key = server.parent.parent.name.removeprefix(f"{LLAMA_CPP_VERSION}-")
    assert wheel.parent.parent == server.parent.parent
    # the build's key as a local version label: pip replaces a same-release wheel built elsewhere
    assert wheel.name.startswith(f"llama_cpp_python-{LLAMA_CPP_VERSION}+arag.{key}-"), wheel.name


def test_the_tools_run_from_a_copy_of_the_cache_directory(server, tmp_path):
    """RUNPATH $ORIGIN: the directory moves whole (a container image, another cache path)."""
    copy = tmp_path / "bin"
    copy.mkdir()
    for item in server.parent.iterdir():
        (copy / item.name).write_bytes(item.read_bytes())
        (copy / item.name).chmod(0o755)
    for tool in ("llama-server", "llama-bench", "llama-batched-bench"):
        needed = subprocess.run(["ldd", str(copy / tool)], capture_output=True, text=True, check=True).stdout
        assert f"{copy}/libllama.so" in needed and "not found" not in needed, (tool, needed)
    version = subprocess.run([str(copy / "llama-server"), "--version"], capture_output=True, text=True, timeout=30)
    assert version.returncode == 0, version.stderr
