"""The real Triton (from the `nvidia-pytriton` wheel) serving a MiniLM ONNX export on loopback,
the gRPC classifier client against it, and the rules fallback once it is stopped.

The model is an untrained MiniLM-L6 (fresh classification head) exported to ONNX in the test, so
exporting needs torch (`train` extras, installed by `make setup`).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import pytriton  # noqa: F401  (required: the local Triton comes from nvidia-pytriton)
import torch  # noqa: F401  (required: exporting the test model)

from adaptive_rag.contracts import Tier
from adaptive_rag.routing.classifier_client import QueryTokenizer, TritonClassifier
from adaptive_rag.routing.model_repository import open_version
from services.classifier.local import TritonProcess
from lab.harness.models import export_untrained_version


@pytest.fixture(scope="module")
def model_repository(tmp_path_factory) -> Path:
    return export_untrained_version(tmp_path_factory.mktemp("model-repository"), max_length=64)


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
        assert not decision.fallback and decision.model_version == 1
        # The in-process router (evaluation rows) gives the served model's probabilities.
        from adaptive_rag.routers.local_classifier import LocalOnnxClassifier

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


def test_triton_serves_the_shipped_bag_of_words_router_like_the_fitted_model(tmp_path):
    """The router a fresh clone ships, rebuilt from its JSON without torch, through real Triton."""
    from adaptive_rag.training.bag_of_words import fit, publish
    from tests.unit.test_bag_of_words_router import keyword_labels

    router = fit(keyword_labels())
    router.save(tmp_path / "router.json")
    publish(tmp_path / "router.json", tmp_path / "repo")
    version = open_version(tmp_path / "repo")
    server = TritonProcess(tmp_path / "repo", tmp_path / "serve.log")
    try:
        with TritonClassifier.from_version(version, url=server.url, timeout_s=5.0, batching=False) as client:
            logits, served = client.logits(QUERIES)
            assert served == "1"
            np.testing.assert_allclose(logits, router.logits(QUERIES), atol=1e-4)
            assert [client.classify(q).tier.value for q in QUERIES] == router.route_many(QUERIES)
    finally:
        server.stop()


def test_a_router_priced_on_time_is_served_with_its_price(tmp_path):
    """The price chosen for a time budget travels with the version (thresholds.json) and the
    client applies it to what real Triton returns: fewer questions reach C than unpriced."""
    from adaptive_rag.routing.policy import RoutingPolicy
    from adaptive_rag.training.bag_of_words import fit, fit_time_price, publish, served_thresholds
    from tests.unit.test_time_price import labels

    examples = labels()
    router = fit(examples)
    fit_time_price(router, examples, 0.7)
    router.save(tmp_path / "router.json")
    publish(tmp_path / "router.json", tmp_path / "repo")
    version = open_version(tmp_path / "repo")
    questions = [f"Who directed the film that came out in year {i}?" for i in range(40, 46)] + [
        "Which film came out first, film 50 or film 51, and who directed both?", "Who wrote book number 60?"]
    policy = RoutingPolicy(served_thresholds(router))
    priced = [policy.tier(list(map(float, p)))[0].value for p in router.probabilities(questions)]
    unpriced = router.route_many(questions)
    assert priced.count("C") < unpriced.count("C")
    server = TritonProcess(tmp_path / "repo", tmp_path / "serve.log")
    try:
        with TritonClassifier.from_version(version, url=server.url, timeout_s=5.0, batching=False) as client:
            decisions = [client.classify(q) for q in questions]
            assert [d.tier.value for d in decisions] == priced
            assert all("time priced at" in d.reason for d in decisions)
    finally:
        server.stop()
