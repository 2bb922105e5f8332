"""The offline replay of a recorded domain-adaptation run: each round sees only its own and earlier
feedback, is relabelled with the current rule, and the tenant step runs over version 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adaptive_rag.contracts import AnswerResult, ResultKind, Tier
from adaptive_rag.evaluation.support import FAQ_FILE
from adaptive_rag.training.bag_of_words import fit, publish
from adaptive_rag.training.learned_routers import LabelledQuery
from adaptive_rag.storage import make_engine, upgrade_database
from adaptive_rag.storage.records import RecordStore
from adaptive_rag.training.splits import live_split
from lab.experiments.domain_adaptation_replay import render, replay

DATA_DIR = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"


def recorded_run(run: Path) -> RecordStore:
    """Two rounds of a support tenant's traffic: FAQ-like questions answered right at B (round 1)
    and wrong at B and C alike (round 2), served by a version 1 that over-retrieves."""
    examples = [LabelledQuery(f"how do I clean my mask {i}", Tier.C) for i in range(30)]
    examples += [LabelledQuery(f"who wrote book {i}", Tier.B) for i in range(30)]
    examples += [LabelledQuery(f"hello friend {i}", Tier.A) for i in range(30)]
    fit(examples).save(run / "router.json")
    publish(run / "router.json", run / "model_repository")
    (run / "stack").mkdir()
    url = f"sqlite:///{run / 'stack' / 'arag.db'}"
    upgrade_database(url)
    store = RecordStore(make_engine(url))
    lines = []
    for i in range(24):
        request_id, round_no = f"r{i}", 1 if i < 12 else 2
        store.create_request(request_id, "support", None, f"how do I clean my mask {i}")
        answer = "wash it" if round_no == 1 else "burn it"
        store.save_result(AnswerResult(request_id=request_id, tier="C", strategy="ircot", answer=answer, steps=2), "w", 1)
        store.save_result(AnswerResult(request_id=request_id, kind=ResultKind.SHADOW, tier="B",
                                       strategy="single_step", answer=answer, steps=1), "w", 1)
        store.add_feedback(request_id, "support", 1 if round_no == 1 else -1, None, None)
        lines.append(json.dumps({"round": round_no, "request_id": request_id}))
    (run / "replay.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return store


def test_each_round_relabels_only_its_feedback_and_keeps_a_prior_that_pays(tmp_path) -> None:
    if not (DATA_DIR / FAQ_FILE).is_file():
        pytest.skip(f"support data not found in {DATA_DIR}")
    # the store stays open, as a live stack's would: its newest rows may sit in the write-ahead log
    store = recorded_run(tmp_path)
    result = replay(tmp_path, DATA_DIR)
    del store
    first, second = result["rounds"]
    # Round 1: 12 thumbs up, B said the same as C -> B; round 2 adds 12 where both failed -> B too.
    assert sum(first["labels"].values()) == 12 and first["labels"]["B"] == 12
    assert sum(second["labels"].values()) == 24 and second["labels"]["B"] == 24
    # The tenant step sees the `train` share of the labels (by question hash), and version 1
    # sends these FAQ-like questions to C while the labels say B: a prior that pays.
    train = [i for i in range(24) if live_split(f"how do I clean my mask {i}") == "train"]
    assert [r["tenant_priors"][0]["labels"] for r in result["rounds"]] == [
        sum(i < 12 for i in train), len(train)]
    assert second["tenant_priors"][0]["verdict"] in ("promoted", "refused")
    promoted = [r for r in result["rounds"] if r["tenant_priors"][0]["verdict"] == "promoted"]
    assert promoted and promoted[0]["support"]["over"] <= result["start"]["over"]
    assert not (tmp_path / "model_repository" / "complexity" / "1" / "tenant_priors.json").exists()  # a copy was used
    text = render(result)
    assert "| start |" in text and "| round 2 |" in text and "not a live run" in text
