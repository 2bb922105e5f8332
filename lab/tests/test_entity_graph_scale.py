"""The entity-graph scale measure: its corpus copies and its report."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.experiments.entity_graph_scale import markdown, scaled_corpus

DATA_DIR = Path(__file__).resolve().parents[3] / "shared" / "data"


@pytest.fixture(scope="module")
def corpus() -> list:
    if not DATA_DIR.is_dir():
        pytest.skip("benchmark data not found in ../shared/data")
    return scaled_corpus(DATA_DIR, 30_000)


def test_copies_are_new_passages_and_new_entities_with_the_same_text(corpus) -> None:
    assert len(corpus) == 30_000
    assert len({p.id for p in corpus}) == len(corpus)
    copy = corpus[-1]
    original = next(p for p in corpus if copy.id.startswith(p.id + "-"))
    assert copy.text == original.text and copy.title.startswith(original.title + " ") and copy.title != original.title


def test_the_report_states_each_ratio_against_the_smallest_size() -> None:
    rows = [{"passages": 25_000, "entities": 20_000, "edges": 40_000, "hubs": 10, "build_s": 10.0, "graph_mb": 20.0,
             "peak_mb": 30.0, "process_mb": 300.0, "walk_ms_median": 50.0, "load_average": 2.0},
            {"passages": 100_000, "entities": 80_000, "edges": 160_000, "hubs": 40, "build_s": 45.0, "graph_mb": 90.0,
             "peak_mb": 120.0, "process_mb": 900.0, "walk_ms_median": 200.0, "load_average": 2.5}]
    text = markdown(rows, "python -m lab.experiments.entity_graph_scale")
    assert "builds in **45 s** (4.5x" in text and "**90 MB**" in text and "(4.5x)" in text and "(median; 4.0x)" in text
