"""The small-talk detector: whole utterances of chit-chat get a canned reply; anything that carries
a real request, even after a greeting or a thank-you, is a query (None)."""

from __future__ import annotations

import pytest

from adaptive_rag.routing.small_talk import REPLIES, SmallTalk, normalise, small_talk_intent

POSITIVE = {
    "greeting": [
        "hi", "Hi!", "HI THERE", "hello", "Hello 👋", "hey", "heyyy", "Hey there!!", "hiya",
        "good morning", "Good Evening :)", "morning!", "hello again", "Hi everyone",
        "hello, is anyone there?", "yo", "nice to meet you",
        "  hello   ", "hello...", "¡hola!",
    ],
    "thanks": [
        "thanks", "Thanks!", "thank you", "Thank you so much!", "thank you very much for your help",
        "thanks a lot 🙏", "thx", "ty", "TYSM!!!", "many thanks", "cheers", "much appreciated",
        "thanks for the info", "thank u", "that was really helpful", "ok thanks", "great, thank you!",
        "Thanks 4 the help",
    ],
    "goodbye": [
        "bye", "Bye!", "bye bye", "goodbye", "good bye 👋", "see you", "see you later", "see ya",
        "take care", "have a nice day", "Have a great weekend!", "ok bye", "thanks, bye!",
        "that's all for now, thanks", "good night", "Tschüss!",
    ],
    "identity": ["who are you?", "What are you?", "who are u", "introduce yourself"],
    "name": ["what's your name?", "what is your name", "do you have a name"],
    "creator": ["who made you?", "who built you", "Who created you?"],
    "capabilities": ["what can you do?", "how can you help me?", "can you help me?", "help", "I need help"],
    "wellbeing": [
        "what's up?", "Whats up",  # a greeting to the rules; "I'm doing well" answers it too
        "how are you?", "How are you doing today?", "hi, how are you?", "how's it going?",
        "Hey! How are you doing?", "you ok?",
    ],
    "bot_or_human": [
        "are you a bot?", "Are you a real person?", "are you human??", "is this a chatbot",
        "Is this an AI?", "am I talking to a human or a machine?", "are you a robot or a human",
        "I want to talk to a real person", "can I speak to an agent?", "hello, are you a bot?",
    ],
    "acknowledgement": ["ok", "okay!", "Got it.", "cool", "perfect 👍", "sounds good", "alright"],
}

NEGATIVE = [
    "hi, how do I reset my hub?",
    "Hello, what is a novel coronavirus?",
    "hey can you tell me how the virus spreads",
    "good morning, can I get tested at a pharmacy?",
    "thanks, but how long does the virus survive on surfaces?",
    "thank you for nothing, my order never arrived",
    "who are you supposed to call if you have symptoms?",
    "what are you doing about refunds?",
    "how are you tested for COVID-19?",
    "how are masks cleaned?",
    "are you open on sundays?",
    "are you able to ship to Canada?",
    "help me find a testing site",
    "I need help with my invoice",
    "bye the way, where do I get a test",
    "hello world",
    "Goodbye letter template",
    "What is the source of the virus?",
    "ok so what about masks?",
    "Is this a scam?",
    "thanks! also, can pets spread it?",
    "hi hi hi hi hi hi hi hi hi hi hi hi hi hi hi hi hi hi",  # a paste, not a greeting
    "",
    "   ",
    "?!",
    "👋",
]


@pytest.mark.parametrize(
    ("intent", "text"), [(intent, text) for intent, texts in POSITIVE.items() for text in texts]
)
def test_small_talk_is_recognised_with_its_intent(intent: str, text: str) -> None:
    found = small_talk_intent(text)
    assert found == SmallTalk(intent, REPLIES[intent]), text


@pytest.mark.parametrize("text", NEGATIVE)
def test_real_questions_and_non_talk_are_not_small_talk(text: str) -> None:
    assert small_talk_intent(text) is None


def test_every_intent_has_a_short_reply() -> None:
    assert set(REPLIES) == set(POSITIVE)
    assert all(0 < len(reply) <= 120 for reply in REPLIES.values())


def test_the_most_specific_intent_answers_a_mixed_turn() -> None:
    assert small_talk_intent("hi! are you a bot?").intent == "bot_or_human"
    assert small_talk_intent("hello, who are you?").intent == "identity"
    assert small_talk_intent("thanks, bye").intent == "goodbye"
    assert small_talk_intent("hi, thanks").intent == "thanks"


def test_case_punctuation_and_typographic_apostrophes_do_not_matter() -> None:
    assert small_talk_intent("WHAT’S YOUR NAME???") == small_talk_intent("what's your name")
    assert small_talk_intent("Thank-you!") == small_talk_intent("thank you")


def test_normalise_splits_clauses_on_punctuation_and_emoji() -> None:
    assert normalise("Hi 👋 How are you?") == ["hi", "how are you"]
    assert normalise("Whats up, youre a bot") == ["what's up", "you're a bot"]
    assert normalise("!!!") == []


@pytest.mark.parametrize(("query", "parts", "several"), [
    ("In what year was the Hub H2 released, and which hub firmware introduced Adaptive Daylight?", 2, True),
    ("Can pets catch COVID-19? And how long does the virus live on surfaces?", 2, True),
    ("What is the rate limit; and who can raise it?", 2, True),
    ("What is the maximum brightness of the A19 bulb and of the Flex Strip?", 2, True),  # about two things
    ("How do I give my bookkeeper access, and can they download all the invoice PDFs at once?", 2, True),
    ("How do I export all my data, and then how do I close my account?", 2, True),
    ("How do I reset the hub and can I keep my scenes", 2, True),  # people leave the "?" out
    ("How long is the trial and do I need a card for it?", 2, True),
    ("How do I reset my password and change my email?", 2, True),
    ("Can I pause my plan, and if so, for how long?", 2, True),
    ("What are the fees for cards, direct debit and bank transfers?", 3, True),
    ("Two things: 1) how long does shipping take, 2) can I return an opened bulb?", 2, True),
    ("My bulb is unresponsive. What should I try? How do I reset it?", 2, True),
    ("Which plan supports more devices, Lumora Plus or Lumora Pro?", 1, True),  # a comparison: C, read at once
    ("Compare the Plus plan with the Pro plan.", 1, True),
    ("Is the population of Paris and of Rome larger than 2 million?", 1, False),
    ("Who directed the film that won the Oscar in 1995 and in which country was he born?", 1, False),  # a chain
    ("Are both movies Nerdcore Rising and What Would Jesus Buy? focused on similar topics?", 1, False),
    ("Where's Officer Tuba? is a comedy film that stars which actress?", 1, False),
    ("What file type and size can my logo be?", 1, False),
    ("If both the project and the member have an hourly rate, which one is used?", 1, False),
    ("Which Spanish officer established the settlement at St. Augustine?", 1, False),
    ("Who was born first out of Amable Eno, Dit Deschamps and Wayne Sykes?", 1, False),  # picks one: a comparison
    ("JSOC was created on the advice of a colonel who served in the Malayan Emergency and what other war?", 1, False),
    ("Which singer, who was born in 1954 and whose third album was Through His Eyes, sang a duet?", 1, False),
    ("I moved office. Will the invoices I already sent show my new address?", 1, False),
])
def test_several_questions_in_the_ways_people_write_them(query: str, parts: int, several: bool) -> None:
    from adaptive_rag.routing.rules import asks_several_things, question_parts

    assert len(question_parts(query)) == parts, question_parts(query)
    assert asks_several_things(query) is several


def test_a_question_about_two_things_is_split_into_one_question_each() -> None:
    from adaptive_rag.routing.rules import question_parts

    assert question_parts("What is the maximum brightness of the A19 bulb and of the Flex Strip?") == [
        "What is the maximum brightness of the A19 bulb?", "What is the maximum brightness of the Flex Strip?"]
    assert question_parts("How do I export my data, and then how do I close my account?") == [
        "How do I export my data", "how do I close my account?"]


def test_escalation_to_c_keeps_the_decision_and_says_why() -> None:
    from adaptive_rag.contracts import RoutingDecision, Tier
    from adaptive_rag.routing.rules import escalate_several_things

    b = RoutingDecision(tier=Tier.B, probabilities={"A": 0.0, "B": 0.7, "C": 0.3}, model_version=1, reason="argmax B")
    moved = escalate_several_things("Who makes it? And where?", b)
    assert (moved.tier, moved.model_version, moved.reason) == (Tier.C, 1, "argmax B; several questions in one: C")
    assert escalate_several_things("Who makes it?", b) is b
