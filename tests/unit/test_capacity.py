"""The capacity planner: Erlang C and the M/M/c time-in-system distribution against textbook values,
a numerical convolution and a seeded simulation; the planner's minimal answer; the `arag capacity`
command's errors and JSON output."""

from __future__ import annotations

import heapq
import json
import math
import random
import sys

import pytest

from adaptive_rag.capacity import (
    LN20, CapacityError, UnreachableTargetError, erlang_c, evaluate_tier, parse_service_time_report,
    parse_tier_values, plan_capacity, plan_tier, queue_length_target, response_percentile,
    response_tail, wait_percentile, wait_tail,
)

EXAMPLE_MIX = {"A": 0.6, "B": 0.3, "C": 0.1}
EXAMPLE_TIMES = {"A": 0.15, "B": 1.8, "C": 4.5}


def erlang_c_direct(c: int, a: float) -> float:
    """The textbook formula term by term (fine for small c)."""
    top = a**c / math.factorial(c) * c / (c - a)
    return top / (sum(a**k / math.factorial(k) for k in range(c)) + top)


# --- Erlang C and the M/M/c distributions ----------------------------------------------------------


@pytest.mark.parametrize("rho", [0.1, 0.5, 0.9, 0.99])
def test_one_worker_is_mm1(rho: float) -> None:
    lam, mu = rho * 2.0, 2.0
    assert erlang_c(1, lam / mu) == pytest.approx(rho)  # P(wait) = rho
    plan = evaluate_tier("A", lam, 1 / mu, 1, 1e6)
    assert plan.wq_mean_s == pytest.approx(rho / (mu - lam))  # Wq = rho / (mu - lam)
    assert plan.lq == pytest.approx(rho**2 / (1 - rho))
    for t in (0.1, 1.0, 5.0):  # M/M/1 time in system is Exp(mu - lam)
        assert response_tail(t, lam, mu, 1) == pytest.approx(math.exp(-(mu - lam) * t), rel=1e-12)
    assert response_percentile(lam, mu, 1) == pytest.approx(LN20 / (mu - lam), rel=1e-9)


def test_two_workers_by_hand() -> None:
    """lam 1.5, mu 1, c 2: a = 1.5; C = (a^2/2 * 2/(2-a)) / (1 + a + a^2/2 * 2/(2-a)) = 4.5/7;
    Wq = C / (2 - 1.5) = 9/7; Lq = 1.5 * 9/7 = 27/14 (= 2 rho^3 / (1 - rho^2) with rho = 0.75)."""
    assert erlang_c(2, 1.5) == pytest.approx(4.5 / 7)
    plan = evaluate_tier("B", 1.5, 1.0, 2, 100.0)
    assert plan.prob_wait == pytest.approx(4.5 / 7)
    assert plan.wq_mean_s == pytest.approx(9 / 7)
    assert plan.lq == pytest.approx(27 / 14)
    assert plan.utilization == pytest.approx(0.75)
    assert wait_tail(2.0, 1.5, 1.0, 2) == pytest.approx(4.5 / 7 * math.exp(-0.5 * 2.0))
    assert wait_percentile(1.5, 1.0, 2) == pytest.approx(math.log(4.5 / 7 / 0.05) / 0.5)
    assert plan.response_mean_s == pytest.approx(9 / 7 + 1)


@pytest.mark.parametrize(("c", "a", "expected"), [(10, 8.0, 0.4092), (5, 4.0, 0.5541), (3, 2.0, 0.4444)])
def test_erlang_c_table_values(c: int, a: float, expected: float) -> None:
    assert erlang_c(c, a) == pytest.approx(expected, abs=5e-5)
    assert erlang_c(c, a) == pytest.approx(erlang_c_direct(c, a), rel=1e-12)


def test_erlang_c_is_stable_for_large_pools() -> None:
    value = erlang_c(2000, 1900.0)
    assert 0 < value < 1 and math.isfinite(value)
    assert erlang_c(1, 0.0) == 0.0


def test_theta_equal_mu_limit() -> None:
    """c mu - lam = mu (lam 1, mu 1, c 2): P(T > t) = e^{-t} (1 + C t), C = 1/3; continuous around it."""
    for t in (0.5, 2.0, 7.0):
        exact = math.exp(-t) * (1 + t / 3)
        assert response_tail(t, 1.0, 1.0, 2) == pytest.approx(exact, rel=1e-12)
        assert response_tail(t, 1.0 + 1e-9, 1.0, 2) == pytest.approx(exact, rel=1e-6)
        assert response_tail(t, 1.0 - 1e-9, 1.0, 2) == pytest.approx(exact, rel=1e-6)


@pytest.mark.parametrize(("lam", "mu", "c"), [(1.5, 1.0, 2), (8.0, 1.0, 10), (0.5, 1.0, 3), (30.0, 2.0, 17)])
def test_response_tail_matches_numerical_convolution(lam: float, mu: float, c: int) -> None:
    """P(T > t) = P(Wq = 0) P(S > t) + int_0^t f_Wq(w) P(S > t - w) dw + P(Wq > t), by Simpson's rule."""
    cw, theta = erlang_c(c, lam / mu), c * mu - lam
    for t in (0.3, 1.0, 4.0):
        n = 4000
        h = t / n
        f = [cw * theta * math.exp(-theta * w) * math.exp(-mu * (t - w)) for w in (i * h for i in range(n + 1))]
        integral = h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))
        numeric = (1 - cw) * math.exp(-mu * t) + integral + cw * math.exp(-theta * t)
        assert response_tail(t, lam, mu, c) == pytest.approx(numeric, rel=1e-9)


def test_response_p95_matches_a_seeded_simulation() -> None:
    """FIFO M/M/3 simulated (each task takes the earliest free worker): empirical p95 within 3 %."""
    lam, mu, c, n = 2.4, 1.0, 3, 200_000
    rng = random.Random(7)
    free = [0.0] * c
    now, times = 0.0, []
    for _ in range(n):
        now += rng.expovariate(lam)
        start = max(now, heapq.heappop(free))
        done = start + rng.expovariate(mu)
        heapq.heappush(free, done)
        times.append(done - now)
    times.sort()
    empirical = times[int(0.95 * n)]
    assert empirical == pytest.approx(response_percentile(lam, mu, c), rel=0.03)


def test_p95_decreases_in_workers() -> None:
    lam, mu = 40.0, 1 / 0.5
    p95s = [response_percentile(lam, mu, c) for c in range(21, 60)]
    waits = [wait_percentile(lam, mu, c) for c in range(21, 60)]
    assert all(a >= b for a, b in zip(p95s, p95s[1:]))
    assert all(a > b for a, b in zip(p95s[:10], p95s[1:11]))  # strictly while waits still matter
    assert all(a >= b for a, b in zip(waits, waits[1:]))
    assert p95s[-1] == pytest.approx(LN20 * 0.5, rel=1e-6)  # many workers: the service p95 alone


def test_unstable_queue_is_refused() -> None:
    with pytest.raises(CapacityError, match="unstable queue"):
        response_percentile(2.0, 1.0, 2)


# --- the planner -----------------------------------------------------------------------------------


def _meets(lam: float, s: float, c: int, target: float, umax: float) -> bool:
    if lam * s >= c or lam * s / c > umax:
        return False
    return response_percentile(lam, 1 / s, c) <= target


@pytest.mark.parametrize(
    ("lam", "s", "target", "umax", "binding"),
    [
        (300.0, 0.15, 10.0, 0.8, "utilization"),
        (10.0, 1.0, 3.2, 0.99, "p95"),   # target close to s ln 20: the wait must nearly vanish
        (0.2, 4.5, 30.0, 0.8, "utilization"),  # light load: one worker
        (50.0, 4.5, 14.0, 0.99, "p95"),  # 231 workers, utilization bound alone: 228
        (7.0, 1.0, 3.05, 1.0, "p95"),
        (1.0, 1.0, 3.5, 0.99, "p95"),
    ],
)
def test_planner_answer_is_minimal(lam: float, s: float, target: float, umax: float, binding: str) -> None:
    plan = plan_tier("X", lam, s, target, umax)
    assert plan.binding == binding
    assert _meets(lam, s, plan.workers, target, umax)
    assert plan.workers == 1 or not _meets(lam, s, plan.workers - 1, target, umax)
    assert plan.utilization <= umax and plan.response_p95_s <= target


def test_queue_length_target_formula() -> None:
    assert queue_length_target(4, 2.0, 2.5) == 20  # floor(4 * 2 * 2.5)
    assert queue_length_target(3, 1 / 1.8, 8.2) == math.floor(3 / 1.8 * 8.2)
    assert queue_length_target(5, 1.0, 0.0) == 0
    plan = plan_tier("B", 150.0, 1.8, 10.0, 0.8)
    assert plan.wait_budget_s == pytest.approx(8.2)
    assert plan.queue_length_target == math.floor(plan.workers / 1.8 * 8.2)
    assert plan.list_length_per_worker == math.floor(8.2 / 1.8)
    # a task arriving behind `target` queued tasks waits target / (c mu) <= the budget; one more exceeds it
    assert plan.queue_length_target / (plan.workers / 1.8) <= 8.2 < (plan.queue_length_target + 1) / (plan.workers / 1.8)


def test_unreachable_target_names_the_smallest_p95() -> None:
    with pytest.raises(UnreachableTargetError, match=r"smallest achievable p95 is just above 13\.481 s"):
        plan_tier("C", 50.0, 4.5, 10.0)


def test_500_queries_per_second_example() -> None:
    """The brief's example: 500 q/s, A .6 / B .3 / C .1, 0.15 / 1.8 / 4.5 s, p95 10 s, utilization 0.8.
    Under exponential service C cannot meet 10 s (its service alone has p95 4.5 ln 20 = 13.48 s);
    A and B get finite counts, and C gets one with a reachable target."""
    with pytest.raises(UnreachableTargetError) as info:
        plan_capacity(500.0, EXAMPLE_MIX, EXAMPLE_TIMES, 10.0, 0.8)
    assert "tier C" in str(info.value) and "tier A" not in str(info.value)
    plan = plan_capacity(500.0, EXAMPLE_MIX, EXAMPLE_TIMES, {"A": 10.0, "B": 10.0, "C": 15.0}, 0.8)
    workers = {t.tier: t.workers for t in plan.tiers}
    assert workers == {"A": 57, "B": 338, "C": 282}  # all bound by utilization 0.8: ceil(a / 0.8)
    for t in plan.tiers:
        assert t.workers == math.ceil(t.offered_load / 0.8 - 1e-9)
        assert math.isfinite(t.response_p95_s) and t.response_p95_s <= t.p95_target_s
    assert plan.total_workers == 677


@pytest.mark.parametrize(
    ("mix", "times", "message"),
    [
        ({"A": 0.6, "B": 0.3}, EXAMPLE_TIMES, "mix shares sum to 0.9, not 1"),
        ({"A": 0.6, "B": 0.3, "D": 0.1}, EXAMPLE_TIMES, "unknown tier(s) 'D' in mix"),
        ({"A": 1.1, "B": -0.1}, EXAMPLE_TIMES, "mix share of tier B must be a positive number"),
        (EXAMPLE_MIX, {"A": 0.15, "B": 1.8}, "no service time for tier(s) C"),
        (EXAMPLE_MIX, {"A": 0.15, "B": 0.0, "C": 4.5}, "tier B service time must be a positive number"),
    ],
)
def test_planner_input_errors(mix: dict[str, float], times: dict[str, float], message: str) -> None:
    with pytest.raises(CapacityError) as info:
        plan_capacity(500.0, mix, times, 20.0)
    assert message in str(info.value)


def test_mix_within_tolerance_and_bad_rate() -> None:
    plan = plan_capacity(10.0, {"A": 0.6, "B": 0.3, "C": 0.1 + 5e-7}, EXAMPLE_TIMES, 20.0)
    assert [t.tier for t in plan.tiers] == ["A", "B", "C"]
    with pytest.raises(CapacityError, match="rate must be a positive number"):
        plan_capacity(0.0, EXAMPLE_MIX, EXAMPLE_TIMES, 20.0)


def test_parse_tier_values() -> None:
    assert parse_tier_values("a=0.6, B=0.3,C=0.1", "--mix") == {"A": 0.6, "B": 0.3, "C": 0.1}
    for text, message in (("A=x", "is not a number"), ("A0.6", "expected TIER=VALUE"),
                          ("A=1,A=2", "given twice"), ("A=-1", "must be a positive number")):
        with pytest.raises(CapacityError, match=message):
            parse_tier_values(text, "--mix")


def test_service_time_report_schemas() -> None:
    assert parse_service_time_report({"service_time_s": {"A": 0.15, "B": 1.8, "C": 4.5}}) == EXAMPLE_TIMES
    per_tier = {"per_tier": {"a": {"service_time_s": 0.15, "p95_s": 0.4}, "B": {"service_time_s": 1.8},
                             "shadow": {"service_time_s": 9.0}, "C": {"service_time_s": None}},
                "service_time_s": {"C": 4.5}, "rate": 20}
    assert parse_service_time_report(per_tier) == EXAMPLE_TIMES
    for bad, message in (([], "expected a JSON object"), ({"x": 1}, "has no service times"),
                         ({"service_time_s": {"A": "fast"}}, "not a number"),
                         ({"service_time_s": {"A": -1}}, "must be a positive number")):
        with pytest.raises(CapacityError, match=message):
            parse_service_time_report(bad)


# --- the command -----------------------------------------------------------------------------------


def run_capacity(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from adaptive_rag.cli import app
    from adaptive_rag.cli.common import run_app

    monkeypatch.setattr(sys, "argv", ["arag", "capacity", *args])
    monkeypatch.setenv("COLUMNS", "200")
    try:
        run_app(app)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, " ".join(err.split())


BASE = ("--rate", "500", "--mix", "A=0.6,B=0.3,C=0.1")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--mix", "A=0.6,B=0.3", "--p95", "20", "--service-times", "A=1,B=1"), "mix shares sum to 0.9, not 1"),
        (("--mix", "A=0.6,B=0.3,E=0.1", "--p95", "20", "--service-times", "A=1,B=1,C=1"), "unknown tier(s) 'E' in --mix"),
        (("--mix", "A=1", "--p95", "20", "--service-times", "A=0"), "--service-times of tier A must be a positive number"),
        (("--mix", "A=1", "--p95", "-3", "--service-times", "A=1"), "tier A p95 target must be a positive number"),
        (("--mix", "A=1", "--p95", "20"), "give exactly one of --service-times and --from-report"),
        (("--mix", "A=1", "--p95", "20", "--from-report", "/nonexistent/report.json"), "service-time report not found"),
        (("--mix", "A=0.6,B=0.3,C=0.1", "--p95", "10", "--service-times", "A=0.15,B=1.8,C=4.5"),
         "tier C: p95 target 10 s is unreachable"),
    ],
)
def test_cli_errors_exit_2(monkeypatch, capsys, args: tuple[str, ...], message: str) -> None:
    code, _, err = run_capacity(monkeypatch, capsys, "--rate", "500", *args)
    assert code == 2, err
    assert message in err
    assert "Traceback" not in err


def test_cli_rejects_non_positive_rate(monkeypatch, capsys) -> None:
    code, _, err = run_capacity(monkeypatch, capsys, "--rate", "0", "--mix", "A=1", "--p95", "20",
                                "--service-times", "A=1")
    assert code == 2 and "rate must be a positive number" in err


def test_cli_json_output(monkeypatch, capsys, tmp_path) -> None:
    report = tmp_path / "load.json"
    report.write_text(json.dumps({"per_tier": {t: {"service_time_s": s} for t, s in EXAMPLE_TIMES.items()}}))
    code, out, err = run_capacity(monkeypatch, capsys, *BASE, "--p95", "A=10,B=10,C=15",
                                  "--from-report", str(report), "--concurrency", "8", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["total_workers"] == 677 and data["concurrency"] == 8
    rows = {row["tier"]: row for row in data["tiers"]}
    assert {t: r["workers"] for t, r in rows.items()} == {"A": 57, "B": 338, "C": 282}
    assert rows["C"]["replicas"] == math.ceil(282 / 8)
    assert rows["B"]["list_length_per_replica"] == 8 * math.floor(8.2 / 1.8)
    for key in ("arrival_rate", "service_time_s", "utilization", "lq", "wq_mean_s", "wq_p95_s",
                "response_p95_s", "queue_length_target", "binding"):
        assert key in rows["A"]


def test_cli_table_and_help(monkeypatch, capsys) -> None:
    code, out, err = run_capacity(monkeypatch, capsys, *BASE, "--p95", "A=10,B=10,C=15",
                                  "--service-times", "A=0.15,B=1.8,C=4.5")
    assert code == 0, err
    assert "677 workers" in out and "queue target" in out
    code, out, _ = run_capacity(monkeypatch, capsys, "--help")
    text = " ".join(out.split())
    for phrase in ("Poisson", "exponential service", "FIFO", "one task at a time", "Erlang C",
                   "not exponential", "load run", "tasks ahead of you"):
        assert phrase in text, phrase
