"""Learned routers over sentence embeddings, beside the fine-tuned classifier.

Three routers from the literature the product is compared with, each trained only on `train`
labels (the `training_labels` table: `arag label`, and live labels from `arag relabel`), with
every hyper-parameter chosen on a validation split carved from those labels by a stable hash of
the normalised question (`validation_split`: duplicates and paraphrases that normalise alike land
on the same side), then refitted on all of them:

- `LogisticRouter` ("lr"): multinomial logistic regression on sentence embeddings;
  C and the class weighting chosen by validation macro-F1 (the fine-tuned classifier's criterion).
- `KnnRouter` ("knn"): the tier most voted by the k nearest labelled past queries (cosine), as in
  SKR (Wang et al., 2023, "Self-Knowledge Guided Retrieval Augmentation"); k and the vote weighting
  chosen by validation macro-F1. The memory is simply the labelled queries, so it grows with live
  traffic: `fit` takes any labelled queries (benchmark or live) and `extend` adds newly relabelled
  ones without refitting, like the policy datastore of SR-RAG (Self-Routing RAG, 2025).
- `RewardRouter` ("reward"): MBA-RAG style cost-aware routing (Tang et al., COLING 2025). Per tier
  the soft target is correctness minus lambda * steps, from the stored outcomes of every tier; one
  multi-output ridge regressor predicts the three rewards; the route is the argmax (exact ties go
  to the cheaper tier). See `RewardRouter` for the lambda rule. MBA-RAG reports F1 48.61 at 1.80
  steps against Adaptive-RAG's 46.94 at 2.17 with FLAN-T5-XL; those are the paper's figures, not
  ours. Unlike MBA-RAG's bandit, every train question here has all three tiers' outcomes, so the
  rewards are regressed with full information and nothing has to be explored.

Fitting needs scikit-learn (the `train` extras). Routing needs only numpy and the encoder
(`adaptive_rag.routing.embeddings.OnnxEmbedder`: ONNX Runtime + tokenizers): every fitted model is
a dot product, so it is stored as plain arrays (`router.npz`, loaded without pickle, so loading an
artefact runs no code) next to `router.json` (label counts, validation scores, chosen
hyper-parameters, the encoder's sha256, the artefact's sha256) and a `MODEL_CARD.md`.

`AsyncRouter` adapts any of them to the front door's router port (`await route(query)`, never
raises); `open_router(kind, path)` builds one from a saved directory.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from adaptive_rag.contracts import TIER_VALUES, RoutingDecision, Tier
from adaptive_rag.errors import ConfigurationError
from adaptive_rag.routing.embeddings import Embedder, OnnxEmbedder, file_sha256
from adaptive_rag.training.splits import VALIDATION_SHARE, validation_part
from adaptive_rag.routing.policy import fallback_decision

if TYPE_CHECKING:
    from adaptive_rag.storage.models import TrainingLabel

CARD_FILE = "router.json"
ARRAYS_FILE = "router.npz"
MODEL_CARD = "MODEL_CARD.md"
FORMAT = 1
DEFAULT_VAL_SHARE = VALIDATION_SHARE
TIE = 1e-9
MBA_RAG_REFERENCE = (
    "MBA-RAG (Tang et al., COLING 2025) reports F1 48.61 at 1.80 steps against Adaptive-RAG's 46.94 "
    "at 2.17 with FLAN-T5-XL (the paper's figures, not measured here)"
)


# --- labelled queries and the validation split ---------------------------------------------------


@dataclass(frozen=True)
class TierOutcome:
    """What one tier's strategy did for a question (None: not known, e.g. a live label)."""

    f1: float | None = None
    correct: bool | None = None
    steps: float | None = None


@dataclass(frozen=True)
class LabelledQuery:
    """A question with its tier label and, when known, every tier's outcome."""

    question: str
    label: Tier
    dataset: str = ""
    question_id: str = ""
    origin: str = "benchmark"  # benchmark | live
    source: str = ""  # silver | binary | feedback | shadow
    outcomes: Mapping[str, TierOutcome] = field(default_factory=dict)

    def has_rewards(self) -> bool:
        """Every tier's F1 (or correctness) and steps are known: usable by the reward router."""
        return all(
            (o := self.outcomes.get(t)) is not None and o.steps is not None
            and (o.f1 is not None or o.correct is not None)
            for t in TIER_VALUES
        )


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def examples_from_labels(rows: Iterable[TrainingLabel]) -> list[LabelledQuery]:
    """`training_labels` rows (benchmark and live alike) as labelled queries with their outcomes."""
    found = []
    for row in rows:
        outcomes = {
            tier: TierOutcome(
                f1=_float(o.get("f1")),
                correct=None if o.get("correct") is None else bool(o["correct"]),
                steps=_float(o.get("steps")),
            )
            for tier, o in (row.outcomes or {}).items() if tier in TIER_VALUES and isinstance(o, Mapping)
        }
        found.append(LabelledQuery(row.question, Tier(row.label), row.dataset, row.question_id,
                                   row.origin, row.label_source, outcomes))
    return found


def in_validation(question: str, share: float = DEFAULT_VAL_SHARE) -> bool:
    """The one validation split of `train` (`training.splits.validation_part`, a hash of the
    normalised question), shared with classifier promotion: stable on any machine."""
    return validation_part(question, share) == "validation"


def validation_split(
    examples: Sequence[LabelledQuery], share: float = DEFAULT_VAL_SHARE,
) -> tuple[list[int], list[int]]:
    """Indexes of the fitting part and of the validation part."""
    fit_part, validation = [], []
    for index, example in enumerate(examples):
        (validation if in_validation(example.question, share) else fit_part).append(index)
    return fit_part, validation


def label_counts(examples: Iterable[LabelledQuery]) -> dict[str, int]:
    counts = Counter(e.label.value for e in examples)
    return {t: counts.get(t, 0) for t in TIER_VALUES}


# --- scores --------------------------------------------------------------------------------------


def label_scores(truth: Sequence[str], predicted: Sequence[str]) -> dict[str, Any]:
    """Accuracy, macro-F1 over the classes present in `truth`, per-class recall."""
    n = len(truth)
    if not n:
        return {"n": 0}
    present = [t for t in TIER_VALUES if t in set(truth)]
    f1s, recall = [], {}
    for tier in present:
        tp = sum(1 for a, b in zip(truth, predicted) if a == b == tier)
        support = sum(1 for a in truth if a == tier)
        chosen = sum(1 for b in predicted if b == tier)
        precision = tp / chosen if chosen else 0.0
        recall[tier] = tp / support
        f1s.append(2 * precision * recall[tier] / (precision + recall[tier]) if tp else 0.0)
    return {"n": n, "accuracy": sum(a == b for a, b in zip(truth, predicted)) / n,
            "macro_f1": sum(f1s) / len(f1s), "recall": recall}


def routed_quality(examples: Sequence[LabelledQuery], tiers: Sequence[str]) -> dict[str, float] | None:
    """Mean stored F1 and steps of the routed tiers, over the examples whose outcomes hold them."""
    f1 = steps = 0.0
    n = 0
    for example, tier in zip(examples, tiers):
        outcome = example.outcomes.get(tier)
        if outcome is None or outcome.f1 is None or outcome.steps is None:
            continue
        f1, steps, n = f1 + outcome.f1, steps + outcome.steps, n + 1
    return {"f1": f1 / n, "steps": steps / n, "n": n} if n else None


def validation_report(examples: Sequence[LabelledQuery], predicted: Sequence[str]) -> dict[str, Any]:
    """Label agreement and, where outcomes are stored, the routed F1 and steps beside always-B's
    and the labels' own (the cheapest correct tier) on the same questions."""
    report: dict[str, Any] = label_scores([e.label.value for e in examples], list(predicted))
    quality = routed_quality(examples, predicted)
    if quality is not None:
        report["routed"] = quality
        report["always_b"] = routed_quality(examples, ["B"] * len(examples))
        report["labels"] = routed_quality(examples, [e.label.value for e in examples])
    return report


def _cheapest_best(scores: np.ndarray) -> np.ndarray:
    """Per row, the first (cheapest) column within `TIE` of the row's maximum."""
    return np.argmax(scores >= scores.max(axis=1, keepdims=True) - TIE, axis=1)


def _unit(rows: np.ndarray) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.float32)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.maximum(norms, 1e-12)


def _software() -> dict[str, str]:
    found = {"numpy": np.__version__}
    try:
        import sklearn

        found["scikit-learn"] = sklearn.__version__
    except ImportError:  # pragma: no cover - routing needs no sklearn
        pass
    return found


# --- the routers ---------------------------------------------------------------------------------


class LearnedRouter(ABC):
    """Shared by the three routers: fit with a hash validation split, route, save and load."""

    kind: ClassVar[str]
    description: ClassVar[str]
    selection_rule: ClassVar[str]

    def __init__(self, embedder: Embedder | None = None, val_share: float = DEFAULT_VAL_SHARE) -> None:
        self.embedder = embedder
        self.val_share = val_share
        self.card: dict[str, Any] = {}
        self.params: dict[str, Any] = {}
        self.artefact_sha256 = ""

    # -- what each router defines
    @abstractmethod
    def _usable(self, example: LabelledQuery) -> bool: ...

    @abstractmethod
    def _select(
        self, x_fit: np.ndarray, fit: list[LabelledQuery], x_val: np.ndarray, val: list[LabelledQuery],
    ) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
        """`(chosen hyper-parameters, their validation report, every setting tried)`."""

    @abstractmethod
    def _fit_final(self, x: np.ndarray, examples: list[LabelledQuery], params: Mapping[str, Any]) -> None: ...

    @abstractmethod
    def _decide(self, x: np.ndarray) -> list[tuple[str, dict[str, float] | None, str]]:
        """Per embedding row: `(tier, probabilities or None, reason)`."""

    @abstractmethod
    def _arrays(self) -> dict[str, np.ndarray]: ...

    @abstractmethod
    def _restore(self, arrays: Mapping[str, np.ndarray]) -> None: ...

    # -- fitting
    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        if self.embedder is None:
            raise ConfigurationError(f"the {self.kind} router has no embedder")
        many = getattr(self.embedder, "embed_many", None)
        return many(texts) if many is not None else self.embedder.embed(texts)

    def fit(
        self, examples: Sequence[LabelledQuery], embeddings: np.ndarray | None = None, note: str = "",
    ) -> dict[str, Any]:
        """Choose hyper-parameters on the hash validation split, then refit on every usable
        example. `embeddings` (same order as `examples`) saves embedding them again. Returns the
        card."""
        started = time.perf_counter()
        x_all = self._embed([e.question for e in examples]) if embeddings is None else np.asarray(embeddings)
        keep = [i for i, e in enumerate(examples) if self._usable(e)]
        usable = [examples[i] for i in keep]
        x = _unit(x_all[keep]) if keep else np.zeros((0, x_all.shape[1] if x_all.ndim == 2 else 0), np.float32)
        if len({e.label for e in usable}) < 2:
            raise ConfigurationError(f"the {self.kind} router needs labelled queries of at least two tiers "
                                     f"({len(usable)} usable of {len(examples)})")
        fit_idx, val_idx = validation_split(usable, self.val_share)
        fit_part, val_part = [usable[i] for i in fit_idx], [usable[i] for i in val_idx]
        if not val_part or len({e.label for e in fit_part}) < 2:
            raise ConfigurationError(f"the validation split left {len(fit_part)} fitting and {len(val_part)} "
                                     "validation examples: too few labelled queries to choose hyper-parameters")
        params, report, grid = self._select(x[fit_idx], fit_part, x[val_idx], val_part)
        self.params = dict(params)
        self._fit_final(x, usable, self.params)
        self.card = {
            "kind": self.kind, "format": FORMAT, "description": self.description,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "note": note,
            "labels": {
                "fitted_on": label_counts(usable), "fit_part": label_counts(fit_part),
                "validation": label_counts(val_part), "excluded": len(examples) - len(usable),
                "origins": dict(Counter(e.origin for e in usable)),
                "sources": dict(Counter(e.source for e in usable)),
            },
            "validation_split": {"share": self.val_share,
                                 "rule": "sha256 of the normalised question (training.splits.validation_part)"},
            "hyperparameters": self.params, "selection": self.selection_rule,
            "validation": report, "grid": grid,
            "refit": "on every usable labelled query (fitting part + validation) with the chosen hyper-parameters",
            "seconds": round(time.perf_counter() - started, 2), "software": _software(),
        }
        return self.card

    # -- routing
    @property
    def artefact_id(self) -> str:
        return self.artefact_sha256[:12] or "unsaved"

    @property
    def model_name(self) -> str:
        """What the records store as the model: the kind and the artefact it ran."""
        return f"{self.kind}@{self.artefact_id}"

    def decide(self, embeddings: np.ndarray) -> list[RoutingDecision]:
        return [
            RoutingDecision(tier=Tier(tier), probabilities=probabilities, model_name=self.model_name,
                            reason=f"{self.kind}: {reason}")
            for tier, probabilities, reason in self._decide(_unit(np.atleast_2d(embeddings)))
        ]

    def route(self, question: str) -> RoutingDecision:
        if self.embedder is None:
            raise ConfigurationError(f"the {self.kind} router has no embedder")
        return self.decide(self.embedder.embed([question]))[0]

    def route_many(self, questions: Sequence[str]) -> list[RoutingDecision]:
        return self.decide(self._embed(list(questions))) if questions else []

    __call__ = route

    # -- artefacts
    def save(self, directory: Path) -> Path:
        """`router.npz` + `router.json` + `MODEL_CARD.md` in `directory`."""
        if not self.card:
            raise ConfigurationError(f"the {self.kind} router is not fitted")
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        arrays_path = directory / ARRAYS_FILE
        np.savez(arrays_path, **self._arrays())
        self.artefact_sha256 = file_sha256(arrays_path)
        encoder: dict[str, Any] = {"identity": getattr(self.embedder, "identity", "")}
        if isinstance(self.embedder, OnnxEmbedder):
            encoder.update(name=self.embedder.name, dim=self.embedder.dim,
                           path=os.path.relpath(self.embedder.directory.resolve(), directory.resolve()),
                           base=self.embedder.info.get("base"))
        self.card.update(artefact={"file": ARRAYS_FILE, "sha256": self.artefact_sha256}, encoder=encoder,
                         hyperparameters=self.params)
        (directory / CARD_FILE).write_text(json.dumps(self.card, indent=2, default=str) + "\n", encoding="utf-8")
        (directory / MODEL_CARD).write_text(model_card(self.card), encoding="utf-8")
        return directory

    @classmethod
    def load(cls, directory: Path, embedder: Embedder | None = None, threads: int = 1) -> LearnedRouter:
        """A saved router; its encoder is opened from the card unless `embedder` is given, and must
        be the one it was fitted with (same sha256)."""
        directory = Path(directory)
        card = json.loads((directory / CARD_FILE).read_text(encoding="utf-8"))
        kind = card.get("kind")
        target = KINDS.get(kind) if cls is LearnedRouter else cls
        if target is None or target.kind != kind:
            raise ConfigurationError(f"{directory} holds a {kind!r} router, not {cls.kind!r}")
        arrays_path = directory / card["artefact"]["file"]
        sha = file_sha256(arrays_path)
        if sha != card["artefact"]["sha256"]:
            raise ConfigurationError(f"{arrays_path} has sha256 {sha}, its card says {card['artefact']['sha256']}")
        encoder = card.get("encoder", {})
        if embedder is None:
            if "path" not in encoder:
                raise ConfigurationError(f"{directory} was fitted with a test embedder ({encoder.get('identity')}); "
                                         "pass the embedder to load it")
            embedder = OnnxEmbedder((directory / encoder["path"]).resolve(), threads=threads)
        if embedder.identity != encoder.get("identity"):
            raise ConfigurationError(f"{directory} was fitted on encoder {encoder.get('identity')}, "
                                     f"not {embedder.identity}: refit it (`arag routers train`)")
        router = target(embedder)
        router.card, router.params, router.artefact_sha256 = card, dict(card["hyperparameters"]), sha
        with np.load(arrays_path, allow_pickle=False) as arrays:
            router._restore({k: arrays[k] for k in arrays.files})
        return router


class LogisticRouter(LearnedRouter):
    """Multinomial logistic regression on the sentence embeddings."""

    kind = "lr"
    description = "logistic regression (scikit-learn) on sentence embeddings; argmax tier"
    selection_rule = ("C and class weighting with the highest validation macro-F1 of the labels; ties: "
                      "higher accuracy, then the smaller C (stronger regularisation)")
    C_GRID = (0.01, 0.1, 1.0, 10.0, 100.0)
    WEIGHTS = (None, "balanced")

    def _usable(self, example: LabelledQuery) -> bool:
        return True

    @staticmethod
    def _model(params: Mapping[str, Any]):
        from sklearn.linear_model import LogisticRegression

        return LogisticRegression(C=params["C"], class_weight=params["class_weight"], max_iter=5000)

    def _select(self, x_fit, fit, x_val, val):
        grid = []
        y_fit = [e.label.value for e in fit]
        for c in self.C_GRID:
            for weight in self.WEIGHTS:
                params = {"C": c, "class_weight": weight}
                self._set(self._model(params).fit(x_fit, y_fit))
                predicted = [tier for tier, _, _ in self._decide(x_val)]
                grid.append({"params": params, "validation": validation_report(val, predicted)})
        best = max(grid, key=lambda g: (round(g["validation"]["macro_f1"], 9),
                                        round(g["validation"]["accuracy"], 9), -g["params"]["C"]))
        return best["params"], best["validation"], grid

    def _set(self, model) -> None:
        """Keep the fitted model as arrays: logits = x @ weights.T + bias over `classes`."""
        classes = [str(c) for c in model.classes_]
        weights, bias = np.asarray(model.coef_, np.float64), np.asarray(model.intercept_, np.float64)
        if len(classes) == 2:  # sklearn keeps one row for two classes: P(second) = sigmoid(row)
            weights, bias = np.vstack([np.zeros_like(weights), weights]), np.concatenate([[0.0], bias])
        self.classes, self.weights, self.bias = classes, weights, bias

    def _fit_final(self, x, examples, params) -> None:
        self._set(self._model(params).fit(x, [e.label.value for e in examples]))

    def probabilities(self, x: np.ndarray) -> np.ndarray:
        """[n, 3] in A, B, C order (a class never seen in training has probability 0)."""
        logits = x.astype(np.float64) @ self.weights.T + self.bias
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        out = np.zeros((x.shape[0], len(TIER_VALUES)))
        for column, tier in enumerate(self.classes):
            out[:, TIER_VALUES.index(tier)] = p[:, column]
        return out

    def _decide(self, x):
        probs = self.probabilities(x)
        found = []
        for row in probs:
            tier = TIER_VALUES[int(_cheapest_best(row[None, :])[0])]
            found.append((tier, {t: float(p) for t, p in zip(TIER_VALUES, row)},
                          f"argmax {tier} (p={row[TIER_VALUES.index(tier)]:.3f})"))
        return found

    def _arrays(self):
        return {"weights": self.weights, "bias": self.bias, "classes": np.array(self.classes)}

    def _restore(self, arrays) -> None:
        self.weights, self.bias = arrays["weights"], arrays["bias"]
        self.classes = [str(c) for c in arrays["classes"]]


def cosine_neighbours(memory: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """`(similarities, indexes)` [n, k] of the k most cosine-similar memory rows, nearest first
    (rows are unit length). The same neighbours as scikit-learn's
    `NearestNeighbors(metric="cosine", algorithm="brute")` (tested), in plain numpy: a routing
    call is one matrix-vector product, and the artefact needs no pickle."""
    k = min(k, memory.shape[0])
    sims = queries @ memory.T
    if k < memory.shape[0]:
        part = np.argpartition(-sims, k - 1, axis=1)[:, :k]
    else:
        part = np.tile(np.arange(memory.shape[0]), (queries.shape[0], 1))
    part_sims = np.take_along_axis(sims, part, axis=1)
    order = np.lexsort((part, -part_sims), axis=1)  # by similarity, then by index: deterministic
    return np.take_along_axis(part_sims, order, axis=1), np.take_along_axis(part, order, axis=1)


class KnnRouter(LearnedRouter):
    """The tier most voted among the k nearest labelled queries."""

    kind = "knn"
    description = ("k nearest labelled past queries (cosine on sentence embeddings), SKR style; "
                   "the memory grows with live labelled queries")
    selection_rule = ("k and vote weighting with the highest validation macro-F1 of the labels; ties: "
                      "higher accuracy, then the smaller k")
    K_GRID = (1, 3, 5, 7, 9, 15, 25, 35)
    WEIGHTINGS = ("uniform", "similarity")

    def _usable(self, example: LabelledQuery) -> bool:
        return True

    def _select(self, x_fit, fit, x_val, val):
        self.memory, self.labels = x_fit, np.array([e.label.value for e in fit])
        grid = []
        for k in (k for k in self.K_GRID if k <= len(fit)):
            for weighting in self.WEIGHTINGS:
                self.params = {"k": k, "weighting": weighting}
                predicted = [tier for tier, _, _ in self._decide(x_val)]
                grid.append({"params": dict(self.params), "validation": validation_report(val, predicted)})
        best = max(grid, key=lambda g: (round(g["validation"]["macro_f1"], 9),
                                        round(g["validation"]["accuracy"], 9), -g["params"]["k"]))
        return best["params"], best["validation"], grid

    def _fit_final(self, x, examples, params) -> None:
        self.memory, self.labels = x.astype(np.float32), np.array([e.label.value for e in examples])

    def extend(self, examples: Sequence[LabelledQuery], embeddings: np.ndarray | None = None) -> None:
        """Add labelled queries (e.g. live ones from `arag relabel`) to the memory; k stays.
        Save again to keep them (the artefact's sha256 changes)."""
        if not examples:
            return
        x = _unit(self._embed([e.question for e in examples]) if embeddings is None else embeddings)
        self.memory = np.vstack([self.memory, x.astype(np.float32)])
        self.labels = np.concatenate([self.labels, [e.label.value for e in examples]])
        extended = self.card.setdefault("labels", {}).setdefault("extended", {})
        for tier, n in label_counts(examples).items():
            extended[tier] = extended.get(tier, 0) + n

    def _decide(self, x):
        k, weighting = int(self.params["k"]), self.params["weighting"]
        sims, idx = cosine_neighbours(self.memory, x.astype(np.float32), k)
        found = []
        for row_sims, row_idx in zip(sims, idx):
            scores = dict.fromkeys(TIER_VALUES, 0.0)
            first: dict[str, int] = {}
            for rank, (sim, i) in enumerate(zip(row_sims, row_idx)):
                tier = str(self.labels[i])
                scores[tier] += 1.0 if weighting == "uniform" else max(float(sim), 0.0) + 1e-6
                first.setdefault(tier, rank)
            # Most votes; a tie goes to the tier of the nearest neighbour among the tied.
            tier = max(first, key=lambda t: (round(scores[t], 9), -first[t]))
            total = sum(scores.values()) or 1.0
            votes = f"{scores[tier]:.0f}" if weighting == "uniform" else f"{scores[tier]:.2f}"
            reason = (f"{votes} of k={len(row_idx)} neighbours ({weighting}) say {tier}; nearest "
                      f"{self.labels[row_idx[0]]} at cosine {row_sims[0]:.3f}")
            found.append((tier, {t: scores[t] / total for t in TIER_VALUES}, reason))
        return found

    def _arrays(self):
        return {"memory": self.memory, "labels": self.labels}

    def _restore(self, arrays) -> None:
        self.memory, self.labels = arrays["memory"].astype(np.float32), arrays["labels"].astype(str)


class RewardRouter(LearnedRouter):
    """Cost-aware rewards per tier, regressed from the stored outcomes (MBA-RAG style).

    Soft target of tier t for a question: `correctness_t - lambda * steps_t`, where correctness is
    the stored F1 (`target="f1"`, default) or the stored correct flag (`target="correct"`) and
    steps are as stored with the outcome. One multi-output ridge regressor predicts the three
    targets from the embedding; the route is the argmax, exact ties to the cheaper tier.

    Lambda rule (with the ridge penalty alpha, on the validation split): the setting whose routes
    have the highest mean stored F1 on the validation questions among those whose mean steps stay
    within `step_budget` (None: no budget); F1 ties (within 1e-9) go to fewer mean steps, then to
    the larger lambda. When no setting meets the budget, the cheapest one is taken. Ridge is linear
    in its targets, so the regressor of `f1 - lambda * steps` equals the F1 regressor minus lambda
    times the steps regressor: one fit per alpha scores every lambda, and the final model is
    fitted on the soft targets themselves. Questions without every tier's outcome (most live
    labels) cannot give rewards and are left out (counted in the card).
    """

    kind = "reward"
    description = ("cost-aware reward regression (MBA-RAG style): per tier correctness - lambda * steps, "
                   "ridge on sentence embeddings, argmax reward")
    ALPHAS = (0.1, 1.0, 10.0, 100.0)
    LAMBDAS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5)

    def __init__(self, embedder: Embedder | None = None, val_share: float = DEFAULT_VAL_SHARE,
                 target: str = "f1", step_budget: float | None = None) -> None:
        super().__init__(embedder, val_share)
        if target not in ("f1", "correct"):
            raise ValueError(f"target is f1 or correct, not {target!r}")
        self.target, self.step_budget = target, step_budget

    @property
    def selection_rule(self) -> str:  # type: ignore[override]
        budget = "no step budget" if self.step_budget is None else f"mean steps <= {self.step_budget:g}"
        return ("alpha and lambda whose routes have the highest mean stored F1 on the validation questions "
                f"({budget}); F1 ties go to fewer mean steps, then the larger lambda; over budget everywhere: "
                "the cheapest setting")

    def _usable(self, example: LabelledQuery) -> bool:
        return example.has_rewards()

    def _targets(self, examples: Sequence[LabelledQuery]) -> tuple[np.ndarray, np.ndarray]:
        quality = np.array([[
            float(e.outcomes[t].f1 if self.target == "f1" and e.outcomes[t].f1 is not None
                  else bool(e.outcomes[t].correct)) for t in TIER_VALUES] for e in examples])
        steps = np.array([[float(e.outcomes[t].steps) for t in TIER_VALUES] for e in examples])
        return quality, steps

    def _select(self, x_fit, fit, x_val, val):
        from sklearn.linear_model import Ridge

        quality, steps = self._targets(fit)
        grid = []
        for alpha in self.ALPHAS:
            model = Ridge(alpha=alpha).fit(x_fit, np.hstack([quality, steps]))
            predicted = model.predict(x_val)
            p_quality, p_steps = predicted[:, :3], predicted[:, 3:]
            for lam in self.LAMBDAS:
                chosen = _cheapest_best(p_quality - lam * p_steps)
                tiers = [TIER_VALUES[i] for i in chosen]
                grid.append({"params": {"alpha": alpha, "lambda": lam, "target": self.target},
                             "validation": validation_report(val, tiers)})
        def steps_of(g: Mapping[str, Any]) -> float:
            return g["validation"]["routed"]["steps"]

        within = [g for g in grid if self.step_budget is None or steps_of(g) <= self.step_budget + TIE]
        if within:
            best = max(within, key=lambda g: (round(g["validation"]["routed"]["f1"], 9), -round(steps_of(g), 9),
                                              g["params"]["lambda"]))
        else:
            best = min(grid, key=steps_of)
        report = {**best["validation"], "step_budget": self.step_budget, "within_budget": bool(within)}
        return best["params"], report, grid

    def _fit_final(self, x, examples, params) -> None:
        from sklearn.linear_model import Ridge

        quality, steps = self._targets(examples)
        model = Ridge(alpha=params["alpha"]).fit(x, quality - params["lambda"] * steps)
        self.weights, self.bias = np.asarray(model.coef_, np.float64), np.asarray(model.intercept_, np.float64)

    def rewards(self, x: np.ndarray) -> np.ndarray:
        """Predicted soft rewards [n, 3] in A, B, C order."""
        return x.astype(np.float64) @ self.weights.T + self.bias

    def _decide(self, x):
        rewards = self.rewards(x)
        chosen = _cheapest_best(rewards)
        lam = self.params.get("lambda")
        return [
            (TIER_VALUES[i], None, "argmax reward " + ", ".join(f"{t} {r:.3f}" for t, r in zip(TIER_VALUES, row))
             + f" (correctness - {lam:g} x steps)")
            for i, row in zip(chosen, rewards)
        ]

    def _arrays(self):
        return {"weights": self.weights, "bias": self.bias}

    def _restore(self, arrays) -> None:
        self.weights, self.bias = arrays["weights"], arrays["bias"]
        self.target = self.params.get("target", "f1")


KINDS: dict[str, type[LearnedRouter]] = {r.kind: r for r in (LogisticRouter, KnnRouter, RewardRouter)}


def load_router(directory: Path, embedder: Embedder | None = None, threads: int = 1) -> LearnedRouter:
    """Whichever router `directory` holds (its card names the kind)."""
    return LearnedRouter.load(directory, embedder, threads)


def router_dirs(paths: Iterable[Path]) -> list[Path]:
    """Saved router directories among `paths`, each a router directory or a folder of them."""
    found: list[Path] = []
    for path in (Path(p) for p in paths):
        if (path / CARD_FILE).is_file():
            found.append(path)
        elif path.is_dir():
            found.extend(sorted(p for p in path.iterdir() if (p / CARD_FILE).is_file()))
    return list(dict.fromkeys(found))


# --- serving -------------------------------------------------------------------------------------


class AsyncRouter:
    """A learned router as the front door's router port: `await route(query)`, never raising.

    Routing runs on a small dedicated thread pool (ONNX Runtime releases the GIL), so a routing
    call never blocks the event loop and never waits behind blocking I/O in the default executor;
    `inline=True` runs it on the loop instead (no thread hop; for measurements). A failure routes
    with the rules, flagged as a fallback, like the Triton classifier's.
    """

    def __init__(self, router: LearnedRouter, inline: bool = False, threads: int = 2) -> None:
        self.router = router
        self.inline = inline
        self._pool = None if inline else ThreadPoolExecutor(threads, thread_name_prefix=f"router-{router.kind}")
        self.version: int | None = None  # learned routers are identified by `model_name`

    @property
    def model_name(self) -> str:
        return self.router.model_name

    async def route(self, query: str) -> RoutingDecision:
        try:
            if self._pool is None:
                return self.router.route(query)
            return await asyncio.get_running_loop().run_in_executor(self._pool, self.router.route, query)
        except Exception as exc:  # noqa: BLE001 - the port never raises: rules, flagged
            return fallback_decision(query, f"{self.router.model_name} failed: {exc}")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def open_router(kind: str, path: Path, threads: int = 1, inline: bool = False) -> AsyncRouter:
    """The saved router of `kind` ("lr", "knn", "reward") in `path`, ready for the front door
    (`threads`: ONNX Runtime intra-op threads of its encoder)."""
    if kind not in KINDS:
        raise ConfigurationError(f"unknown router kind {kind!r}; choose one of {', '.join(KINDS)}")
    return AsyncRouter(KINDS[kind].load(Path(path), threads=threads), inline=inline)


# --- the model card ------------------------------------------------------------------------------


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def model_card(card: Mapping[str, Any]) -> str:
    labels, validation = card.get("labels", {}), card.get("validation", {})
    encoder = card.get("encoder", {})
    base = (encoder.get("base") or {}).get("description") or (encoder.get("base") or {}).get("name", "-")
    split = card["validation_split"]
    lines = [
        f"# Learned router: {card['kind']}", "", card.get("description", ""), "",
        f"- artefact: `{card.get('artefact', {}).get('file')}` sha256 `{card.get('artefact', {}).get('sha256')}`",
        f"- encoder: {encoder.get('name', '-')} (ONNX sha256 `{encoder.get('identity')}`; base {base})",
        f"- hyper-parameters: {json.dumps(card.get('hyperparameters', {}))}",
        f"- selection: {card.get('selection')}",
        f"- validation split: {split['share']:.0%} of the `train` labels by {split['rule']}; never the `test` split",
        f"- refit: {card.get('refit')}", f"- fitted in {card.get('seconds')} s; {card.get('software')}",
        *([f"- data: {card['note']}"] if card.get("note") else []), "",
        "## Labels", "", "| slice | A | B | C |", "| --- | ---: | ---: | ---: |",
    ]
    for name in ("fitted_on", "fit_part", "validation", "extended"):
        if name in labels:
            c = labels[name]
            lines.append(f"| {name.replace('_', ' ')} | {c.get('A', 0)} | {c.get('B', 0)} | {c.get('C', 0)} |")
    left_out = (f"Left out (no outcome for every tier): {labels.get('excluded', 0)}; origins "
                f"{labels.get('origins')}; label sources {labels.get('sources')}.")
    lines += ["", left_out, "", "## Validation (the chosen setting)", ""]
    if validation.get("n"):
        recall = validation.get("recall", {})
        lines.append(f"accuracy {_pct(validation.get('accuracy'))} %, macro-F1 {_pct(validation.get('macro_f1'))} % "
                     f"(n = {validation['n']}); recall " + ", ".join(f"{t} {_pct(r)}" for t, r in recall.items()))
        if validation.get("routed"):
            lines += ["", "| on the validation questions | F1 | steps | n |", "| --- | ---: | ---: | ---: |"]
            for name, key in (("this router", "routed"), ("always B", "always_b"), ("the labels (cheapest correct tier)", "labels")):
                cell = validation.get(key)
                if cell:
                    lines.append(f"| {name} | {_pct(cell['f1'])} | {cell['steps']:.2f} | {cell['n']} |")
    lines += ["", "## References", "",
              "- SKR: Wang et al., 2023, Self-Knowledge Guided Retrieval Augmentation (kNN over labelled questions).",
              "- SR-RAG: Self-Routing RAG, 2025 (a policy datastore of past queries that grows with use).",
              f"- {MBA_RAG_REFERENCE}.",
              "- Adaptive-RAG: Jeong et al., NAACL 2024 (the labels: cheapest correct tier, else the dataset's bias).", ""]
    return "\n".join(lines)
