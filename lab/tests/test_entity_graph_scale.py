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
    write = {"write_passages": 100, "rebuild_edits_s": 40.0, "update_edits_s": 2.0, "rematched_edits": 100,
             "rebuild_titles_s": 40.0, "update_titles_s": 10.0, "rematched_titles": 400}
    rows = [{"passages": 25_000, "entities": 20_000, "edges": 40_000, "hubs": 10, "build_s": 10.0, "graph_mb": 20.0,
             "peak_mb": 30.0, "process_mb": 300.0, "walk_ms_median": 50.0, "load_average": 2.0, **write},
            {"passages": 100_000, "entities": 80_000, "edges": 160_000, "hubs": 40, "build_s": 45.0, "graph_mb": 90.0,
             "peak_mb": 120.0, "process_mb": 900.0, "walk_ms_median": 200.0, "load_average": 2.5, **write}]
    text = markdown(rows, "python -m lab.experiments.entity_graph_scale")
    assert "builds in **45 s** (4.5x" in text and "**90 MB**" in text and "(4.5x)" in text and "(median; 4.0x)" in text
    assert "**2.00 s** against a fresh build's 40.0 s when the write edits texts (**0.05x**)" in text
    assert "**10.0 s** against 40.0 s when it adds 50 titles (**0.25x**" in text


def test_a_write_changes_texts_and_adds_passages_with_known_first_words(corpus) -> None:
    from lab.experiments.entity_graph_scale import WRITE_CHANGED, WRITE_NEW, written

    after = written(corpus)
    assert len(after) == len(corpus) + WRITE_NEW
    assert sum(a.text != b.text for a, b in zip(after, corpus)) == WRITE_CHANGED
    assert all(p.title.endswith(" revised") for p in after[len(corpus):])
    edits = written(corpus, new_titles=False)
    assert len(edits) == len(corpus) and sum(a.text != b.text for a, b in zip(edits, corpus)) == WRITE_CHANGED + WRITE_NEW
