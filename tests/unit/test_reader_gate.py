"""The reader's gate after the retrieval gate: an abstaining reader's no-answer marker abstains,
and with a minimum confidence only a marker the reader was sure of does; an unsure one is asked
again without the marker."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import pytest
from fakes import FakeLLM, FakeRetriever

from adaptive_rag.contracts import AnswerStyle
from adaptive_rag.domain import Completion, Passage
from adaptive_rag.prompts import single_step as prompts
from adaptive_rag.settings import Settings
from adaptive_rag.strategies import build_strategy
from adaptive_rag.strategies.single_step import READER_FOUND_NONE, SingleStep

PASSAGES = [Passage("returns#0", "Returns", "Items can be returned within 30 days at any post office.", 9.0)]


class SureLLM(FakeLLM):
    """Replies with a first-token probability each (None: no log-probabilities reported)."""

    def __init__(self, replies: Sequence[tuple[str, float | None]]) -> None:
        super().__init__([text for text, _ in replies])
        self._sure = [p for _, p in replies]

    def generate(self, prompt: str, max_tokens: int, stop: Sequence[str] = ()) -> Completion:
        completion = super().generate(prompt, max_tokens, stop)
        sure = self._sure.pop(0)
        return replace(completion, token_logprobs=None if sure is None else [math.log(sure), -0.1])


def _single(llm: FakeLLM, confidence: float | None) -> SingleStep:
    return SingleStep(FakeRetriever(PASSAGES), llm, reader_abstains=True, style=AnswerStyle.SUPPORT,
                      abstain_min_confidence=confidence)


def test_a_sure_marker_abstains_in_one_call() -> None:
    llm = SureLLM([("not in the passages", 0.9)])
    result = _single(llm, 0.7).run("can I pay with a gift card?")
    assert not result.answerable and result.abstain_reason == READER_FOUND_NONE
    assert len(llm.calls) == 1


def test_an_unsure_marker_is_asked_again_without_the_marker_and_answers() -> None:
    llm = SureLLM([("not in the passages", 0.55), ("Returns are free within 30 days [1].", 0.8)])
    result = _single(llm, 0.7).run("are returns free?")
    assert result.answerable and result.answer == "Returns are free within 30 days [1]."
    assert len(llm.calls) == 2
    assert prompts.NO_ANSWER_MARKER in llm.prompts[0] and prompts.NO_ANSWER_MARKER not in llm.prompts[1]


@pytest.mark.parametrize("confidence, sure", [(None, 0.3), (0.7, None)])
def test_without_a_minimum_or_without_log_probabilities_every_marker_abstains(confidence, sure) -> None:
    llm = SureLLM([("not in the passages", sure)])
    assert not _single(llm, confidence).run("gift cards?").answerable
    assert len(llm.calls) == 1


def test_an_answer_is_kept_however_unsure_its_first_token() -> None:
    llm = SureLLM([("Within 30 days [1].", 0.2)])
    result = _single(llm, 0.7).run("how long to return?")
    assert result.answerable and len(llm.calls) == 1


def test_the_minimum_confidence_comes_from_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARAG_READER_ABSTAINS", "true")
    monkeypatch.setenv("ARAG_READER_ABSTAIN_MIN_CONFIDENCE", "0.7")
    built = build_strategy("single_step", FakeRetriever([]), FakeLLM([]), Settings(_env_file=None))
    assert built.reader_abstains and built.abstain_min_confidence == 0.7
    monkeypatch.delenv("ARAG_READER_ABSTAIN_MIN_CONFIDENCE")
    assert Settings(_env_file=None).reader_abstain_min_confidence is None
