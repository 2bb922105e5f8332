"""Evidence that fits: the sentences of the retrieved passages that answer the question, up to a
token budget, instead of the passages whole.

Why: a B answer's time on a CPU reader is its prompt's length (about 60 prompt tokens/s against
16 generated on 2 cores); five passages are most of the prompt, and the answer is usually in one
or two of their sentences. So the reader gets the best units up to `budget` tokens:

- each passage (its whole text, not the prompt's 400-character cut) is split into units:
  sentences of prose, and a list (consecutive numbered or bulleted lines, with the lead-in that
  ends in a colon) as one unit, so a procedure's steps stay together;
- units are scored against the question by TF-IDF cosine (scikit-learn; idf over this
  question's units), plus `context` times their passage's own cosine, so a sentence that says
  "it" still counts when its passage is about the question's subject;
- the best units are kept while they fit, each costing its estimated tokens, plus its
  passage's `[n] Title: ` header the first time;
- the kept units are written in passage order and text order, under their passage's number and
  title (`[3] Title: sentence ... sentence`), so a citation [n] still names the n-th retrieved
  passage; a passage with nothing kept is left out (its number is skipped).

Tokens are estimated from characters (`estimate_tokens`), not from a tokenizer: the budget is a
bound on the prompt's evidence, not an exact count (the reader's own counts are in the records).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from adaptive_rag.domain import Passage

# Characters per token of English prose in the readers' tokenizers (Qwen2.5, Gemma 3): about 4.
CHARS_PER_TOKEN = 4.0
# Weight of the unit's passage similarity beside its own (chosen on `train`, reports/evidence_budget/).
CONTEXT_WEIGHT = 2.0
GAP = " ... "

_LIST_ITEM = re.compile(r"^\s*(?:\d{1,3}[.)]|[-*\u2022])\s+")
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")


def estimate_tokens(text: str) -> int:
    """Prompt tokens `text` takes, estimated from its length (at least 1 for any text)."""
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN)) if text else 0


def split_units(text: str) -> list[str]:
    """`text` as selectable units in order: sentences of each prose line, a run of list items
    (numbered or bulleted lines) as one unit with its lines kept, opened by the sentence before
    it when that one ends in a colon (the steps rarely repeat the question's words, their
    lead-in does), every unit stripped."""
    units: list[str] = []
    steps: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if _LIST_ITEM.match(line):
            if not steps and units and units[-1].endswith(":"):
                steps.append(units.pop())  # the list's lead-in ("To reset a bulb:") opens it
            steps.append(line)
            continue
        if steps:
            units.append("\n".join(steps))
            steps = []
        if line:
            units.extend(s.strip() for s in _SENTENCE_END.split(line) if s.strip())
    if steps:
        units.append("\n".join(steps))
    return units


@dataclass(frozen=True, slots=True)
class Unit:
    """One unit of one passage: its 0-based passage rank and position in the passage."""

    passage: int
    position: int
    text: str
    tokens: int


def header(number: int, passage: Passage) -> str:
    """A passage's block opening in the prompt (as `prompts.format_passages` writes it)."""
    return f"[{number}] {passage.title}: "


def warm() -> None:
    """Import the scorer and fit it once: a worker process pays scikit-learn's import (0.85 s
    here) when it starts, not on its first answer."""
    score_units("warm up", [Passage(id="w", title="warm", text="warm up the scorer")],
                [Unit(0, 0, "warm up the scorer", 4)])


def score_units(question: str, passages: Sequence[Passage], units: Sequence[Unit],
                context: float = CONTEXT_WEIGHT) -> list[float]:
    """Each unit's TF-IDF cosine to `question`, plus `context` times its passage's (title and
    whole text). Idf is fitted on this question's units, so rare words among them weigh most."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    if not units:
        return []
    whole = [f"{p.title}. {p.text}" for p in passages]
    vectorizer = TfidfVectorizer(stop_words="english", sublinear_tf=True, token_pattern=r"(?u)\b\w+\b")
    try:
        vectorizer.fit([u.text for u in units] + whole)
    except ValueError:  # nothing but stop words: no unit can be told from another
        return [0.0] * len(units)
    asked = vectorizer.transform([question])
    own = (vectorizer.transform([u.text for u in units]) @ asked.T).toarray().ravel()
    if not context:
        return [float(s) for s in own]
    around = (vectorizer.transform(whole) @ asked.T).toarray().ravel()
    return [float(s + context * around[u.passage]) for s, u in zip(own, units)]


def select_units(question: str, passages: Sequence[Passage], budget: int,
                 context: float = CONTEXT_WEIGHT) -> list[Unit]:
    """The units kept within `budget` tokens (headers included), best first by score, in
    passage and text order. A unit that does not fit is passed over for smaller ones after it;
    when not even the best unit fits, its first words that do are kept, so the reader never
    gets nothing from passages it was given."""
    units = [Unit(rank, position, text, estimate_tokens(text))
             for rank, passage in enumerate(passages)
             for position, text in enumerate(split_units(passage.text))]
    scores = score_units(question, passages, units, context)
    order = sorted(range(len(units)), key=lambda i: (-scores[i], units[i].passage, units[i].position))
    kept: list[Unit] = []
    opened: set[int] = set()
    left = budget
    for i in order:
        unit = units[i]
        cost = unit.tokens + (0 if unit.passage in opened else
                              estimate_tokens(header(unit.passage + 1, passages[unit.passage])))
        if cost <= left:
            kept.append(unit)
            opened.add(unit.passage)
            left -= cost
    if not kept and order:
        best = units[order[0]]
        room = budget - estimate_tokens(header(best.passage + 1, passages[best.passage]))
        words = best.text.split()
        while words and estimate_tokens(" ".join(words)) > room:
            words.pop()
        if words:
            text = " ".join(words)
            kept.append(Unit(best.passage, best.position, text, estimate_tokens(text)))
    return sorted(kept, key=lambda u: (u.passage, u.position))


def format_evidence(question: str, passages: Sequence[Passage], budget: int,
                    context: float = CONTEXT_WEIGHT) -> str:
    """The kept units as numbered `[n] Title: text` blocks (n: the passage's place in `passages`),
    non-adjacent units of a passage joined by `GAP`."""
    blocks: list[str] = []
    kept = select_units(question, passages, budget, context)
    for rank in dict.fromkeys(u.passage for u in kept):
        mine = [u for u in kept if u.passage == rank]
        text = mine[0].text
        for before, unit in zip(mine, mine[1:]):
            text += (" " if unit.position == before.position + 1 else GAP) + unit.text
        blocks.append(header(rank + 1, passages[rank]) + text)
    return "\n".join(blocks)


def kept_passages(question: str, passages: Sequence[Passage], budget: int,
                  context: float = CONTEXT_WEIGHT) -> list[int]:
    """0-based ranks of the passages some of whose text the reader gets within `budget`."""
    return list(dict.fromkeys(u.passage for u in select_units(question, passages, budget, context)))
