"""Classifier client without a server: tokenization, softmax, batching, cache and the fallback."""

from __future__ import annotations

import importlib.util
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from adaptive_rag.routing.classifier_client import (
    ClassifierUnavailableError, QueryTokenizer, TritonClassifier, softmax_rows,
)
from adaptive_rag.routing.model_repository import config_pbtxt, next_version, open_version, versions
from adaptive_rag.contracts import Tier
from adaptive_rag.errors import ConfigurationError
from adaptive_rag.routing.policy import PolicyThresholds, RoutingPolicy
from infra.local.servers import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def tokenizer_json(tmp_path) -> Path:
    """A tiny BERT-style tokenizer.json built with the tokenizers library (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "who", "wrote", "dune", "?", "hi", "a", "b", "c"]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def test_tokenizer_pads_to_a_bucket_and_truncates(tokenizer_json):
    ids, mask = QueryTokenizer(tokenizer_json, max_length=32, pad_to_multiple=8)(["who wrote dune ?", "hi"])
    assert ids.dtype == np.int64 and mask.dtype == np.int64
    assert ids.shape == (2, 8)
    assert ids[0, :6].tolist() == [2, 4, 5, 6, 7, 3] and ids[0, 6:].tolist() == [0, 0]
    assert mask.tolist() == [[1] * 6 + [0] * 2, [1] * 3 + [0] * 5]
    long_ids, _ = QueryTokenizer(tokenizer_json, max_length=8, pad_to_multiple=16)(["hi " * 50])
    assert long_ids.shape == (1, 8) and long_ids[0, -1] == 3  # truncated, [SEP] kept


def test_softmax_rows():
    probs = softmax_rows(np.array([[0.0, 0.0, 0.0], [1000.0, 0.0, -1000.0]]))
    np.testing.assert_allclose(probs.sum(axis=1), 1.0)
    assert probs[1, 0] == pytest.approx(1.0)


def test_unreachable_triton_gives_flagged_rules_fallback_quickly(tokenizer_json):
    url = f"127.0.0.1:{free_port()}"  # nothing listens there
    with TritonClassifier(tokenizer_json, url=url, timeout_s=0.5, batching=True) as client:
        start = time.perf_counter()
        decision = client.classify("Compare dune and who?")
        assert time.perf_counter() - start < 2.0
        assert decision.fallback and decision.tier is Tier.C and decision.probabilities is None
        assert "rules fallback" in decision.reason
        assert not client.is_ready()
        # Within retry_after_s the server is not tried again at all.
        with pytest.raises(ClassifierUnavailableError, match="recent failure"):
            client.logits(["hi"])
        assert [d.fallback for d in client.classify_many(["hi", "who wrote dune ?"])] == [True, True]


class _StubClassifier(TritonClassifier):
    """The client with Triton replaced by a function of the batch (counts requests)."""

    def __init__(self, tokenizer_json, **kwargs):
        super().__init__(tokenizer_json, url=f"127.0.0.1:{free_port()}", **kwargs)
        self.requests: list[int] = []
        self.lock = threading.Lock()

    def logits(self, queries):
        with self.lock:
            self.requests.append(len(queries))
        time.sleep(0.01)
        rows = [[0.0, 0.0, 5.0] if "?" in q else [0.0, 5.0, 0.0] for q in queries]
        return np.array(rows, dtype=np.float32), "7"

    async def alogits(self, queries):
        return self.logits(queries)


def test_waiting_queries_are_batched_into_fewer_requests(tokenizer_json):
    with _StubClassifier(tokenizer_json, batching=True, max_batch=16) as client:
        with ThreadPoolExecutor(16) as pool:
            decisions = list(pool.map(client.classify, [f"q{i}{'?' if i % 2 else ''}" for i in range(64)]))
        assert sum(client.requests) == 64
        assert len(client.requests) < 64  # some requests carried several queries
        assert max(client.requests) <= 16
        assert [d.tier for d in decisions] == [Tier.C if i % 2 else Tier.B for i in range(64)]
        assert all(d.model_version == 7 and not d.fallback for d in decisions)


def test_cache_answers_repeated_queries_without_a_request(tokenizer_json):
    with _StubClassifier(tokenizer_json, batching=False, cache_size=2) as client:
        client.classify("a")
        client.classify("a")
        assert client.requests == [1]
        client.classify("b"), client.classify("c"), client.classify("a")  # "a" was evicted
        assert client.requests == [1, 1, 1, 1]


def test_policy_thresholds_come_with_the_model_version(tmp_path, tokenizer_json):
    version_dir = tmp_path / "complexity" / "3"
    version_dir.mkdir(parents=True)
    (version_dir / "model.onnx").write_bytes(b"onnx")
    (version_dir / "tokenizer.json").write_bytes(tokenizer_json.read_bytes())
    (version_dir / "classifier.json").write_text('{"max_length": 64, "labels": ["A", "B", "C"]}')
    PolicyThresholds(c_threshold=0.2).save(version_dir)
    (tmp_path / "complexity" / "1").mkdir()  # no model.onnx: not a version
    assert versions(tmp_path / "complexity") == [3]
    assert next_version(tmp_path / "complexity") == 4
    version = open_version(tmp_path)
    assert (version.version, version.max_length) == (3, 64)
    client = TritonClassifier.from_version(version, url=f"127.0.0.1:{free_port()}", batching=False)
    assert client.policy == RoutingPolicy(PolicyThresholds(c_threshold=0.2))
    client.close()
    with pytest.raises(ConfigurationError):
        open_version(tmp_path / "nowhere")


def test_config_pbtxt_names_the_contract():
    text = config_pbtxt("complexity", max_batch_size=16)
    assert 'backend: "onnxruntime"' in text and "max_batch_size: 16" in text
    assert "preferred_batch_size: [ 4, 8, 16 ]" in text
    assert "latest: { num_versions: 1 }" in text
    # A lone request is not held back waiting for company (busy-instance batching still merges).
    assert "max_queue_delay_microseconds: 0" in text


def test_serve_puts_this_interpreters_libdir_first_on_the_loader_path():
    spec = importlib.util.spec_from_file_location("serve", REPO_ROOT / "services/classifier/serve.py")
    serve = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(serve)
    import sysconfig

    libdir = sysconfig.get_config_var("LIBDIR")
    value = serve.python_libdir_first({"LD_LIBRARY_PATH": f"/usr/lib:{libdir}:/opt/x"})
    assert value.split(":") == [libdir, "/usr/lib", "/opt/x"]
    assert serve.python_libdir_first({}) == libdir


def test_routed_outcomes_pick_the_routed_tier_and_add_routing_time():
    from adaptive_rag.evaluation.adaptive import routed_outcomes
    from adaptive_rag.routing.rules import rules_router
    from adaptive_rag.evaluation.datasets import Question
    from adaptive_rag.evaluation.runner import Outcome

    questions = [
        Question("1", "nq", "hello", ("x",)),
        Question("2", "hotpotqa", "What is the difference between X and Y?", ("y",)),
        Question("3", "nq", "Who wrote Dune?", ("z",)),
        Question("4", "nq", "missing outcomes?", ("z",)),
    ]
    tiers = ("no_retrieval", "single_step", "decompose")
    outcomes = {}
    for q in questions[:3]:
        for steps, name in enumerate(tiers):
            outcomes[(q.dataset, q.id, name)] = Outcome(q.id, q.dataset, name, name, steps, 1.0 + steps,
                                                        em=float(name == "single_step"), f1=0.0, acc=0.0)
    # A router that takes a known time per question: that time must be added to the outcome's.
    routing_s = {"hello": 0.05, questions[1].question: 0.15, "Who wrote Dune?": 0.25}

    class SlowRulesRouter:
        def route(self, query: str):
            time.sleep(routing_s[query])
            return rules_router(query)

    rows, counts = routed_outcomes(outcomes, questions, tiers, SlowRulesRouter(), "adaptive, rules only")
    assert [r.answer for r in rows] == ["no_retrieval", "decompose", "single_step"]
    assert counts == {"A": 1, "B": 1, "C": 1, "fallback": 0}
    assert all(r.strategy == "adaptive, rules only" for r in rows)
    assert [r.steps for r in rows] == [0, 2, 1]
    for row, question in zip(rows, questions):
        tier_seconds = outcomes[(question.dataset, question.id, row.answer)].seconds
        added = row.seconds - tier_seconds
        # At least the router's sleep, and not much more (generous for a busy machine).
        assert routing_s[question.question] <= added < routing_s[question.question] + 0.5, (row, added)
    assert rules_router("hi").reason == "rules" and not rules_router("hi").fallback


def test_async_callers_share_batches(tokenizer_json):
    import asyncio

    async def main(client):
        return await asyncio.gather(*(client.aclassify(f"q{i}?") for i in range(20)))

    with _StubClassifier(tokenizer_json, batching=True, max_batch=32) as client:
        decisions = asyncio.run(main(client))
        assert all(d.tier is Tier.C and not d.fallback for d in decisions)
        assert sum(client.requests) == 20 and len(client.requests) < 20


def test_queries_differing_in_case_and_spacing_share_the_routing_cache():
    from adaptive_rag.routing.classifier_client import cache_key

    assert cache_key("  How LONG is the\tHub  warranty? ") == cache_key("how long is the hub warranty?")
    assert cache_key("hub warranty") != cache_key("hub warranties")


class _FakeTriton:
    """Triton's gRPC inference service on loopback (grpc.aio): answers ModelInfer with fixed
    logits after `delay_s`, naming the version asked for, and keeps each request."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.requests: list = []

    async def start(self) -> str:
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        fake = self

        class Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):
            async def ModelInfer(self, request, context):  # noqa: N802 - gRPC method name
                import asyncio

                fake.requests.append(request)
                await asyncio.sleep(fake.delay_s)
                n = request.inputs[0].shape[0]
                logits = np.tile(np.array([[0.0, 5.0, 0.0]], dtype=np.float32), (n, 1))
                return service_pb2.ModelInferResponse(
                    model_name=request.model_name, model_version=request.model_version or "1",
                    outputs=[service_pb2.ModelInferResponse.InferOutputTensor(
                        name="logits", datatype="FP32", shape=[n, 3])],
                    raw_output_contents=[logits.tobytes()],
                )

        self.server = grpc.aio.server()
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Servicer(), self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return f"127.0.0.1:{port}"

    async def stop(self) -> None:
        await self.server.stop(None)


def test_async_callers_use_the_asyncio_client_pinned_to_their_version(tokenizer_json):
    """aclassify asks Triton through tritonclient's asyncio client on the caller's loop (no
    batcher thread): the request names the pinned version, the decision the version that answered,
    and the callers of one loop iteration share a request."""
    import asyncio

    from adaptive_rag.contracts import CLASSIFIER_OUTPUT

    assert CLASSIFIER_OUTPUT == "logits"

    async def main():
        fake = _FakeTriton()
        url = await fake.start()
        client = TritonClassifier(tokenizer_json, url=url, model_version="7", timeout_s=2.0)
        client.classify = None  # the blocking path must not be used
        try:
            one = await client.aclassify("who wrote dune ?")
            many = await asyncio.gather(*(client.aclassify(f"q{i}") for i in range(5)))
        finally:
            client.close()
            await asyncio.sleep(0)  # the asyncio client closes on this loop
            await fake.stop()
        return fake, one, many

    fake, one, many = asyncio.run(main())
    assert one.tier is Tier.B and not one.fallback and one.model_version == 7
    assert all(d.tier is Tier.B and d.model_version == 7 for d in many)
    assert [r.model_version for r in fake.requests] == ["7", "7"]
    assert [r.inputs[0].shape[0] for r in fake.requests] == [1, 5]


def test_async_timeout_gives_the_flagged_rules_fallback_and_skips_triton_for_a_while(tokenizer_json):
    import asyncio

    async def main():
        fake = _FakeTriton(delay_s=1.0)
        url = await fake.start()
        client = TritonClassifier(tokenizer_json, url=url, model_version="3", timeout_s=0.2,
                                  retry_after_s=60.0)
        try:
            start = time.perf_counter()
            slow = await client.aclassify("Compare dune and who?")
            took = time.perf_counter() - start
            again = await client.aclassify("who wrote dune ?")
        finally:
            client.close()
            await asyncio.sleep(0)
            await fake.stop()
        return fake, slow, took, again

    fake, slow, took, again = asyncio.run(main())
    assert slow.fallback and slow.tier is Tier.C and "rules fallback" in slow.reason
    assert "DEADLINE" in slow.reason.upper() or "deadline" in slow.reason.lower()
    assert took < 1.0
    assert again.fallback and "recent failure" in again.reason
    assert len(fake.requests) == 1  # within retry_after_s Triton is not asked again
