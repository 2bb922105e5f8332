"""The ceiling benchmark's bisection between the last sustained and the first failed rate."""

from __future__ import annotations

from benchmarks.ceiling import refine


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
