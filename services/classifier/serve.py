"""Local Triton for the complexity classifier, with the same model control as production.

Starts the real `tritonserver` that the `nvidia-pytriton` wheel ships on the model repository as
it is (`<repo>/complexity/config.pbtxt`, `<version>/model.onnx`), in EXPLICIT model-control mode
with `--load-model=complexity`: the versions loaded are the ones config.pbtxt's version policy
names (the served version and the one before it, after a promotion), and `arag model promote`,
`arag retrain` and `arag model rollback` swap versions with `load_model` exactly as against a
production Triton. That wheel's server has only the Python backend, so the repository's
`backend: "onnxruntime"` resolves to a Python-based backend of that name
(`services/classifier/backends/onnxruntime/model.py`) that runs the same ONNX file with ONNX
Runtime. Listens on loopback; checks server, model version and one real inference before it
prints READY; stops cleanly on SIGTERM / SIGINT.

    .venv/bin/python services/classifier/serve.py --repository var/model_repository --grpc-port 8001

`--version N` serves exactly version N instead (the config's other settings unchanged): the
benchmarks compare versions that way.

Machine fact (ARCHITECTURE.md): the Python-backend stub loads whichever `libpython3.11.so` the
loader finds first; under a pyenv Python that is the system's older 3.11.2 and the model fails to
load. The running interpreter's LIBDIR is therefore put first on `LD_LIBRARY_PATH` for the Triton
process (and this environment's `bin` first on `PATH`, so the stub imports its packages).
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import uuid
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO_ROOT))

from adaptive_rag.routing.model_repository import (  # noqa: E402
    CONFIG_FILE, ModelVersion, open_version, read_served, write_config,
)
from adaptive_rag.settings import ClassifierSettings  # noqa: E402

LOG = logging.getLogger("arag.triton")
BACKEND_SOURCE = Path(__file__).resolve().parent / "backends" / "onnxruntime" / "model.py"
STOP_TIMEOUT_S = 30


def python_libdir_first(env: dict[str, str] | None = None) -> str:
    """`LD_LIBRARY_PATH` with this interpreter's LIBDIR in front (see the module doc)."""
    env = os.environ if env is None else env
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    parts = [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p and p != libdir]
    return ":".join([libdir, *parts]) if libdir else ":".join(parts)


def triton_distribution() -> tuple[Path, Path, Path]:
    """`(tritonserver binary, python backend dir, this Python's backend stub)` from the wheel."""
    import pytriton

    root = Path(pytriton.__file__).resolve().parent / "tritonserver"
    stub = root / "python_backend_stubs" / f"{sys.version_info[0]}.{sys.version_info[1]}" / "triton_python_backend_stub"
    return root / "bin" / "tritonserver", root / "backends" / "python", stub


def prepare_backends(workdir: Path) -> Path:
    """`<workdir>/backends`: the wheel's Python backend with this interpreter's stub, and the
    `onnxruntime` Python-based backend. Returns the backend directory."""
    _, python_backend, stub = triton_distribution()
    backends = Path(workdir) / "backends"
    shutil.copytree(python_backend, backends / "python", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(stub, backends / "python" / "triton_python_backend_stub")
    (backends / "onnxruntime").mkdir(parents=True)
    shutil.copy2(BACKEND_SOURCE, backends / "onnxruntime" / "model.py")
    return backends


def triton_env(threads: int) -> dict[str, str]:
    """The server's environment: this interpreter's libpython first, the wheel's libraries,
    this environment's `bin` first on PATH (the stub finds its site-packages from it)."""
    from pytriton.utils.distribution import get_libs_path

    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ":".join(p for p in (python_libdir_first(env), str(get_libs_path())) if p)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env["ARAG_TRITON_ONNX_THREADS"] = str(threads)
    return env


def triton_command(
    repository: Path, backends: Path, model: str, grpc_port: int, http_port: int, metrics_port: int,
    address: str = "127.0.0.1", load_model: bool = True, log_verbose: int = 0,
) -> list[str]:
    """The `tritonserver` command line: EXPLICIT model control, the repository as it is."""
    binary, _, _ = triton_distribution()
    shm_prefix = f"arag{os.getpid()}-{uuid.uuid4().hex[:6]}-"
    return [
        str(binary), f"--model-repository={Path(repository).resolve()}",
        f"--backend-directory={backends}", "--model-control-mode=explicit",
        *([f"--load-model={model}"] if load_model else []),
        f"--grpc-address={address}", f"--grpc-port={grpc_port}",
        f"--http-address={address}", f"--http-port={http_port}",
        f"--metrics-address={address}", f"--metrics-port={metrics_port}",
        "--allow-gpu-metrics=false", "--strict-readiness=true", "--exit-timeout-secs=5",
        f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
        f"--log-verbose={log_verbose}",
    ]


def pinned_config(repository: Path, model: str, version: int) -> str:
    """The repository's config.pbtxt as JSON with its version policy set to `version` only
    (the `config` override of `load_model`, for `--version`)."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    text = (Path(repository) / model / CONFIG_FILE).read_text(encoding="utf-8")
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    config.version_policy.Clear()
    config.version_policy.specific.versions.append(version)
    return json_format.MessageToJson(config, preserving_proto_field_name=True)


def wait_until_live(grpc_url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    import tritonclient.grpc as grpcclient

    deadline = time.monotonic() + timeout_s
    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"tritonserver exited with code {proc.returncode}")
            try:
                if client.is_server_live():
                    return
            except Exception:  # noqa: BLE001 - not up yet
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"Triton at {grpc_url} not live within {timeout_s} s")
            time.sleep(0.2)
    finally:
        client.close()


def health_check(grpc_url: str, model: str, version: ModelVersion, timeout_s: float = 60.0) -> float:
    """Server live and ready, model version ready, one real inference pinned to that version;
    returns its round trip in ms."""
    import tritonclient.grpc as grpcclient

    from adaptive_rag.routing.classifier_client import TritonClassifier

    deadline = time.monotonic() + timeout_s
    client = grpcclient.InferenceServerClient(grpc_url)
    while True:
        try:
            if (client.is_server_live() and client.is_server_ready()
                    and client.is_model_ready(model, str(version.version))):
                break
        except Exception:  # noqa: BLE001 - not up yet
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"Triton at {grpc_url} not ready within {timeout_s} s")
        time.sleep(0.2)
    classifier = TritonClassifier.from_version(version, url=grpc_url, model_version=str(version.version),
                                               timeout_s=5.0, batching=False)
    start = time.perf_counter()
    decision = classifier.classify("Which is older, the Eiffel Tower or Big Ben?")
    elapsed = 1000 * (time.perf_counter() - start)
    classifier.close()
    client.close()
    if decision.fallback:
        raise RuntimeError(f"health check inference failed: {decision.reason}")
    return elapsed


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """The server gets SIGTERM when this process dies, even by SIGKILL (no orphaned Triton)."""
    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM (Triton unloads its models and exits), SIGKILL after `STOP_TIMEOUT_S`."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = ClassifierSettings()  # ARAG_MODEL_REPOSITORY, ARAG_CLASSIFIER_MODEL
    parser.add_argument("--repository", type=Path, default=defaults.model_repository)
    parser.add_argument("--model", default=defaults.classifier_model)
    parser.add_argument("--version", type=int, default=None,
                        help="serve exactly this version (default: the versions config.pbtxt names)")
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads per version")
    parser.add_argument("--log-verbose", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    version = open_version(args.repository, args.model, args.version)  # default: the served one
    model_dir = Path(args.repository) / args.model
    if read_served(model_dir) is None:
        # No served pointer (version directories copied in by hand or by an older export): the
        # version served is the latest, so the config's version policy must name it.
        write_config(model_dir, keep=[version.version])
        LOG.info("%s now loads version %d (no served pointer)", CONFIG_FILE, version.version)
    started = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="arag-triton-"))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    command = triton_command(args.repository, prepare_backends(workdir), args.model, args.grpc_port,
                             args.http_port, args.metrics_port, args.address,
                             load_model=args.version is None, log_verbose=args.log_verbose)
    proc = subprocess.Popen(command, env=triton_env(args.threads), stdin=subprocess.DEVNULL,
                            preexec_fn=_die_with_parent)  # noqa: PLW1509 - only prctl, no locks
    try:
        url = f"{args.address}:{args.grpc_port}"
        if args.version is not None:
            import tritonclient.grpc as grpcclient

            wait_until_live(url, proc, timeout_s=60.0)
            client = grpcclient.InferenceServerClient(url)
            client.load_model(args.model, config=pinned_config(args.repository, args.model, args.version))
            client.close()
        rtt = health_check(url, args.model, version)
        print(
            f"READY model {args.model} version {version.version} from {version.onnx_path} "
            f"on grpc {url}, http {args.address}:{args.http_port}, model control explicit "
            f"(started in {time.perf_counter() - started:.1f} s, health inference {rtt:.1f} ms)",
            flush=True,
        )
        while not stop.is_set() and proc.poll() is None:
            stop.wait(1.0)
        if proc.poll() is not None and not stop.is_set():
            print(f"tritonserver exited with code {proc.returncode}", flush=True)
            return 1
    finally:
        stop_server(proc)
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
