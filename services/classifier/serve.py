"""Local Triton for the complexity classifier.

Starts the real `tritonserver` that the `nvidia-pytriton` wheel ships and binds the classifier
model (`adaptive_rag.contracts.CLASSIFIER_MODEL`, "complexity"; tensors `CLASSIFIER_INPUTS` ->
`CLASSIFIER_OUTPUT`) to a Python callable that runs the repository's ONNX file
(`<repo>/complexity/<version>/model.onnx`) with ONNX Runtime: the same file a standalone Triton
loads with its onnxruntime backend and `config.pbtxt`. Listens on loopback; checks server, model
and one real inference before it says READY; stops cleanly on SIGTERM / SIGINT.

    .venv/bin/python services/classifier/serve.py --repository var/model_repository --grpc-port 8001

Machine fact (ARCHITECTURE.md): the Python-backend stub loads whichever `libpython3.11.so` the
loader finds first; under a pyenv Python that is the system's older 3.11.2 and the model fails to
load. The running interpreter's LIBDIR is therefore put first on `LD_LIBRARY_PATH` for the Triton
process.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import sysconfig
import threading
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO_ROOT))

from adaptive_rag.contracts import CLASSIFIER_INPUTS, CLASSIFIER_OUTPUT, TIERS  # noqa: E402
from adaptive_rag.routing.model_repository import ModelVersion, open_version  # noqa: E402
from adaptive_rag.settings import ClassifierSettings  # noqa: E402

LOG = logging.getLogger("arag.triton")


def python_libdir_first(env: dict[str, str] | None = None) -> str:
    """`LD_LIBRARY_PATH` with this interpreter's LIBDIR in front (see the module doc)."""
    env = os.environ if env is None else env
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    parts = [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p and p != libdir]
    return ":".join([libdir, *parts]) if libdir else ":".join(parts)


class OnnxComplexityModel:
    """The PyTriton inference callable: a list of requests in, one `logits` array per request out.

    Triton's dynamic batcher only groups requests whose shapes match; the callable still pads
    every request of a group to the longest sequence and runs them as one ONNX batch.
    """

    def __init__(self, version: ModelVersion, threads: int = 1) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(
            str(version.onnx_path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self.version = version

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        feeds = (input_ids.astype(np.int64), attention_mask.astype(np.int64))
        return self.session.run([CLASSIFIER_OUTPUT], dict(zip(CLASSIFIER_INPUTS, feeds)))[0].astype(np.float32)

    def __call__(self, requests):
        ids_name, mask_name = CLASSIFIER_INPUTS
        ids = [np.atleast_2d(r[ids_name]) for r in requests]
        masks = [np.atleast_2d(r[mask_name]) for r in requests]
        width = max(a.shape[1] for a in ids)
        padded_ids = np.concatenate([np.pad(a, ((0, 0), (0, width - a.shape[1]))) for a in ids])
        padded_mask = np.concatenate([np.pad(m, ((0, 0), (0, width - m.shape[1]))) for m in masks])
        logits = self.run(padded_ids, padded_mask)
        out, start = [], 0
        for a in ids:
            out.append({CLASSIFIER_OUTPUT: logits[start:start + a.shape[0]]})
            start += a.shape[0]
        return out


def start_triton(
    version: ModelVersion,
    grpc_port: int,
    http_port: int,
    metrics_port: int,
    address: str = "127.0.0.1",
    max_batch_size: int = 32,
    queue_delay_us: int = 500,
    threads: int = 1,
    log_verbose: int = 0,
):
    """Start Triton with the model bound; returns the running `pytriton.triton.Triton`."""
    os.environ["LD_LIBRARY_PATH"] = python_libdir_first()
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    config = TritonConfig(
        grpc_address=address, grpc_port=grpc_port, http_address=address, http_port=http_port,
        metrics_address=address, metrics_port=metrics_port, allow_metrics=True,
        allow_gpu_metrics=False, exit_timeout_secs=5, log_verbose=log_verbose,
    )
    triton = Triton(config=config)
    triton.bind(
        model_name=version.name,
        model_version=version.version,
        infer_func=OnnxComplexityModel(version, threads=threads),
        inputs=[Tensor(name=name, dtype=np.int64, shape=(-1,)) for name in CLASSIFIER_INPUTS],
        outputs=[Tensor(name=CLASSIFIER_OUTPUT, dtype=np.float32, shape=(len(TIERS),))],
        config=ModelConfig(
            max_batch_size=max_batch_size,
            batcher=DynamicBatcher(max_queue_delay_microseconds=queue_delay_us),
        ),
        strict=True,
    )
    triton.run()
    return triton


def health_check(grpc_url: str, model: str, version: ModelVersion, timeout_s: float = 30.0) -> float:
    """Server live and ready, model ready, one real inference; returns its round trip in ms."""
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
    classifier = TritonClassifier.from_version(version, url=grpc_url, timeout_s=5.0, batching=False)
    start = time.perf_counter()
    decision = classifier.classify("Which is older, the Eiffel Tower or Big Ben?")
    elapsed = 1000 * (time.perf_counter() - start)
    classifier.close()
    client.close()
    if decision.fallback:
        raise RuntimeError(f"health check inference failed: {decision.reason}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = ClassifierSettings()  # ARAG_MODEL_REPOSITORY, ARAG_CLASSIFIER_MODEL
    parser.add_argument("--repository", type=Path, default=defaults.model_repository)
    parser.add_argument("--model", default=defaults.classifier_model)
    parser.add_argument("--version", type=int, default=None, help="default: the latest")
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--queue-delay-us", type=int, default=500)
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    parser.add_argument("--log-verbose", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    version = open_version(args.repository, args.model, args.version)
    started = time.perf_counter()
    triton = start_triton(
        version, args.grpc_port, args.http_port, args.metrics_port, args.address,
        args.max_batch_size, args.queue_delay_us, args.threads, args.log_verbose,
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        url = f"{args.address}:{args.grpc_port}"
        rtt = health_check(url, args.model, version)
        print(
            f"READY model {args.model} version {version.version} from {version.onnx_path} "
            f"on grpc {url}, http {args.address}:{args.http_port} "
            f"(started in {time.perf_counter() - started:.1f} s, health inference {rtt:.1f} ms)",
            flush=True,
        )
        while not stop.is_set() and triton.is_alive():
            stop.wait(1.0)
    finally:
        triton.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
