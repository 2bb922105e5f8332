"""Labels: the cheapest-correct rule, the binary fallback, storage through Alembic, resumability."""

from __future__ import annotations

import pytest
from fakes import FakeLLM, FakeRetriever, make_passages
from sqlalchemy import inspect

from adaptive_rag.training.labelling import (
    choose_label, is_correct, label_questions, limit_per_dataset,
)
from adaptive_rag.contracts import Tier
from adaptive_rag.evaluation.datasets import Question
from adaptive_rag.evaluation.runner import Outcome
from adaptive_rag.storage import LabelStore, TrainingLabel, make_engine, upgrade_database
from adaptive_rag.strategies import NoRetrieval, SingleStep


def _outcome(strategy: str, em: float = 0.0, acc: float = 0.0) -> Outcome:
    return Outcome("q", "hotpotqa", strategy, "x", 1, 0.1, em=em, f1=em, acc=acc)


def _tiers(*correct: tuple[float, float]) -> dict[Tier, Outcome]:
    return {t: _outcome(t.value, em, acc) for t, (em, acc) in zip(Tier, correct)}


def test_cheapest_correct_strategy_wins_ties_go_to_the_cheaper():
    assert choose_label(_tiers((1, 1), (1, 1), (1, 1)), multi_hop=True) == (Tier.A, "silver")
    assert choose_label(_tiers((0, 0), (1, 1), (1, 1)), multi_hop=True) == (Tier.B, "silver")
    assert choose_label(_tiers((0, 0), (0, 0), (0, 1)), multi_hop=False) == (Tier.C, "silver")


def test_all_fail_falls_back_to_the_dataset_bias():
    assert choose_label(_tiers((0, 0), (0, 0), (0, 0)), multi_hop=False) == (Tier.B, "binary")
    assert choose_label(_tiers((0, 0), (0, 0), (0, 0)), multi_hop=True) == (Tier.C, "binary")


def test_correctness_metric_is_configurable():
    contained = _outcome("a", em=0, acc=1)
    assert is_correct(contained, "acc") and is_correct(contained, "em_or_acc")
    assert not is_correct(contained, "em")
    assert choose_label(_tiers((0, 1), (1, 1), (1, 1)), True, "em") == (Tier.B, "silver")
    with pytest.raises(ValueError):
        is_correct(contained, "f1")


def test_limit_per_dataset_keeps_order():
    qs = [Question(f"{d}{i}", d, "q?", ("a",)) for d in ("nq", "hotpotqa") for i in range(3)]
    assert [q.id for q in limit_per_dataset(qs, 2)] == ["nq0", "nq1", "hotpotqa0", "hotpotqa1"]
    assert len(limit_per_dataset(qs, None)) == 6


def test_skipping_gives_a_later_sample_that_never_overlaps_the_first():
    qs = [Question(f"{d}{i}", d, "q?", ("a",)) for d in ("nq", "hotpotqa") for i in range(4)]
    first, later = limit_per_dataset(qs, 2), limit_per_dataset(qs, 1, skip=2)
    assert [q.id for q in later] == ["nq2", "hotpotqa2"] and not {q.id for q in first} & {q.id for q in later}
    assert [q.id for q in limit_per_dataset(qs, None, skip=3)] == ["nq3", "hotpotqa3"]
    assert limit_per_dataset(qs, 2, skip=9) == []
    with pytest.raises(ValueError, match="count"):
        limit_per_dataset(qs, 2, skip=-1)


@pytest.fixture
def store(tmp_path) -> LabelStore:
    url = f"sqlite:///{tmp_path}/db/arag.db"
    upgrade_database(url)
    return LabelStore(make_engine(url))


def test_migration_creates_the_labels_table(store):
    inspector = inspect(store.engine)
    assert "training_labels" in inspector.get_table_names()
    columns = {c["name"] for c in inspector.get_columns("training_labels")}
    assert {"question_id", "dataset", "question", "label", "label_source", "outcomes", "split",
            "created_at", "origin", "request_id"} <= columns
    assert store.add(TrainingLabel(
        origin="benchmark", dataset="nq", question_id="1", question="q", label="B",
        label_source="binary", split="train", correct_metric="em", outcomes={},
    ))
    # The same key again is refused, not duplicated.
    assert not store.add(TrainingLabel(
        origin="benchmark", dataset="nq", question_id="1", question="q", label="A",
        label_source="silver", split="train", correct_metric="em", outcomes={},
    ))
    assert [row.label for row in store.labels(split="train")] == ["B"]


class _Multi:
    """A stand-in C strategy: one retrieval + one generation, named like a real one."""

    name = "decompose"

    def __init__(self, retriever, llm):
        self.inner = SingleStep(retriever, llm)

    def run(self, question):
        result = self.inner.run(question)
        result.strategy, result.steps = self.name, 3
        return result


def test_label_questions_runs_all_tiers_stores_outcomes_and_resumes(store, tmp_path):
    questions = [
        Question("h1", "hotpotqa", "Who directed the film?", ("Jane Doe",)),
        Question("n1", "nq", "Capital of France?", ("Paris",)),
        Question("n2", "nq", "Who painted it?", ("Nobody Knows",)),
    ]
    answers = {"Who directed": "Jane Doe", "Capital of France": "Paris"}

    def reply(prompt: str) -> str:
        with_passages = "Text of passage" in prompt
        for key, answer in answers.items():
            if key in prompt:
                # h1 needs passages (B); n1 is known without them (A).
                return answer if (with_passages or key == "Capital of France") else "unknown"
        return "unknown"

    llm, retriever = FakeLLM(reply), FakeRetriever(make_passages(3))
    strategies = {
        Tier.A: NoRetrieval(llm), Tier.B: SingleStep(retriever, llm), Tier.C: _Multi(retriever, llm),
    }
    ticks = []
    stats = label_questions(questions, strategies, store, tmp_path / "cache.jsonl",
                            labeller={"llm": "fake"}, on_progress=ticks.append)
    assert stats.labelled == 3 and stats.skipped == 0 and len(ticks) == 3
    rows = {row.question_id: row for row in store.labels(split=None)}
    assert (rows["h1"].label, rows["h1"].label_source) == ("B", "silver")
    assert (rows["n1"].label, rows["n1"].label_source) == ("A", "silver")
    assert (rows["n2"].label, rows["n2"].label_source) == ("B", "binary")
    assert rows["h1"].outcomes["C"]["strategy"] == "decompose"
    assert rows["h1"].outcomes["C"]["steps"] == 3
    assert rows["h1"].outcomes["B"]["correct"] is True
    assert rows["h1"].labeller["strategies"] == {"A": "no_retrieval", "B": "single_step", "C": "decompose"}
    calls = len(llm.calls)
    # A rerun skips everything already labelled: no strategy runs again.
    again = label_questions(questions, strategies, store, tmp_path / "cache.jsonl")
    assert again.labelled == 0 and again.skipped == 3 and len(llm.calls) == calls


def test_migrations_match_the_models(store):
    """`alembic revision --autogenerate` would find nothing to add: models and migration agree."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from adaptive_rag.storage import Base

    with store.engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert diff == []


def test_postgres_urls_use_psycopg_3():
    from adaptive_rag.storage.db import normalise_url

    assert normalise_url("postgresql://u:p@h/db") == "postgresql+psycopg://u:p@h/db"
    assert normalise_url("postgres://u@h/db") == "postgresql+psycopg://u@h/db"
    assert normalise_url("sqlite:///var/arag.db") == "sqlite:///var/arag.db"
