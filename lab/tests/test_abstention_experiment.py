"""The abstention experiment (`lab.experiments.abstention`): which candidate the `train` rule picks,
and a whole run on the support data (when present) whose pick is the rule the product ships."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adaptive_rag.knowledge.calibration import FLOOR, QUANTILE
from lab.experiments.abstention import main, pick

DATA_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def test_the_pick_is_the_best_mean_separation_within_the_false_abstention_budget() -> None:
    table = [
        {"candidate": "catches all, refuses too much", "cells": {"a": (1.0, 0.2), "b": (1.0, 0.0)}},
        {"candidate": "good", "cells": {"a": (0.9, 0.05), "b": (0.7, 0.02)}},
        {"candidate": "cautious", "cells": {"a": (0.5, 0.0), "b": (0.5, 0.0)}},
    ]
    assert [row.get("picked", False) for row in pick(table)] == [False, True, False]


def test_a_run_writes_its_records_and_picks_the_shipped_rule_on_train(tmp_path: Path) -> None:
    if not (DATA_DIR / "covid-faq_en_covid-qa.csv").is_file():
        pytest.skip(f"support data not found in {DATA_DIR}")
    main(["--data-dir", str(DATA_DIR), "--out", str(tmp_path), "--split", "train"])
    report = json.loads((tmp_path / "report.json").read_text())
    (picked,) = [row["candidate"] for row in report["candidates"] if row.get("picked")]
    assert picked == f"relevance: reference q{QUANTILE:g}, floor {FLOOR:g}"
    assert set(report["knowledge_bases"]) == {"support", "demo"}
    assert (tmp_path / "records.jsonl.gz").is_file() and "(picked)" in (tmp_path / "report.md").read_text()
