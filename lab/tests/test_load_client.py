"""The shared load client (`lab.harness.load_client`): what it records of each call, a good
client's retries, and the open and closed loops. Its calls go through real gRPC on loopback to a
scripted AdaptiveRag servicer (a test double of the front door, on the generated stubs), so the
stubs, metadata and trailers are the real ones; no services."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import grpc
import pytest

from adaptive_rag.contracts import CallError
from lab.harness.load_client import (
    GAVE_UP, NEVER_RAN, CallRecord, LoadClient, closed_loop, error_fields, open_loop, read_jsonl, reply_fields, tier_name,
)
from services.frontdoor.stubs import pb2, pb2_grpc

KEYS = {"acme": "arag_key-of-acme", "globex": "arag_key-of-globex"}


@dataclass
class ScriptedFrontDoor(pb2_grpc.AdaptiveRagServicer):
    """Answers `Answer` by the query: "busy" is refused (RESOURCE_EXHAUSTED, retry-after) the
    first `refusals` times per client_request_id, "slow" outlasts the front door's wait
    (DEADLINE_EXCEEDED, the request id in the trailer) and is then ready through GetResult after
    `polls` "still running" replies, "broken" is INTERNAL, "overran" passed its tier's time limit
    (final), "dependency" outlasts the wait and its run then failed for a dependency (a resend
    runs it); anything else is answered at once on tier B."""

    refusals: int = 1
    polls: int = 1
    seen: dict[str, int] = field(default_factory=dict)
    tenants: list[str] = field(default_factory=list)

    def tenant(self, context: grpc.aio.ServicerContext) -> str:
        auth = dict(context.invocation_metadata()).get("authorization", "")
        return next(t for t, k in KEYS.items() if auth == f"Bearer {k}")

    def reply(self, request_id: str, tier: int = pb2.TIER_B) -> pb2.AnswerReply:
        return pb2.AnswerReply(request_id=request_id, answer="ok", tier=tier, strategy="single_step",
                               classifier=pb2.ClassifierInfo(model_version=2, fallback=False),
                               timings=pb2.Timings(classify_ms=1.0, queue_wait_ms=2.0, strategy_ms=5.0,
                                                   total_ms=10.0))

    async def Answer(self, request, context):  # noqa: N802 - gRPC method name
        self.tenants.append(self.tenant(context))
        query, cid = request.query.decode(), request.client_request_id
        self.seen[cid] = self.seen.get(cid, 0) + 1
        if query == "busy" and self.seen[cid] <= self.refusals:
            context.set_trailing_metadata((("retry-after", "0.01"), ("x-request-id", f"r-{cid}")))
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "tier B is full; retry after 0.01 s")
        if query == "slow":  # the front door's wait ends before the answer: it says so, with the id
            context.set_trailing_metadata((("x-request-id", f"r-{cid}"),))
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"call GetResult(request_id=\"r-{cid}\")")
        if query == "broken":
            await context.abort(grpc.StatusCode.INTERNAL, "boom")
        if query == "overran":
            context.set_trailing_metadata((("x-request-id", f"r-{cid}"),
                                           ("x-error-code", CallError.ANSWER_TIME_LIMIT.value)))
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "the run passed its tier's time limit")
        if query == "dependency" and self.seen[cid] == 1:
            context.set_trailing_metadata((("x-request-id", f"dep-{cid}"),))
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "no answer within the deadline")
        return self.reply(f"r-{cid}")

    async def GetResult(self, request, context):  # noqa: N802 - gRPC method name
        self.seen[request.request_id] = self.seen.get(request.request_id, 0) + 1
        if request.request_id.startswith("dep-"):
            context.set_trailing_metadata((("x-error-code", CallError.ANSWER_DEPENDENCY_UNAVAILABLE.value),
                                           ("retry-after", "0.01")))
            await context.abort(grpc.StatusCode.UNAVAILABLE, "a service the answer needs stayed unreachable")
        if self.seen[request.request_id] <= self.polls:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"request {request.request_id} is still running; call GetResult again later")
        return self.reply(request.request_id, pb2.TIER_C)

    async def Route(self, request, context):  # noqa: N802 - gRPC method name
        return pb2.RouteReply(decision_id="d-1", tier=pb2.TIER_A, strategy="no_retrieval",
                              classifier=pb2.ClassifierInfo(fallback=True), classify_ms=0.5)


def run(coro):
    return asyncio.run(coro)


async def started() -> tuple[grpc.aio.Server, ScriptedFrontDoor, str]:
    server = grpc.aio.server()
    servicer = ScriptedFrontDoor()
    pb2_grpc.add_AdaptiveRagServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, servicer, f"127.0.0.1:{port}"


# --- records --------------------------------------------------------------------------------------


def test_an_answer_is_recorded_with_its_reply_and_its_time(tmp_path) -> None:
    async def go() -> tuple[CallRecord, list[CallRecord]]:
        server, servicer, address = await started()
        try:
            async with LoadClient(address, KEYS, journal=tmp_path / "calls.jsonl") as client:
                before = time.time()
                call = await client.answer("hello", tenant="acme", client_request_id="c-1",
                                           tags={"phase": "solo"})
                assert before <= call.start <= call.end <= time.time()
                return call, client.records
        finally:
            await server.stop(0)

    call, records = run(go())
    assert records == [call]
    assert (call.method, call.client_request_id, call.code, call.request_id) == ("Answer", "c-1", "OK", "r-c-1")
    assert (call.tier, call.strategy, call.model_version, call.fallback) == ("B", "single_step", 2, False)
    assert (call.queue_wait_ms, call.strategy_ms, call.total_ms, call.overhead_ms) == (2.0, 5.0, 10.0, 3.0)
    assert call.tenant == "acme" and call.tags == {"phase": "solo"} and call.ok
    assert call.latency_ms == pytest.approx(1000 * (call.end - call.start))
    (line,) = (tmp_path / "calls.jsonl").read_text().splitlines()
    assert json.loads(line)["type"] == "call"
    assert read_jsonl(tmp_path / "calls.jsonl") == [call]  # the journal reads back as it was


def test_a_refusal_is_recorded_with_its_status_trailers_and_tenant(tmp_path) -> None:
    async def go() -> tuple[CallRecord, ScriptedFrontDoor, LoadClient]:
        server, servicer, address = await started()
        try:
            async with LoadClient(address, KEYS) as client:
                return await client.answer("busy", tenant="globex", client_request_id="c-2"), servicer, client
        finally:
            await server.stop(0)

    call, servicer, client = run(go())
    assert (call.code, call.request_id, call.retry_after_s) == ("RESOURCE_EXHAUSTED", "r-c-2", 0.01)
    assert "tier B is full" in call.detail and not call.ok and call.tier is None
    assert servicer.tenants == ["globex"]  # the tenant's own key went with the call
    path = client.dump_jsonl(tmp_path / "dump.jsonl")
    assert read_jsonl(path) == [call]


def test_route_and_a_client_side_failure_are_records_too() -> None:
    async def go() -> tuple[CallRecord, CallRecord]:
        server, _, address = await started()
        try:
            async with LoadClient(address, KEYS["acme"]) as client:
                route = await client.route("hi")
            async with LoadClient("127.0.0.1:1", KEYS["acme"]) as nobody:  # nothing listens there
                refused = await nobody.answer("hello", timeout=0.5)
            return route, refused
        finally:
            await server.stop(0)

    route, refused = run(go())
    assert (route.method, route.code, route.request_id, route.tier, route.fallback) == ("Route", "OK", "d-1", "A", True)
    assert route.classify_ms == 0.5 and route.total_ms is None
    assert refused.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED") and refused.client_request_id


def test_a_record_keeps_only_what_it_has_and_reads_back() -> None:
    call = CallRecord("GetResult", "c-9", 1.0, 1.5, "FAILED_PRECONDITION", request_id="r-9",
                      detail="request r-9 is still queued; call GetResult again later", attempt=3)
    assert call.is_poll and not call.ok
    item = call.as_dict()
    assert "tier" not in item and "tags" not in item and item["attempt"] == 3
    assert CallRecord.from_dict({**item, "unknown": 1}) == call
    assert not CallRecord("GetResult", "c", 0, 1, "FAILED_PRECONDITION", detail="request expired; never ran").is_poll


def test_reply_and_error_fields_read_the_stubs_messages() -> None:
    reply = pb2.AnswerReply(request_id="r", tier=pb2.TIER_C, replayed=True, timings=pb2.Timings(total_ms=3.0))
    assert reply_fields(reply)["tier"] == "C" and reply_fields(reply)["replayed"] is True
    assert tier_name(pb2.TIER_UNSPECIFIED) is None and tier_name(pb2.TIER_A) == "A"

    class Refusal:
        def code(self):
            return grpc.StatusCode.UNAVAILABLE

        def details(self):
            return "x" * 1000

        def trailing_metadata(self):
            return (("retry-after", "soon"),)

    found = error_fields(Refusal())
    assert found["code"] == "UNAVAILABLE" and "retry_after_s" not in found
    assert found["detail"].startswith("bad retry-after 'soon'") and len(found["detail"]) < 400


# --- a good client --------------------------------------------------------------------------------


def test_a_good_client_resends_after_a_refusal_with_the_same_client_request_id() -> None:
    async def go():
        server, _, address = await started()
        try:
            async with LoadClient(address, KEYS["acme"]) as client:
                return await client.request("busy", budget_s=10, call_timeout_s=5, client_request_id="c-3",
                                            tags={"query_tier": "B"}), client.records
        finally:
            await server.stop(0)

    outcome, records = run(go())
    assert (outcome.final, outcome.attempts, outcome.tier, outcome.request_ids) == ("OK", 2, "B", ["r-c-3"])
    assert outcome.tags == {"query_tier": "B"} and outcome.latency_ms > 0
    assert [(r.method, r.code, r.attempt, r.client_request_id) for r in records] == [
        ("Answer", "RESOURCE_EXHAUSTED", 1, "c-3"), ("Answer", "OK", 2, "c-3")]


def test_a_deadline_is_followed_by_get_result_until_the_answer_is_there() -> None:
    async def go():
        server, _, address = await started()
        try:
            async with LoadClient(address, KEYS["acme"]) as client:
                return await client.request("slow", budget_s=10, call_timeout_s=5, poll_s=0.05,
                                            client_request_id="c-4"), client.records
        finally:
            await server.stop(0)

    outcome, records = run(go())
    assert (outcome.final, outcome.tier) == ("OK", "C")
    assert [(r.method, r.code) for r in records] == [
        ("Answer", "DEADLINE_EXCEEDED"), ("GetResult", "FAILED_PRECONDITION"), ("GetResult", "OK")]
    assert records[1].is_poll and all(r.client_request_id == "c-4" for r in records)


def test_a_good_client_stops_at_internal_and_gives_up_when_its_budget_is_spent() -> None:
    async def go():
        server, servicer, address = await started()
        servicer.refusals = 1000
        try:
            async with LoadClient(address, KEYS["acme"]) as client:
                broken = await client.request("broken", budget_s=10, call_timeout_s=5)
                spent = await client.request("busy", budget_s=0.3, call_timeout_s=5)
                return broken, spent
        finally:
            await server.stop(0)

    broken, spent = run(go())
    assert (broken.final, broken.attempts) == ("INTERNAL", 1)
    assert spent.final == GAVE_UP and spent.attempts > 1


def test_a_final_error_of_the_run_ends_the_request_and_a_failed_dependency_is_sent_again() -> None:
    """The contract's final errors end a request at once (no polling to the end of the budget);
    a GetResult that says the run failed for a dependency turns into a resend of the Answer."""
    async def go():
        server, _, address = await started()
        try:
            async with LoadClient(address, KEYS["acme"]) as client:
                overran = await client.request("overran", budget_s=10, call_timeout_s=5, client_request_id="c-5")
                resent = await client.request("dependency", budget_s=10, call_timeout_s=5, poll_s=0.01,
                                              client_request_id="c-6")
                return overran, resent, client.records
        finally:
            await server.stop(0)

    overran, resent, records = run(go())
    assert (overran.final, overran.attempts) == ("DEADLINE_EXCEEDED", 1)
    assert records[0].resolves and not records[0].ok
    assert resent.final == "OK"
    assert [(r.method, r.code) for r in records[1:]] == [
        ("Answer", "DEADLINE_EXCEEDED"), ("GetResult", "UNAVAILABLE"), ("Answer", "OK")]
    assert not records[1].resolves and not records[2].resolves
    assert not CallRecord("Answer", "c", 0, 1, "INTERNAL", error_code=CallError.INTERNAL.value).resolves
    assert CallRecord("GetResult", "c", 0, 1, "INTERNAL", error_code=CallError.ANSWER_FAILED.value).resolves


# --- load shapes ----------------------------------------------------------------------------------


def test_an_open_loop_sends_on_time_whatever_the_earlier_calls_are_doing() -> None:
    async def go():
        async def slow(k: int) -> int:
            await asyncio.sleep(0.2)  # longer than the period: calls overlap
            return k

        return await open_loop(slow, rate=50.0, count=10)

    sent = run(go())
    assert sent.results == list(range(10)) and sent.indices == list(range(10)) and sent.skipped == 0
    assert sent.max_in_flight_seen > 1 and len(sent.late_s) == 10


def test_an_open_loop_skips_what_its_in_flight_cap_does_not_allow_and_stops_when_told() -> None:
    async def go():
        stop = asyncio.Event()

        async def slow(k: int) -> int:
            await asyncio.sleep(0.3)
            return k

        async def stop_soon() -> None:
            await asyncio.sleep(0.25)
            stop.set()

        _, sent = await asyncio.gather(stop_soon(), open_loop(slow, rate=40.0, stop=stop, max_in_flight=2))
        return sent

    sent = run(go())
    assert sent.results == [0, 1] and sent.max_in_flight_seen == 2
    assert sent.skipped >= 5  # slots 2.. found both calls still out


def test_a_closed_loop_keeps_its_clients_busy_one_call_each() -> None:
    async def go():
        busy, most = 0, 0

        async def call(item: int, lane: int) -> tuple[int, int]:
            nonlocal busy, most
            busy += 1
            most = max(most, busy)
            await asyncio.sleep(0.01)
            busy -= 1
            return item, lane

        return await closed_loop(call, range(9), clients=3), most

    results, most = run(go())
    assert sorted(item for item, _ in results) == list(range(9))
    assert {lane for _, lane in results} == {0, 1, 2} and most == 3


def test_the_reason_comes_from_the_error_code_trailer() -> None:
    """A poll and a never-ran request are told by `x-error-code`, whatever the message says."""
    class Failed:
        def code(self):
            import grpc
            return grpc.StatusCode.FAILED_PRECONDITION

        def details(self):
            return "request r-1: not finished"

        def trailing_metadata(self):
            return (("x-error-code", CallError.NOT_FINISHED.value), ("x-request-id", "r-1"))

    found = error_fields(Failed())
    assert found["error_code"] == "not_finished" and found["request_id"] == "r-1"
    poll = CallRecord("GetResult", "c", 0, 1, found.pop("code"), **found)
    assert poll.is_poll and not poll.says(NEVER_RAN)
    never = CallRecord("GetResult", "c", 0, 1, "FAILED_PRECONDITION", detail="still words",
                       error_code=CallError.NEVER_RAN.value)
    assert never.says(NEVER_RAN) and not never.is_poll
