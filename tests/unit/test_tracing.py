"""OpenTelemetry through the real gRPC front door (in process, loopback) and the library: one
Answer is a server span whose trace id comes back in the `trace-id` trailer and in every JSON log
line of the call; the front door's stages are its children; a client's `traceparent` is
continued; health checks make no spans; strategy phases are spans with their token counts; and
without an SDK the library's spans cost nothing and name no trace."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from fakes import FakeLLM, FakeRetriever, make_passages
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.trace import SpanKind
from otel_support import hex_id, recorded
from test_frontdoor import AUTH, Harness, make_settings, trailing

from adaptive_rag.logs import configure_logging
from adaptive_rag.strategies import IRCoT, SingleStep
from adaptive_rag.strategies.base import run_metered
from adaptive_rag.tracing import INPUT_TOKENS, OUTPUT_TOKENS

REPO = Path(__file__).resolve().parents[2]
ANSWER_SPAN = "/adaptive_rag.v1.AdaptiveRag/Answer"


@pytest.fixture
def harness():
    h = Harness(make_settings())
    yield h
    h.close()


def test_an_answer_is_a_server_span_whose_trace_id_is_in_the_trailer_and_the_logs(harness):
    stream = io.StringIO()
    configure_logging("INFO", stream=stream)
    with recorded() as spans:
        reply, call = harness.answer("Which is older, X or Y?")
        trace_id = trailing(call.trailing_metadata())["trace-id"]
        server = spans.one(ANSWER_SPAN)
    assert server.kind is SpanKind.SERVER and hex_id(server.context.trace_id) == trace_id
    assert server.attributes["rpc.grpc.status_code"] == grpc.StatusCode.OK.value[0]
    # classification, enqueue, waiting: children of the server span, in the same trace
    stages = {s.name: s for s in spans.in_trace(server.context.trace_id) if s.name.startswith("serving.")}
    for stage in ("authenticate", "validate", "classify", "record", "admit", "enqueue", "wait", "reply"):
        assert stages[f"serving.{stage}"].parent.span_id == server.context.span_id, stage
    lines = [json.loads(line) for line in stream.getvalue().splitlines() if line.startswith("{")]
    call_lines = [line for line in lines if line.get("request_id") == reply.request_id]
    assert call_lines and {line["trace_id"] for line in call_lines} == {trace_id}
    assert any(line["event"] == "rpc" for line in call_lines)


def test_a_failed_call_also_carries_its_trace_id(harness):
    with recorded() as spans:
        with pytest.raises(grpc.RpcError) as info:
            harness.answer("What is 2+2?", metadata=(("authorization", "Bearer arag_nobody"),))
        server = spans.one(ANSWER_SPAN)
    assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert trailing(info.value.trailing_metadata())["trace-id"] == hex_id(server.context.trace_id)
    # a client's error: recorded as the code (span status stays UNSET, as the conventions say)
    assert server.attributes["rpc.grpc.status_code"] == grpc.StatusCode.UNAUTHENTICATED.value[0]


def test_a_clients_traceparent_is_continued(harness):
    caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    parent = f"00-{caller_trace}-00f067aa0ba902b7-01"
    with recorded() as spans:
        _, call = harness.answer("What is 2+2?", metadata=AUTH + (("traceparent", parent),))
        server = spans.one(ANSWER_SPAN)
    assert trailing(call.trailing_metadata())["trace-id"] == caller_trace
    assert hex_id(server.context.trace_id) == caller_trace
    assert format(server.parent.span_id, "016x") == "00f067aa0ba902b7"


def test_health_checks_make_no_spans(harness):
    with recorded() as spans:
        health = health_pb2_grpc.HealthStub(harness.channel)
        for _ in range(3):
            health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert spans.all == []


def test_each_strategy_phase_is_a_span_with_its_step_and_tokens():
    llm = FakeLLM(["Lumora was founded by Ada.", "So the answer is: Ada."])
    strategy = IRCoT(FakeRetriever(make_passages(3)), llm, top_k=2, max_steps=3)
    with recorded() as spans:
        result = run_metered(strategy, "Who founded the company that makes Lumora lamps?")
        run = spans.one("strategy ircot")
    assert result.usage.llm_calls == 2 == len(llm.calls)
    assert result.usage.prompt_tokens == sum(len(p.split()) for p in llm.prompts)
    assert result.usage.completion_tokens == len("Lumora was founded by Ada.".split()) + len("So the answer is: Ada.".split())
    assert run.attributes[INPUT_TOKENS] == result.usage.prompt_tokens
    assert run.attributes[OUTPUT_TOKENS] == result.usage.completion_tokens
    assert run.attributes["steps"] == result.steps == 2
    retrieves = sorted(spans.named("retrieve"), key=lambda s: s.start_time)
    generates = sorted(spans.named("generate"), key=lambda s: s.start_time)
    assert [s.attributes["step"] for s in retrieves] == [1, 2]
    assert [s.attributes["step"] for s in generates] == [1, 2]
    assert all(s.parent.span_id == run.context.span_id for s in retrieves + generates)
    assert sum(s.attributes[INPUT_TOKENS] for s in generates) == result.usage.prompt_tokens


def test_usage_is_counted_per_run_even_when_strategies_nest():
    """self_route-style nesting: an outer meter counts the inner run's generations too."""
    llm = FakeLLM(lambda prompt: "Lumora Lighting")
    inner = SingleStep(FakeRetriever(make_passages(2)), llm)
    with recorded():
        first = run_metered(inner, "Who makes Lumora lamps?")
        second = run_metered(inner, "Who makes Lumora lamps?")
    assert first.usage.llm_calls == second.usage.llm_calls == 1
    assert first.usage.prompt_tokens == second.usage.prompt_tokens > 0


def test_without_an_sdk_the_library_spans_are_no_ops():
    code = (
        "from adaptive_rag.tracing import span, current_trace_id, inject_context\n"
        "with span('x', a=1) as s:\n"
        "    assert not s.is_recording() and current_trace_id() is None\n"
        "    assert inject_context({}) == {}\n"
        "import sys; assert not any(m.startswith('opentelemetry.sdk') for m in sys.modules)\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr


def test_the_library_uses_the_opentelemetry_api_only():
    """No SDK, exporter or instrumentation in adaptive_rag (import-linter cannot tell the
    `opentelemetry` namespace's packages apart)."""
    offenders = [
        str(path.relative_to(REPO)) for path in (REPO / "adaptive_rag").rglob("*.py")
        if any(f"opentelemetry.{part}" in path.read_text(encoding="utf-8")
               for part in ("sdk", "exporter", "instrumentation"))
    ]
    assert offenders == []
