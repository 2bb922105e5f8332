"""The fault campaign's accounting (`lab.experiments.chaos`) on synthetic client logs and records: what
counts as lost, duplicated, a wrong code, and when clients count as served again."""

from __future__ import annotations

import pytest

from lab.experiments.chaos import Record, account_window, goals, per_second, recovery, serving_at, window_of
from lab.harness.load_client import CallRecord, Outcome

W = "w01-redis-restart-r1"


def attempt(cid: str, n: int, method: str, start: float, end: float, code: str, tier: str | None = None,
            rid: str | None = None, retry_after: float | None = None, detail: str = "") -> CallRecord:
    """One call of the load client's log, as the accounting reads it."""
    return CallRecord(method, cid, start, end, code, request_id=rid, tier=tier, attempt=n,
                      retry_after_s=retry_after, detail=detail)


def steady(start: float, end: float, rate: float = 5.0, code: str = "OK", latency: float = 0.2,
           window: str = W) -> list[CallRecord]:
    """Calls sent every 1/rate s in [start, end), each ending `latency` later with `code`."""
    out, t, n = [], start, 0
    while t < end:
        n += 1
        out.append(attempt(f"{window}.{n:05d}", 1, "Answer", t, t + latency, code))
        t += 1.0 / rate
    return out


def test_window_of_takes_the_prefix_before_the_sequence_number() -> None:
    assert window_of("w03-postgres-down-r2.00042") == "w03-postgres-down-r2"
    assert window_of(None) is None
    assert window_of("no-sequence") is None


def test_an_accepted_request_without_result_that_was_not_rejected_is_stranded() -> None:
    records = [
        Record("r1", f"{W}.00001", "done", 1, 1),
        Record("r2", f"{W}.00002", "running", 0, 0),  # stranded
        Record("r3", f"{W}.00003", "rejected", 0, 0),  # never ran: a resend runs it
        Record("r4", f"{W}.00004", "queued", 0, 1),  # only a shadow result: still stranded
        Record("r5", "w02-other-r1.00001", "queued", 0, 0),  # another window
    ]
    row = account_window(W, records, [], [])
    assert row["accepted"] == 4
    assert row["answered"] == 1
    assert row["never_ran"] == 1
    assert row["stranded"] == 2
    assert sorted(row["stranded_ids"]) == ["r2", "r4"]
    assert row["stranded_status"] == {"running": 1, "queued": 1}
    assert goals({**row, "recovery_s": 0.0})["stranded"] is False


def test_lost_is_sent_minus_answered_in_time_as_the_client_log_tells_it() -> None:
    """The records cannot see a request the front door never wrote, nor a client that gave up
    on a request the records show answered: only the client's log can."""
    calls = [
        attempt(f"{W}.00001", 1, "Answer", 0.0, 0.2, "OK", "B", "r1"),
        # refused until its budget ran out, never recorded
        attempt(f"{W}.00002", 1, "Answer", 1.0, 1.1, "UNAVAILABLE", retry_after=1.0),
        # answered in the records, but after the client gave up polling
        attempt(f"{W}.00003", 1, "Answer", 2.0, 5.0, "DEADLINE_EXCEEDED", rid="r3"),
        # its run's final error: resolved, not lost
        CallRecord("Answer", f"{W}.00004", 3.0, 4.0, "DEADLINE_EXCEEDED", request_id="r4",
                   error_code="answer_time_limit", detail="the run passed its tier's time limit"),
        # answered, but past the grace
        attempt(f"{W}.00005", 1, "Answer", 4.0, 4.5, "DEADLINE_EXCEEDED", rid="r5"),
        attempt(f"{W}.00005", 2, "GetResult", 60.0, 60.1, "OK", "B", "r5"),
        # the client's own INTERNAL: the run failed for no final reason the contract names
        attempt(f"{W}.00007", 1, "Answer", 6.0, 6.5, "INTERNAL", rid="r7"),
    ]
    outcomes = [
        Outcome(f"{W}.00001", 0.0, 0.2, "OK", 1, "B", ["r1"]),
        Outcome(f"{W}.00002", 1.0, 91.0, "GAVE_UP", 30),
        Outcome(f"{W}.00003", 2.0, 92.0, "GAVE_UP", 40, None, ["r3"]),
        Outcome(f"{W}.00004", 3.0, 4.0, "DEADLINE_EXCEEDED", 1, None, ["r4"]),
        Outcome(f"{W}.00005", 4.0, 60.1, "OK", 2, "B", ["r5"]),
        Outcome(f"{W}.00007", 6.0, 6.5, "INTERNAL", 1, None, ["r7"]),
    ]
    # sent (the send note), never ended: the campaign stopped with it in flight
    sends = {f"{W}.{i:05d}": float(i - 1) for i in range(1, 8)} | {"w02-other-r1.00001": 0.0}
    records = [Record("r1", f"{W}.00001", "done", 1, 1), Record("r3", f"{W}.00003", "done", 1, 1),
               Record("r4", f"{W}.00004", "error", 1, 1, error_code="time_limit"),
               Record("r5", f"{W}.00005", "done", 1, 1), Record("r6", f"{W}.00006", "done", 1, 1),
               Record("r7", f"{W}.00007", "error", 1, 1, error_code="internal")]
    row = account_window(W, records, outcomes, calls, grace_s=30.0, sends=sends)
    assert row["sent"] == 7 and row["client_answered"] == 2 and row["lost"] == 5
    assert row["lost_reasons"] == {"gave_up": 2, "late": 1, "unfinished": 1, "final INTERNAL": 1}
    assert row["lost_unrecorded"] == 1
    assert f"{W}.00002: gave_up, never recorded" in row["lost_cids"]
    assert row["stranded"] == 0  # every accepted request has its result row: the records see nothing
    assert goals({**row, "recovery_s": 0.0})["lost"] is False
    # the grace is the operator's: a wider one takes the late answer in
    assert account_window(W, records, outcomes, calls, grace_s=60.0, sends=sends)["lost"] == 4
    assert account_window(W, [], [], [])["sent"] == 0 and goals(
        {**account_window(W, [], [], []), "recovery_s": 0.0})["lost"] is True


def test_a_request_that_ran_twice_is_reported_though_it_has_one_result_row() -> None:
    records = [
        Record("r1", f"{W}.00001", "done", 1, 1, runs=1, deliveries=1),
        Record("r2", f"{W}.00002", "done", 1, 1, runs=2, deliveries=2),  # delivered again
        Record("r3", f"{W}.00003", "done", 1, 1, runs=3, deliveries=1),  # re-admitted by resends
        Record("r4", f"{W}.00004", "done", 1, 1, attempts=2),  # a row from before `runs`
    ]
    row = account_window(W, records, [], [])
    assert row["duplicates"] == 0
    assert row["reruns"] == 3 and row["extra_runs"] == 4
    assert (row["reruns_same_message"], row["reruns_resent"]) == (1, 1)
    assert row["rerun_ids"][0] == "r3: 3 runs"
    assert all(goals({**row, "recovery_s": 0.0}).values())  # reported, not a goal


def test_two_primary_results_or_two_request_ids_for_one_client_id_are_duplicates() -> None:
    records = [Record("r1", f"{W}.00001", "done", 2, 2), Record("r2", f"{W}.00002", "done", 1, 2),
               Record("r9", f"{W}.00002", "done", 1, 1), Record("r3", f"{W}.00003", "done", 1, 1)]
    outcomes = [
        Outcome(f"{W}.00001", 0.0, 1.0, "OK", 1, "B", ["r1"]),
        Outcome(f"{W}.00002", 0.0, 1.0, "OK", 2, "B", ["r2", "r9"]),  # the resend got a new request
        Outcome(f"{W}.00003", 0.0, 1.0, "OK", 2, "B", ["r3", "r3"]),  # the same id twice: fine
    ]
    row = account_window(W, records, outcomes, [])
    assert row["duplicates"] == 2
    assert set(row["duplicate_ids"]) == {"r1", f"{W}.00002"}
    assert row["reruns"] == 0 and row["extra_runs"] == 0


def test_a_request_id_that_was_never_recorded_is_not_a_duplicate() -> None:
    """UNAVAILABLE while the records are away names a request id it could not write."""
    records = [Record("r2", f"{W}.00001", "done", 1, 1)]
    attempts = [attempt(f"{W}.00001", 1, "Answer", 0.0, 0.1, "UNAVAILABLE", rid="r1"),
                attempt(f"{W}.00001", 2, "Answer", 2.0, 2.5, "OK", "B", "r2")]
    outcomes = [Outcome(f"{W}.00001", 0.0, 2.5, "OK", 2, "B", ["r1", "r2"])]
    assert account_window(W, records, outcomes, attempts)["duplicates"] == 0
    # answered under two ids (e.g. an Answer replay and a GetResult of another id): a duplicate
    attempts.append(attempt(f"{W}.00001", 3, "GetResult", 3.0, 3.1, "OK", "B", "r1"))
    assert account_window(W, records, outcomes, attempts)["duplicates"] == 1


def test_internal_and_unknown_are_wrong_codes_unavailable_is_not() -> None:
    attempts = [
        attempt(f"{W}.00001", 1, "Answer", 0.0, 1.0, "UNAVAILABLE", retry_after=2.0),
        attempt(f"{W}.00001", 2, "Answer", 3.0, 3.5, "OK", "A", "r1"),
        attempt(f"{W}.00002", 1, "Answer", 0.0, 1.0, "INTERNAL"),
        attempt(f"{W}.00003", 1, "Answer", 0.0, 1.0, "UNKNOWN"),
    ]
    records = [Record("r4", f"{W}.00004", "error", 1, 1, error_code="internal"),
               Record("r5", f"{W}.00005", "error", 1, 1, error_code="dependency_unavailable")]
    row = account_window(W, records, [], attempts)
    assert row["wrong_codes"] == 3  # two statuses + one internal result
    assert row["error_results"] == {"internal": 1, "dependency_unavailable": 1}
    assert row["answered_ok"] == 0
    assert goals({**row, "recovery_s": 1.0})["wrong_codes"] is False


def test_latency_percentiles_are_over_the_requests_answered_from_first_send() -> None:
    outcomes = [Outcome(f"{W}.{i:05d}", 10.0, 10.0 + i / 10, "OK", 1) for i in range(1, 11)]
    outcomes.append(Outcome(f"{W}.00099", 10.0, 100.0, "GAVE_UP", 30))
    row = account_window(W, [], outcomes, [])
    assert row["p50_ms"] == pytest.approx(550.0)
    assert row["p95_ms"] == pytest.approx(955.0)
    assert row["client_ok"] == 10 and row["client_not_ok"] == 1


def test_no_disturbance_recovers_at_once() -> None:
    attempts = steady(0, 100)
    rec = recovery(attempts, [], injected=50.0, end=99.0, pre_s=15.0)
    assert rec.seconds == 0.0
    assert rec.pre_ok_per_s == pytest.approx(5.0, abs=0.1)


def test_recovery_is_when_the_window_is_good_again_and_stays_good() -> None:
    # OK until 50 s, failing calls from 50 to 62 s, OK again after
    attempts = steady(0, 50) + steady(50, 62, code="UNAVAILABLE") + steady(62, 120)
    rec = recovery(attempts, [], injected=50.0, end=110.0, pre_s=15.0)
    assert rec.first_bad_s == pytest.approx(1.0)
    # the last failure ends at 62.0: the 5 s window holds failures until t = 67
    assert rec.seconds == pytest.approx(17.0)


def test_silence_counts_as_not_recovered() -> None:
    # nothing finishes between 50 and 70 s (calls hang), then every call is OK
    attempts = steady(0, 50) + steady(70, 120)
    rec = recovery(attempts, [], injected=50.0, end=110.0, pre_s=15.0)
    assert rec.seconds is not None and 20.0 <= rec.seconds <= 25.0


def test_health_not_serving_keeps_the_fault_open() -> None:
    attempts = steady(0, 120)
    health = [(49.0, True), (52.0, False), (80.0, True)]
    rec = recovery(attempts, health, injected=50.0, end=110.0, pre_s=15.0)
    assert rec.seconds == pytest.approx(30.0)
    assert serving_at(health, 51.0) is True and serving_at(health, 60.0) is False
    assert goals({"lost": 0, "stranded": 0, "duplicates": 0, "wrong_codes": 0, "recovery_s": rec.seconds})["recovery"] is True


def test_never_recovered_within_the_window_is_none_and_fails_the_goal() -> None:
    attempts = steady(0, 50) + steady(50, 120, code="UNAVAILABLE")
    rec = recovery(attempts, [], injected=50.0, end=110.0, pre_s=15.0)
    assert rec.seconds is None
    assert goals({"lost": 0, "stranded": 0, "duplicates": 0, "wrong_codes": 0, "recovery_s": None})["recovery"] is False


def test_a_slow_recovery_fails_the_goal() -> None:
    attempts = steady(0, 50) + steady(50, 85, code="UNAVAILABLE") + steady(85, 150)
    rec = recovery(attempts, [], injected=50.0, end=140.0, pre_s=15.0)
    assert rec.seconds == pytest.approx(40.0)
    assert goals({"lost": 0, "stranded": 0, "duplicates": 0, "wrong_codes": 0, "recovery_s": rec.seconds})["recovery"] is False


def test_still_running_polls_are_neither_successes_nor_failures() -> None:
    attempts = steady(0, 120)
    attempts += [attempt(f"{W}.9{i:04d}", 2, "GetResult", 60.0 + i * 0.1, 60.0 + i * 0.1 + 0.01,
                         "FAILED_PRECONDITION", detail="request x is still running; call GetResult again later")
                 for i in range(100)]
    rec = recovery(attempts, [], injected=50.0, end=110.0, pre_s=15.0)
    assert rec.seconds == 0.0
    row = account_window(W, [], [], attempts)
    assert row["polls"] == 100
    assert "FAILED_PRECONDITION" not in row["codes"]


def test_per_second_counts_ok_and_failed_calls() -> None:
    attempts = [attempt("a.1", 1, "Answer", 0.0, 0.5, "OK"), attempt("a.2", 1, "Answer", 0.0, 1.5, "UNAVAILABLE"),
                attempt("a.3", 1, "Answer", 0.0, 1.7, "OK")]
    assert per_second(attempts, 0.0, 3.0) == {"ok": [1, 1, 0], "failed": [0, 1, 0]}
