"""The parts of a query that asks several things, in the ways people write them.

Each part is a question of its own to look up: tier C answers each from its own passages
(`strategies.parts`) and the router sends the query to C (`rules.escalate_several_things`).
The forms (a part is at least two words; a question inside a title, "What Would Jesus Buy? focused
on ...", starts no part because the text after it does not start a sentence):

- several sentences that ask: "X? Y?", "X? And y?", "X. Also, y?", "I want A. What ...? When ...?"
  (a statement before the questions is kept with every part: it says what they are about);
- a second question after a comma, "and" or "as well as": "X, and what ...?", "X and can I ...?",
  "X and how ...?";
- a dependent second question: "X, and if so, y?" / "X? If so, y?" (the part keeps X as its topic);
- the same ask about two things: "the brightness of X and of Y?";
- the same ask with two actions: "How do I reset my password and change my email?";
- lists of three or more: "the fees for A, B and C?", "1) ... 2) ... 3) ...", "a; b; c";
- lead-ins are dropped: "Two things:", "I have three questions:", "Can you tell me:".

Comparisons ("compare X with Y", "X vs Y", "the difference between X and Y", "which is cheaper,
X or Y?") need both sides looked up but one answer that weighs them: `is_comparison` sends them to
C, where the multi-step strategy reads both sides at once, so they are no parts here.

A question whose second clause needs the first's answer ("Who directed the film that ... and in
which country was he born?") is a chain, not parts: the classifier routes it.
"""

from __future__ import annotations

import re

_WH = r"(?:what|which|who|whom|whose|when|where|why|how)"
_AUX = r"(?:do|does|did|can|could|will|would|is|are|was|were|should|may|must|has|have)"
# The auxiliaries that open a yes/no question ("..., and can they ...?"): "and has the slogan" or
# "and was surpassed by" go on with the same subject, they ask nothing new.
_INVERTED = r"(?:can|could|will|would|is|are|does|do|did|should|may)"
_SUBJECT = r"(?:i|we|you|they|it|he|she|my|our|your|their|its|the|this|that|these|those|there|a|an)"
_QUESTION_START = re.compile(rf"^(?:{_WH}|{_AUX}|is|are|tell me|explain)\b", re.IGNORECASE)

_LEAD_IN = re.compile(
    r"^\s*(?:(?:i have|i've got|got|quick|a few|some|several|two|three|four|\d)\s*)*"
    r"(?:questions?|things?)\s*[:\-]\s*"
    r"|^\s*(?:can|could) you (?:tell me|explain|help me with)\s*:\s*",
    re.IGNORECASE,
)
_ENUMERATION = re.compile(r"(?:^|\s)(?:\(?\d{1,2}[).]|[a-e]\))\s+")
# A sentence ends at "?", "." or "!" before a capital, but not after an initial or a short abbreviation
# ("St. Augustine", "Alex P. Keaton").
_SENTENCE_END = re.compile(r"(?<![\s.][A-Z][a-z]\.)(?<![\s.][A-Z]\.)(?<![\s.][A-Z][a-z][a-z]\.)(?<=[?.!])\s+(?=[A-Z])")
_ALSO = re.compile(r"^(?:and\s+)?(?:also|plus|additionally|and|another question)\b[,:]?\s*", re.IGNORECASE)
_LEADING_AND = re.compile(r"^and\s+", re.IGNORECASE)  # "...; and how ...": the item's own question
_IF_SO = re.compile(r"^(?:and\s+)?if\s+(?:so|yes|not|no)\b[,:]?\s*", re.IGNORECASE)

# A second question after the first within one sentence; each form marks where the first ends.
_SECOND_QUESTION = re.compile(
    r"\?(?P<after_mark>)\s+(?:and|also)\s+\S[^?]*\?"
    rf"|(?P<comma_wh>)[,;]\s+and\s+(?:then\s+)?{_WH}\b"
    rf"|(?P<comma_aux>)[,;]\s+and\s+{_INVERTED}\s+[^?]*\?\s*$"
    rf"|(?P<and_aux>)\s(?:and|as well as)\s+{_INVERTED}\s+{_SUBJECT}\b"
    # no comma: a lower-case question word ("and How Sweet It Is!" is a title) that is no relative
    # pronoun ("a singer, who was born in 1954 and whose album ..."), followed by a verb (checked below)
    r"|(?<=[^,;])(?P<and_wh>)\s+and\s+(?-i:what|when|where|why|how)\b"
    r"|(?P<if_so>),?\s+and\s+if\s+(?:so|yes|not|no)\b",
    re.IGNORECASE,
)
_CUTS = ("after_mark", "comma_wh", "comma_aux", "and_aux", "and_wh", "if_so")
_VERB = re.compile(rf"\b(?:{_AUX}|am|be|been|get|gets|work|works|happen|happens|change|changed|cost|costs|mean|means)\b",
                   re.IGNORECASE)

# One ask about two things, the preposition repeated: "the brightness of the A19 bulb and of the Flex
# Strip?". A wh-question only, and the second object is no question of its own.
_TWO_OBJECTS = re.compile(
    rf"^(?P<ask>{_WH}\b.+?\b(?P<prep>of|for|in|on))\s+(?P<first>.+?)"
    rf"\s+and\s+(?P=prep)\s+(?!{_WH}\b)(?P<second>[^,;]+?)\s*\?\s*$",
    re.IGNORECASE,
)
# One ask, two actions: "How do I reset my password and change my email?".
_ACTIONS = (
    "add|allow|apply|archive|attach|back|block|book|buy|cancel|change|charge|check|claim|close|connect|"
    "contact|convert|copy|create|delete|disable|download|downgrade|edit|enable|export|find|fix|get|give|"
    "hide|import|install|invite|issue|join|keep|link|lock|log|make|manage|merge|move|order|pause|pay|"
    "print|receive|record|recover|refund|register|reinstall|remove|rename|renew|reopen|repair|replace|"
    "reset|restore|resume|return|schedule|see|send|set|share|sign|start|stop|switch|sync|track|transfer|"
    "turn|undo|unlink|unlock|update|upgrade|upload|use|verify|view|void|waive"
)
_TWO_ACTIONS = re.compile(
    r"^(?P<ask>(?:how\s+(?:do|can|should|would|could)\s+(?:i|we|you)|how\s+to|tell me how to|"
    r"(?:can|could|may|should)\s+(?:i|we)|where\s+(?:do|can)\s+(?:i|we)|is it possible to)\s+)"
    rf"(?P<first>\S+\s+\S.*?)\s+(?:and|as well as)\s+(?P<second>(?:{_ACTIONS})\b.+?)\s*(?P<end>[?.!]?)\s*$",
    re.IGNORECASE,
)
# A list of three or more after one ask: "What are the fees for A, B and C?".
_LIST = re.compile(
    r"^(?P<head>[^,;]+?),\s+(?P<middle>(?:[^,;]+,\s+)*[^,;]+?),?\s+and\s+(?P<last>[^,;?.!]+?)"
    r"\s*(?P<end>[?.!]?)\s*$",
    re.IGNORECASE,
)
# Where the first item starts in the ask before it ("the fees for | A"); items are short noun phrases,
# no clause of their own ("along with Kenny G", "the performer of Saxophonic" are no list items).
_LIST_BOUNDARY = re.compile(r"(?:of|for|about|on|include|includes|including|offer|offers|up|need|needs)", re.IGNORECASE)
_PREPOSITION = re.compile(rf"\b(?:of|for|with|along|in|on|at|by|from|to|about|as|than|that|be|{_WH}|{_AUX})\b",
                          re.IGNORECASE)
# An ask that picks one thing among the items is one question ("Who was born first out of A, B and C?").
_PICKS_ONE = re.compile(
    r"\b(?:first|last|earlier|later|older|younger|more|most|less|least|best|worst|largest|smallest|biggest|"
    r"highest|lowest|oldest|youngest|earliest|latest|longest|shortest|fastest|cheapest)\b",
    re.IGNORECASE,
)
_MAX_LIST_ASK_WORDS = 7
_MAX_ITEM_WORDS = 4
_MIN_PART_WORDS = 3
_COMPARISON = re.compile(
    r"\b(?:compare|compared (?:to|with)|comparison|difference(?:s)? between|versus|vs\b\.?)"
    r"|\bwhich\b[^,?]*\b(?:better|cheaper|faster|brighter|bigger|larger|smaller|longer|shorter|more|less|"
    r"older|newer|first)\b[^?]*,[^?]*\bor\b",
    re.IGNORECASE,
)


def question_parts(query: str) -> list[str]:
    """The questions `query` asks, each to be looked up on its own; `[query]` when it asks one
    thing (or is a comparison: see the module)."""
    text = " ".join(query.split())
    if not text:
        return [query]
    body = _LEAD_IN.sub("", text, count=1)
    enumerated = _enumerated(body)
    if enumerated:
        return enumerated
    if ";" in body:
        items = [item.strip(" ,") for item in body.split(";")]
        if len(items) > 1 and all(_asks(item) for item in items):
            return [_question(_LEADING_AND.sub("", item)) for item in items]
    sentences = [s.strip() for s in _SENTENCE_END.split(body) if s.strip()]
    # Every sentence after the first asks only when it starts as a question does (a statement ending
    # in "?" is a quiz's second sentence, not a second question).
    asked = [s for i, s in enumerate(sentences)
             if _words(s) >= _MIN_PART_WORDS and (_QUESTION_START.match(_ALSO.sub("", s)) or _IF_SO.match(s)
                                                   or (i == 0 and s.endswith("?")))]
    if len(asked) > 1:
        context = " ".join(s for s in sentences[: sentences.index(asked[0])])
        parts: list[str] = []
        for sentence in asked:
            parts += _with_context(_sentence_parts(_ALSO.sub("", sentence) if parts else sentence), context)
        return _dependent(parts)
    if len(asked) == 1 and len(sentences) > 1:
        context = " ".join(s for s in sentences if s is not asked[0])
        parts = _sentence_parts(asked[0])
        if len(parts) > 1:
            return _dependent(_with_context(parts, context))
    parts = _sentence_parts(body)
    return _dependent(parts) if len(parts) > 1 else [query]


def is_comparison(query: str) -> bool:
    """True when `query` weighs two things against each other ("compare", "vs", "difference
    between", "which is cheaper, X or Y?")."""
    return _COMPARISON.search(query) is not None


def asks_several_things(query: str) -> bool:
    """True when `query` needs more than one look-up: several questions, or a comparison."""
    return len(question_parts(query)) > 1 or is_comparison(query)


def _sentence_parts(sentence: str) -> list[str]:
    """The questions one sentence asks (the sentence alone when it asks one)."""
    match = _SECOND_QUESTION.search(sentence)
    if match is not None:
        cut = next(match.start(name) for name in _CUTS if match.start(name) >= 0)
        first, second = sentence[:cut].strip(" ,;"), sentence[cut:].lstrip("?,; ").strip()
        second = re.sub(r"^(?:and|also|as well as)\s+(?:then\s+)?", "", second, flags=re.IGNORECASE)
        clause = match.start("and_wh") < 0 or _VERB.search(second) is not None  # "and what other war?": no clause
        # After a question mark, a short second question is still one ("Who makes it? And where?").
        long_enough = match.start("after_mark") >= 0 or (
            _words(first) >= _MIN_PART_WORDS and _words(second) >= _MIN_PART_WORDS)
        if clause and long_enough or _IF_SO.match(second):
            return [first, *_sentence_parts(second)]
    if is_comparison(sentence):
        return [sentence]
    objects = _TWO_OBJECTS.match(sentence)
    if objects is not None:
        return [f"{objects['ask']} {objects['first']}?", f"{objects['ask']} {objects['second']}?"]
    actions = _TWO_ACTIONS.match(sentence)
    if actions is not None and _words(actions["first"]) >= 2:
        end = actions["end"] or "?"
        return [f"{actions['ask']}{actions['first']}{end}", f"{actions['ask']}{actions['second']}{end}"]
    return _listed(sentence) or [sentence]


def _listed(sentence: str) -> list[str] | None:
    """"<ask> A, B and C?" -> one question per item; None when the sentence is no such list."""
    found = _LIST.match(sentence)
    if found is None:
        return None
    rest = [item.strip() for item in found["middle"].split(",")] + [found["last"].strip()]
    if any(not item or _words(item) > _MAX_ITEM_WORDS or _QUESTION_START.match(item) or _PREPOSITION.search(item)
           for item in rest):
        return None
    head = found["head"].split()
    span = max(_words(item) for item in rest) + 1
    tail = head[-span:]
    boundaries = [i for i, word in enumerate(tail) if _LIST_BOUNDARY.fullmatch(word)]
    if not boundaries or len(head) - len(tail) + boundaries[-1] + 1 > _MAX_LIST_ASK_WORDS \
            or _PICKS_ONE.search(found["head"]):
        return None
    start = len(head) - len(tail) + boundaries[-1] + 1
    if start <= 0 or start >= len(head):
        return None
    ask, first = " ".join(head[:start]), " ".join(head[start:])
    if _PREPOSITION.search(first):
        return None
    end = found["end"] or "?"
    return [f"{ask} {item}{end}" for item in (first, *rest)]


def _enumerated(body: str) -> list[str] | None:
    """"1) ... 2) ..." -> the items; None when `body` numbers fewer than two."""
    pieces = _ENUMERATION.split(body)
    if len(pieces) < 3:
        return None
    items = [p.strip(" ,;") for p in pieces[1:]]
    if not all(_words(item) >= 2 for item in items):
        return None
    return [_question(_LEADING_AND.sub("", item)) for item in items]


def _dependent(parts: list[str]) -> list[str]:
    """A part that starts "if so" is about the part before it: it keeps that part as its topic."""
    resolved: list[str] = []
    for part in parts:
        condition = _IF_SO.match(part)
        if condition is not None and resolved:
            rest = part[condition.end():].strip()
            topic = resolved[-1].rstrip("?.! ")
            part = f"{topic}: {_question(rest)}" if rest else part
        resolved.append(part)
    return resolved


def _with_context(parts: list[str], context: str) -> list[str]:
    return [f"{context} {part}" if context else part for part in parts]


def _asks(item: str) -> bool:
    return _words(item) >= 2 and bool(_QUESTION_START.match(_LEADING_AND.sub("", item)))


def _question(text: str) -> str:
    text = text.strip()
    return text if text.endswith(("?", ".", "!")) else f"{text}?"


def _words(text: str) -> int:
    return len(text.split())
