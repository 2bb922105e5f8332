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
No torch needed.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from typing import Literal, TypeVar

VALIDATION_SHARE = 0.2
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
