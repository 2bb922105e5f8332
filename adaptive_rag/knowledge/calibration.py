"""Each knowledge base's own abstention threshold, derived from the knowledge base alone.

No tenant labels a question. When a knowledge base is written, the reference questions
(`reference_questions.txt`: 160 questions about everything from cooking to tax law, written for
this project) are asked of it: their relevance there (`retrieval.relevance`: the best passage's
BM25 score over the question's summed idf) is what a question the knowledge base does not cover
scores on this knowledge base. The threshold is the relevance that only a fifth of them reach
(`QUANTILE`), and never less than `FLOOR`: a narrow help centre that no reference question
matches still abstains on a question it shares only common words with.

Both numbers were chosen on the support suite's `train` split and on the `train` half of the demo
help centre's coverage questions, against the raw BM25 top score (with the same reference
quantiles), the share of the question's terms the knowledge base knows, and pseudo-questions cut
from the knowledge base's own passages (`reports/abstention/`). Then which threshold is in effect
for a tenant: `threshold_in_effect`.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from pathlib import Path
from typing import Any

from adaptive_rag.ports import QueryWeigher, Retriever
from adaptive_rag.retrieval.relevance import relevance

REFERENCE_FILE = Path(__file__).with_name("reference_questions.txt")
METHOD = "relevance: max(floor, reference quantile)"
FLOOR = 0.45
QUANTILE = 0.8


@cache
def reference_questions(path: Path = REFERENCE_FILE) -> tuple[str, ...]:
    """The reference questions: one a line, `#` comments and blank lines skipped."""
    lines = (line.strip() for line in path.read_text(encoding="utf-8").splitlines())
    return tuple(dict.fromkeys(line for line in lines if line and not line.startswith("#")))


@dataclass(frozen=True)
class Calibration:
    """A knowledge base's derived threshold and what it was derived from (kept in the records)."""

    threshold: float
    reference_relevance: float  # the `quantile` of the reference questions' relevance
    floor: float
    quantile: float
    questions: int
    chunks: int  # the knowledge base's size when it was derived
    method: str = METHOD

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Calibration:
        """The calibration `as_record` stored (keys it does not know are ignored)."""
        return cls(**{name: record[name] for name in cls.__dataclass_fields__ if name in record})

    def as_record(self) -> dict[str, Any]:
        return {"threshold": self.threshold, "reference_relevance": self.reference_relevance,
                "floor": self.floor, "quantile": self.quantile, "questions": self.questions,
                "chunks": self.chunks, "method": self.method}

    def describe(self) -> str:
        """One line for operators: how the number came about."""
        return (f"max(floor {self.floor:g}, relevance {self.reference_relevance:.3f} that "
                f"{100 * (1 - self.quantile):.0f} % of {self.questions} reference questions reach), "
                f"derived at {self.chunks} chunks")


def quantile(values: Sequence[float], q: float) -> float:
    """The `q` quantile of `values` by linear interpolation (numpy's default)."""
    if len(values) == 1 or q <= 0:
        return float(min(values))
    if q >= 1:
        return float(max(values))
    return statistics.quantiles(values, n=1000, method="inclusive")[round(q * 1000) - 1]


def calibrate(retriever: Retriever, chunks: int, questions: Sequence[str] | None = None,
              floor: float = FLOOR, q: float = QUANTILE) -> Calibration | None:
    """The knowledge base's own threshold from its retriever; None when it has no chunks or its
    retriever cannot weigh queries (relevance needs both)."""
    if chunks <= 0 or not isinstance(retriever, QueryWeigher):
        return None
    asked = list(questions if questions is not None else reference_questions())
    scores = [relevance(retriever, question, retriever.search(question, 1)) or 0.0 for question in asked]
    reference = quantile(scores, q)
    return Calibration(threshold=round(max(floor, reference), 4), reference_relevance=round(reference, 4),
                       floor=floor, quantile=q, questions=len(asked), chunks=chunks)


class ThresholdSource(StrEnum):
    """Where the relevance threshold in effect for a tenant comes from (first that is set)."""

    TENANT = "tenant override"  # `arag kb threshold --tenant T VALUE`
    DEPLOYMENT = "deployment setting"  # ARAG_ABSTAIN_MIN_RELEVANCE
    AUTOMATIC = "automatic"  # derived from the knowledge base
    NONE = "none"  # nothing derived yet: abstain only when nothing is retrieved


@dataclass(frozen=True)
class ThresholdInEffect:
    value: float
    source: ThresholdSource
    automatic: float | None
    override: float | None

    def describe(self) -> str:
        text = f"relevance below {self.value:g} ({self.source.value}"
        if self.source is not ThresholdSource.AUTOMATIC and self.automatic is not None:
            text += f"; automatic would be {self.automatic:g}"
        return text + ")"


def threshold_in_effect(automatic: float | None, override: float | None,
                        deployment: float | None) -> ThresholdInEffect:
    """The tenant's override, else the deployment's setting, else the knowledge base's own."""
    for value, source in ((override, ThresholdSource.TENANT), (deployment, ThresholdSource.DEPLOYMENT),
                          (automatic, ThresholdSource.AUTOMATIC)):
        if value is not None:
            return ThresholdInEffect(value, source, automatic, override)
    return ThresholdInEffect(0.0, ThresholdSource.NONE, automatic, override)
