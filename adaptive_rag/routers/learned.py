"""Learned routers over sentence embeddings, beside the fine-tuned classifier.

Three routers from the literature the product is compared with, each fitted only on `train`
labels, with every hyper-parameter chosen on a hash validation split of them
(`adaptive_rag.training.learned_routers`, which fits them), then refitted on all of them:

- `LogisticRouter` ("lr"): multinomial logistic regression on sentence embeddings;
  C and the class weighting chosen by validation macro-F1 (the fine-tuned classifier's criterion).
- `KnnRouter` ("knn"): the tier most voted by the k nearest labelled past queries (cosine), as in
  SKR (Wang et al., 2023, "Self-Knowledge Guided Retrieval Augmentation"); k and the vote weighting
  chosen by validation macro-F1. The memory is simply the labelled queries, so it grows with live
  traffic: `fit` takes any labelled queries (benchmark or live) and `extend` adds newly relabelled
  ones without refitting, like the policy datastore of SR-RAG (Self-Routing RAG, 2025).
- `RewardRouter` ("reward"): MBA-RAG style cost-aware routing (Tang et al., COLING 2025). Per tier
  the soft target is correctness minus lambda * cost (the outcome's steps, or its recorded time as a
  share of C's where tiers take one step each but not the same time), from the stored outcomes of
  every tier; one multi-output ridge regressor predicts the three rewards; the route is the argmax
  (exact ties go to the cheaper tier). See `RewardRouter` for the lambda rule. MBA-RAG reports
  F1 48.61 at 1.80 steps against Adaptive-RAG's 46.94 at 2.17 with FLAN-T5-XL; those are the
  paper's figures, not ours. Unlike MBA-RAG's bandit, every train question here has all three
  tiers' outcomes, so the rewards are regressed with full information and nothing has to be
  explored.

Fitting needs scikit-learn (the `train` extras). Routing (this module) needs only numpy and the encoder
(`adaptive_rag.routers.embeddings.OnnxEmbedder`: ONNX Runtime + tokenizers): every fitted model is
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
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from adaptive_rag.contracts import TIER_VALUES, RoutingDecision, Tier
from adaptive_rag.errors import ConfigurationError
from adaptive_rag.pinned import file_sha256
from adaptive_rag.routers.embeddings import Embedder, OnnxEmbedder
from adaptive_rag.routing.policy import fallback_decision

CARD_FILE = "router.json"
ARRAYS_FILE = "router.npz"
MODEL_CARD = "MODEL_CARD.md"
FORMAT = 1
TIE = 1e-9
MBA_RAG_REFERENCE = (
    "MBA-RAG (Tang et al., COLING 2025) reports F1 48.61 at 1.80 steps against Adaptive-RAG's 46.94 "
    "at 2.17 with FLAN-T5-XL (the paper's figures, not measured here)"
)


def cheapest_best(scores: np.ndarray) -> np.ndarray:
    """Per row, the first (cheapest) column within `TIE` of the row's maximum."""
    return np.argmax(scores >= scores.max(axis=1, keepdims=True) - TIE, axis=1)


def unit(rows: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (cosine similarity is then a dot product)."""
    rows = np.asarray(rows, dtype=np.float32)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.maximum(norms, 1e-12)


# --- the routers ---------------------------------------------------------------------------------


class LearnedRouter(ABC):
    """Shared by the three routers: route, save and load (fitting: `adaptive_rag.training.learned_routers`)."""

    kind: ClassVar[str]
    description: ClassVar[str]

    def __init__(self, embedder: Embedder | None = None) -> None:
        self.embedder = embedder
        self.card: dict[str, Any] = {}
        self.params: dict[str, Any] = {}
        self.artefact_sha256 = ""

    # -- what each router defines
    @abstractmethod
    def _decide(self, x: np.ndarray) -> list[tuple[str, dict[str, float] | None, str]]:
        """Per embedding row: `(tier, probabilities or None, reason)`."""

    @abstractmethod
    def _arrays(self) -> dict[str, np.ndarray]: ...

    @abstractmethod
    def _restore(self, arrays: Mapping[str, np.ndarray]) -> None: ...

    # -- embedding
    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        if self.embedder is None:
            raise ConfigurationError(f"the {self.kind} router has no embedder")
        many = getattr(self.embedder, "embed_many", None)
        return many(texts) if many is not None else self.embedder.embed(texts)

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
            for tier, probabilities, reason in self._decide(unit(np.atleast_2d(embeddings)))
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
            tier = TIER_VALUES[int(cheapest_best(row[None, :])[0])]
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

    Soft target of tier t for a question: `correctness_t - lambda * cost_t`, where correctness is
    the stored F1 (`target="f1"`, default) or the stored correct flag (`target="correct"`) and
    the cost is the steps stored with the outcome or (`cost` "seconds") its recorded time as a
    share of the mean C time. One multi-output ridge regressor predicts the three
    targets from the embedding; the route is the argmax, exact ties to the cheaper tier.

    Lambda rule (with the ridge penalty alpha, on the validation split or out-of-fold): the setting
    whose routes have the highest mean stored F1 among those within the budget (mean steps, or time
    as a share of always C's; None: no budget); F1 ties (within 1e-9) go to the cheaper routes, then
    to the larger lambda. When no setting meets the budget, the cheapest one is taken. Ridge is
    linear in its targets, so the regressor of `f1 - lambda * cost` equals the F1 regressor minus
    lambda times the cost regressor: one fit per alpha scores every lambda, and the final model is
    fitted on the soft targets themselves. Questions without every tier's outcome (most live
    labels) cannot give rewards and are left out (counted in the card).
    """

    kind = "reward"
    description = ("cost-aware reward regression (MBA-RAG style): per tier correctness - lambda * cost (steps or time), "
                   "ridge on sentence embeddings, argmax reward")
    target = "f1"  # what correctness was when it was fitted (`f1` or `correct`), from its card

    def rewards(self, x: np.ndarray) -> np.ndarray:
        """Predicted soft rewards [n, 3] in A, B, C order."""
        return x.astype(np.float64) @ self.weights.T + self.bias

    def _decide(self, x):
        rewards = self.rewards(x)
        chosen = cheapest_best(rewards)
        lam = self.params.get("lambda")
        cost = "C-time share" if self.params.get("cost") == "seconds" else "steps"
        return [
            (TIER_VALUES[i], None, "argmax reward " + ", ".join(f"{t} {r:.3f}" for t, r in zip(TIER_VALUES, row))
             + f" (correctness - {lam:g} x {cost})")
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
