"""A conversation's follow-up turn as a question that stands alone, before small-talk detection,
routing and retrieval see it ("and how long does that take?" is searched as "how long does
returning an order take?", not as it was typed).

Rules first, for the easy cases, judged against the conversation's previous question (in its
own standalone form):
- no sign of depending on the conversation (no pronoun, no leading "and" / "what about"):
  the question is used as sent (`NONE`), whatever came before;
- one pronoun ("it", "that", "they", ...): it is replaced by the previous question's topic
  (its first noun phrase: "the warranty on the frame" of "what is the warranty on the frame?");
- an elliptical "and X?" / "what about X?" / "how about X?": the previous question about X
  instead of its last noun phrase ("and the battery?" after "what is the warranty on the frame?"
  is "what is the warranty on the battery?"); an X opening with a preposition ("and to
  Canada?") is added to the previous question.
Anything else that depends on the conversation (two pronouns, "does the same apply ...") goes to
the reader, behind the `LLM` port, when one is given (`READER`); without one the previous topic
is added to the question (`CONTEXT`), which keeps retrieval on the subject.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from adaptive_rag.ports import LLM
from adaptive_rag.prompts import rewrite as prompt
from adaptive_rag.strategies.base import ask


class RewriteMethod(StrEnum):
    """How a turn became the question that was routed and searched."""

    NONE = "none"  # used as sent
    RULES = "rules"
    READER = "reader"
    CONTEXT = "context"  # the previous topic added (no rule fitted and no reader)


@dataclass(frozen=True, slots=True)
class Turn:
    """An earlier turn of the conversation: its question as it was searched, and its answer."""

    question: str
    answer: str = ""


@dataclass(frozen=True, slots=True)
class Rewrite:
    question: str
    method: RewriteMethod

    @property
    def changed(self) -> bool:
        return self.method is not RewriteMethod.NONE


# A rewrite longer than this many times the two questions together is the reader rambling.
_MAX_GROWTH = 2.0
_TOKEN = re.compile(r"[\w'’-]+|[^\w\s]")
_PRONOUNS = frozenset({"it", "that", "this", "they", "them", "these", "those"})
# Also signs of depending on the conversation, which only the reader resolves.
_OTHER_REFERENCES = frozenset({"its", "their", "theirs", "there", "he", "she", "him", "her", "same", "one", "ones"})
_ELLIPSIS = re.compile(r"^(?:and|also|plus|what about|how about|and what about|and how about)\s+(?P<rest>.+)$",
                       re.IGNORECASE)
_LEADING_AND = re.compile(r"^(?:and|also|so|but)\s+", re.IGNORECASE)
_WH = frozenset({"what", "what's", "whats", "how", "who", "when", "where", "why", "which", "whose"})
_WH_MODIFIERS = frozenset({"long", "much", "many", "often", "soon", "far", "old", "big"})
_COPULAS = frozenset({"is", "are", "was", "were", "'s"})
_DO_AUXILIARIES = frozenset({"do", "does", "did", "can", "could", "will", "would", "should", "may",
                             "might", "must", "shall"})
_AUXILIARIES = _COPULAS | _DO_AUXILIARIES | frozenset({"has", "have", "had"})
_SUBJECT_PRONOUNS = frozenset({"i", "you", "we", "they", "he", "she", "one"})
_DETERMINERS = frozenset({"a", "an", "the", "my", "your", "our", "their", "his", "her", "this",
                          "these", "those", "some", "any"})
_PREPOSITIONS = frozenset({"on", "for", "of", "about", "with", "in", "to", "from", "at", "by",
                           "after", "before", "during", "without", "into", "over", "under"})
# Words that make a turn a question of its own, not a bare "and X?".
_VERBISH = _AUXILIARIES | _WH
# Closed-class words and light verbs: a turn made only of these and the words above names no
# subject of its own ("how many can I have?", "how much at once?", "why not?"), so it is about
# the previous question's.
_FUNCTION_WORDS = frozenset({
    "not", "no", "n't", "many", "much", "more", "most", "less", "least", "few", "once", "twice",
    "again", "then", "too", "also", "still", "yet", "instead", "else", "ever", "already", "even",
    "just", "only", "all", "both", "each", "every", "either", "neither", "enough", "so", "as",
    "than", "out", "off", "down", "if", "or", "and", "but", "any", "anything", "something",
    "now", "later", "soon", "here", "way", "ways", "exactly", "really", "possible",
    "have", "get", "got", "do", "make", "take", "go", "happen", "happens", "mean", "means", "need",
    "come", "about", "i", "me", "my", "we", "us", "our",
    "long", "often", "far", "old", "big", "which", "kind", "type", "sort", "lot",
})


def _words(text: str) -> list[str]:
    return text.strip().rstrip("?.! ").split()


def _tokens(text: str) -> list[str]:
    return [t.lower() for t in _TOKEN.findall(text)]


def _opening(words: list[str]) -> tuple[int, bool, bool]:
    """How many words open the question (wh-word, its modifier, auxiliaries, a pronoun subject);
    whether a do-type auxiliary opened it; whether the subject was a pronoun or the wh-word."""
    lower = [w.lower() for w in words]
    i, do_support, pronoun_subject = 0, False, False
    if i < len(lower) and lower[i] in _WH:
        i += 1
        if i < len(lower) and lower[i] in _WH_MODIFIERS:
            i += 1
        if i < len(lower) and lower[i] not in _AUXILIARIES and lower[0] in {"who", "what"}:
            return i, False, True  # "who can ...", "what happens ...": the wh-word is the subject
    if i < len(lower) and lower[i] in _AUXILIARIES:
        do_support = lower[i] in _DO_AUXILIARIES
        i += 1
    if i < len(lower) and lower[i] in _SUBJECT_PRONOUNS:
        pronoun_subject = True
        i += 1
        if i < len(lower) and lower[i] in _AUXILIARIES:  # "how do I have to ..."
            i += 1
    if (lower and lower[0] in {"who", "what"} and i == 2 and lower[1] in _DO_AUXILIARIES
            and lower[1] not in {"do", "does", "did"}):
        pronoun_subject = True  # "who can get ...", "what should happen ...": a verb follows
    return i, do_support, pronoun_subject


def _noun_phrase(words: list[str], last: bool) -> tuple[int, int] | None:
    """The span (start, end) of the question's first (or last) noun phrase, or None."""
    if not words:
        return None
    start, do_support, pronoun_subject = _opening(words)
    rest = [w.lower() for w in words[start:]]
    if not rest:
        return None
    determiners = [i for i, w in enumerate(rest) if w in _DETERMINERS]
    if pronoun_subject:  # a verb follows: the object is the topic
        if determiners:
            first = (determiners[-1] if last else determiners[0])
            return start + first, len(words)
        after = [i for i, w in enumerate(rest) if w in _PREPOSITIONS and i + 1 < len(rest)]
        if after:  # "can I pay with paypal": the preposition's object
            return start + after[-1 if last else 0] + 1, len(words)
        return (start + 1, len(words)) if len(rest) > 1 else (start, len(words))
    if do_support:  # "<aux> <subject> <verb> ...": the subject, up to the verb
        cut = next((i for i, w in enumerate(rest) if w in _PREPOSITIONS), len(rest))
        if last and determiners and cut < len(rest):
            after = [i for i in determiners if i > cut]
            if after:
                return start + after[-1], len(words)
        end = cut - 1 if cut > 1 else cut
        return start, start + max(end, 1)
    if last and determiners:  # copula: "what is the warranty on the frame"
        return start + determiners[-1], len(words)
    return start, len(words)


def topic(question: str, last: bool = False) -> str:
    """The previous question's first (or last) noun phrase, as written; "" when none is found."""
    words = _words(question)
    span = _noun_phrase(words, last)
    return " ".join(words[span[0]:span[1]]) if span else ""


_ADDRESSEE = frozenset({"you", "your", "yours", "u", "ya"})
_CLOSED_CLASS = (_WH | _WH_MODIFIERS | _AUXILIARIES | _SUBJECT_PRONOUNS | _DETERMINERS | _PREPOSITIONS
                 | _PRONOUNS | _OTHER_REFERENCES | _FUNCTION_WORDS)


def names_no_subject(question: str) -> bool:
    """Whether the turn asks something (a question word or auxiliary first, or a question mark)
    with no word of its own beyond question words, auxiliaries, pronouns, determiners,
    prepositions and other closed-class words ("how many can I have?"; not "no", "later")."""
    words = [t for t in _tokens(question) if t[0].isalnum()]
    asks = bool(words) and (words[0] in _VERBISH or question.rstrip().endswith("?"))
    if _ADDRESSEE & set(words):  # "how are you?", "what do you mean?": about the assistant or its reply
        return False
    return asks and all(w in _CLOSED_CLASS or w.isdigit() for w in words)


def depends_on_conversation(question: str) -> bool:
    """Whether the turn shows a sign of needing the earlier turns to be understood: a reference
    to them (a pronoun, a leading "and X?") or no subject of its own."""
    tokens = _tokens(question)
    return bool(_ELLIPSIS.match(question.strip()) or set(tokens) & (_PRONOUNS | _OTHER_REFERENCES)
                or names_no_subject(question))


def _ellipsis(question: str, previous: str) -> str | None:
    """ "and X?" / "what about X?" as the previous question about X, or None."""
    found = _ELLIPSIS.match(question.strip().rstrip("?.! "))
    if not found:
        return None
    rest = found.group("rest").strip()
    rest_words = [w.lower() for w in rest.split()]
    if not rest_words or len(rest_words) > 6 or set(rest_words) & (_VERBISH | _PRONOUNS | _OTHER_REFERENCES):
        return None  # "and how long does it take?" is a question of its own
    base = previous.strip().rstrip("?.! ")
    if rest_words[0] in _PREPOSITIONS:
        return f"{base} {rest}?"
    words = _words(previous)
    span = _noun_phrase(words, last=True)
    if span is None:
        return None
    return " ".join([*words[:span[0]], rest, *words[span[1]:]]) + "?"


def _pronoun(question: str, previous: str) -> str | None:
    """The question with its one pronoun replaced by the previous question's topic, or None."""
    stripped = _LEADING_AND.sub("", question.strip())
    words = stripped.split()
    bare = [re.sub(r"[^\w'’-]", "", w).lower() for w in words]
    found = [i for i, w in enumerate(bare) if w in _PRONOUNS]
    if len(found) != 1 or set(bare) & _OTHER_REFERENCES:
        return None
    subject = topic(previous)
    if not subject:
        return None
    i = found[0]
    trailing = words[i][len(re.sub(r"[^\w'’-]+$", "", words[i])):]  # keep "?" of "it?"
    rewritten = " ".join([*words[:i], subject + trailing, *words[i + 1:]])
    return rewritten[0].upper() + rewritten[1:] if rewritten else rewritten


def by_rules(question: str, previous: str) -> str | None:
    """The rules' standalone question, or None when no rule fits."""
    return _ellipsis(question, previous) or _pronoun(question, previous)


def _plain(text: str) -> str:
    return " ".join(_tokens(text.rstrip("?.! ")))


def _without_earlier(line: str, history: Sequence[Turn]) -> str:
    """`line` without the sentences that repeat an earlier question word for word: a small reader
    often writes the earlier question back before the rewritten one ("How long is the incubation
    period? When is someone infectious?"), which then reads, and is routed, as two questions; or
    only the earlier question. "" when nothing else is left."""
    earlier = {_plain(turn.question) for turn in history}
    parts = [part for part in re.split(r"(?<=[?.!])\s+", line) if part.strip()]
    return " ".join(part for part in parts if _plain(part) not in earlier).strip()


def by_reader(llm: LLM, question: str, history: Sequence[Turn]) -> str | None:
    """The reader's standalone question, or None when what it wrote is unusable (empty, rambling,
    or only an earlier question written back)."""
    earlier = "\n".join(turn.question for turn in history)
    text = ask(llm, prompt.PROMPT, history=earlier, question=question).text
    line = next((ln.strip() for ln in text.strip().splitlines() if ln.strip()), "")
    line = re.sub(r"^(rewritten( question)?|question)\s*:\s*", "", line, flags=re.IGNORECASE).strip().strip('"')
    line = _without_earlier(line, history)
    if not line or len(line) > _MAX_GROWTH * (len(question) + len(history[-1].question)):
        return None
    return line


def standalone_question(question: str, history: Sequence[Turn], llm: LLM | None = None) -> Rewrite:
    """`question` as it must be routed and searched, given the conversation's earlier turns
    (oldest first; their questions in standalone form). See the module for the order."""
    if not history or not depends_on_conversation(question):
        return Rewrite(question, RewriteMethod.NONE)
    previous = history[-1].question
    ruled = by_rules(question, previous)
    if ruled:
        return Rewrite(ruled, RewriteMethod.RULES)
    if llm is not None:
        try:
            read = by_reader(llm, question, history)
        except Exception:  # noqa: BLE001 - the reader away costs the rewrite's quality, not the turn
            read = None
        if read:
            return Rewrite(read, RewriteMethod.READER)
    subject = topic(previous) or previous.rstrip("?.! ")
    return Rewrite(f"{question.rstrip()} ({subject})", RewriteMethod.CONTEXT)
