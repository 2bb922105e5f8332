"""The small-talk latency experiment's summary and report from its call records (no stack)."""

from __future__ import annotations

import json

from lab.experiments.small_talk_latency import Call, render, summarize


def calls() -> list[Call]:
    out = [Call("idle", "small_talk", "hi", "OK", ms, 0.0, "A", "small_talk", True) for ms in (4.0, 5.0, 6.0)]
    out += [Call("loaded", "small_talk", "hi", "OK", ms, 0.0, "A", "small_talk", True) for ms in (8.0, 10.0, 12.0)]
    out.append(Call("loaded", "small_talk", "bye", "UNAVAILABLE", 1.0, 0.0))
    out.append(Call("loaded", "question", "How long is the warranty?", "OK", 9_000.0, 0.0, "B", "single_step"))
    return out


def test_the_summary_reads_the_loaded_and_idle_small_talk_and_counts_the_front_doors_answers(tmp_path):
    summary = summarize(calls(), 4, {"stack": {}})
    idle, loaded = summary["phases"]["idle"], summary["phases"]["loaded"]
    assert (idle["p50_ms"], loaded["p50_ms"], loaded["n"], loaded["ok"]) == (5.0, 10.0, 4, 3)
    assert loaded["answered_by_front_door"] == 3 and summary["loaded_over_idle_p50"] == 2.0
    assert summary["background"] == {"answers": 1, "ok": 1, "by_tier": {"A": 0, "B": 1, "C": 0}, "p50_s": 9.0}
    render(tmp_path, json.loads(json.dumps(summary, default=str)))
    text = (tmp_path / "README.md").read_text()
    assert "**10.0 ms p50**" in text and "| loaded | 3 of 4 | 10.0 |" in text and text.count("Yes:") == 1
