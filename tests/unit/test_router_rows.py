"""Learned routers as evaluation rows: `arag routers train` on a labels store, then `arag eval
--report-only --routers` shows them beside the fixed strategies, the rules and the oracle, with
their under- and over-retrieval; the F1-against-time plot names every row."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from adaptive_rag.contracts import Tier
from adaptive_rag.evaluation.report import (
    plot,
    retrieval_errors,
    retrieval_errors_markdown,
)
from adaptive_rag.storage.models import TrainingLabel
from tests.support.encoders import tiny_encoder

DATA_DIR = Path(os.environ.get("ARAG_DATA_DIR", "../shared/data"))
TIER_STRATEGIES = ("no_retrieval", "single_step", "evidence")


def test_under_and_over_retrieval_against_the_cheapest_correct_tier() -> None:
    cheapest = {("d", "1"): Tier.B, ("d", "2"): Tier.C, ("d", "3"): Tier.A, ("d", "4"): None, ("d", "5"): None}
    routed = {
        "always B": {k: Tier.B for k in cheapest},
        "router": {("d", "1"): Tier.A, ("d", "2"): Tier.C, ("d", "3"): Tier.C, ("d", "4"): Tier.A,
                   ("d", "5"): Tier.C, ("d", "missing"): Tier.B},
    }
    found = retrieval_errors(routed, cheapest)
    assert found["always B"] == {"under": 1, "exact": 1, "over": 1, "answerable": 3,
                                 "no_correct_tier": {"A": 0, "B": 2, "C": 0}, "n": 5}
    assert found["router"] == {"under": 1, "exact": 1, "over": 1, "answerable": 3,
                               "no_correct_tier": {"A": 1, "B": 0, "C": 1}, "n": 5}
    text = retrieval_errors_markdown(found, {"router": "learned knn"})
    assert "| learned knn | 3 | 1 (33.3 %) | 1 (33.3 %) | 1 (33.3 %) | 2 (1 / 0 / 1) |" in text


def test_the_plot_names_every_row_and_no_two_look_alike(tmp_path: Path) -> None:
    kinds = {"no_retrieval": "fixed", "single_step": "fixed", "decompose": "fixed", "ircot": "strategy",
             "oracle": "oracle", **{f"router {i}": "router" for i in range(20)}}
    table = {row: {"average": {"f1": 0.1 + i / 100, "seconds": 1.0 + i, "f1_ci": [0.05 + i / 100, 0.15 + i / 100]},
                   **({"squad": {"f1": 0.2, "seconds": 2.0}} if i % 2 else {})}
             for i, row in enumerate(kinds)}
    table["only on squad"] = {"squad": {"f1": 0.3, "seconds": 3.0}}  # absent from the first panel
    entries = plot(table, tmp_path / "plot.png", {"oracle": "the oracle"}, kinds)
    assert (tmp_path / "plot.png").stat().st_size > 10_000
    assert [e["label"] for e in entries] == [("the oracle" if r == "oracle" else r) for r in table]
    assert len({(e["colour"], e["marker"], e["hollow"]) for e in entries}) == len(entries)
    assert {e["marker"] for e in entries if e["kind"] == "fixed"} == {"s"}
    assert next(e for e in entries if e["kind"] == "oracle")["marker"] == "*"


def test_a_one_question_interval_a_rounding_error_off_its_point_still_plots(tmp_path: Path) -> None:
    # on one question the bootstrap interval is the point, computed another way: a rounding error off
    table = {"single_step": {"average": {"f1": 0.1 + 0.2, "seconds": 4.0, "f1_ci": [0.3, 0.3]}}}
    assert 100 * 0.3 - 100 * (0.1 + 0.2) < 0.0
    plot(table, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").is_file()


# --- the commands ------------------------------------------------------------------------------


def squad_test_questions():
    from adaptive_rag.evaluation.datasets import limit_per_dataset, load_questions

    if not (DATA_DIR / "squad-v1.1_train-dev-mix_mrc-odqa-tutorial.json").is_file():
        pytest.skip(f"benchmark data not found in {DATA_DIR}")
    return limit_per_dataset(load_questions(DATA_DIR, ["squad"], split="test"), 6)


def arag(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-c", "from adaptive_rag.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "COLUMNS": "200", **(env or {})})
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def write_labels(database_url: str) -> None:
    """Synthetic `train` labels with every tier's outcome (and a few `test` ones, never used)."""
    from adaptive_rag.cli.common import open_label_store

    store = open_label_store(database_url)
    rng = random.Random(0)
    words = {"A": "hello", "B": "who", "C": "compare"}
    for i in range(120):
        tier = "ABC"[i % 3]
        store.add(TrainingLabel(
            origin="benchmark", dataset="squad", question_id=f"q{i}", label=tier, label_source="silver",
            question=f"{words[tier]} {words[tier]} w{rng.randrange(300)} w{rng.randrange(300)} n{i}",
            split="test" if i % 10 == 0 else "train", correct_metric="em_or_acc",
            outcomes={t: {"f1": float(t == tier), "correct": t == tier, "steps": "ABC".index(t),
                          "seconds": 2.0 * (1 + "ABC".index(t))} for t in "ABC"},
        ))


def write_outcomes(out: Path, questions) -> Path:
    """Every tier's outcome; tier `index % 3` alone is correct, so every routing error shows."""
    out.mkdir()
    with (out / "results.jsonl").open("w") as handle:
        for index, question in enumerate(questions):
            for rank, strategy in enumerate(TIER_STRATEGIES):
                correct = rank == index % 3
                handle.write(json.dumps({
                    "question_id": question.id, "dataset": "squad", "strategy": strategy, "answer": "x",
                    "steps": rank, "seconds": 1.0 + rank, "em": float(correct), "f1": 0.1 * rank + correct,
                    "acc": 0.0, "passage_ids": [], "trace": [],
                }) + "\n")
    return out


def test_further_classifier_versions_are_rows_named_by_their_labels(tmp_path: Path) -> None:
    from lab.harness.models import publish_length_router

    questions = squad_test_questions()
    repository = tmp_path / "models"
    publish_length_router(repository, 1, c_bias=-15.5)
    ablation = publish_length_router(repository, 2, c_bias=-40.0)  # routes everything to A or B
    info = json.loads((ablation / "classifier.json").read_text())
    info.update(base="/cache/models/mpnet-base", train_config={"labels": "silver"})
    (ablation / "classifier.json").write_text(json.dumps(info))
    out = write_outcomes(tmp_path / "eval", questions)
    args = ["eval", "--report-only", "--data-dir", str(DATA_DIR), "--datasets", "squad", "--limit", "6",
            "--strategies", ",".join(TIER_STRATEGIES), "--out", str(out), "--classifier-version", "1",
            "--classifier-versions", "2", "--routers", str(tmp_path)]
    arag(*args, env={"ARAG_MODEL_REPOSITORY": str(repository)})
    report = json.loads((out / "report.json").read_text())
    assert report["rows"]["adaptive v2"]["label"] == "adaptive v2 (silver labels, mpnet-base)"
    assert report["rows"]["adaptive v2"]["routed"]["C"] == 0 < report["rows"]["adaptive"]["routed"]["C"]
    assert "adaptive v2" in json.loads((out / "routes.json").read_text())
    assert "adaptive v2" in report["retrieval_errors"]


def test_routers_train_then_eval_shows_them_as_rows(tmp_path: Path) -> None:
    questions = squad_test_questions()
    database_url = f"sqlite:///{tmp_path / 'labels.db'}"
    write_labels(database_url)
    routers = tmp_path / "routers"
    tiny_encoder(routers / "encoders" / "minilm-l6")  # in place of the exported MiniLM: no torch needed
    trained = arag("routers", "train", "--out", str(routers), "--database-url", database_url, "--threads", "1")
    assert "validation split of the train labels" in trained.stdout
    cards = {k: json.loads((routers / k / "router.json").read_text()) for k in ("lr", "knn", "reward")}
    for card in cards.values():
        assert sum(card["labels"]["fitted_on"].values()) == 108  # the 12 `test` labels are never used
        assert card["encoder"]["path"] == "../encoders/minilm-l6"

    out = write_outcomes(tmp_path / "eval", questions)
    args = ["eval", "--report-only", "--data-dir", str(DATA_DIR), "--datasets", "squad", "--limit", "6",
            "--strategies", ",".join(TIER_STRATEGIES), "--out", str(out), "--routers", str(routers)]
    env = {"ARAG_MODEL_REPOSITORY": str(tmp_path / "no-models")}
    arag(*args, env=env)
    report = json.loads((out / "report.json").read_text())
    learned = [row for row in report["table"] if row.startswith("learned ")]
    assert learned == ["learned knn", "learned lr", "learned reward"]  # by directory name
    for row in learned:
        assert report["table"][row]["squad"]["n"] == 6
        assert report["rows"][row]["kind"] == "router"
        assert report["rows"][row]["info"]["artefact_sha256"] == cards[row.split()[1]]["artefact"]["sha256"]
        assert report["retrieval_errors"][row]["n"] == 6
    assert {"oracle", "single_step", "dataset-identity rule"} <= set(report["retrieval_errors"])
    assert report["retrieval_errors"]["oracle"]["under"] == report["retrieval_errors"]["oracle"]["over"] == 0
    assert any(c["a"] == "learned knn" and c["b"] == "single_step" for c in report["claims"])
    markdown = (out / "report.md").read_text()
    assert "## Under- and over-retrieval per router" in markdown and "learned reward (alpha" in markdown
    recorded = json.loads((out / "routes.json").read_text())
    assert set(learned) <= set(recorded)

    # Without the artefacts, a report-only run replays the recorded routes.
    first = {row: report["table"][row]["squad"]["f1"] for row in learned}
    (routers / "knn" / "router.json").unlink()
    args[-1] = str(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    arag(*args, env=env)
    replayed = json.loads((out / "report.json").read_text())
    assert {row: replayed["table"][row]["squad"]["f1"] for row in learned} == first
    assert "replayed" in replayed["rows"]["learned knn"]["label"]


def test_a_reward_router_under_a_time_budget_from_the_command_line(tmp_path: Path) -> None:
    database_url = f"sqlite:///{tmp_path / 'labels.db'}"
    write_labels(database_url)
    routers = tmp_path / "routers"
    tiny_encoder(routers / "encoders" / "minilm-l6")
    arag("routers", "train", "--kind", "reward", "--cost", "seconds", "--time-budget", "0.7", "--folds", "3",
         "--out", str(routers / "reward-time"), "--database-url", database_url, "--threads", "1")
    card = json.loads((routers / "reward-time" / "router.json").read_text())
    assert card["hyperparameters"]["cost"] == "seconds"
    assert card["validation"]["folds"] == 3 and card["validation"]["n"] == 108  # every `train` label, out of fold
    assert card["validation"]["time_share_of_c"] <= 0.7 and card["validation"]["within_budget"]
    for bad, message in ((["--cost", "tokens"], "--cost is steps or seconds"),
                         (["--time-budget", "0"], "--time-budget is a positive share"),
                         (["--folds", "0"], "--folds is at least 1")):
        done = subprocess.run([sys.executable, "-c", "from adaptive_rag.cli import main; main()", "routers", "train",
                               "--kind", "reward", "--database-url", database_url, *bad],
                              capture_output=True, text=True, timeout=300, check=False,
                              env={**os.environ, "COLUMNS": "200"})
        assert done.returncode == 2 and message in done.stdout + done.stderr
