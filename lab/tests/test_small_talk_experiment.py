"""The small-talk experiment's scoring: recall counts only small-talk replies, a false positive is
any canned reply to a real request, the unseen subset leaves out training examples, and the report
recomputes from its records."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.experiments.small_talk import Record, judge, read_records, score
from lab.harness.stats import wilson_interval


def record(detector: str, decided: str | None, kind: str = "small_talk", source: str = "greet",
           text: str = "hi", in_training: bool = False, accepted: tuple[str, ...] = ("greeting",)) -> Record:
    dataset = "real-requests" if kind == "request" and source in ("nq", "covid-faq") else "rasa-demo"
    return Record(dataset, source, kind, text, accepted if kind == "small_talk" else (), in_training, detector, decided)


def sample() -> list[Record]:
    return [
        record("learned", "greeting", text="hi"),
        record("learned", "thanks", text="hello there"),          # recalled, wrong intent
        record("learned", "acknowledgement", text="heya"),        # the prompt is not recall
        record("learned", "greeting", text="hello", in_training=True),
        record("learned", None, kind="request", source="nq", text="who wrote dune"),
        record("learned", "acknowledgement", kind="request", source="covid-faq", text="masks?"),
        record("rules", "greeting", text="hi"),
        record("rules", None, text="hello there"),
        record("rules", None, text="heya"),
        record("rules", "greeting", text="hello", in_training=True),
        record("rules", None, kind="request", source="nq", text="who wrote dune"),
        record("rules", None, kind="request", source="covid-faq", text="masks?"),
    ]


def test_recall_intent_and_false_positives_are_counted_as_defined() -> None:
    summary = score(sample())
    learned, rules = summary["detectors"]["learned"], summary["detectors"]["rules"]
    assert (learned["recall"]["hits"], learned["recall"]["n"]) == (3, 4)
    assert (learned["recall_unseen"]["hits"], learned["recall_unseen"]["n"]) == (2, 3)
    assert learned["intent_correct"]["hits"] == 2
    assert (learned["false_positives"]["hits"], learned["false_positives"]["n"]) == (1, 2)
    assert learned["false_positives_per_source"]["covid-faq"]["hits"] == 1
    assert learned["false_positive_examples"] == ["masks? -> acknowledgement"]
    assert (rules["recall"]["hits"], rules["false_positives"]["hits"]) == (2, 0)
    assert summary["recall_difference_learned_minus_rules"]["estimate"] == pytest.approx(0.25)
    assert summary["targets"]["false_positives_met"] is False


def test_a_zero_proportion_gets_a_wilson_interval_beside_its_flat_bootstrap() -> None:
    rules = score(sample())["detectors"]["rules"]["false_positives"]
    assert (rules["estimate"], rules["low"], rules["high"]) == (0.0, 0.0, 0.0)
    assert rules["wilson_low"] == 0.0 and rules["wilson_high"] > 0.3


def test_wilson_interval_matches_known_values() -> None:
    low, high = wilson_interval(0, 100)
    assert low == 0.0 and high == pytest.approx(0.0370, abs=1e-4)
    low, high = wilson_interval(50, 100)
    assert (low, high) == (pytest.approx(0.4038, abs=1e-4), pytest.approx(0.5962, abs=1e-4))
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_judge_runs_every_detector_and_the_report_recomputes_from_its_records(tmp_path: Path) -> None:
    import gzip
    import json
    from dataclasses import asdict

    rows = [{"set": "rasa-demo", "source": "greet", "kind": "small_talk", "text": "hi", "accepted": ("greeting",),
             "in_training": False},
            {"set": "real-requests", "source": "nq", "kind": "request", "text": "who wrote dune", "accepted": (),
             "in_training": False}]
    records = judge(rows, {"learned": lambda t: "greeting" if t == "hi" else None, "rules": lambda t: None})
    assert [(r.detector, r.decided) for r in records] == [("learned", "greeting"), ("learned", None),
                                                         ("rules", None), ("rules", None)]
    path = tmp_path / "records.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.writelines(json.dumps(asdict(r)) + "\n" for r in records)
    assert score(read_records(path)) == score(records)
