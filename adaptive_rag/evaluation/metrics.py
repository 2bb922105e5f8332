"""Answer metrics as in the paper: SQuAD-normalised EM and F1 and Acc, max over gold aliases."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lowercase, drop punctuation and articles, squeeze whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in golds))


def _f1(prediction: str, gold: str) -> float:
    pred_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, golds: Sequence[str]) -> float:
    return max((_f1(prediction, g) for g in golds), default=0.0)


def accuracy(prediction: str, golds: Sequence[str]) -> float:
    """1 when a normalised gold answer occurs, on word boundaries, in the normalised prediction."""
    pred = f" {normalize_answer(prediction)} "
    return float(
        any(norm and f" {norm} " in pred for norm in (normalize_answer(g) for g in golds))
    )


def score(prediction: str, golds: Sequence[str]) -> dict[str, float]:
    return {
        "em": exact_match(prediction, golds),
        "f1": f1_score(prediction, golds),
        "acc": accuracy(prediction, golds),
    }
