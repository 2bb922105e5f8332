"""The chain-reader experiment's bookkeeping: which questions each split reads, the train choice,
and the figures recomputed from records (paired differences, time ratios, complete chains)."""

from __future__ import annotations

from adaptive_rag.domain import Passage
from adaptive_rag.evaluation.datasets import Question
from adaptive_rag.evaluation.runner import Outcome
from lab.experiments.chain_reader import (
    B,
    DATASETS,
    GoldPassages,
    choose,
    readme,
    summarise,
    table,
    sample_test,
    first_train,
)


def questions(n: int = 20) -> list[Question]:
    return [Question(f"{d}-{i}", d, f"q {d} {i}?", ("a",), (f"T{d}{i}", f"U{d}{i}"))
            for d in DATASETS for i in range(n)]


def test_test_subset_is_seeded_per_set_and_independent_of_file_order() -> None:
    pool = questions()
    first = sample_test(pool, 5, seed=31)
    assert len(first) == 15 and all(sum(q.dataset == d for q in first) == 5 for d in DATASETS)
    assert [q.id for q in sample_test(list(reversed(pool)), 5, seed=31)] == [q.id for q in first]
    assert {q.id for q in sample_test(pool, 5, seed=32)} != {q.id for q in first}
    assert {q.id for q in first} <= {q.id for q in sample_test(pool, 7, seed=31)}  # a larger draw extends it


def test_train_subset_takes_each_set_equally() -> None:
    chosen = first_train(questions(), 4)
    assert all(sum(q.dataset == d for q in chosen) == 4 for d in DATASETS)


def outcome(dataset: str, i: int, name: str, f1: float, seconds: float, ids: tuple[str, ...] = ()) -> Outcome:
    return Outcome(f"{dataset}-{i}", dataset, name, "x", 1, seconds, 0.0, f1, 0.0, list(ids))


def records(c_gain: float, c_name: str = "evidence@5", c_time: float = 2.0) -> dict:
    found = {}
    for d in DATASETS:
        for i in range(10):
            b = 0.2 + 0.05 * (i % 3)
            found[(d, f"{d}-{i}", B)] = outcome(d, i, B, b, 4.0, (f"p{d}{i}",))
            found[(d, f"{d}-{i}", c_name)] = outcome(d, i, c_name, b + c_gain, 4.0 * c_time,
                                                     (f"p{d}{i}", f"r{d}{i}"))
    return found


def test_summary_pairs_c_with_b_per_question() -> None:
    pool = {(q.dataset, q.id): q for q in questions(10)}
    titles = {f"p{d}{i}": f"T{d}{i}" for d in DATASETS for i in range(10)}
    titles |= {f"r{d}{i}": f"U{d}{i}" for d in DATASETS for i in range(10)}
    summary = summarise(records(0.1), pool, titles)
    c = summary["evidence@5"]
    for d in DATASETS:
        assert c[d]["minus_b"] == {"mean": 10.0, "low": 10.0, "high": 10.0}
        assert c[d]["time_ratio_b"] == 2.0 and c[d]["all_supporting_read"] == 100.0
        assert summary[B][d]["all_supporting_read"] == 0.0 and "minus_b" not in summary[B][d]
    assert c["sets"]["minus_b_mean_of_sets"]["mean"] == 10.0 and c["sets"]["time_ratio_b"] == 2.0
    assert "| **evidence@5** | mean of sets | 30 |" in table(summary)


def test_choice_is_the_best_mean_f1_ties_to_fewer_passages() -> None:
    pool = {(q.dataset, q.id): q for q in questions(10)}
    summary = summarise({**records(0.1, "evidence@8"), **records(0.1, "evidence@3"), **records(-0.1, "evidence@5")},
                        pool, {})
    assert choose(summary) == "evidence@3"
    summary = summarise({**records(0.2, "evidence@8"), **records(0.1, "evidence@3")}, pool, {})
    assert choose(summary) == "evidence@8"
    assert choose(summarise(records(0.1, "gold"), pool, {})) is None


def test_readme_says_when_c_does_not_beat_b() -> None:
    pool = {(q.dataset, q.id): q for q in questions(10)}
    worse = summarise(records(-0.1, "evidence@3"), pool, {})
    text = readme({"summary": {"train": worse, "test": worse}, "chosen_on_train": "evidence@3"})
    assert "C is below B" in text and "-10.0" in text
    better = summarise(records(0.1, "evidence@3"), pool, {})
    assert "C beats B" in readme({"summary": {"train": better, "test": better}, "chosen_on_train": "evidence@3"})


class _Search:
    def search(self, query: str, k: int) -> list[Passage]:
        return [Passage("t2", "T", "second"), Passage("t1", "T", "first")]


def test_gold_passages_by_title_the_best_ranked_of_a_shared_title() -> None:
    corpus = [Passage("t1", "T", "first"), Passage("t2", "T", "second"), Passage("u", "U", "other")]
    gold = GoldPassages(corpus, _Search())
    found = gold.of(Question("q", "2wiki", "q?", ("a",), ("T", "U", "missing")))
    assert [p.id for p in found] == ["t2", "u"]


def test_readme_gives_no_verdict_on_a_partial_test() -> None:
    pool = {(q.dataset, q.id): q for q in questions(10)}
    found = {k: v for k, v in records(0.3, "evidence@3").items() if k[0] != "hotpotqa"}
    text = readme({"summary": {"test": summarise(found, pool, {})}, "chosen_on_train": "evidence@3"})
    assert "partial" in text and "C beats B" not in text
