"""The domain-adaptation benchmark's own logic (`lab.experiments.domain_adaptation`), without services:
the agent's feedback rule, tier accounting against the gold tiers, paired changes and their
wording, which queries each round replays, label bookkeeping, the benchmark-test check and the
report built from a synthetic run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from adaptive_rag.contracts import Tier
from adaptive_rag.evaluation.support import (
    FAQ, JOINED, OUT_OF_KB, PARAPHRASE, SMALL_TALK, SupportQuery,
)
from lab.experiments.domain_adaptation import (
    RoutedQuery, agent_feedback, benchmark_check, gold_polarity, supported_share, checkpoint, change_wording, cumulative_labels, eval_strategies,
    gold_agreement, in_sample_champion, last_json_object, live_label_counts, paired_change, render_markdown,
    replay_summary, retrieval_error, round_queries, summarise_routes, summary_lines, write_report,
)

GOLD = "Wash your hands often with soap and water for at least 20 seconds."


def query(kind: str, qid: str = "q1", tier: Tier = Tier.B, answers: tuple[str, ...] = (GOLD,)) -> SupportQuery:
    return SupportQuery(id=qid, kind=kind, query=f"question {qid}", gold_tier=tier,
                        gold_answers=answers if kind not in (SMALL_TALK, OUT_OF_KB) else (),
                        expect_abstain=kind == OUT_OF_KB)


# --- the agent's feedback ---------------------------------------------------------------------------


def test_a_short_answer_the_faq_backs_gets_a_thumbs_up_though_its_f1_is_low() -> None:
    verdict = agent_feedback(query(FAQ), "wash hands with soap", True)
    assert verdict.rating == 1 and verdict.support == pytest.approx(1.0)
    assert verdict.f1 is not None and verdict.f1 < 0.6  # token F1 would have said no


def test_an_answer_the_faq_does_not_back_gets_a_thumbs_down_with_its_share() -> None:
    verdict = agent_feedback(query(PARAPHRASE), "The capital of France is Paris.", True)
    assert verdict.rating == -1 and verdict.support == pytest.approx(0.0)


def test_words_match_their_other_forms_and_filler_does_not_count() -> None:
    # "washing" / "wash", "hand" / "hands"; "the", "your" carry no claim
    assert supported_share("washing the hand", GOLD) == pytest.approx(1.0)
    assert supported_share("wash your car", GOLD) == pytest.approx(0.5)
    assert supported_share("the", GOLD) == 0.0


def test_the_threshold_is_inclusive() -> None:
    answer = "wash your car"  # half backed
    assert agent_feedback(query(FAQ), answer, True, 0.5).rating == 1
    assert agent_feedback(query(FAQ), answer, True, 0.5 + 1e-6).rating == -1


def test_a_yes_or_no_is_judged_by_what_the_faq_says() -> None:
    masks = query(FAQ, answers=("No. If your child is healthy, there is no need for them to wear a facemask.",))
    assert agent_feedback(masks, "no", True).rating == 1
    assert agent_feedback(masks, "Yes.", True).rating == -1
    pools = query(PARAPHRASE, answers=("There is no evidence that COVID-19 spreads through pools.",))
    assert gold_polarity(pools.gold_answers[0]) == -1 and agent_feedback(pools, "no", True).rating == 1
    dismissal = query(FAQ, answers=("Depending on the situation, officials may recommend school dismissals.",))
    assert agent_feedback(dismissal, "yes", True).rating == 1


def test_a_bare_yes_to_a_joined_question_backs_nothing() -> None:
    joined = query(JOINED, tier=Tier.C, answers=(GOLD + " Most cases are mild.",))
    assert agent_feedback(joined, "yes, yes", True).rating == -1
    assert agent_feedback(joined, "wash hands, mild", True).rating == 1


def test_out_of_kb_questions_want_an_abstention() -> None:
    assert agent_feedback(query(OUT_OF_KB), "", False).rating == 1
    assert agent_feedback(query(OUT_OF_KB), "Paris", True).rating == -1


def test_abstaining_on_a_question_the_faq_answers_is_wrong() -> None:
    verdict = agent_feedback(query(JOINED, tier=Tier.C), "", False)
    assert verdict.rating == -1 and verdict.f1 == 0.0


def test_small_talk_wants_a_reply_not_an_abstention() -> None:
    assert agent_feedback(query(SMALL_TALK, tier=Tier.A), "Hello! How can I help?", True).rating == 1
    assert agent_feedback(query(SMALL_TALK, tier=Tier.A), "", False).rating == -1


def test_a_failed_request_is_a_thumbs_down_whatever_the_kind() -> None:
    for kind in (FAQ, OUT_OF_KB, SMALL_TALK):
        assert agent_feedback(query(kind), None, False).rating == -1


# --- tiers against the gold -------------------------------------------------------------------------


def test_retrieval_error_orders_the_tiers() -> None:
    assert retrieval_error("A", "B") == "under"
    assert retrieval_error("B", "C") == "under"
    assert retrieval_error("C", "B") == "over"
    assert retrieval_error("B", "B") == "exact"


def test_summarise_routes_counts_accuracy_under_and_over_per_kind() -> None:
    rows = [RoutedQuery("1", FAQ, "B", "B", 1), RoutedQuery("2", FAQ, "B", "C", 1),
            RoutedQuery("3", JOINED, "C", "B", 1), RoutedQuery("4", SMALL_TALK, "A", "A", 0),
            RoutedQuery("5", OUT_OF_KB, "B", "A", 1, fallback=True)]
    summary = summarise_routes(rows)
    assert summary["n"] == 5
    assert summary["accuracy"]["mean"] == pytest.approx(0.4)
    assert summary["accuracy"]["low"] <= 0.4 <= summary["accuracy"]["high"]
    assert (summary["under"], summary["exact"], summary["over"]) == (2, 2, 1)
    assert summary["routed"] == {"A": 2, "B": 2, "C": 1}
    assert summary["kinds"][FAQ]["accuracy"]["mean"] == pytest.approx(0.5)
    assert summary["kinds"][FAQ]["over"] == 1
    assert summary["kinds"][JOINED]["under"] == 1
    assert list(summary["kinds"]) == [FAQ, SMALL_TALK, JOINED, OUT_OF_KB]  # the suite's kind order
    assert summary["model_versions"] == {0: 1, 1: 4}
    assert summary["fallbacks"] == 1


# --- paired changes and their wording -----------------------------------------------------------------


def test_paired_change_uses_only_queries_measured_both_times() -> None:
    before = {"a": 0.0, "b": 1.0, "c": 0.0}
    after = {"a": 1.0, "b": 1.0, "d": 1.0}
    change = paired_change(before, after)
    assert change["n"] == 2 and change["mean"] == pytest.approx(0.5) and change["changed"] == 1
    assert paired_change({"a": 1.0}, {"b": 1.0}) is None


def test_change_wording_claims_a_change_only_when_the_interval_excludes_zero() -> None:
    up = paired_change({str(i): 0.0 for i in range(40)}, {str(i): 1.0 if i < 30 else 0.0 for i in range(40)})
    assert "improved" in change_wording(up)
    down = paired_change({str(i): 1.0 for i in range(40)}, {str(i): 0.0 if i < 30 else 1.0 for i in range(40)})
    assert "dropped" in change_wording(down)
    noisy = paired_change({str(i): float(i % 2) for i in range(40)},
                          {str(i): float((i + (i < 2)) % 2) for i in range(40)})
    assert "did not change measurably" in change_wording(noisy)
    same = paired_change({"a": 1.0, "b": 0.0}, {"a": 1.0, "b": 0.0})
    assert "every query was routed as before" in change_wording(same)
    assert "not measured" in change_wording(None)


# --- rounds --------------------------------------------------------------------------------------------


def test_each_round_replays_new_queries_per_kind_in_the_given_order() -> None:
    train = [query(kind, f"{kind}-{i}") for i in range(5) for kind in (FAQ, PARAPHRASE, JOINED)]
    first, second, third = (round_queries(train, r, 2) for r in range(3))
    assert [q.id for q in first] == ["faq-0", "paraphrase-0", "joined-0", "faq-1", "paraphrase-1", "joined-1"]
    assert not {q.id for q in first} & {q.id for q in second}
    assert [q.id for q in third] == ["faq-4", "paraphrase-4", "joined-4"]  # what is left
    assert round_queries(train, 3, 2) == []


def test_round_queries_keeps_kinds_that_run_out_short() -> None:
    train = [query(FAQ, "f0"), query(FAQ, "f1"), query(FAQ, "f2"), query(OUT_OF_KB, "o0")]
    assert [q.id for q in round_queries(train, 1, 2)] == ["f2"]


@dataclass
class Label:
    label: str
    split: str
    request_id: str | None


def test_live_label_counts_split_tier_and_kind() -> None:
    labels = [Label("B", "train", "r1"), Label("C", "test", "r2"), Label("C", "train", "r3"),
              Label("A", "train", None)]
    counts = live_label_counts(labels, {"r1": FAQ, "r2": FAQ, "r3": JOINED})
    assert (counts["total"], counts["train"], counts["test"]) == (4, 3, 1)
    assert counts["by_tier"] == {"A": 1, "B": 1, "C": 2}
    assert counts["train_by_tier"] == {"A": 1, "B": 1, "C": 1}
    assert counts["by_kind"] == {FAQ: {"A": 0, "B": 1, "C": 1}, JOINED: {"A": 0, "B": 0, "C": 1},
                                 "other": {"A": 1, "B": 0, "C": 0}}


def test_gold_agreement_counts_labels_equal_to_their_kinds_gold_tier() -> None:
    by_kind = {FAQ: {"A": 0, "B": 2, "C": 3}, JOINED: {"A": 0, "B": 1, "C": 1}, "other": {"A": 4, "B": 0, "C": 0}}
    assert gold_agreement(by_kind) == (3, 7)  # faq B 2 + joined C 1; "other" has no gold tier


def test_in_sample_champion_is_named_only_when_promotion_flatters_it() -> None:
    held_out = {"accuracy": 0.95, "macro_f1": 0.942, "n": 811}
    flattered = {"champion_version": 1, "champion_score": 0.988, "metric": "macro_f1"}
    assert "fitted on them" in in_sample_champion(held_out, flattered)
    assert in_sample_champion(held_out, {**flattered, "champion_score": 0.945}) is None
    assert in_sample_champion(held_out, {**flattered, "champion_version": 2}) is None  # a retrained champion
    assert in_sample_champion(None, flattered) is None


def test_benchmark_check_allows_a_drop_of_at_most_one_point() -> None:
    start = {"estimate": 0.600, "low": 0.5, "high": 0.7, "n": 100}
    assert benchmark_check(start, {**start, "estimate": 0.590})["pass"]
    failed = benchmark_check(start, {**start, "estimate": 0.589})
    assert not failed["pass"] and failed["change_points"] == pytest.approx(-1.1)
    assert benchmark_check(start, {**start, "estimate": 0.65})["pass"]
    assert benchmark_check(None, start) is None and benchmark_check(start, None) is None


def test_eval_strategies_take_tier_c_from_the_results_directory() -> None:
    assert eval_strategies({"multi_step_knobs": {"multi_step": "decompose"}}) == \
        ["no_retrieval", "single_step", "decompose"]
    assert eval_strategies({}) == ["no_retrieval", "single_step", "ircot"]


def test_last_json_object_finds_what_retrain_printed_last() -> None:
    text = 'epoch 1 loss 0.3\n{"a": 1}\nrefused: not better\n{\n  "status": "refused",\n  "fit": 12\n}\n'
    assert last_json_object(text) == {"status": "refused", "fit": 12}
    assert last_json_object("no json here\n") is None


def test_replay_summary_counts_thumbs_failures_and_f1() -> None:
    rows = [{"kind": FAQ, "code": "OK", "tier": "B", "rating": 1, "f1": 0.5, "seconds": 2.0},
            {"kind": FAQ, "code": "OK", "tier": "C", "rating": -1, "f1": 0.1, "seconds": 4.0},
            {"kind": SMALL_TALK, "code": "OK", "tier": "A", "rating": 1, "f1": None, "seconds": 0.1},
            {"kind": OUT_OF_KB, "code": "DEADLINE_EXCEEDED", "tier": None, "rating": -1, "f1": None, "seconds": 9.0}]
    summary = replay_summary(rows, shadow_missing=1)
    assert (summary["queries"], summary["failed"], summary["up"], summary["down"]) == (4, 1, 2, 2)
    assert summary["mean_f1"] == pytest.approx(0.3)
    assert summary["routed"] == {"A": 1, "B": 1, "C": 1}
    assert summary["shadow_missing"] == 1


# --- the report -------------------------------------------------------------------------------------------


def _support(correct: list[int]) -> dict:
    rows = [RoutedQuery(str(i), FAQ if i % 2 else JOINED, "B" if i % 2 else "C",
                        ("B" if i % 2 else "C") if c else "A", 1) for i, c in enumerate(correct)]
    return summarise_routes(rows)


def synthetic_report(promoted: bool, bench_now: float) -> dict:
    bench = lambda e: {"accuracy": {"estimate": e, "low": e - 0.05, "high": e + 0.05, "n": 31}}  # noqa: E731
    start_correct = [1, 0] * 10
    after_correct = [1, 1] * 10 if promoted else start_correct
    return {
        "meta": {"command": "python -m lab.experiments.domain_adaptation --quick", "reader": "gemma-270m",
                 "f1_threshold_value": 0.2, "notes": ["a note"], "starting_router": "fitted here",
                 "starting_router_validation": {"accuracy": 0.95, "macro_f1": 0.9, "n": 100}},
        "start": {"served_version": 1, "support": _support(start_correct), "benchmark": bench(0.6), "seconds": 5},
        "rounds": [{
            "round": 1, "served_version": 2 if promoted else 1, "new_labels": 8,
            "replay": {"queries": 10, "failed": 0, "shadow_missing": 0, "up": 6, "down": 4, "mean_f1": 0.21,
                       "routed": {"A": 2, "B": 6, "C": 2}},
            "live_labels": {"total": 8, "train": 5, "test": 3, "by_tier": {"A": 2, "B": 3, "C": 3},
                            "by_kind": {FAQ: {"A": 0, "B": 2, "C": 1}}},
            "retrain": {"status": "promoted" if promoted else "refused", "metric": "macro_f1",
                        "challenger_score": 0.61, "champion_score": 0.58 if promoted else 0.99,
                        "challenger_version": 2 if promoted else None, "champion_version": 1,
                        "fit": 100, "validation": 25, "validation_counts": {"A": 5, "B": 10, "C": 10}},
            "support": _support(after_correct), "benchmark": bench(bench_now),
            "support_change": paired_change({str(i): float(c) for i, c in enumerate(start_correct)},
                                            {str(i): float(c) for i, c in enumerate(after_correct)}),
            "benchmark_check": benchmark_check(bench(0.6)["accuracy"], bench(bench_now)["accuracy"]),
            "seconds": {"replay": 60, "shadows": 20, "relabel": 2, "retrain": 90, "measure": 10, "total": 182},
        }],
    }


def test_summary_says_plainly_when_nothing_changed_and_when_the_benchmark_check_fails() -> None:
    report = synthetic_report(promoted=False, bench_now=0.55)
    lines = summary_lines(report)
    text = "\n".join(lines)
    assert "did not change: every query was routed as before" in text
    assert "Neither a challenger nor a tenant prior was promoted" in text
    assert "FAIL" in text
    assert "Live labels equal to the suite's gold tier of their query kind: 2 of 3" in text
    assert "5 of the 125 `train` labels" in text
    assert "fitted on them" in text  # champion 0.99 in promotion, 0.90 held out


def test_summary_reports_an_improvement_with_its_interval() -> None:
    text = "\n".join(summary_lines(synthetic_report(promoted=True, bench_now=0.6)))
    assert "improved" in text and "Neither a challenger" not in text and "FAIL" not in text
    assert "fitted on them" not in text


def test_a_promoted_tenant_prior_is_reported_and_counts_as_a_change() -> None:
    report = synthetic_report(promoted=False, bench_now=0.6)
    report["rounds"][0]["retrain"]["tenant_priors"] = [
        {"tenant": "acme", "verdict": "skipped", "reason": "3 labels"},
        {"tenant": "support", "verdict": "promoted", "revision": 1, "labels": 23, "challenger_accuracy": 0.826,
         "champion_accuracy": 0.783, "challenger_offsets": [-0.04, 0.0, -1.99]},
    ]
    text = "\n".join(summary_lines(report))
    assert "Tenant prior verdicts: round 1 promoted r1 (82.6 vs 78.3 on 23; A -0.04, C -1.99)." in text
    assert "Neither a challenger" not in text
    assert "| promoted r1 (82.6 vs 78.3 on 23; A -0.04, C -1.99) |" in render_markdown(report)


def test_report_files_hold_the_round_table_and_the_plot(tmp_path: Path) -> None:
    report = synthetic_report(promoted=True, bench_now=0.6)
    report["summary"] = summary_lines(report)
    paths = write_report(report, tmp_path)
    assert [p.name for p in paths] == ["report.json", "report.md", "accuracy_vs_labels.png"]
    assert all(p.stat().st_size > 0 for p in paths)
    markdown = (tmp_path / "report.md").read_text()
    assert "| start | 0 |" in markdown and "| 1 | 8 (8) | 2 / 3 / 3 | promoted (macro_f1 61.0 vs 58.0) | v2 | - |" in markdown
    assert "+0.0 (pass)" in markdown and "accuracy_vs_labels.png" in markdown
    assert "macro-F1 90.0 % on 100 labels" in markdown
    assert cumulative_labels(report) == [0, 8]
    assert render_markdown(report) == markdown


def test_a_checkpoint_writes_the_rounds_done_so_far_marked_in_progress(tmp_path: Path) -> None:
    import argparse
    import json

    report = synthetic_report(promoted=True, bench_now=0.6)
    report["start"]["correct"] = {"0": 1.0}
    checkpoint(report, argparse.Namespace(report_dir=tmp_path, rounds=3))
    written = json.loads((tmp_path / "report.json").read_text())
    assert written["meta"]["finished"] == "in progress: 1 of 3 rounds done"
    assert "correct" not in written["start"] and "correct" in report["start"]  # the run's own report untouched
    assert written["summary"] and (tmp_path / "report.md").is_file()
    assert "finished" not in report["meta"]
