"""The dense-rerank gate: how each variant orders the candidates, and what its report concludes."""

from __future__ import annotations

import numpy as np

from adaptive_rag.domain import Passage
from lab.experiments.dense_rerank import VARIANTS, readme, rankings, summarise


def _passage(n: int) -> Passage:
    return Passage(id=f"p{n}", title=f"T{n}", text=f"text {n}")


def test_the_cosine_order_reranks_the_same_candidates_and_the_fusions_keep_them() -> None:
    first, chain = [_passage(n) for n in (1, 2, 3)], [_passage(n) for n in (1, 4, 2)]
    pool = [_passage(n) for n in (1, 2, 3, 4, 5)]
    # p5 is the nearest to the question, then p2; p1 the farthest.
    vectors = {f"p{n}": np.array([c, np.sqrt(1 - c * c)]) for n, c in
               ((1, 0.0), (2, 0.8), (3, 0.3), (4, 0.5), (5, 1.0))}
    nearest = [_passage(5), _passage(2)]
    ranked = rankings(first, chain, pool, vectors, np.array([1.0, 0.0]), nearest)
    assert set(ranked) == set(VARIANTS)
    assert [p.id for p in ranked["dense"]] == ["p2", "p4", "p1"]
    assert ranked["bm25"] == first and ranked["chain"] == chain
    assert {p.id for p in ranked["chain+dense"]} == {"p1", "p2", "p4"}
    assert {p.id for p in ranked["chain+dense-pool"]} == {"p1", "p2", "p3", "p4", "p5"}  # the pool adds p3, p5
    assert [p.id for p in ranked["bm25+dense"]][0] == "p2"  # 2nd by BM25, 1st by cosine
    assert [p.id for p in ranked["hybrid"]][:2] == ["p2", "p1"] and "p5" in {p.id for p in ranked["hybrid"]}


def _records(group: str, chain: list[float], other: list[float]) -> list[dict]:
    rows = []
    for variant in VARIANTS:
        values = chain if variant == "chain" else other
        rows += [{"group": group, "id": f"{group}{i}", "split": "train", "variant": variant,
                  "complete@5": v, "complete@8": v, "recall@5": v, "recall@8": v, "found": []}
                 for i, v in enumerate(values)]
    return rows


def test_a_variant_below_the_chain_fails_the_gate_and_test_is_not_read() -> None:
    records = (_records("2wiki", [1, 1, 1, 0], [1, 0, 0, 0]) + _records("musique", [0, 0, 1, 0], [1, 0, 1, 0])
               + _records("hotpotqa", [1, 1, 0, 0], [1, 0, 0, 0]))
    summary = summarise(records)
    assert summary["mean_complete@5"]["chain"] > summary["mean_complete@5"]["dense"]
    assert summary["sets"]["musique"]["dense"]["complete@5 - chain"]["estimate"] == 0.25
    report = {"summary": summary, "split": "train", "command": "python -m lab.experiments.dense_rerank",
              "title_boost": 1.0, "pool": 20, "corpus_passages_embedded": 12,
              "encoder": {"base": {"description": "MiniLM"}, "max_length": 128, "sha256": "0" * 64},
              "embed_ms_per_question": {"median": 100.0, "n": 4}}
    text = readme(report)
    assert text.count("**Answer.** No") == 1 and "`test` was not read" in text
    assert "MuSiQue alone" in text and "+25.0" in text
