"""Small talk in front of the router: greetings, thanks, goodbyes and questions about the assistant
itself get a short canned reply instead of an LLM call or a retrieval.

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

Curated phrases rather than a model because a false positive is the costly error: a real question
answered with "Hello! What can I help you with?" is a failed support contact, while a missed
greeting only costs one cheap tier-A call.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

GREETING = "greeting"
THANKS = "thanks"
GOODBYE = "goodbye"
IDENTITY = "identity"
CAPABILITIES = "capabilities"
WELLBEING = "wellbeing"
BOT_OR_HUMAN = "bot_or_human"
ACKNOWLEDGEMENT = "acknowledgement"

REPLIES: dict[str, str] = {
    GREETING: "Hello! What can I help you with?",
    THANKS: "You're welcome! Is there anything else I can help you with?",
    GOODBYE: "Goodbye, and thanks for getting in touch!",
    IDENTITY: "I'm the virtual support assistant: I answer questions from this help centre.",
    CAPABILITIES: "I can answer questions about the topics in this help centre. What would you like to know?",
    WELLBEING: "I'm doing well, thanks for asking! What can I help you with?",
    BOT_OR_HUMAN: "I'm a virtual assistant, not a person. If I can't help, I'll hand you over to our team.",
    ACKNOWLEDGEMENT: "Glad that helped. Anything else I can do for you?",
}

# Most specific first: the reply of the first intent present wins.
_PRIORITY = (BOT_OR_HUMAN, IDENTITY, CAPABILITIES, WELLBEING, GOODBYE, THANKS, GREETING, ACKNOWLEDGEMENT)


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
        r"what\s+is\s+your\s+name|what'?s\s+your\s+name|do\s+you\s+have\s+a\s+name|your\s+name",
        r"who\s+am\s+i\s+(?:talking|speaking|chatting)\s+(?:to|with)",
        r"who\s+(?:made|built|created)\s+" + _YOU,
        r"introduce\s+yourself|tell\s+me\s+about\s+yourself",
    ),
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


def small_talk_intent(query: str) -> SmallTalk | None:
    """The small-talk intent of the whole utterance `query` and its reply, or None for a query."""
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


__all__ = ["REPLIES", "SmallTalk", "normalise", "small_talk_intent"]
