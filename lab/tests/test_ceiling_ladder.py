"""The ceiling benchmark: the bisection between the last sustained and the first failed rate, and
the front door's own overhead at shares of the ceiling."""

from __future__ import annotations

from lab.experiments.ceiling import overhead_summary, refine, write_report


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
