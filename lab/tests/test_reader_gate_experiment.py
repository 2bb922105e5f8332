"""The reader-gate experiment's decisions and selection, on records made up here (no reader)."""

from __future__ import annotations

import math
from pathlib import Path

from lab.experiments import reader_gate as rg


def _judge(reply: str, prob: float) -> dict:
    return {"prompt": "judge", "reply": reply, "tokens": [{"token": reply, "logprob": math.log(prob), "top": {}}]}


def _support(reply: str, prob: float = 0.9) -> dict:
    return {"prompt": "support_abstain", "reply": reply, "tokens": [{"token": reply[:3], "logprob": math.log(prob), "top": {}}]}


def _question(kb: str, text: str, expect_abstain: bool, stopped: bool = False, split: str = "train") -> dict:
    return {"kb": kb, "id": text, "split": split, "kind": "uncovered" if expect_abstain else "question",
            "question": text, "expect_abstain": expect_abstain, "relevance": 0.9, "threshold": 0.45,
            "retrieved": 5, "retrieval_abstained": stopped}


def test_p_yes_is_the_chosen_token_probability_or_its_complement() -> None:
    assert math.isclose(rg.p_yes(_judge("yes", 0.8)), 0.8)
    assert math.isclose(rg.p_yes(_judge("no", 0.8)), 0.2)
    assert math.isclose(rg.p_yes(_judge(" Yes", 0.6)), 0.6)


def test_the_support_gate_abstains_only_on_a_reply_opening_with_the_marker() -> None:
    assert rg.support_says_no("not in the passages")
    assert rg.support_says_no("Answer: Not in the passages.")
    assert not rg.support_says_no("You can return it within 30 days [1]; it is not in the")


def test_a_question_the_retrieval_gate_stops_abstains_in_every_gated_row_without_a_reply() -> None:
    made = rg.decisions(_question("kb", "q", True, stopped=True), {})
    assert made[rg.NEVER] is False
    assert all(made[row] for row in (rg.RETRIEVAL, rg.SUPPORT, rg.SUPPORT_AT, rg.JUDGE, rg.JUDGE_AT))


def test_reader_rows_decide_from_their_own_reply() -> None:
    replies = {"support_abstain": _support("not in the passages", 0.6), "judge": _judge("yes", 0.7)}
    made = rg.decisions(_question("kb", "q", True), replies, {rg.JUDGE_AT: 0.8, rg.SUPPORT_AT: 0.7})
    assert made == {rg.NEVER: False, rg.RETRIEVAL: False, rg.SUPPORT: True, rg.SUPPORT_AT: False,
                    rg.JUDGE: False, rg.JUDGE_AT: True, rg.RELAXED: True}


def test_the_marker_probability_counts_only_a_marker_reply() -> None:
    assert math.isclose(rg.p_marker(_support("not in the passages", 0.7)), 0.7)
    assert rg.p_marker(_support("You can [1]", 0.7)) == 0.0


def test_selection_keeps_retrieval_alone_when_a_reader_gate_abstains_falsely_too_often() -> None:
    questions, replies = [], {}
    for kb in rg.SELECT_KBS:
        for i in range(10):  # in-KB: the judge says no to three of ten (30 % false), support never abstains
            q = _question(kb, f"in {i}", False)
            questions.append(q)
            replies[(kb, q["question"])] = {"support_abstain": _support("Yes [1]"),
                                            "judge": _judge("no" if i < 3 else "yes", 0.9)}
        q = _question(kb, "out", True)
        questions.append(q)
        replies[(kb, "out")] = {"support_abstain": _support("Yes [1]"), "judge": _judge("no", 0.9)}
    picked = rg.select(questions, replies)
    assert picked["picked"] == rg.RETRIEVAL


def test_selection_picks_a_reader_gate_that_catches_more_within_the_budget() -> None:
    questions, replies = [], {}
    for kb in rg.SELECT_KBS:
        for i in range(20):
            q = _question(kb, f"in {i}", False)
            questions.append(q)
            replies[(kb, q["question"])] = {"support_abstain": _support("Yes [1]"), "judge": _judge("yes", 0.9)}
        q = _question(kb, "out", True)
        questions.append(q)
        replies[(kb, "out")] = {"support_abstain": _support("not in the passages"), "judge": _judge("yes", 0.9)}
    assert rg.select(questions, replies)["picked"] == rg.SUPPORT


def test_the_sample_keeps_every_question_to_abstain_on_and_a_stable_prefix_of_the_in_kb_ones() -> None:
    from adaptive_rag.contracts import Tier
    from adaptive_rag.evaluation.support import SupportQuery

    queries = [SupportQuery(f"question-{i}", "question", f"q{i}", Tier.B) for i in range(200)]
    queries += [SupportQuery(f"uncovered-{i}", "uncovered", f"u{i}", Tier.B, expect_abstain=True) for i in range(30)]
    five = rg.sample(queries, "train", 5)
    ten = rg.sample(queries, "train", 10)
    outs = [q for q in queries if q.kind == "uncovered" and q.split == "train"]
    assert [q for q in five if q.kind == "uncovered"] == [q for q in ten if q.kind == "uncovered"]
    assert len([q for q in five if q.kind == "uncovered"]) == len(outs)
    inside_five = [q for q in five if q.kind == "question"]
    assert len(inside_five) == 5 and inside_five == [q for q in ten if q.kind == "question"][:5]


def test_the_cache_reads_back_what_it_wrote(tmp_path: Path) -> None:
    cache = rg.ReaderCache(tmp_path / "records.jsonl")
    template, tokens = rg.PROMPTS["judge"]
    row = {"prompt": "judge", "version": rg.prompt_version(template, tokens), "kb": "kb", "question": "q", "reply": "no"}
    cache.add(row)
    assert rg.ReaderCache(tmp_path / "records.jsonl").get("judge", "kb", "q") == row
    assert rg.ReaderCache(tmp_path / "records.jsonl").get("support_abstain", "kb", "q") is None


def test_the_call_order_takes_turns_between_groups_and_skips_questions_the_retrieval_gate_stopped() -> None:
    def q(kb: str, name: str, out: bool, stopped: bool = False) -> rg.Question:
        return rg.Question(kb, name, "test", "k", name, out, None, 0.45, 5, stopped, "")

    ordered = rg.call_order([q("a", "a-out-1", True), q("a", "a-out-2", True), q("a", "a-out-3", True, stopped=True),
                             q("a", "a-in-1", False), q("a", "a-in-2", False), q("b", "b-in-1", False)])
    assert [x.id for x in ordered] == ["a-out-1", "a-in-1", "b-in-1", "a-out-2", "a-in-2"]


def test_the_relaxed_row_lets_the_reader_decide_between_a_share_of_the_threshold_and_the_threshold() -> None:
    below = {**_question("kb", "q", False, stopped=True), "relevance": 0.40}  # threshold 0.45
    cuts = {rg.RELAXED_SHARE: 0.8, rg.RELAXED: 0.7}
    assert rg.decisions(below, {"support_abstain": _support("You can [1]")}, cuts)[rg.RELAXED] is False
    assert rg.decisions(below, {"support_abstain": _support("not in the passages", 0.9)}, cuts)[rg.RELAXED] is True
    assert rg.decisions(below, {"support_abstain": _support("not in the passages", 0.5)}, cuts)[rg.RELAXED] is False
    far_below = {**below, "relevance": 0.30}  # under 0.8 x 0.45: stopped without the reader
    assert rg.decisions(far_below, {"support_abstain": _support("You can [1]")}, cuts)[rg.RELAXED] is True
    assert rg.decisions({**below, "retrieved": 0, "relevance": None}, {}, cuts)[rg.RELAXED] is True


def test_selection_relaxes_the_retrieval_gate_only_when_every_question_was_asked() -> None:
    questions, replies = [], {}
    for kb in rg.SELECT_KBS:
        for i in range(20):  # in-KB; two of them just under the threshold: the retrieval gate refuses them
            q = {**_question(kb, f"in {i}", False, stopped=i < 2), "relevance": 0.42 if i < 2 else 0.9}
            questions.append(q)
            replies[(kb, q["question"])] = {"support_abstain": _support("Yes [1]")}
        q = {**_question(kb, "out", True), "relevance": 0.5}  # passes retrieval; the reader is sure it is not there
        questions.append(q)
        replies[(kb, "out")] = {"support_abstain": _support("not in the passages", 0.9)}
    picked = rg.select(questions, replies, ("support_abstain",))
    assert picked["picked_row"] == rg.RELAXED and picked["cuts"][rg.RELAXED_SHARE] < 0.93
    for kb in rg.SELECT_KBS:  # one in-KB question never asked: the retrieval gate stays as it is
        del replies[(kb, "in 0")]
    assert rg.select(questions, replies, ("support_abstain",))["picked_row"] != rg.RELAXED
