"""Resumable evaluation runs and the report built from their outcomes."""

from __future__ import annotations

import json

import pytest

from adaptive_rag.domain import Passage, StrategyResult
from adaptive_rag.evaluation.datasets import Question
from adaptive_rag.evaluation.adaptive import ORACLE
from adaptive_rag.evaluation.report import (
    AVERAGE, markdown, oracle_outcomes, router_goals, router_goals_markdown, summarise, write_report,
)
from adaptive_rag.evaluation.runner import Outcome, context_reset, load_outcomes, run_evaluation


class ScriptedStrategy:
    """Answers from a {question: answer} map; counts runs."""

    def __init__(self, name: str, answers: dict[str, str], steps: int = 1, seconds: float = 1.0):
        self.name, self.answers, self.steps, self.seconds = name, answers, steps, seconds
        self.runs: list[str] = []

    def run(self, question: str) -> StrategyResult:
        self.runs.append(question)
        return StrategyResult(
            strategy=self.name, answer=self.answers.get(question, "no idea"), steps=self.steps,
            passages=[Passage(f"{self.name}-{question}", "T", "x")],
            timings={"total": self.seconds, "generate": self.seconds / 2},
            trace=[f"trace of {question}"],
        )


QUESTIONS = [
    Question("q1", "nq", "capital of France?", ("Paris",)),
    Question("q2", "nq", "largest planet?", ("Jupiter",)),
    Question("h1", "hotpotqa", "who was first?", ("Spielberg", "Steven Spielberg")),
]


def strategies() -> dict[str, ScriptedStrategy]:
    return {
        "no_retrieval": ScriptedStrategy("no_retrieval", {"capital of France?": "Paris"}, 0, 0.5),
        "single_step": ScriptedStrategy(
            "single_step", {"largest planet?": "It is Jupiter", "who was first?": "Spielberg"}, 1, 2.0
        ),
    }


def total_runs(strats) -> int:
    return sum(len(s.runs) for s in strats.values())


# --- runner ---------------------------------------------------------------------------------------


def test_run_evaluation_writes_one_scored_line_per_pair(tmp_path) -> None:
    path = tmp_path / "deep" / "results.jsonl"
    strats = strategies()
    progress: list[int] = []
    outcomes = run_evaluation(QUESTIONS, strats, path, progress.append)
    assert total_runs(strats) == 6 and sum(progress) == 6
    lines = path.read_text().splitlines()
    assert len(lines) == 6
    rows = [json.loads(line) for line in lines]
    assert {(r["dataset"], r["question_id"], r["strategy"]) for r in rows} == set(outcomes)
    paris = outcomes[("nq", "q1", "no_retrieval")]
    assert (paris.answer, paris.em, paris.f1, paris.acc, paris.steps, paris.seconds) == (
        "Paris", 1.0, 1.0, 1.0, 0, 0.5,
    )
    assert paris.passage_ids == ["no_retrieval-capital of France?"]
    assert paris.trace == ["trace of capital of France?"]
    jupiter = outcomes[("nq", "q2", "single_step")]
    assert (jupiter.em, jupiter.acc) == (0.0, 1.0)
    assert 0 < jupiter.f1 < 1
    assert outcomes[("nq", "q2", "no_retrieval")].correct is False
    assert jupiter.correct is True


def test_second_run_reruns_nothing(tmp_path) -> None:
    path = tmp_path / "results.jsonl"
    first = run_evaluation(QUESTIONS, strategies(), path)
    before = path.read_text()
    strats = strategies()
    progress: list[int] = []
    second = run_evaluation(QUESTIONS, strats, path, progress.append)
    assert total_runs(strats) == 0
    assert sum(progress) == 6  # progress still counts the pairs already done
    assert second == first
    assert path.read_text() == before


def test_each_run_starts_from_a_fresh_reader_context_and_cached_pairs_do_not(tmp_path) -> None:
    path = tmp_path / "results.jsonl"
    strats = strategies()
    calls: list[int] = []

    def forget() -> None:
        calls.append(total_runs(strats))  # how many runs had happened when the reader forgot

    run_evaluation(QUESTIONS[:1], strats, path, fresh_context=forget)
    assert calls == [0, 1]  # before each of the two strategies' runs, not after
    run_evaluation(QUESTIONS, strats, path, fresh_context=forget)
    assert len(calls) == 2 + 4  # the first question's two pairs came from the file


def test_a_reader_without_local_prompt_state_has_no_reset() -> None:
    class Remote:
        prompt_style = "chat"

    class Embedded:
        def forget_context(self) -> None: ...

    assert context_reset(Remote()) is None
    embedded = Embedded()
    assert context_reset(embedded) == embedded.forget_context


def test_new_strategy_runs_only_itself(tmp_path) -> None:
    path = tmp_path / "results.jsonl"
    run_evaluation(QUESTIONS, strategies(), path)
    strats = strategies()
    strats["ircot"] = ScriptedStrategy("ircot", {}, 3, 5.0)
    outcomes = run_evaluation(QUESTIONS, strats, path)
    assert len(strats["ircot"].runs) == 3 and total_runs(strats) == 3
    assert len(outcomes) == 9
    assert len(path.read_text().splitlines()) == 9


def test_truncated_last_line_is_tolerated_and_redone(tmp_path) -> None:
    path = tmp_path / "results.jsonl"
    run_evaluation(QUESTIONS, strategies(), path)
    text = path.read_text()
    path.write_text(text[: len(text) - 25])  # a crash cut the last record short
    assert len(load_outcomes(path)) == 5
    strats = strategies()
    outcomes = run_evaluation(QUESTIONS, strats, path)
    assert total_runs(strats) == 1
    assert strats["single_step"].runs == ["who was first?"]
    assert len(outcomes) == 6


def test_redone_record_survives_the_next_resume(tmp_path) -> None:
    path = tmp_path / "results.jsonl"
    run_evaluation(QUESTIONS, strategies(), path)
    text = path.read_text()
    path.write_text(text[: len(text) - 25])
    run_evaluation(QUESTIONS, strategies(), path)
    assert len(load_outcomes(path)) == 6
    strats = strategies()
    run_evaluation(QUESTIONS, strats, path)
    assert total_runs(strats) == 0


def test_load_outcomes_skips_garbage_lines(tmp_path) -> None:
    path = tmp_path / "results.jsonl"
    good = Outcome("q1", "nq", "s", "a", 1, 1.0, 1.0, 1.0, 1.0)
    path.write_text(
        "not json\n[1, 2]\n{\"question_id\": \"x\"}\n\n"
        + json.dumps(good.__dict__) + "\n"
    )
    assert load_outcomes(path) == {good.key: good}
    assert load_outcomes(tmp_path / "absent.jsonl") == {}


# --- report ---------------------------------------------------------------------------------------


def outcome(qid: str, dataset: str, strategy: str, *, f1=0.0, em=0.0, acc=0.0, steps=1, seconds=1.0):
    return Outcome(qid, dataset, strategy, "ans", steps, seconds, em, f1, acc)


def test_summarise_means_per_dataset_and_over_datasets() -> None:
    rows = {
        "single_step": [
            outcome("1", "hotpotqa", "single_step", f1=1.0, em=1.0, acc=1.0, steps=1, seconds=4.0),
            outcome("1", "squad", "single_step", f1=1.0, em=1.0, acc=1.0, steps=1, seconds=1.0),
            outcome("2", "squad", "single_step", f1=0.0, steps=1, seconds=3.0),
        ],
        "no_retrieval": [
            outcome("1", "squad", "no_retrieval", f1=0.5, steps=0, seconds=1.0),
            outcome("1", "hotpotqa", "no_retrieval", f1=0.0, steps=0, seconds=1.0),
        ],
    }
    table = summarise(rows)
    ss = table["single_step"]
    assert list(ss) == ["squad", "hotpotqa", AVERAGE]  # benchmark order, average last
    assert ss["squad"]["f1"] == pytest.approx(0.5)
    assert ss["squad"]["seconds"] == pytest.approx(2.0)
    assert ss["squad"]["n"] == 2 and ss["hotpotqa"]["n"] == 1
    # The average weighs datasets equally: (0.5 + 1.0) / 2, not 2 / 3 over outcomes.
    assert ss[AVERAGE]["f1"] == pytest.approx(0.75)
    assert ss[AVERAGE]["em"] == pytest.approx(0.75)
    assert ss[AVERAGE]["seconds"] == pytest.approx(3.0)
    assert ss[AVERAGE]["n"] == 3
    assert all(cell["relative_time"] == pytest.approx(1.0) for cell in ss.values())
    nr = table["no_retrieval"]
    # On its own questions: squad question 1 took 1 s in both rows (not 1 s against squad's 2 s mean).
    assert nr["squad"]["relative_time"] == pytest.approx(1.0)
    assert nr["hotpotqa"]["relative_time"] == pytest.approx(0.25)
    assert nr[AVERAGE]["relative_time"] == pytest.approx((1.0 + 1.0) / (1.0 + 4.0))
    assert nr[AVERAGE]["steps"] == 0


def test_relative_time_pairs_questions_so_machine_speed_and_subsets_cancel() -> None:
    # Question 1 ran on a machine twice as fast as question 2's; the subset row ran only on 2.
    rows = {
        "single_step": [outcome("1", "nq", "single_step", seconds=2.0),
                        outcome("2", "nq", "single_step", seconds=4.0)],
        "ircot": [outcome("1", "nq", "ircot", seconds=6.0), outcome("2", "nq", "ircot", seconds=12.0)],
        "self_route": [outcome("2", "nq", "self_route", seconds=6.0)],
    }
    table = summarise(rows)
    assert table["ircot"]["nq"]["relative_time"] == pytest.approx(3.0)
    # Against all of single step's seconds (mean 3.0) it would read 2.0; paired it is 1.5.
    assert table["self_route"]["nq"]["relative_time"] == pytest.approx(1.5)
    assert table["self_route"][AVERAGE]["relative_time"] == pytest.approx(1.5)


def test_summarise_without_single_step_has_no_relative_time() -> None:
    table = summarise({"ircot": [outcome("1", "nq", "ircot", seconds=2.0)]})
    assert table["ircot"]["nq"]["relative_time"] is None


def test_summarise_empty_row() -> None:
    assert summarise({"single_step": []}) == {"single_step": {}}


TIERS = ("no_retrieval", "single_step", "ircot")


def test_oracle_picks_the_cheapest_correct_and_falls_back_by_hop() -> None:
    qs = [
        Question("s1", "nq", "?", ("x",)),        # B and C correct -> B
        Question("s2", "nq", "?", ("x",)),        # A correct (acc only) -> A
        Question("s3", "squad", "?", ("x",)),     # none correct, single-hop -> B
        Question("m1", "musique", "?", ("x",)),   # none correct, multi-hop -> C
        Question("m2", "2wiki", "?", ("x",)),     # only C correct -> C
        Question("m3", "2wiki", "?", ("x",)),     # an outcome missing -> skipped
    ]
    correct = {("s1", "single_step"), ("s1", "ircot"), ("s2", "no_retrieval"), ("m2", "ircot")}
    outcomes = {}
    for q in qs:
        for name in TIERS:
            if q.id == "m3" and name == "ircot":
                continue
            hit = (q.id, name) in correct
            o = outcome(q.id, q.dataset, name, em=float(hit and q.id != "s2"), acc=float(hit))
            outcomes[o.key] = o
    picked = oracle_outcomes(outcomes, qs, TIERS)
    assert [(o.question_id, o.strategy) for o in picked] == [
        ("s1", "single_step"), ("s2", "no_retrieval"), ("s3", "single_step"),
        ("m1", "ircot"), ("m2", "ircot"),
    ]


def test_markdown_has_a_table_per_dataset() -> None:
    table = summarise({
        "single_step": [outcome("1", "nq", "single_step", f1=0.5, seconds=2.0)],
        "ircot": [outcome("1", "nq", "ircot", f1=1.0, steps=3, seconds=6.0)],
    })
    text = markdown(table)
    assert "### nq (single-hop)" in text and f"### {AVERAGE}\n" in text
    assert "| ircot | 1 | 0.0 | 100.0 | 0.0 | 3.00 | 6.00 | 3.00 |" in text
    assert "| single_step | 1 | 0.0 | 50.0 | 0.0 | 1.00 | 2.00 | 1.00 |" in text


def test_write_report_writes_json_markdown_and_png(tmp_path) -> None:
    table = summarise({
        "single_step": [outcome("1", "nq", "single_step", f1=0.5), outcome("2", "musique", "single_step")],
        "ircot": [outcome("1", "nq", "ircot", f1=1.0, steps=3, seconds=4.0)],
    })
    meta = {"command": "arag eval --limit 2", "llm": "fake"}
    paths = write_report(table, tmp_path / "out", meta)
    assert [p.name for p in paths] == ["report.json", "report.md", "f1_vs_time.png"]
    data = json.loads(paths[0].read_text())
    assert data["meta"] == meta
    assert data["table"]["ircot"]["nq"]["steps"] == 3
    md = paths[1].read_text()
    assert "Command: `arag eval --limit 2`" in md and "- llm: fake" in md
    assert "### musique (multi-hop)" in md
    png = paths[2].read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000


def test_report_json_is_strict_json_without_single_step_row(tmp_path) -> None:
    table = summarise({"ircot": [outcome("1", "nq", "ircot", seconds=2.0)]})
    json_path = write_report(table, tmp_path, {"command": "x"})[0]

    def reject(token: str):
        raise ValueError(f"non-standard JSON token {token}")

    json.loads(json_path.read_text(), parse_constant=reject)


def test_report_gives_f1_and_time_shares_of_the_multi_step_row(tmp_path) -> None:
    table = summarise({
        "decompose": [outcome("1", "nq", "decompose", f1=0.8, seconds=10.0),
                      outcome("2", "musique", "decompose", f1=0.0, seconds=10.0)],
        "adaptive": [outcome("1", "nq", "adaptive", f1=0.6, seconds=4.0),
                     outcome("2", "musique", "adaptive", f1=0.5, seconds=5.0)],
    })
    paths = write_report(table, tmp_path, {"command": "x", "multi_step_row": "decompose"})
    shares = json.loads(paths[0].read_text())["versus_multi_step"]["adaptive"]
    assert shares["nq"] == {"f1_share": pytest.approx(0.75), "time_share": pytest.approx(0.4)}
    assert shares["musique"]["f1_share"] is None  # reference F1 is zero: no share, not a crash
    md = paths[1].read_text()
    assert "share of `decompose`" in md and "| adaptive | 75 % / 40 % | - / 50 % |" in md


def test_router_goals_measure_the_gain_the_gap_closed_and_the_time_share() -> None:
    # Ten nq questions: the best fixed row answers 0-3, the oracle 0-7; the good router 0-5 at a
    # quarter of multi-step time, the cheap router only 0-1.
    def row(name: str, correct: int, seconds: float) -> list[Outcome]:
        return [outcome(str(i), "nq", name, f1=float(i < correct), seconds=seconds) for i in range(10)]

    rows = {"single_step": row("single_step", 3, 1.0), "ircot": row("ircot", 4, 4.0),
            ORACLE: row(ORACLE, 8, 1.0), "good": row("good", 6, 1.0), "cheap": row("cheap", 2, 0.5)}
    table = summarise(rows)
    found = router_goals(table, rows, ["good", "cheap"], best_fixed="ircot", multi_step_row="ircot",
                         resamples=300)
    good, cheap = found["good"], found["cheap"]
    assert good["f1_vs_best_fixed"]["estimate"] == pytest.approx(0.2)
    assert good["gap_closed"]["estimate"] == pytest.approx(0.5)
    assert good["time_share_of_multi_step"] == pytest.approx(0.25)
    assert good["met_by_estimate"] and not good["met_by_interval"]  # ten questions decide nothing
    assert cheap["f1_vs_best_fixed"]["estimate"] == pytest.approx(-0.2) and not cheap["met_by_estimate"]
    text = router_goals_markdown(found, "ircot", "ircot")
    assert "| good | 10 | +20.0 [" in text and "| 25 % | met (estimate only) |" in text
    assert "| cheap | 10 | -20.0 [" in text and "not met |" in text


def test_router_goals_need_the_oracle_and_the_best_fixed_row() -> None:
    rows = {"ircot": [outcome("1", "nq", "ircot")], "good": [outcome("1", "nq", "good")]}
    assert router_goals(summarise(rows), rows, ["good"], "ircot", "ircot") == {}
