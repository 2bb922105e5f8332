"""Comparison questions, read per side: "Which film came out first, A or B?", "Was A or B born
first?", "Are A and B of the same nationality?".

With the whole chain in hand a small reader still names the wrong side of a comparison: the two
sides' facts sit in different passages and it must hold both, compare them and name a side in one
go. Read per side instead, each step single-hop: each side's passages give that side's fact (a
date, a number, a place), and the comparison is then a rule (two dates or numbers and the
question's direction) or, when the facts are not comparable by rule, one short read of the two
facts alone.

This module holds the rules: which questions are comparisons (`split_comparison`), what each
side's fact is read as, and how two facts decide (`decide`). A question the rules do not
recognise is no comparison, and is read as before.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Direction = Literal["earlier", "later", "more", "less"]
Kind = Literal["which", "same"]
Measure = Literal["date", "amount", "lifespan", "attribute"]

# Words that say which way a "which ... A or B" question compares, and what it compares: a date
# (earlier / later) or an amount (more / less). "older" is an earlier birth, "younger" a later one.
_DIRECTION_WORDS: tuple[tuple[str, Direction], ...] = (
    (r"\b(first|earlier|earliest|older|oldest|sooner)\b", "earlier"),
    (r"\b(later|latest|last|younger|youngest|more recently|most recently|at a later date)\b", "later"),
    (r"\b(more|most|larger|largest|bigger|biggest|longer|longest|higher|highest|taller|tallest)\b", "more"),
    (r"\b(fewer|fewest|less|least|smaller|smallest|shorter|shortest|lower|lowest)\b", "less"),
)
# "Was A or B born first?": the sides stand between the opening word and one of these verbs.
_INLINE_VERBS = (
    "born", "released", "published", "founded", "established", "formed", "created", "built",
    "opened", "made", "died", "married", "launched", "started", "produced", "written", "directed",
    "come out", "came out", "first", "older", "younger",
)
_TRAILING = re.compile(r"^(?P<head>.+?),\s*(?P<a>[^,]+?)\s+or\s+(?P<b>[^,]+?)\s*\?*$")
_INLINE = re.compile(
    r"^(?P<open>was|were|is|did|does|do|who|which)\s+(?P<a>.+?)\s+or\s+(?P<b>.+?)\s+"
    r"(?P<tail>(?:" + "|".join(re.escape(v) for v in _INLINE_VERBS) + r")\b.*?)\s*\?*$",
    re.IGNORECASE,
)
_SAME = re.compile(
    r"^(?:are|were|is|was|do|did)\s+(?:both\s+)?(?P<a>.+?)\s+and\s+(?P<b>.+?)\s+"
    r"(?P<tail>(?:both\s+)?(?:of|from|located in|in|have|share)\s+the\s+same\b.*?)\s*\?*$",
    re.IGNORECASE,
)
# "Who lived longer, A or B?" compares lifespans: each side's birth and death dates.
_LIFESPAN = re.compile(r"\b(lived|live|lives)\s+longer\b", re.IGNORECASE)
# What each side's fact is, in words the side reader is asked for.
MEASURE_WORDS: dict[Measure, str] = {
    "date": "date (day, month and year)",
    "amount": "number",
    "lifespan": "birth and death dates",
    "attribute": "place, country or nationality",
}
_MONTHS = {m: i for i, m in enumerate(
    ("january", "february", "march", "april", "may", "june", "july", "august", "september",
     "october", "november", "december"), start=1)}
_DATE = re.compile(
    r"(?:(?P<d1>\d{1,2})\s+(?P<m1>[A-Za-z]+)\s+(?P<y1>\d{3,4}))"          # 5 March 1901
    r"|(?:(?P<m2>[A-Za-z]+)\s+(?P<d2>\d{1,2}),?\s+(?P<y2>\d{3,4}))"        # March 5, 1901
    r"|(?:(?P<m3>[A-Za-z]+)\s+(?P<y3>\d{3,4}))"                            # March 1901
    r"|(?P<y4>\b\d{3,4}\b)"                                                # 1901
)
_NUMBER = re.compile(r"-?\d+(?:[.,]\d+)*")


@dataclass(frozen=True)
class Comparison:
    """A comparison question's two sides, what kind it is and, for "which", its direction."""

    question: str
    sides: tuple[str, str]
    kind: Kind
    direction: Direction | None = None
    measure: Measure = "attribute"

    def side_query(self, side: str) -> str:
        """What to retrieve a side's passages with: the question with the other side left out."""
        other = self.sides[1] if side == self.sides[0] else self.sides[0]
        return " ".join(self.question.replace(other, " ").split())


def _clean(side: str) -> str:
    return side.strip().strip("'\"“”‘’").strip()


def _direction(text: str) -> Direction | None:
    lowered = text.lower()
    for pattern, direction in _DIRECTION_WORDS:
        if re.search(pattern, lowered):
            return direction
    return None


def split_comparison(question: str) -> Comparison | None:
    """The comparison a question asks, or None when the rules do not recognise one."""
    text = " ".join(question.split())
    same = _SAME.match(text)
    if same:
        return Comparison(text, (_clean(same["a"]), _clean(same["b"])), "same")
    for match, said in ((_TRAILING.match(text), "head"), (_INLINE.match(text), "tail")):
        if not match:
            continue
        sides = (_clean(match["a"]), _clean(match["b"]))
        direction = _direction(match[said])
        if direction is None or not all(sides) or sides[0].lower() == sides[1].lower():
            continue
        measure: Measure = ("lifespan" if _LIFESPAN.search(text) else
                            "date" if direction in ("earlier", "later") else "amount")
        return Comparison(text, sides, "which", direction, measure)
    return None


def _date(match: re.Match[str]) -> tuple[int, int, int]:
    groups = match.groupdict()
    year = next(int(groups[k]) for k in ("y1", "y2", "y3", "y4") if groups[k])
    month_name = next((groups[k] for k in ("m1", "m2", "m3") if groups[k]), None)
    month = _MONTHS.get(month_name.lower(), 0) if month_name else 0
    # "Act 1901" is no month: the year alone
    day = int(next((groups[k] for k in ("d1", "d2") if groups[k]), 0) or 0) if month else 0
    return year, month, day


def as_date(fact: str) -> tuple[int, int, int] | None:
    """The first date in a fact as (year, month, day), a missing month or day as 0; None if none."""
    found = _DATE.search(fact)
    return _date(found) if found else None


def as_number(fact: str) -> float | None:
    """The first number in a fact (thousands separators dropped); None if none."""
    found = _NUMBER.search(fact)
    if not found:
        return None
    try:
        return float(found.group().replace(",", ""))
    except ValueError:
        return None


def as_lifespan(fact: str) -> int | None:
    """Years between the first and the last year a fact names (birth and death); None unless two."""
    years = [_date(m)[0] for m in _DATE.finditer(fact)]
    return years[-1] - years[0] if len(years) >= 2 and years[-1] >= years[0] else None


def decide(comparison: Comparison, facts: tuple[str, str]) -> str | None:
    """The answer two sides' facts give by rule, or None when no rule decides (the facts are then
    read together). "which": the side whose date, number or lifespan lies in the question's
    direction (never on a tie); "same": never by rule (a nationality and a country are said many
    ways)."""
    if comparison.kind != "which" or comparison.direction is None:
        return None
    if comparison.measure == "lifespan":
        spans = [as_lifespan(f) for f in facts]
        if None in spans:
            return None
        a, b = spans
    elif comparison.measure == "date":
        values = [as_date(f) for f in facts]
        if None in values:
            return None
        first, second = values
        # compare only as precisely as both facts say: two bare years compare by year alone
        depth = 1
        while depth < 3 and first[depth] and second[depth]:
            depth += 1
        a, b = first[:depth], second[:depth]
    else:
        numbers = [as_number(f) for f in facts]
        if None in numbers:
            return None
        a, b = numbers
    if a == b:
        return None
    a_wins = a < b if comparison.direction in ("earlier", "less") else a > b
    return comparison.sides[0] if a_wins else comparison.sides[1]
