"""The learned small-talk detector: its confidence floor, the clause veto, the question guards in
front of it (a follow-up about a topic, a question about a named thing), and loading (the shipped
file, a round trip, a broken file, the fallback to rules)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from adaptive_rag.routing import small_talk
from adaptive_rag.routing.small_talk import REPLIES, learned_intent, normalise, rule_intent
from adaptive_rag.routing.small_talk_model import CLAUSE_VETO, NONE, SmallTalkModel, clause_features


def toy_model(min_confidence: float = 0.5) -> SmallTalkModel:
    """Two classes, three word features: "hello" votes greeting, "refund" and "order" vote none."""
    vocabulary = ["w:hello", "w:order", "w:refund"]
    weights = np.array([[4.0, -4.0], [-4.0, 4.0], [-4.0, 4.0]], dtype=np.float32)
    return SmallTalkModel(vocabulary, weights, np.zeros(2, dtype=np.float32), ["greeting", NONE], min_confidence)


def test_a_confident_score_is_small_talk_and_a_higher_floor_turns_it_into_a_request() -> None:
    model = toy_model(min_confidence=0.5)
    chance = model.score_clauses(["hello"]).not_none
    assert 0.5 < chance < 1.0
    assert model.decide(["hello"]) == "greeting"
    model.min_confidence = chance + 1e-3
    assert model.decide(["hello"]) is None
    model.min_confidence = chance - 1e-3
    assert model.decide(["hello"]) == "greeting"


def test_unknown_words_fall_back_to_the_bias_and_a_request_word_is_none() -> None:
    model = toy_model()
    assert model.score_clauses(["zzz"]).not_none == pytest.approx(0.5)
    assert model.decide(["refund"]) is None


def test_a_clause_that_is_surely_a_request_vetoes_the_whole_utterance() -> None:
    model = toy_model(min_confidence=0.0)  # the floor alone would let everything through
    assert 1.0 - model.score_clauses(["refund order"]).not_none >= CLAUSE_VETO
    assert model.decide(["hello", "hello"]) == "greeting"
    assert model.decide(["hello", "refund order"]) is None


def test_features_mark_the_utterance_edges_and_do_not_pair_across_clauses() -> None:
    features = clause_features(["hi there", "bye"])
    assert {"w:hi", "b:<s> hi", "b:hi there", "c: hi ", "b:bye </s>"} <= features
    assert "b:there bye" not in features


def test_shape_mismatch_and_missing_none_class_are_refused() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        SmallTalkModel(["w:a"], np.zeros((2, 2)), np.zeros(2), ["greeting", NONE], 0.5)
    with pytest.raises(ValueError, match="none"):
        SmallTalkModel(["w:a"], np.zeros((1, 2)), np.zeros(2), ["greeting", "thanks"], 0.5)


def test_save_and_load_give_the_same_decisions(tmp_path: Path) -> None:
    model = toy_model(min_confidence=0.6)
    model.info = {"hyperparameters": {"C": 1.0}}
    loaded = SmallTalkModel.load(model.save(tmp_path / "detector.npz"))
    assert loaded.classes == model.classes and loaded.min_confidence == pytest.approx(0.6)
    assert loaded.info == model.info
    for clauses in (["hello"], ["refund"], ["hello", "order"]):
        assert np.allclose(loaded.score_clauses(clauses).probabilities,
                           model.score_clauses(clauses).probabilities, atol=1e-3)


def test_a_file_of_another_format_is_refused(tmp_path: Path) -> None:
    path = toy_model().save(tmp_path / "detector.npz")
    with np.load(path) as data:
        arrays = dict(data)
    arrays["format"] = np.array(99)
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match="format 99"):
        SmallTalkModel.load(path)


def test_the_shipped_detector_loads_once_with_every_intent() -> None:
    small_talk.shipped_model.cache_clear()
    model = small_talk.shipped_model()
    assert model is not None and small_talk.shipped_model() is model
    assert set(model.classes) == {*REPLIES, NONE}
    assert 0.5 <= model.min_confidence < 1.0
    assert model.info["command"].startswith("arag smalltalk train --held-out ")  # make small-talk-model


def test_an_unreadable_detector_falls_back_to_the_phrase_rules(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(small_talk, "DEFAULT_MODEL", tmp_path / "missing.npz")
    small_talk.shipped_model.cache_clear()
    try:
        assert small_talk.shipped_model() is None
        assert small_talk.small_talk_intent("hello") == rule_intent("hello")
        assert small_talk.small_talk_intent("how do I return an item?") is None
    finally:
        small_talk.shipped_model.cache_clear()


@pytest.mark.parametrize("text", [
    "what about masks?", "and what about refunds", "ok so how about the warranty?", "So what about my order?",
])
def test_a_follow_up_about_a_topic_is_guarded_whatever_the_model_says(text: str) -> None:
    model = toy_model(min_confidence=0.0)  # would call anything small talk
    assert small_talk.is_guarded_request(normalise(text))
    assert learned_intent(text, model) is None


def test_a_follow_up_about_the_assistant_is_left_to_the_model() -> None:
    assert not small_talk.is_guarded_request(normalise("what about you?"))
    assert not small_talk.is_guarded_request(normalise("hello"))


def test_too_long_an_utterance_is_a_request_whatever_the_model_says() -> None:
    model = toy_model(min_confidence=0.0)
    assert learned_intent("hello " * (small_talk.MAX_WORDS + 1), model) is None
    assert learned_intent("hello", model) is not None
    # one word longer than any word of chat: a code, an address or noise
    assert learned_intent("x" * (small_talk.MAX_CHAT_WORD + 1), model) is None
    assert learned_intent("congratulations", model) is not None


@pytest.mark.parametrize("text", [
    "What does Acme do?", "what does zendesk do", "what is the premium plan", "What's Klarna?",
    "who is the author of dune", "Who's the CEO of Shopify?", "how does the loyalty program work",
    "how does stripe work?", "can you tell me what acme does", "what can shopify do?",
    "what can i do with zendesk", "hi, what is bitcoin?", "can u explain kubernetes",
    "I would like to know about stripe", "Who founded Microsoft?", "who made the X200",
    "who won the world cup", "who invented the telephone?",
])
def test_a_question_about_a_named_thing_is_guarded_whatever_the_model_says(text: str) -> None:
    model = toy_model(min_confidence=0.0)  # would call anything small talk
    assert small_talk.is_guarded_request(normalise(text))
    assert learned_intent(text, model) is None


@pytest.mark.parametrize("text", [
    "what is your name", "whats ur name?", "what does this bot do", "what does the assistant do",
    "who are you", "what r u", "who made you", "who is your creator", "who is the developer",
    "how do you work", "how does this work", "what can you do", "what can u do?", "what can i do",
    "what's up", "whats poppin", "what is going on", "what's new", "who is there", "who is it",
    "what is this", "tell me about yourself", "explain yourself", "what can i do with you",
    "what is the point of you", "what's the name of your maker", "who created you?", "who built this bot",
    "who wrote you",
])
def test_a_question_about_the_assistant_or_a_chat_phrase_is_left_to_the_model(text: str) -> None:
    assert not small_talk.is_guarded_request(normalise(text))
    assert learned_intent(text, toy_model(min_confidence=0.0)) is not None
