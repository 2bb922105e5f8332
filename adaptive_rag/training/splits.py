"""Which labels a model may learn from and which ones judge it, decided by the question's text.

Two stable hashes of the *normalised* question (casefolded, whitespace collapsed, punctuation at
both ends stripped), so the same question asked twice ("Who wrote Dune?" / "who wrote  dune")
always lands on the same side and never leaks from training into the comparison:

- `live_split`: `train` or `test` for labels from live traffic (60/40, like the benchmark split);
  benchmark labels keep their dataset's split (`adaptive_rag.evaluation.datasets.split_of`).
- `validation_part`: `validation` or `fit` inside `train` (20 % validation). Promotion compares
  challenger and champion on `validation` only and the challenger learns from `fit` only; `test`
  is never used to choose anything (ARCHITECTURE.md, evaluation protocol).

The two hashes use different salts, so validation is a fifth of `train` whatever the split was.

Live labels are few beside the benchmark's thousands (31 of 4,181 `train` labels after one support
round): `weighted_live` repeats them up to a share of what a challenger learns from, and
`live_group` names the tenant whose own validation labels promotion checks separately. No torch
needed.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from typing import Literal, TypeVar

VALIDATION_SHARE = 0.2
LIVE_SHARE = 0.2  # share of the examples a challenger learns from that live labels may make up
MAX_LIVE_REPEATS = 20  # a live label counts at most this many times
LIVE_PREFIX = "live:"  # dataset of a live label: "live:<tenant>"
LIVE_TRAIN_SHARE = 0.6  # the benchmark's 60/40 (`adaptive_rag.evaluation.datasets.TRAIN_SHARE`)

Part = Literal["fit", "validation"]
T = TypeVar("T")
_SPACES = re.compile(r"\s+")


def normalise_question(text: str) -> str:
    """Compatibility forms folded, casefolded, punctuation and symbols dropped, spacing collapsed:
    what makes two questions "the same" for every split."""
    text = unicodedata.normalize("NFKC", text).casefold()
    kept = "".join(
        " " if unicodedata.category(char).startswith(("P", "S")) else char for char in text
    )
    return _SPACES.sub(" ", kept).strip()


def question_fraction(question: str, salt: str) -> float:
    """A stable number in [0, 1) for the normalised question (sha256, salted per use)."""
    digest = hashlib.sha256(f"{salt}:{normalise_question(question)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def validation_part(question: str, share: float = VALIDATION_SHARE) -> Part:
    """`validation` for about `share` of the questions of `train`, else `fit`."""
    return "validation" if question_fraction(question, "validation") < share else "fit"


def live_split(question: str) -> Literal["train", "test"]:
    """`train` or `test` for a live-traffic label, by its normalised question (never by request)."""
    return "train" if question_fraction(question, "live-split") < LIVE_TRAIN_SHARE else "test"


def partition(
    rows: Iterable[T], question: Callable[[T], str], share: float = VALIDATION_SHARE
) -> tuple[list[T], list[T]]:
    """`(fit, validation)` of `train` rows, by `validation_part` of each row's question."""
    fit: list[T] = []
    validation: list[T] = []
    for row in rows:
        (validation if validation_part(question(row), share) == "validation" else fit).append(row)
    return fit, validation


def tier_counts(labels: Sequence[str]) -> dict[str, int]:
    """`{"A": n, "B": n, "C": n}` of a list of labels (what promotion records)."""
    return {tier: sum(1 for label in labels if label == tier) for tier in ("A", "B", "C")}


def live_group(dataset: str) -> str | None:
    """The tenant a label's dataset names ("live:<tenant>" -> "<tenant>"); None for benchmark labels."""
    if not dataset.startswith(LIVE_PREFIX):
        return None
    return dataset[len(LIVE_PREFIX):] or None


def live_repeats(live: int, benchmark: int, share: float = LIVE_SHARE, cap: int = MAX_LIVE_REPEATS) -> int:
    """How many times each live example is counted so that live examples make up about `share` of
    the total (never fewer than once, at most `cap`)."""
    if live <= 0 or share <= 0:
        return 1
    if share >= 1:
        return cap
    wanted = share * benchmark / ((1 - share) * live)
    return max(1, min(cap, round(wanted)))


def weighted_live(rows: Sequence[T], dataset: Callable[[T], str], share: float = LIVE_SHARE,
                  cap: int = MAX_LIVE_REPEATS) -> list[T]:
    """`rows` with each live row repeated `live_repeats` times (order kept, repeats adjacent):
    a tenant's few labels then weigh against the benchmark's many instead of vanishing in them."""
    live = sum(1 for row in rows if live_group(dataset(row)) is not None)
    times = live_repeats(live, len(rows) - live, share, cap)
    out: list[T] = []
    for row in rows:
        out.extend([row] * (times if live_group(dataset(row)) is not None else 1))
    return out


def validation_columns(rows: Iterable[object]) -> tuple[list[str], list[str], list[str | None]]:
    """`(texts, labels, tenants)` of label rows (`.question`, `.label`, `.dataset`): what promotion
    compares on, with the tenant of each live label (None for a benchmark label)."""
    rows = list(rows)
    return ([row.question for row in rows], [row.label for row in rows],  # type: ignore[attr-defined]
            [live_group(row.dataset) for row in rows])  # type: ignore[attr-defined]
