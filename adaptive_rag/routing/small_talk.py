"""Small talk in front of the router: greetings, thanks, goodbyes and questions about the assistant
itself get a short canned reply instead of an LLM call or a retrieval.

Two detectors, one contract (`small_talk_intent`: the intent and its reply, or None for a real
request):

- the learned detector (`small_talk_model`, the default): a linear model over n-grams fitted on a
  phrase bank written for it and on real questions (`arag smalltalk train`), shipped as package data;
- the phrase rules below, used when the learned model cannot be loaded (said once in the logs) and
  kept as the measured baseline (`rule_intent`).

Both keep the rule that matters most: a real question is never answered with a canned reply. A
false positive is the costly error (a real question answered with "Hello! What can I help you
with?" is a failed support contact), while a missed greeting costs one cheap tier-A call.

Bare acknowledgements ("ok", "sure", "great", "yes please") are neither small talk nor
questions: with no question there is nothing to retrieve, and a reader would invent an answer to
"sure". They get the `acknowledgement` reply, which claims nothing and asks for the question.

The rule (whole utterances only):

1. Normalise: Unicode NFKC, lower case, typographic apostrophes to `'`, contractions without the
   apostrophe ("whats", "youre") spelled out, hyphens as spaces ("thank-you"), every other
   character that is not a letter, digit, apostrophe or space (punctuation, emoji, symbols)
   becomes a clause break.
2. Every clause must be covered, end to end, by a sequence of curated small-talk phrases
   (`_PHRASES`), optionally joined by "and" / "&" / "but" / "so". One clause that is not small
   talk makes the whole utterance a real query (`None`): "hi, how do I reset my hub?" has the
   clause "how do i reset my hub", which no phrase covers.
3. When several intents occur ("hi, how are you?"), the reply is that of the most specific one
   (`_PRIORITY`): a question about the assistant outranks a goodbye ("thanks, bye" is a
   goodbye), which outranks thanks, which outranks a greeting.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass

import structlog

from adaptive_rag.routing.small_talk_model import DEFAULT_MODEL, SmallTalkModel

LOG = structlog.get_logger("small_talk")

GREETING = "greeting"
THANKS = "thanks"
GOODBYE = "goodbye"
IDENTITY = "identity"
NAME = "name"
CREATOR = "creator"
CAPABILITIES = "capabilities"
WELLBEING = "wellbeing"
BOT_OR_HUMAN = "bot_or_human"
ACKNOWLEDGEMENT = "acknowledgement"

REPLIES: dict[str, str] = {
    GREETING: "Hello! What can I help you with?",
    THANKS: "You're welcome! Is there anything else I can help you with?",
    GOODBYE: "Goodbye, and thanks for getting in touch!",
    IDENTITY: "I'm the virtual support assistant: I answer questions from this help centre.",
    NAME: "I'm the virtual support assistant of this help centre; I don't have a name of my own. What can I help you with?",
    CREATOR: "I was set up by the team behind this help centre to answer questions from its articles.",
    CAPABILITIES: "I can answer questions about the topics in this help centre. What would you like to know?",
    WELLBEING: "I'm doing well, thanks for asking! What can I help you with?",
    BOT_OR_HUMAN: "I'm a virtual assistant, not a person. If I can't help, I'll hand you over to our team.",
    ACKNOWLEDGEMENT: "All right. If you have a question, just ask.",
}
# Every intent the detectors answer with, in the order of `REPLIES`.
INTENTS = tuple(REPLIES)

# Most specific first: the reply of the first intent present wins.
_PRIORITY = (BOT_OR_HUMAN, NAME, CREATOR, IDENTITY, CAPABILITIES, WELLBEING, GOODBYE, THANKS, GREETING, ACKNOWLEDGEMENT)


@dataclass(frozen=True, slots=True)
class SmallTalk:
    """A recognised small-talk turn and the reply to send back."""

    intent: str
    reply: str


# A pattern matches one way only (the leftmost alternative that fits), so within a pattern the
# longer alternatives come first ("doing today" before "doing").
# Who is addressed, allowed after most phrases: "hi there", "thanks bot", "bye everyone".
_VOCATIVE = r"(?:\s+(?:there|again|all|everyone|everybody|folks|guys|friend|buddy|mate|team|bot|chatbot|assistant|support))?"
_YOU = r"(?:you|u|ya)"
# What the assistant might be: "a bot", "an ai", "a real person", "human".
_WHAT = (
    r"(?:a\s+|an\s+)?(?:real\s+|live\s+)?(?:human\s+being|chat\s*bot|bot|robot|machine|computer|ai|"
    r"program|human|person|agent|operator)"
)

_PHRASES: dict[str, tuple[str, ...]] = {
    GREETING: (
        r"(?:hi+|hey+|hello+|hallo|helo|hiya|heya|howdy|yo|greetings|hola|salut|moin|servus|sup|wassup|what'?s up)" + _VOCATIVE,
        r"good\s+(?:morning|afternoon|evening|day)" + _VOCATIVE,
        r"(?:morning|evening)" + _VOCATIVE,
        r"hey\s+hey|hi\s+hi",
        r"anyone\s+(?:there|here|around)|is\s+(?:anyone|anybody|someone)\s+(?:there|here|around)",
        r"nice\s+to\s+meet\s+" + _YOU + r"(?:\s+too)?",
        r"pleased\s+to\s+meet\s+" + _YOU,
    ),
    THANKS: (
        r"(?:many\s+|big\s+)?(?:thanks|thank\s+" + _YOU + r"|thx|thnx|thanx|ty|tysm|cheers|ta|merci|danke)"
        r"(?:\s+(?:so|very)\s+much|\s+a\s+(?:lot|ton|bunch|million)|\s+again|\s+kindly)?"
        r"(?:\s+(?:for|4)\s+(?:your|the|all\s+(?:the|your)|this|that)?\s*"
        r"(?:help|answer|answers|info|information|assistance|support|reply|quick\s+reply|explanation|time))?"
        + _VOCATIVE,
        r"(?:much\s+)?appreciated|i\s+appreciate\s+(?:it|that|your\s+help)",
        r"(?:that\s+was|you'?ve\s+been|you\s+have\s+been|you\s+are|you're)\s+(?:very\s+|really\s+|so\s+)?(?:helpful|a\s+great\s+help|a\s+big\s+help)",
        r"(?:that|this)\s+(?:helped|helps)(?:\s+a\s+lot)?",
    ),
    GOODBYE: (
        r"(?:(?:good\s*)?bye+(?:\s+bye)?|bye\s+for\s+now|farewell|ciao|tschuss|tschüss|adios)" + _VOCATIVE,
        r"see\s+" + _YOU + r"(?:\s+(?:later|soon|around|tomorrow))?|see\s+ya|cya|later|laters|ttyl",
        r"(?:have\s+a\s+)?(?:good|nice|great|lovely)\s+(?:day|one|evening|night|weekend)(?:\s+too)?" + _VOCATIVE,
        r"take\s+care|good\s*night|talk\s+(?:to\s+" + _YOU + r"\s+)?(?:later|soon)",
        r"that'?s\s+all(?:\s+for\s+(?:now|today))?|that\s+is\s+all(?:\s+for\s+(?:now|today))?|i'?m\s+done|i\s+am\s+done",
    ),
    IDENTITY: (
        r"who\s+(?:are|r)\s+" + _YOU + r"(?:\s+exactly)?",
        r"what\s+(?:are|r)\s+" + _YOU + r"(?:\s+exactly)?",
        r"who\s+am\s+i\s+(?:talking|speaking|chatting)\s+(?:to|with)",
        r"introduce\s+yourself|tell\s+me\s+about\s+yourself",
    ),
    NAME: (r"what\s+is\s+your\s+name|what'?s\s+your\s+name|do\s+you\s+have\s+a\s+name|your\s+name",),
    CREATOR: (r"who\s+(?:made|built|created)\s+" + _YOU,),
    CAPABILITIES: (
        r"what\s+(?:can|do)\s+" + _YOU + r"\s+(?:do|help\s+(?:me\s+)?with)",
        r"how\s+(?:can|do)\s+" + _YOU + r"\s+help(?:\s+me)?",
        r"(?:can|could)\s+" + _YOU + r"\s+help(?:\s+me)?(?:\s+please)?",
        r"(?:i\s+)?need\s+(?:some\s+)?help|help(?:\s+me)?(?:\s+please)?|please\s+help(?:\s+me)?",
        r"what\s+do\s+" + _YOU + r"\s+know(?:\s+about)?",
    ),
    WELLBEING: (
        r"how\s+(?:are|r)\s+" + _YOU + r"(?:\s+(?:doing\s+today|doing|today))?",
        r"how'?s\s+it\s+going|how\s+is\s+it\s+going|how\s+are\s+things|how\s+do\s+you\s+do|how'?s\s+your\s+day",
        r"(?:are\s+)?" + _YOU + r"\s+(?:ok|okay|alright|good|well)",
        r"what'?s\s+new",
    ),
    BOT_OR_HUMAN: (
        r"(?:are|r)\s+" + _YOU + r"\s+" + _WHAT + r"(?:\s+or\s+" + _WHAT + r")?",
        r"(?:am\s+i\s+)?(?:talking|speaking|chatting)\s+(?:to|with)\s+" + _WHAT + r"(?:\s+or\s+" + _WHAT + r")?",
        r"(?:is\s+this|is\s+that)\s+(?:automated|" + _WHAT + r")(?:\s+or\s+" + _WHAT + r")?",
        r"(?:i\s+(?:want|would\s+like|need)\s+to\s+|can\s+i\s+|let\s+me\s+)?(?:talk|speak|chat)\s+(?:to|with)\s+(?:a\s+|an\s+)?(?:real\s+|live\s+)?(?:human|person|agent|operator)",
        r"are\s+" + _YOU + r"\s+real|(?:a\s+)?(?:real\s+)?(?:human|person|agent)\s+please",
    ),
    ACKNOWLEDGEMENT: (
        r"ok+|okay|okey|k|kk|alright|all\s+right|got\s+it|gotcha|i\s+see|understood|noted|sure|fine",
        r"cool|great|perfect|awesome|nice|good|excellent|wonderful|brilliant|super|sounds\s+good|makes\s+sense|lol|haha+|yes|yep|yeah|no\s+worries",
        r"(?:that'?s|that\s+is)\s+(?:great|perfect|good|fine|awesome|helpful|clear)",
        r"you'?re\s+(?:great|awesome|the\s+best)",
    ),
}

_CONNECTOR = re.compile(r"(?:and|&|but|so|oh|well|um+|uh+|please|pls|plz|again|then|very|really)\b\s*")
_COMPILED: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (intent, re.compile(r"(?:" + pattern + r")(?=\s|$)"))
    for intent, patterns in _PHRASES.items()
    for pattern in patterns
)

_CONTRACTIONS = {
    "whats": "what's", "hows": "how's", "thats": "that's", "youre": "you're", "im": "i'm",
    "youve": "you've", "whos": "who's",
}
# Utterances longer than this are never small talk (a paste, a real request with pleasantries).
MAX_WORDS = 16


def normalise(text: str) -> list[str]:
    """Lower-cased clauses of `text`: punctuation, emoji and symbols split clauses and vanish."""
    text = unicodedata.normalize("NFKC", text).lower().replace("\u2019", "'").replace("`", "'")
    clauses: list[str] = []
    current: list[str] = []
    for char in text:
        if char.isalnum() or char == "'" or char == "&":
            current.append(char)
        elif char.isspace() or char in "-_":
            current.append(" ")
        else:
            clauses.append("".join(current))
            current = []
    clauses.append("".join(current))
    result = []
    for clause in clauses:
        words = [_CONTRACTIONS.get(w.strip("'"), w.strip("'")) for w in clause.split()]
        words = [w for w in words if w]
        if words:
            result.append(" ".join(words))
    return result


def _clause_intents(clause: str) -> list[str] | None:
    """Intents of the phrases covering `clause` end to end, or None when it is not small talk.

    Dynamic programming over character positions: a position is reachable when a phrase (or a
    connector word) ends there; the clause is small talk when its end is reachable.
    """
    reach: dict[int, list[str]] = {0: []}
    for start in range(len(clause) + 1):
        if start not in reach:
            continue
        if start == len(clause):
            return reach[start]
        pos = start + (1 if clause[start] == " " else 0)
        connector = _CONNECTOR.match(clause, pos)
        if connector and connector.end() > pos:
            end = connector.end()
            reach.setdefault(end if end <= len(clause) else len(clause), reach[start])
        for intent, pattern in _COMPILED:
            found = pattern.match(clause, pos)
            if found and found.end() > pos:
                reach.setdefault(found.end(), reach[start] + [intent])
    return None


def rule_intent(query: str) -> SmallTalk | None:
    """The phrase rules' answer for the whole utterance `query`: its intent and reply, or None."""
    clauses = normalise(query)
    if not clauses or sum(len(c.split()) for c in clauses) > MAX_WORDS:
        return None
    found: set[str] = set()
    for clause in clauses:
        intents = _clause_intents(clause)
        if intents is None:
            return None
        found.update(intents)
    if not found:
        return None
    intent = next(i for i in _PRIORITY if i in found)
    return SmallTalk(intent=intent, reply=REPLIES[intent])


# Question guards in front of the learned detector: shapes that always carry a request, however
# chatty their words. A follow-up about something ("what about masks?", "and how about refunds")
# is a question about a topic the model may never have seen, and short enough for the model's
# confidence to rest on "what" and "about" alone; about the assistant ("what about you?") it is
# small talk.
_FOLLOW_UP = re.compile(r"^(?:(?:ok|okay|so|and|but|then|well)\s+)*(?:what|how)\s+about\s+(?!(?:you|u|yourself)\b)\S")


# A question about a named thing other than the assistant is a request: "what does acme do?",
# "what is the premium plan", "who is the author of dune", "how does klarna work", "can you tell
# me what stripe does", "explain bitcoin". About the assistant ("what is your name", "what does
# this bot do", "who are you", "tell me about yourself") the model decides. Each shape captures
# its thing as `x`; `_about_assistant` tells whether that thing is the assistant or a word that
# makes the phrase chat ("what's up", "who is there", "what is going on").
_THING_SHAPES = tuple(re.compile(p) for p in (
    r"\b(?:what|who)(?:'s|\s+(?:is|are|was|were|r))\s+(?P<x>.+)",
    r"\bwhat\s+(?:does|did)\s+(?P<x>.+?)\s+(?:do|mean|offer|sell|make|include|cost|stand\s+for)\b",
    r"\bhow\s+(?:does|did|do)\s+(?P<x>.+?)\s+work",
    r"\bwho\s+(?:\w+ed|made|makes|built|builds|wrote|writes|owns|runs|leads|started|starts|sells|won)\s+(?P<x>.+)",
    r"\bwhat\s+can\s+(?P<x>.+?)\s+do\b",
    r"\bwhat\s+can\s+(?:i|we)\s+do\s+with\s+(?P<x>.+)",
    r"\b(?:what|who)\s+(?P<x>.+?)\s+(?:does|is)$",
    r"\bhow\s+(?P<x>.+?)\s+works$",
    r"\b(?:explain|describe)\s+(?P<x>.+)",
    r"\b(?:tell\s+(?:me|us)|know|learn|hear|brief\s+me)\s+(?:more\s+|a\s+(?:bit|little)\s+(?:more\s+)?)?(?:about|abt|on)\s+(?P<x>.+)",
))
# Words that make the thing the assistant itself (or the one asking: "what can i do" is chat).
_ASSISTANT_WORDS = frozenset(
    "you u ya ye yall y'all your ur yer yo yours yourself urself yourselves bot chatbot assistant robot i we options"
    .split())
# A thing that is only a pronoun, a place word or a chat word: the model decides.
_CHAT_THINGS = frozenset(
    "this that it these those there here up new good sup poppin crackin happenin cookin goin possible behind "
    "responsible".split())
_ASSISTANT_ROLES = re.compile(
    r"(?:the\s+)?(?:(?:real\s+|full\s+)?names?\s+of\s+(?:the\s+)?)?"
    r"(?:creator|maker|developer|programmer|owner|author|builder|designer|inventor|boss|name)s?")


def _about_assistant(thing: str) -> bool:
    """True when the captured thing is the assistant, the user, or a chat word (see above)."""
    words = thing.split()
    return (not words or bool(_ASSISTANT_WORDS.intersection(words)) or words[0] in _CHAT_THINGS
            or words[0].endswith("ing") or bool(_ASSISTANT_ROLES.fullmatch(thing)))


def asks_about_a_thing(clause: str) -> bool:
    """True when `clause` asks what a thing other than the assistant is, does, or how it works."""
    for shape in _THING_SHAPES:
        found = shape.search(clause)
        if found and not _about_assistant(found.group("x")):
            return True
    return False


# No word of chat is this long ("congratulations" is 15): a longer one is a code, an address, a
# product number or noise, never small talk.
MAX_CHAT_WORD = 24


def is_guarded_request(clauses: list[str]) -> bool:
    """True when a clause has the shape of a request whatever the model says: a follow-up about a
    topic (`_FOLLOW_UP`), a question about a named thing (`asks_about_a_thing`), or a word longer
    than any word of chat (`MAX_CHAT_WORD`)."""
    return any(_FOLLOW_UP.match(clause) or asks_about_a_thing(clause)
               or any(len(word) > MAX_CHAT_WORD for word in clause.split()) for clause in clauses)


def learned_intent(query: str, model: SmallTalkModel) -> SmallTalk | None:
    """The learned detector's answer for the whole utterance `query` (see `small_talk_model`):
    None for more than `MAX_WORDS` words or a guarded request shape, else the model's decision
    (its confidence floor and clause veto), with the reply of the most specific intent
    (`_PRIORITY`) among it and the clauses the model is confident about on their own."""
    clauses = normalise(query)
    if not clauses or sum(len(c.split()) for c in clauses) > MAX_WORDS or is_guarded_request(clauses):
        return None
    intent = model.decide(clauses)
    if intent is None or intent not in REPLIES:
        return None
    if len(clauses) > 1:  # "hello, are you a bot?": the most specific clause's reply, as the rules do
        confident = {scored.best_talk for scored in map(model.score_clauses, ([c] for c in clauses))
                     if scored.not_none >= model.min_confidence}
        intent = next(i for i in _PRIORITY if i in confident | {intent})
    return SmallTalk(intent=intent, reply=REPLIES[intent])


@functools.cache
def shipped_model() -> SmallTalkModel | None:
    """The learned detector shipped with the package, or None (then the rules answer) when it
    cannot be read; said once in the logs either way."""
    try:
        model = SmallTalkModel.load(DEFAULT_MODEL)
    except (OSError, ValueError, KeyError) as error:
        LOG.warning("small talk: learned detector unavailable, using the phrase rules",
                    path=str(DEFAULT_MODEL), error=str(error))
        return None
    LOG.info("small talk: learned detector loaded", path=str(DEFAULT_MODEL),
             classes=len(model.classes), features=len(model.index),
             hyperparameters=model.info.get("hyperparameters"))
    return model


def small_talk_intent(query: str) -> SmallTalk | None:
    """The small-talk intent of the whole utterance `query` and its reply, or None for a query:
    the learned detector's answer, or the phrase rules' when the detector is unavailable."""
    model = shipped_model()
    return learned_intent(query, model) if model is not None else rule_intent(query)


__all__ = [
    "INTENTS", "REPLIES", "SmallTalk", "asks_about_a_thing", "is_guarded_request", "learned_intent", "normalise", "rule_intent", "shipped_model",
    "small_talk_intent",
]
