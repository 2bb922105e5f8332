"""The worker side of tracing and metrics, with real Celery on the server-less filesystem broker:
the producer writes the trace into the task's headers and the worker's task span continues it;
strategy phases hang below; tokens and cost reach the stored result and the per-tier metrics; a
pool's prefork children are summed on its metrics port (multiprocess mode); trace files print
as a tree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from cachetools import LRUCache
from fakes import FakeLLM, FakeRetriever, make_passages
from opentelemetry import trace
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind
from otel_support import recorded

from adaptive_rag.contracts import (
    ANSWER_TASK, AnswerResult, AnswerTask, ErrorCode, RoutingDecision, Tier, Timings,
)
from adaptive_rag.settings import Settings
from adaptive_rag.storage import RecordStore, make_engine, upgrade_database
from adaptive_rag.tracing import INPUT_TOKENS
from infra.local.servers import free_port
from infra.local.trace_tree import read_spans, render
from workers.metrics import WorkerMetrics, pool_port, worker_metrics
from workers.telemetry import JsonLinesExporter, TracingSettings

REPO = Path(__file__).resolve().parents[2]
RUN_SPAN = f"run/{ANSWER_TASK}"
QUESTION = "Which hub status light shows after factory resetting the hub?"


def sample(metrics: WorkerMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.fixture
def celery_worker(tmp_path, monkeypatch):
    """The real `adaptive_rag.answer` task function on an app of its own (a temporary filesystem
    broker), run by an in-process worker thread, with a fake LLM and retriever and SQLite records;
    Celery instrumented as `workers.celery_app` does in a pool process."""
    from celery.contrib.testing.worker import start_worker

    import workers.tasks as tasks
    from workers.celery_app import create_app
    from workers.settings import WorkerSettings

    monkeypatch.setenv("ARAG_TRACES", "off")  # the test's in-memory provider stays the one
    settings = WorkerSettings(_env_file=None, broker_dir=tmp_path / "broker", task_max_retries=0)
    app = create_app(settings)
    app.task(bind=True, name=ANSWER_TASK, pydantic=True, acks_late=True)(tasks.answer._decorated_fun)
    url = f"sqlite:///{tmp_path / 'arag.db'}"
    upgrade_database(url)
    library = Settings(_env_file=None, top_k=2, multi_step="ircot", max_steps=2,
                       price_per_1k_prompt_tokens=0.5, price_per_1k_completion_tokens=1.5)
    llm = FakeLLM(lambda prompt: "So the answer is: the blue light.")
    resources = tasks.WorkerResources(library, RecordStore(make_engine(url)), _llm=llm,
                                      _retrievers=LRUCache(maxsize=4))
    resources._retrievers["acme"] = FakeRetriever(make_passages(3))
    monkeypatch.setattr(tasks, "_resources", resources)
    CeleryInstrumentor().instrument()
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING"):
            yield app, resources, llm
    finally:
        CeleryInstrumentor().uninstrument()


def ancestors(span, by_id) -> list[str]:
    """Names of `span`'s ancestors, nearest first, as far as they were recorded."""
    names = []
    while span.parent is not None and span.parent.span_id in by_id:
        span = by_id[span.parent.span_id]
        names.append(span.name)
    return names


def wait_for_result(store: RecordStore, request_id: str, timeout_s: float = 30.0) -> AnswerResult:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = store.get_result(request_id)
        if found is not None:
            return found
        time.sleep(0.05)
    raise AssertionError(f"no result for {request_id} within {timeout_s} s")


def test_the_task_continues_the_front_doors_trace_from_its_headers(celery_worker):
    from workers.client import CeleryTaskQueue

    app, resources, llm = celery_worker
    store = resources.store
    store.create_request("r-trace", "acme", None, QUESTION, decision=RoutingDecision(tier=Tier.C, strategy="ircot"))
    metrics = worker_metrics()
    names = ("arag_worker_prompt_tokens_total", "arag_worker_completion_tokens_total",
             "arag_worker_queue_wait_seconds_count", "arag_worker_llm_cost_total")
    before = {name: sample(metrics, name, tier="C", kind="primary") for name in names}
    runs_before = sample(metrics, "arag_worker_task_seconds_count", tier="C", kind="primary", outcome="ok")
    with recorded() as spans:
        with trace.get_tracer("tests").start_as_current_span("front door call") as call:
            CeleryTaskQueue(app).enqueue(AnswerTask(
                request_id="r-trace", tenant="acme", query=QUESTION, tier=Tier.C, strategy="ircot",
                enqueued_at=time.time()))
        result = wait_for_result(store, "r-trace")
        run = spans.one(RUN_SPAN)
    trace_id = call.get_span_context().trace_id
    send = spans.one(f"send {ANSWER_TASK}")
    assert send.kind is SpanKind.PRODUCER and send.parent.span_id == call.get_span_context().span_id
    # the worker's span: same trace, its parent the producer span that wrote the headers
    assert run.kind is SpanKind.CONSUMER and run.context.trace_id == trace_id
    by_id = {s.context.span_id: s for s in spans.in_trace(trace_id)}
    assert ancestors(run, by_id)[:2] in ([send.name, "front door call"],
                                         # an instrumented producer adds its own apply_async span
                                         [f"apply_async/{ANSWER_TASK}", send.name])
    assert run.attributes["arag.request_id"] == "r-trace" and run.attributes["arag.tier"] == "C"
    strategy = spans.one("strategy ircot")
    assert strategy.parent.span_id == run.context.span_id
    under_run = [s.name for s in sorted(spans.in_trace(trace_id), key=lambda s: s.start_time)
                 if s.parent is not None and s.parent.span_id == run.context.span_id]
    assert under_run == ["records.claim", "resources", "strategy ircot", "records.write"]
    phases = [s for s in spans.in_trace(trace_id) if s.name in ("retrieve", "generate")]
    assert {s.name for s in phases} == {"retrieve", "generate"}
    assert all(s.parent.span_id == strategy.context.span_id for s in phases)
    # tokens summed into the stored result, priced, and counted per tier
    prompt = sum(len(p.split()) for p in llm.prompts)
    completion = len(llm.calls) * len("So the answer is: the blue light.".split())
    assert (result.prompt_tokens, result.completion_tokens) == (prompt, completion)
    assert result.cost == pytest.approx((prompt * 0.5 + completion * 1.5) / 1000)
    assert strategy.attributes[INPUT_TOKENS] == prompt
    after = {name: sample(metrics, name, tier="C", kind="primary") for name in names}
    assert sample(metrics, "arag_worker_task_seconds_count", tier="C", kind="primary", outcome="ok") == runs_before + 1
    assert after["arag_worker_prompt_tokens_total"] - before["arag_worker_prompt_tokens_total"] == prompt
    assert after["arag_worker_completion_tokens_total"] - before["arag_worker_completion_tokens_total"] == completion
    assert after["arag_worker_queue_wait_seconds_count"] - before["arag_worker_queue_wait_seconds_count"] == 1
    assert after["arag_worker_llm_cost_total"] - before["arag_worker_llm_cost_total"] == pytest.approx(result.cost)


def test_failures_and_retries_are_counted_per_tier_and_code():
    metrics = WorkerMetrics()
    failed = AnswerResult(request_id="r", tier=Tier.B, strategy="single_step", error="LLM away",
                          error_code=ErrorCode.DEPENDENCY_UNAVAILABLE, timings=Timings(queue_wait_ms=120.0))
    metrics.task_done(failed, 0.4)
    metrics.task_retried("B", "primary", "transient")
    metrics.task_failed("C", "primary", ErrorCode.TIME_LIMIT.value)
    assert sample(metrics, "arag_worker_task_failures_total", tier="B", kind="primary",
                  code="dependency_unavailable") == 1
    assert sample(metrics, "arag_worker_task_seconds_count", tier="B", kind="primary",
                  outcome="dependency_unavailable") == 1
    assert sample(metrics, "arag_worker_queue_wait_seconds_sum", tier="B", kind="primary") == pytest.approx(0.12)
    assert sample(metrics, "arag_worker_task_retries_total", tier="B", kind="primary", reason="transient") == 1
    assert sample(metrics, "arag_worker_task_failures_total", tier="C", kind="primary", code="time_limit") == 1


def test_a_pools_children_are_summed_on_its_metrics_port(tmp_path):
    """Multiprocess mode as a prefork pool runs it: the main process starts the exporter, two
    forked children each finish a task, one scrape of the main process shows both."""
    port = free_port()
    script = textwrap.dedent(f"""
        import os, sys, time, urllib.request
        from pathlib import Path
        from workers.metrics import start_pool_exporter, worker_metrics
        from adaptive_rag.contracts import AnswerResult, Tier
        served = start_pool_exporter("tier-b@test", {port} - 1, Path({str(tmp_path)!r}))
        assert served == {port}, served
        for _ in range(2):
            pid = os.fork()
            if pid == 0:
                result = AnswerResult(request_id="r", tier=Tier.B, strategy="single_step", answer="x",
                                      prompt_tokens=100, completion_tokens=5)
                worker_metrics().task_done(result, 0.2)
                os._exit(0)
            os.waitpid(pid, 0)
        print(urllib.request.urlopen("http://127.0.0.1:{port}/metrics", timeout=5).read().decode())
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = {line.split(" ")[0]: float(line.split(" ")[1]) for line in done.stdout.splitlines()
             if line.startswith("arag_worker_") and " " in line}
    assert lines['arag_worker_prompt_tokens_total{kind="primary",tier="B"}'] == 200
    assert lines['arag_worker_task_seconds_count{kind="primary",outcome="ok",tier="B"}'] == 2
    assert list(tmp_path.glob("tier-b-*/counter_*.db")), "the samples live in the pool's directory"


def test_pool_ports_follow_the_pool():
    assert [pool_port(9110, f"{q}@h") for q in ("tier-a", "tier-b", "tier-c", "shadow")] == [9110, 9111, 9112, 9113]
    assert pool_port(0, "tier-a@h") is None and pool_port(9110, "other@h") is None


def test_traces_mode_defaults_to_otlp_only_with_an_endpoint(monkeypatch):
    for name in ("ARAG_TRACES", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    assert TracingSettings(_env_file=None).mode == "off"
    assert TracingSettings(_env_file=None, otlp_endpoint="http://collector:4318").mode == "otlp"
    assert TracingSettings(_env_file=None, traces="file", otlp_endpoint="http://c:4318").mode == "file"


def test_trace_files_print_as_a_tree(tmp_path):
    """Two services' files (front door, worker) of one trace -> one tree, the worker's spans
    under the front door's producer span."""
    def provider(service: str) -> TracerProvider:
        made = TracerProvider(resource=Resource.create({"service.name": service}))
        made.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(tmp_path / f"{service}.jsonl")))
        return made

    frontdoor, worker = provider("frontdoor").get_tracer("t"), provider("worker-tier-c").get_tracer("t")
    with frontdoor.start_as_current_span("/adaptive_rag.v1.AdaptiveRag/Answer", kind=SpanKind.SERVER) as root:
        with frontdoor.start_as_current_span("serving.enqueue"):
            with frontdoor.start_as_current_span(f"send {ANSWER_TASK}", kind=SpanKind.PRODUCER) as send:
                carrier = trace.set_span_in_context(send)
        with worker.start_as_current_span(RUN_SPAN, context=carrier, kind=SpanKind.CONSUMER):
            with worker.start_as_current_span("strategy ircot"):
                with worker.start_as_current_span("retrieve", attributes={"step": 1}):
                    pass
                with worker.start_as_current_span("generate", attributes={"step": 1, INPUT_TOKENS: 321}):
                    pass
    spans = list(read_spans([tmp_path]))
    assert {s["service"] for s in spans} == {"frontdoor", "worker-tier-c"}
    assert all(json.dumps(s) for s in spans)
    tree = render(spans)
    lines = tree.splitlines()
    assert lines[0].startswith(f"trace {format(root.get_span_context().trace_id, '032x')}: 7 spans")
    order = ["/adaptive_rag.v1.AdaptiveRag/Answer", "serving.enqueue", f"send {ANSWER_TASK}", RUN_SPAN,
             "strategy ircot", "retrieve", "generate"]
    assert [next(n for n in order if n in line) for line in lines[2:]] == order
    assert "[worker-tier-c]" in next(line for line in lines if RUN_SPAN in line)
    assert "step=1 input_tokens=321" in next(line for line in lines if "generate" in line)
    # the worker's run is drawn under the producer span, deeper than it
    depth = {n: next(line for line in lines if n in line).index(n) for n in (f"send {ANSWER_TASK}", RUN_SPAN)}
    assert depth[RUN_SPAN] > depth[f"send {ANSWER_TASK}"]


def test_the_dashboard_uses_only_metrics_the_services_export():
    """Every `arag_*` series in infra/deploy/grafana-dashboard.json is one the front door or a
    worker pool exports (renaming a metric breaks this test, not the dashboard in silence)."""
    import re

    from services.frontdoor.metrics import FrontDoorMetrics

    exported: set[str] = set()
    for registry in (FrontDoorMetrics().registry, WorkerMetrics().registry):
        for family in registry.collect():
            exported.add(family.name)
            exported.update(f"{family.name}{suffix}" for suffix in ("_total", "_bucket", "_sum", "_count"))
    dashboard = json.loads((REPO / "infra" / "deploy" / "grafana-dashboard.json").read_text())
    used = {name for panel in dashboard["panels"] for target in panel.get("targets", ())
            for name in re.findall(r"\barag_[a-z_]+", target["expr"])}
    assert used and used <= exported, sorted(used - exported)
    assert {"arag_worker_prompt_tokens_total", "arag_frontdoor_request_seconds_bucket"} <= used
