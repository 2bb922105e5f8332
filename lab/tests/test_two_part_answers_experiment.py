"""The two-part answers experiment's scoring and summary from its records (no reader)."""

from __future__ import annotations

from lab.experiments.two_part_answers import Reply, gold_parts, recall, render, summarize


def test_gold_answers_split_into_parts_and_a_part_is_scored_by_its_token_recall():
    assert gold_parts("Lumora Pro; 120 requests per minute") == ["Lumora Pro", "120 requests per minute"]
    assert gold_parts("1100 lumens and 1600 lumens") == ["1100 lumens", "1600 lumens"]
    assert gold_parts("2 years") == ["2 years"]
    assert recall("120 requests per minute", "It allows 120 requests a minute [1].") == 0.75
    assert recall("1600 lumens", "1100 lumens") == 0.5


def reply(way: str, qid: str, seconds: float, parts: list[float]) -> Reply:
    return Reply("kb", qid, way, "q", "a", True, seconds, 100, 10, 1 if way == "B" else 2, parts)


def test_the_summary_counts_replies_with_both_parts_and_compares_time_with_b(tmp_path):
    replies = [reply("B", "1", 10.0, [1.0, 0.0]), reply("B", "2", 20.0, [1.0, 1.0]),
               reply("C whole", "1", 30.0, [1.0, 0.4]), reply("C whole", "2", 40.0, [1.0, 1.0]),
               reply("C parts", "1", 15.0, [1.0, 0.6]), reply("C parts", "2", 25.0, [0.9, 1.0])]
    summary = summarize(replies, {"parallel": 4})
    assert [summary["ways"][w]["both_parts"] for w in ("B", "C whole", "C parts")] == [1, 1, 2]
    assert summary["time_vs_b"]["C parts"]["ratio_of_medians"] == 20.0 / 15.0
    assert summary["time_vs_b"]["C whole"]["median_ratio_to_b"] == (3.0 + 2.0) / 2
    render(tmp_path, summary)
    text = (tmp_path / "README.md").read_text()
    assert "**2 of 2**" in text and "**1.33x B's**" in text and ": met." in text
