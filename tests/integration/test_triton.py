"""The real Triton (from the `nvidia-pytriton` wheel) serving a MiniLM ONNX export on loopback,
the gRPC classifier client against it, and the rules fallback once it is stopped.

The model is an untrained MiniLM-L6 (fresh classification head) exported to ONNX in the test, so
exporting needs torch (`train` extras, installed by `make setup`).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch", reason="torch not installed (needed to export the test model): pip install -e '.[train]'")
pytest.importorskip("pytriton", reason="nvidia-pytriton not installed")

from adaptive_rag.classifier.client import QueryTokenizer, TritonClassifier  # noqa: E402
from adaptive_rag.classifier.repository import open_version  # noqa: E402
from adaptive_rag.domain import Tier  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVE = REPO_ROOT / "services" / "classifier" / "serve.py"
START_TIMEOUT_S = 180


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def model_repository(tmp_path_factory) -> Path:
    from adaptive_rag.classifier.export import export_run
    from adaptive_rag.classifier.model import load_base, save_checkpoint

    run = tmp_path_factory.mktemp("untrained-run")
    network, tokenizer, kind = load_base(None)
    network.eval()
    save_checkpoint(network, tokenizer, kind, run, {"max_length": 64})
    repo = tmp_path_factory.mktemp("model-repository")
    export_run(run, repo)
    return repo


class TritonProcess:
    def __init__(self, repo: Path, log_path: Path) -> None:
        self.grpc_port = _free_port()
        ports = [str(self.grpc_port), str(_free_port()), str(_free_port())]
        self.log_path = log_path
        self.log = log_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVE), "--repository", str(repo), "--grpc-port", ports[0],
             "--http-port", ports[1], "--metrics-port", ports[2]],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO_ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while "READY" not in log_path.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"serve.py did not become ready:\n{log_path.read_text()[-4000:]}")
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
        self.log.close()


@pytest.fixture(scope="module")
def triton(model_repository, tmp_path_factory):
    server = TritonProcess(model_repository, tmp_path_factory.mktemp("triton") / "serve.log")
    yield server
    server.stop()


QUERIES = [
    "hi",
    "Who wrote the novel Dune?",
    "Which film came out first, Blind Shaft or The Mask Of Fu Manchu?",
    "What is the difference between the Eiffel Tower and Big Ben, and which is older?",
]


def test_triton_serves_the_onnx_model_with_the_same_logits(triton, model_repository):
    version = open_version(model_repository)
    with TritonClassifier.from_version(version, url=triton.url, timeout_s=5.0, batching=False) as client:
        assert client.is_ready()
        logits, served = client.logits(QUERIES)
        assert served == "1"
        import onnxruntime as ort

        ids, mask = QueryTokenizer(version.tokenizer_path, version.max_length)(QUERIES)
        local = ort.InferenceSession(str(version.onnx_path)).run(
            ["logits"], {"input_ids": ids, "attention_mask": mask})[0]
        np.testing.assert_allclose(logits, local, atol=1e-4)
        decision = client.classify(QUERIES[1])
        assert not decision.fallback and decision.model_version == "1"
        # The in-process router (evaluation rows) gives the served model's probabilities.
        from adaptive_rag.classifier.adaptive import LocalOnnxClassifier

        offline = LocalOnnxClassifier(version).classify(QUERIES[1])
        assert offline.tier is decision.tier
        for tier, p in decision.probabilities.items():
            assert offline.probabilities[tier] == pytest.approx(p, abs=1e-5)
        assert set(decision.probabilities) == {"A", "B", "C"}
        assert sum(decision.probabilities.values()) == pytest.approx(1.0, abs=1e-5)


def test_concurrent_queries_are_batched_and_all_answered(triton, model_repository):
    version = open_version(model_repository)
    with TritonClassifier.from_version(version, url=triton.url, timeout_s=5.0, batching=True) as client:
        queries = [f"{QUERIES[i % 4]} ({i})" for i in range(64)]
        with ThreadPoolExecutor(8) as pool:
            decisions = list(pool.map(client.classify, queries))
        assert len(decisions) == 64 and not any(d.fallback for d in decisions)
        many = client.classify_many(QUERIES)
        assert [d.tier for d in many] == [
            client.classify(q).tier for q in QUERIES
        ]


def test_stopping_triton_gives_the_flagged_rules_fallback(model_repository, tmp_path):
    server = TritonProcess(model_repository, tmp_path / "serve.log")
    version = open_version(model_repository)
    client = TritonClassifier.from_version(version, url=server.url, timeout_s=1.0, retry_after_s=0.0)
    try:
        assert not client.classify(QUERIES[1]).fallback
        server.stop()
        assert "successfully unloaded" in server.log_path.read_text() or server.proc.returncode is not None
        start = time.perf_counter()
        decision = client.classify("What is the difference between a lamp and a bulb?")
        elapsed = time.perf_counter() - start
        assert decision.fallback and decision.tier is Tier.C
        assert decision.probabilities is None and "rules fallback" in decision.reason
        assert elapsed < 3.0  # bounded by the client timeout, never hangs
        assert not client.is_ready()
    finally:
        client.close()
        server.stop()
