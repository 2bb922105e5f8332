"""The learned small-talk detector: multinomial logistic regression over the utterance's words,
word pairs and character n-grams, one class per small-talk intent plus `none` (a real request).

Why n-grams and not sentence embeddings: the detector runs in the front door before the
classifier, and the front door installs neither ONNX Runtime nor an exported encoder (see
`pyproject.toml`'s `frontdoor` extra); a linear model over n-grams needs numpy only, scores a
query in tens of microseconds, and is small enough to ship as package data
(`small_talk_detector.npz`). It is fitted by `arag smalltalk train`
(`adaptive_rag.training.small_talk`), which uses this module's `features`, so fitting and
serving see the same features.

Features (binary, then the row scaled to unit length): each word, each pair of neighbouring words
with the utterance's start and end marked (`<s> hi`, `you </s>`), the character 3- and 4-grams of
each word padded with spaces (so "thnks" shares most of its n-grams with "thanks"), and a
length bucket. Words come from `normalise` (the rules' normaliser: lower case, contractions
spelled out, punctuation as clause breaks).

A decision (`SmallTalkModel.decide`): the whole utterance and, when it has several clauses, each
clause are scored. It is small talk only when the whole utterance's probability of not being a
request (1 - P(none)) is at least `min_confidence` and no clause is a request with probability
`CLAUSE_VETO` or more (the intent is then the most likely class other than `none`): "hi, how do I reset my hub?" has the clause "how do i reset my hub", a request, so it is
a query. Utterances of more than `MAX_WORDS` words are always queries.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

NONE = "none"
FORMAT = 1
DEFAULT_MODEL = Path(__file__).with_name("small_talk_detector.npz")
CHAR_NGRAMS = (3, 4)
LENGTH_BUCKETS = (1, 2, 3, 5, 8, 12)
# A clause this likely to be a request makes the whole utterance a request, however chatty the
# rest ("hi, how do I reset my hub?"); a clause that is only a name or an opener ("sara, are you
# a bot?", "tell me, ...") is not that sure, and does not.
CLAUSE_VETO = 0.8


def _length_bucket(words: int) -> str:
    for bound in LENGTH_BUCKETS:
        if words <= bound:
            return f"n:<={bound}"
    return f"n:>{LENGTH_BUCKETS[-1]}"


def clause_features(clauses: Sequence[str]) -> set[str]:
    """The feature names of an utterance given as its normalised clauses (see module doc)."""
    found: set[str] = set()
    words_total = 0
    tokens: list[str] = ["<s>"]
    for clause in clauses:
        words = clause.split()
        words_total += len(words)
        tokens.extend(words)
        tokens.append("|")  # a clause break: pairs do not run across it
        for word in words:
            found.add("w:" + word)
            padded = f" {word} "
            for n in CHAR_NGRAMS:
                for start in range(len(padded) - n + 1):
                    found.add("c:" + padded[start:start + n])
    if tokens[-1] == "|":
        tokens[-1] = "</s>"
    for left, right in zip(tokens, tokens[1:], strict=False):
        if left != "|" and right != "|":
            found.add(f"b:{left} {right}")
    found.add(_length_bucket(words_total))
    return found


@dataclass(frozen=True)
class Scored:
    """Class probabilities of one text, in the model's class order."""

    classes: tuple[str, ...]
    probabilities: np.ndarray

    @property
    def best(self) -> str:
        return self.classes[int(np.argmax(self.probabilities))]

    @property
    def not_none(self) -> float:
        """The probability that the text is not a request (any class but `none`)."""
        return 1.0 - float(self.probabilities[self.classes.index(NONE)])

    @property
    def best_talk(self) -> str:
        """The most likely class other than `none`."""
        ranked = np.argsort(-self.probabilities)
        return next(self.classes[i] for i in ranked if self.classes[i] != NONE)


class SmallTalkModel:
    """Fitted weights: one row per feature name, one column per class, plus a bias per class."""

    def __init__(self, vocabulary: Sequence[str], weights: np.ndarray, bias: np.ndarray,
                 classes: Sequence[str], min_confidence: float, info: dict | None = None) -> None:
        if weights.shape != (len(vocabulary), len(classes)) or bias.shape != (len(classes),):
            raise ValueError(f"weights {weights.shape} / bias {bias.shape} do not fit "
                             f"{len(vocabulary)} features x {len(classes)} classes")
        if NONE not in classes:
            raise ValueError(f"the classes must include {NONE!r}")
        self.index = {name: i for i, name in enumerate(vocabulary)}
        self.weights = weights.astype(np.float32)
        self.bias = bias.astype(np.float32)
        self.classes = tuple(classes)
        self.min_confidence = float(min_confidence)
        self.info = info or {}

    # Serving ------------------------------------------------------------------------------------
    def score_clauses(self, clauses: Sequence[str]) -> Scored:
        """Class probabilities of the utterance made of `clauses` (already normalised)."""
        rows = [self.index[f] for f in clause_features(clauses) if f in self.index]
        logits = self.bias.copy()
        if rows:
            logits += self.weights[rows].sum(axis=0) / np.sqrt(len(rows))
        logits -= logits.max()
        exp = np.exp(logits)
        return Scored(self.classes, exp / exp.sum())

    def decide(self, clauses: Sequence[str]) -> str | None:
        """The small-talk intent of the utterance made of `clauses`, or None for a request."""
        whole = self.score_clauses(clauses)
        if whole.not_none < self.min_confidence:
            return None
        if len(clauses) > 1 and any(1.0 - self.score_clauses([c]).not_none >= CLAUSE_VETO for c in clauses):
            return None
        return whole.best_talk

    # Files --------------------------------------------------------------------------------------
    def save(self, path: Path) -> Path:
        """Weights, vocabulary and classes in one `.npz`, the fit's facts in `info` (JSON)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        vocabulary = sorted(self.index, key=self.index.__getitem__)
        with path.open("wb") as handle:
            np.savez_compressed(
                handle, format=np.array(FORMAT), vocabulary=np.array(vocabulary),
                weights=self.weights.astype(np.float16), bias=self.bias,
                classes=np.array(self.classes), min_confidence=np.array(self.min_confidence),
                info=np.array(json.dumps(self.info, sort_keys=True)),
            )
        return path

    @classmethod
    def load(cls, path: Path = DEFAULT_MODEL) -> SmallTalkModel:
        with np.load(Path(path), allow_pickle=False) as data:
            if int(data["format"]) != FORMAT:
                raise ValueError(f"{path}: format {int(data['format'])}, this code reads {FORMAT}")
            return cls(
                vocabulary=[str(v) for v in data["vocabulary"]],
                weights=data["weights"].astype(np.float32), bias=data["bias"],
                classes=[str(c) for c in data["classes"]],
                min_confidence=float(data["min_confidence"]),
                info=json.loads(str(data["info"])),
            )


def vocabulary_of(feature_sets: Iterable[set[str]], min_count: int) -> list[str]:
    """Feature names seen in at least `min_count` texts, sorted (a stable column order)."""
    counts: dict[str, int] = {}
    for features in feature_sets:
        for name in features:
            counts[name] = counts.get(name, 0) + 1
    return sorted(name for name, count in counts.items() if count >= min_count)


__all__ = ["DEFAULT_MODEL", "NONE", "Scored", "SmallTalkModel", "clause_features", "vocabulary_of"]
