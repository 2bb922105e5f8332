"""The ceiling benchmark: the bisection between the last sustained and the first failed rate, and
the front door's own overhead at shares of the ceiling."""

from __future__ import annotations

import pytest

from lab.experiments.ceiling import (
    DEFAULT_P95_BOUND, DEFAULT_P95_BOUNDS, P95Bound, in_trials, overhead_summary, refine, sustain_reasons, write_report,
)


def ladder_point(limit: float, tried: list[float]):
    def point(rate, users, window, what):
        tried.append(rate)
        return {"rate": rate, "sustained": rate <= limit, "what": what}
    return point


def test_refine_halves_the_bracket_twice_and_keeps_the_highest_sustained_rate():
    tried: list[float] = []
    best = refine({"rate": 100.0, "sustained": True}, 140.0, ladder_point(125.0, tried),
                  lambda rate, latency: 10, lambda rate: 20.0, 0.05)
    assert tried == [120.0, 130.0]  # 120 held, then 130 failed
    assert best["rate"] == 120.0


def test_refine_stops_when_the_bracket_is_already_narrow():
    tried: list[float] = []
    best = refine({"rate": 100.0, "sustained": True}, 103.0, ladder_point(1e9, tried),
                  lambda rate, latency: 10, lambda rate: 20.0, 0.05)
    assert tried == [] and best["rate"] == 100.0


def test_overhead_is_what_neither_the_strategy_nor_the_queue_took():
    replies = [{"total_ms": 20.0 + i, "queue_wait_ms": 5.0, "strategy_ms": 10.0, "classify_ms": 1.5}
               for i in range(101)]
    replies.append({"total_ms": 9.0, "queue_wait_ms": None, "strategy_ms": 1.0})  # no timings: left out
    own = overhead_summary(replies)
    assert own["n"] == 101
    assert own["p50"] == 55.0 and own["p99"] == 104.0 and own["classify_p50"] == 1.5
    assert overhead_summary([])["p50"] is None


def test_the_report_shows_the_overhead_at_every_share_of_the_ceiling(tmp_path):
    def point(what, rate, share=None, own=None):
        p = {"what": what, "rate": rate, "users": 4, "window_s": 20.0, "offered_rps": rate,
             "answered_rps": rate, "routed": {"A": 0, "B": 10, "C": 0}, "sustained": True,
             "verdict": "sustained", "latency_ms": {"p50": 20.0, "p95": 30.0, "p99": 40.0, "n": 10},
             "depth": {"last": 0, "max": 1, "slope_per_s": 0.0, "series": {"tier-b": [(0.0, 0), (1.0, 1)]}},
             "stages": {}, "cpu_pct": {"front door": 30.0, "pool B": 20.0}, "replies": []}
        if share is not None:
            p["share_of_ceiling"] = share
            p["overhead_ms"] = {"p50": own, "p95": own * 2, "p99": own * 3, "n": 10, "classify_p50": 1.0}
        return p

    points = [point("ladder", 100.0), point("at10", 10.0, 0.1, 4.5), point("at25", 25.0, 0.25, 6.0),
              point("at50", 50.0, 0.5, 9.5)]
    result = {"command": "test", "started": "now", "machine": "m", "planner": [],
              "modes": {"instant": {"stack": {}, "tiers": {"B": {"points": points, "ceiling": 100.0}}}}}
    write_report(result, tmp_path)
    text = (tmp_path / "README.md").read_text()
    assert "| B | 100.00 | 10 % | 10.00 | 10.00 | 50 | 20 | 30 | 40 | 4.5 / 9.0 / 13.5 | 1.0 | 10 | True |" in text
    assert "| B | 100.00 | 25 % |" in text and "9.5 / 19.0 / 28.5" in text
    assert (tmp_path / "ceiling_instant.png").stat().st_size > 0


# --- the sustained verdict: a p95 bound, three trials ----------------------------------------------


def test_a_rate_whose_p95_passes_the_bound_is_not_sustained_though_its_queue_is_stable():
    steady = {"tier-b": [(float(t), 1.0) for t in range(20)]}
    held = sustain_reasons(10.0, 20.0, 200, 200, {}, steady, p95_ms=300.0, p95_bound_ms=645.0)
    assert held == []
    late = sustain_reasons(10.0, 20.0, 200, 200, {}, steady, p95_ms=921.0, p95_bound_ms=645.0)
    assert late == ["p95 921 ms > bound 645 ms"]
    assert sustain_reasons(10.0, 20.0, 200, 200, {}, steady, p95_ms=921.0, p95_bound_ms=None) == []
    assert sustain_reasons(10.0, 20.0, 0, 0, {}, {}, p95_ms=None, p95_bound_ms=645.0)[-1] == "no answer to take a p95 of"


def test_the_bound_is_relative_to_the_light_load_p95_or_absolute():
    assert P95Bound.parse("3x").ms_for(215.0) == 645.0
    assert P95Bound.parse("800ms").ms_for(215.0) == 800.0 and P95Bound.parse("2s").ms_for(None) == 2000.0
    assert P95Bound.parse("3x").ms_for(None) is None
    assert P95Bound.parse(DEFAULT_P95_BOUND).factor == 3.0
    for bad in ("1x", "0.5x", "-3ms", "fast", "3", "3x,4x", "1s,800ms", "3x,"):
        with pytest.raises(ValueError):
            P95Bound.parse(bad)


def test_a_relative_and_an_absolute_bound_together_hold_a_rate_to_the_stricter():
    both = P95Bound.parse("3x,1s")
    assert (both.factor, both.ms) == (3.0, 1000.0)
    assert both.ms_for(100.0) == 300.0  # a quiet machine: 3x its light-load p95
    assert both.ms_for(450.0) == 1000.0  # a busy one: the light-load p95 no longer loosens it past 1 s
    assert both.ms_for(None) is None  # the relative part has nothing to scale: no bound, no ceiling
    assert str(both) == "the stricter of 3x the light-load p95 and 1000 ms"
    # the instant LLM's default caps every tier at 1 s; with the model the bound stays relative
    assert P95Bound.parse(DEFAULT_P95_BOUNDS["instant"]).ms_for(450.0) == 1000.0
    assert P95Bound.parse(DEFAULT_P95_BOUNDS["llm-server"]).ms_for(4500.0) == 13500.0
    late = sustain_reasons(10.0, 20.0, 200, 200, {}, {}, p95_ms=1100.0, p95_bound_ms=both.ms_for(450.0))
    assert late == ["p95 1100 ms > bound 1000 ms"]


def test_a_rate_holds_only_when_every_trial_does_and_the_first_failure_ends_it():
    verdicts = {1: True, 2: False, 3: True}
    ran: list[int] = []

    def trial(k):
        ran.append(k)
        return {"rate": 5.0, "sustained": verdicts[k], "verdict": "sustained" if verdicts[k] else "p95 900 ms > bound 600 ms",
                "latency_ms": {"p50": 100.0, "p95": 300.0 if verdicts[k] else 900.0}}

    failed = in_trials(5.0, trial, 3)
    assert ran == [1, 2] and failed["sustained"] is False and failed["trials"] == 2
    assert failed["verdict"] == "trial 2/3: p95 900 ms > bound 600 ms"
    assert failed["trial_p95_ms"] == [300.0, 900.0]
    verdicts[2] = True
    held = in_trials(5.0, trial, 3)
    assert held["sustained"] is True and held["verdict"] == "sustained in 3 of 3 trials"
    assert in_trials(5.0, lambda k: None, 3)["sustained"] is False  # skipped: not shown to hold


def test_the_ceiling_is_the_highest_rate_within_the_bound_in_three_trials(monkeypatch, tmp_path):
    """A fake tier: answers everything offered up to 40/s, but its p95 climbs with the rate
    (a queue that stays stable while answers come later); the third trial at 32.5/s is late."""
    import lab.experiments.ceiling as ceiling

    calls: list[tuple[float, float | None]] = []
    windows: list[float] = []
    noisy = {"n": 0}

    def fake_point(st, *, out, tier, rate, users, ramp_s, window_s, answer_timeout, ramp_cap_s=40.0,
                   p95_bound_ms=None):
        calls.append((rate, p95_bound_ms))
        windows.append(window_s)
        if rate == 0:  # the closed-loop probe
            p95, answered = 900.0, 50.0
        else:
            p95, answered = 100.0 + 10.0 * rate, min(rate, 40.0)
            if rate == 32.5:
                noisy["n"] += 1
                p95 += 300.0 if noisy["n"] == 3 else 0.0
        reasons = sustain_reasons(rate, window_s, int(rate * window_s), int(answered * window_s), {}, {},
                                  p95, p95_bound_ms) if rate else []
        return {"tier": tier, "rate": rate, "users": users, "window_s": window_s, "offered_rps": rate,
                "answered_rps": answered, "latency_ms": {"p50": p95 / 2, "p95": p95, "p99": p95, "n": int(answered * window_s)},
                "cpu_pct": {},
                "depth": {"last": 0, "slope_per_s": 0.0}, "overhead_ms": {}, "sustained": not reasons if rate else None,
                "verdict": "; ".join(reasons) or "sustained", "replies": []}

    monkeypatch.setattr(ceiling, "run_point", fake_point)

    class Quiet:
        def print(self, *args, **kwargs):
            pass

    plan = ceiling.ModePlan("instant", ramp_s=1.0)
    tp = ceiling.TierPlan(probe_users=4, probe_window_s=10, window_s=5, max_window_s=10,
                          fractions=(0.5, 0.8), latency_points=False)
    res = ceiling.measure_tier(None, plan, "B", tp, tmp_path, None, Quiet(), P95Bound.parse("3x"), trials=3)
    # reference at 10 % of the probe's 50/s: p95 150 ms -> bound 450 ms, i.e. rates up to 35/s
    assert res["reference_p95_ms"] == 150.0 and res["p95_bound_ms"] == 450.0
    assert calls[1] == (5.0, None)  # the reference itself is measured without a bound
    assert windows[1] == 8.0 and res["reference_n"] == 40  # long enough for 40 answers at 5/s
    # 25/s holds; 40/s fails its first trial; the bisection: 32.5/s holds twice, not three times
    assert [(r["rate"], r["sustained"], r["trials"]) for r in res["rates"]] == [
        (25.0, True, 3), (40.0, False, 1), (32.5, False, 3), (28.75, True, 3)]
    assert res["rates"][2]["verdict"] == "trial 3/3: p95 725 ms > bound 450 ms"
    assert res["ceiling"] == 28.75
    assert all(bound == 450.0 for rate, bound in calls[2:])


@pytest.mark.parametrize("given, reference_run, bound_ms", [("3x,300ms", True, 300.0), ("300ms", False, 300.0),
                                                             ("3x,1s", True, 450.0)])
def test_an_absolute_cap_tightens_the_relative_bound_and_alone_needs_no_reference(monkeypatch, tmp_path, given,
                                                                                  reference_run, bound_ms):
    """A fake tier whose p95 is 100 ms + 10 ms per offered Answer/s (light load at 5/s: 150 ms)."""
    import lab.experiments.ceiling as ceiling

    rates: list[float] = []

    def fake_point(st, *, out, tier, rate, users, ramp_s, window_s, answer_timeout, ramp_cap_s=40.0,
                   p95_bound_ms=None):
        rates.append(rate)
        p95 = 900.0 if rate == 0 else 100.0 + 10.0 * rate
        answered = 50.0 if rate == 0 else rate
        reasons = sustain_reasons(rate, window_s, int(rate * window_s), int(rate * window_s), {}, {},
                                  p95, p95_bound_ms) if rate else []
        return {"tier": tier, "rate": rate, "users": users, "window_s": window_s, "offered_rps": rate,
                "answered_rps": answered, "latency_ms": {"p50": p95 / 2, "p95": p95, "p99": p95, "n": 40},
                "cpu_pct": {}, "depth": {"last": 0, "slope_per_s": 0.0}, "overhead_ms": {},
                "sustained": not reasons if rate else None, "verdict": "; ".join(reasons) or "sustained",
                "replies": []}

    monkeypatch.setattr(ceiling, "run_point", fake_point)

    class Quiet:
        def print(self, *args, **kwargs):
            pass

    tp = ceiling.TierPlan(probe_users=4, probe_window_s=10, window_s=5, max_window_s=10, fractions=(0.3, 0.5, 0.8),
                          latency_points=False)
    res = ceiling.measure_tier(None, ceiling.ModePlan("instant", ramp_s=1.0), "B", tp, tmp_path, None, Quiet(),
                               P95Bound.parse(given), trials=3)
    assert (rates[1] == 5.0) is reference_run  # the light-load reference, only for a relative part
    assert res["p95_bound_ms"] == bound_ms
    # a rate holds (3 trials) while its p95, 100 + 10 R ms, is within the bound; the ladder (15, 25,
    # 40/s) and its bisection end at 20/s under 300 ms, at 32.5/s under 450 ms
    assert res["ceiling"] == {300.0: 20.0, 450.0: 32.5}[bound_ms]
    assert all((100.0 + 10.0 * r["rate"] <= bound_ms) == r["sustained"] for r in res["rates"])
    assert all(r["trials"] == 3 for r in res["rates"] if r["sustained"])
