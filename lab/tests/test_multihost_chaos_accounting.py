"""The multi-host fault campaign's own accounting (`lab.experiments.multihost_chaos`) on synthetic
client logs and records: answers delivered twice with different content, runs per request, and
the goals of a window. The rest (lost, stranded, recovery) is the single-host campaign's, tested in
test_chaos_accounting.py."""

from __future__ import annotations

from lab.experiments.chaos import Record
from lab.experiments.multihost_chaos import delivered_twice_different, headline, runs_per_request, window_goals
from lab.harness.load_client import CallRecord, answer_digest

W = "w02-host-kill-r1"


def ok(cid: str, rid: str, answer: str | None, method: str = "Answer", t: float = 0.0) -> CallRecord:
    return CallRecord(method, cid, t, t + 0.1, "OK", request_id=rid,
                      answer_digest=None if answer is None else answer_digest(answer))


def test_one_answer_per_request_matching_the_records_is_not_delivered_twice() -> None:
    calls = [ok(f"{W}.00001", "r1", "Lumora."), ok(f"{W}.00002", "r2", "Lumora.")]
    stored = {"r1": answer_digest("Lumora."), "r2": answer_digest("Lumora.")}
    assert delivered_twice_different(W, calls, stored) == []


def test_two_request_ids_for_one_client_request_are_two_different_deliveries() -> None:
    """The same text under two request ids: the request ran as two requests; a later GetResult of
    either would name a different request."""
    calls = [ok(f"{W}.00001", "r1", "Lumora."), ok(f"{W}.00001", "r9", "Lumora.", "GetResult", 5.0)]
    assert delivered_twice_different(W, calls, {}) == [f"{W}.00001"]


def test_the_same_answer_delivered_twice_is_not_a_different_one() -> None:
    calls = [ok(f"{W}.00001", "r1", "Lumora."), ok(f"{W}.00001", "r1", "Lumora.", "GetResult", 5.0)]
    assert delivered_twice_different(W, calls, {"r1": answer_digest("Lumora.")}) == []


def test_a_delivered_answer_the_records_keep_differently_counts() -> None:
    """A second run rewrote the result after the client had the first: a resend would get another answer."""
    calls = [ok(f"{W}.00003", "r3", "Lumora.")]
    assert delivered_twice_different(W, calls, {"r3": answer_digest("Another answer.")}) == [f"{W}.00003"]


def test_failed_calls_other_windows_and_replies_without_a_digest_are_left_out() -> None:
    calls = [CallRecord("Answer", f"{W}.00004", 0.0, 1.0, "UNAVAILABLE", request_id="r4"),
             ok(f"{W}.00004", "r5", "Lumora."),
             ok("w03-other-r1.00001", "r6", "x"), ok("w03-other-r1.00001", "r7", "y"),
             ok(f"{W}.00005", "r8", None), ok(f"{W}.00005", "r9", None)]
    assert delivered_twice_different(W, calls, {"r4": answer_digest("old")}) == []
    assert delivered_twice_different("w03-other-r1", calls, {}) == ["w03-other-r1.00001"]


def test_runs_per_request_counts_each_accepted_request_of_the_window() -> None:
    records = [Record("r1", f"{W}.00001", "done", 1, 1, runs=1), Record("r2", f"{W}.00002", "done", 1, 1, runs=2),
               Record("r3", f"{W}.00003", "done", 1, 1, runs=1), Record("r4", f"{W}.00004", "queued", 0, 0, runs=0),
               Record("r5", "w09-x-r1.00001", "done", 1, 1, runs=5)]
    got = runs_per_request(W, records)
    assert got["histogram"] == {"0": 1, "1": 2, "2": 1}
    assert got["mean"] == 1.0 and got["max"] == 2
    assert runs_per_request("w07-none-r1", records) == {"histogram": {}, "mean": None, "max": None}


def _row(**over: object) -> dict:
    row = {"window": W, "lost": 0, "twice_different": 0, "recovery_s": 12.0, "stranded": 0, "duplicates": 0,
           "wrong_codes": 0, "sent": 100}
    row.update(over)
    return row


def test_a_window_passes_only_with_nothing_lost_nothing_twice_and_recovery_within_30_s() -> None:
    assert all(window_goals(_row()).values())
    assert window_goals(_row(lost=1))["lost"] is False
    assert window_goals(_row(twice_different=1))["twice_different"] is False
    assert window_goals(_row(recovery_s=31.0))["recovery"] is False
    assert window_goals(_row(recovery_s=None))["recovery"] is False  # never recovered in its window
    assert window_goals(_row(stranded=2))["stranded"] is False


def test_the_headline_counts_the_tail_and_names_an_unrecovered_window() -> None:
    rows = [_row(pass_=True) | {"pass": True}, _row(lost=3, recovery_s=None) | {"pass": False}]
    tail = _row(window="tail", lost=1, sent=20)
    line = headline({"rows": rows, "tail": tail})
    assert line.startswith("1 of 2 windows met every goal; 4 lost, 0 delivered twice differently of 220 sent")
    assert line.endswith("not recovered in one window")


def test_the_slowest_request_is_the_longest_ok_of_its_window() -> None:
    from lab.experiments.multihost_chaos import slowest_ms
    from lab.harness.load_client import Outcome

    outcomes = [Outcome(f"{W}.00001", 10.0, 10.5, "OK", 1), Outcome(f"{W}.00002", 11.0, 24.0, "OK", 3),
                Outcome(f"{W}.00003", 12.0, 99.0, "GAVE_UP", 9), Outcome("w09-x-r1.00001", 0.0, 50.0, "OK", 1)]
    assert slowest_ms(W, outcomes) == 13000.0
    assert slowest_ms("w05-none-r1", outcomes) is None
