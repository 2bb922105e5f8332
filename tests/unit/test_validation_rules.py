"""Query, request id and feedback validation, and the rule-based fallback router."""

from __future__ import annotations

import pytest

from adaptive_rag.contracts import Tier
from adaptive_rag.errors import InvalidQueryError, InvalidRequestError
from adaptive_rag.routing.rules import rule_tier
from adaptive_rag.validation import check_feedback, check_request_id, validate_query

# --- validate_query -------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", " ", "\t\n\r  ", "\u3000"])
def test_empty_or_blank_query(text: str) -> None:
    with pytest.raises(InvalidQueryError, match="^query is empty$"):
        validate_query(text, 100)


def test_non_text_query() -> None:
    with pytest.raises(InvalidQueryError, match="must be text"):
        validate_query(None, 100)  # type: ignore[arg-type]
    with pytest.raises(InvalidQueryError, match="must be text"):
        validate_query(b"bytes", 100)  # type: ignore[arg-type]


def test_too_long_query_message() -> None:
    with pytest.raises(InvalidQueryError) as info:
        validate_query("x" * 101, 100)
    assert str(info.value) == "query is 101 characters; the limit is 100"


def test_length_is_measured_after_stripping() -> None:
    assert validate_query("   " + "x" * 100 + "\n\n", 100) == "x" * 100


@pytest.mark.parametrize(
    ("text", "code", "position"),
    [
        ("who\x00is", "0000", 3),
        ("\x07bell rings", "0007", 0),
        ("escape \x1b[31m red", "001B", 7),
        ("delete\x7f", "007F", 6),
        ("next line \x85 here", "0085", 10),
        ("ab\x0bc", "000B", 2),
    ],
)
def test_control_characters_rejected_with_position(text: str, code: str, position: int) -> None:
    with pytest.raises(InvalidQueryError) as info:
        validate_query(text, 100)
    assert str(info.value) == f"query contains control character U+{code} at position {position}"


def test_control_position_counts_in_the_stripped_text() -> None:
    with pytest.raises(InvalidQueryError, match="at position 1$"):
        validate_query("   a\x00b", 100)


def test_lone_surrogate_rejected() -> None:
    with pytest.raises(InvalidQueryError, match=r"U\+D800 at position 4$"):
        validate_query("bad \ud800 text", 100)


@pytest.mark.parametrize(
    "text",
    [
        "line one\nline two",
        "col\tcol",
        "windows\r\nline",
        "Où est la café? Zürich, naïve",
        "東京タワーの高さは?",
        "what does 🎉 mean",
        "zero\u200bwidth",  # a format character (Cf), not a control character
    ],
)
def test_allowed_text_is_returned_stripped(text: str) -> None:
    assert validate_query(f"  {text} \n", 100) == text


# --- request ids and feedback text: control characters never reach the records (PostgreSQL text
# cannot hold U+0000: the call would end INTERNAL instead of INVALID_ARGUMENT) ----------------------


@pytest.mark.parametrize(("value", "code", "position"), [("ab\x00cd", "0000", 2), ("\x1b[2J", "001B", 0)])
def test_a_request_id_with_a_control_character_is_refused_precisely(value: str, code: str, position: int) -> None:
    with pytest.raises(InvalidRequestError, match=rf"request_id contains U\+{code} at position {position};"):
        check_request_id(value)


def test_a_well_formed_request_id_is_returned_stripped() -> None:
    assert check_request_id(" 3f600a0fe69d488eacb856e2b89f050f ") == "3f600a0fe69d488eacb856e2b89f050f"


def test_feedback_text_with_a_control_character_is_refused_precisely() -> None:
    with pytest.raises(InvalidRequestError, match=r"^correct_answer contains control character U\+0000 at position 6$"):
        check_feedback(-1, "Lumora\x00Lighting", None)
    with pytest.raises(InvalidRequestError, match=r"^comment contains control character U\+0007 at position 0$"):
        check_feedback(1, None, "\x07ding")
    check_feedback(1, "line one\nline two\tend", "windows\r\nline")  # line structure is fine


# --- rule_tier ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "query",
    [
        "hi", "Hello there, can you help me with something today please?", "hey!",
        "thanks a lot for all your answers", "Thank you", "good morning everyone",
        "Good Evening", "bye", "Goodbye and see you",
    ],
)
def test_greetings_are_tier_a(query: str) -> None:
    assert rule_tier(query) == Tier.A


@pytest.mark.parametrize("query", ["ok", "cool thanks", "nice one there", "lol"])
def test_short_chit_chat_is_tier_a(query: str) -> None:
    assert rule_tier(query) == Tier.A


@pytest.mark.parametrize("query", ["Paris population?", "Who?", "Warranty length?"])
def test_short_questions_are_not_chit_chat(query: str) -> None:
    assert rule_tier(query) == Tier.B


@pytest.mark.parametrize(
    "query",
    [
        "Compare the Lumora Plus and Pro plans",
        "What is the difference between Zigbee and Thread?",
        "Lumora Plus versus Lumora Pro for a big house",
        "Lumora Plus vs. Pro: which to buy",
        "Do both plans include cloud backup?",
        "What is the warranty of each of the hubs?",
        "Which one was released first, the Hub H1 or the Hub H2?",
        "Which plan supports more devices, Lumora Plus or Lumora Pro?",
        "Who was born first, the director of Jaws or the author of Carrie?",
        "Which plan is required for the API, and what is its rate limit?",
        "In what year was the Hub H2 released, and which firmware added Daylight?",
        "How long is the warranty? What does it cover?",
        "Which was bigger, Rome or Carthage?",
    ],
)
def test_comparison_and_multi_part_are_tier_c(query: str) -> None:
    assert rule_tier(query) == Tier.C


@pytest.mark.parametrize(
    "query",
    [
        "How long is the Lumora Hub H2 warranty?",
        "What battery does the Lumora Sense M1 motion sensor use?",
        "Who wrote Pride and Prejudice?",  # "and" not followed by a question word
        "What is the capital of France?",
        "Where is the Eiffel Tower",
        "Which river flows through Vienna?",
        "History of the highlands",  # 'hi' inside a word is no greeting
    ],
)
def test_plain_lookups_are_tier_b(query: str) -> None:
    assert rule_tier(query) == Tier.B


@pytest.mark.parametrize(
    "query", ["Who was the Earl of Bothwell?", "Who founded the channel Vsauce?"]
)
def test_words_starting_with_a_signal_are_not_multi_part(query: str) -> None:
    assert rule_tier(query) == Tier.B


@pytest.mark.parametrize(
    "query",
    ["Hi, how long is the Lumora Hub H2 warranty?", "Hello! What battery does the Sense M1 use?"],
)
def test_greeting_followed_by_a_question_is_not_chit_chat(query: str) -> None:
    assert rule_tier(query) == Tier.B
