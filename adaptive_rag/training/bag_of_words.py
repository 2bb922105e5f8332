"""A linear bag-of-words router: the trained router a fresh clone ships and serves through Triton.

Why it exists: the fine-tuned MiniLM classifier needs torch to train and ~90 MB of ONNX to serve,
so a fresh clone cannot rebuild it in the demo's setup (no torch there) and git should not carry
it. This router is small enough to commit as text (`router.json`: a vocabulary and one weight row
per word) and is rebuilt from it without torch, deterministically, into a regular classifier
model version (ONNX graph + tokenizer), so the front door serves it through Triton exactly like
the MiniLM classifier (same inputs, same logits output, same policy).

The model: multinomial logistic regression (scikit-learn, fitting only) on the counts of the
question's words plus its length in words. Words come from a `tokenizers` pipeline (BERT
normalisation: lower case, accents stripped; split on whitespace and punctuation) over a
vocabulary of the words seen at least `min_count` times in the fitting labels; any other word
counts as `[UNK]`. Because the logits are a sum over words, the ONNX graph is a `Gather` of the
weight rows by token id, a masked sum, plus length x its weight and the bias: the front door's
classifier client tokenizes with the version's `tokenizer.json` and pads with `[PAD]` (masked out).

Hyper-parameters (C, class weighting) are chosen by validation macro-F1 on the one hash validation
split of `train` (`training.splits`); the validation part is never fitted on, so promotion
(`arag retrain`) compares a challenger with this router on labels neither has seen.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from adaptive_rag.contracts import CLASSIFIER_INPUTS, CLASSIFIER_MODEL, CLASSIFIER_OUTPUT, TIER_VALUES, TIERS
from adaptive_rag.errors import ConfigurationError
from adaptive_rag.training.learned_routers import (
    DEFAULT_VAL_SHARE, LabelledQuery, label_counts, validation_report, validation_split,
)

if TYPE_CHECKING:
    from adaptive_rag.routing.policy import PolicyThresholds

KIND = "bag-of-words"
FORMAT = 1
UNK, PAD = "[UNK]", "[PAD]"
MAX_LENGTH = 64  # words; questions are short, and the client truncates at the version's max_length
LENGTH_SCALE = 16.0  # the length feature is words / 16, so its weight is on the scale of a word's
MISSING_CLASS_LOGIT = -30.0  # a tier absent from the labels is never chosen
C_GRID = (0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
WEIGHTS = (None, "balanced")
PARITY_TOLERANCE = 1e-4
PARITY_TEXTS = ("hi there!", "Who wrote the novel Dune?",
                "Which film came out first, Blind Shaft or The Mask Of Fu Manchu, and who directed each?")


def _tokenizer(vocabulary: Sequence[str]):
    """The word tokenizer over `[UNK]`, `[PAD]` and `vocabulary` (ids in that order)."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import WordLevel

    ids = {token: index for index, token in enumerate([UNK, PAD, *vocabulary])}
    tokenizer = Tokenizer(WordLevel(ids, unk_token=UNK))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True, clean_text=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return tokenizer


def words(texts: Iterable[str]) -> list[list[str]]:
    """Each text's words as the tokenizer sees them (normalised, split), before the vocabulary."""
    tokenizer = _tokenizer([])
    return [[w for w, _ in tokenizer.pre_tokenizer.pre_tokenize_str(tokenizer.normalizer.normalize_str(t))]
            for t in texts]


def fit_vocabulary(texts: Iterable[str], min_count: int = 2) -> list[str]:
    """Words seen at least `min_count` times, most frequent first (ties alphabetical): stable."""
    counts = Counter(w for row in words(texts) for w in row)
    return sorted((w for w, n in counts.items() if n >= min_count and w not in (UNK, PAD)),
                  key=lambda w: (-counts[w], w))


def _counted(tokenizer, texts: Sequence[str], max_length: int) -> list[tuple[Counter, int]]:
    """Per text: the count of each token id among its first `max_length` words, and how many."""
    found = []
    for encoding in tokenizer.encode_batch(list(texts)):
        ids = encoding.ids[:max_length]
        found.append((Counter(ids), len(ids)))
    return found


def features(tokenizer, texts: Sequence[str], max_length: int = MAX_LENGTH) -> np.ndarray:
    """Dense [n, vocabulary + 2]: the count of every token id (column = id), then the length in
    words / LENGTH_SCALE; what the served graph computes from ids and mask (numpy only)."""
    size = tokenizer.get_vocab_size()
    rows = np.zeros((len(texts), size + 1), dtype=np.float32)
    for row, (counts, length) in zip(rows, _counted(tokenizer, texts, max_length)):
        row[list(counts)] = list(counts.values())
        row[size] = length / LENGTH_SCALE
    return rows


def sparse_features(tokenizer, texts: Sequence[str], max_length: int = MAX_LENGTH):
    """`features` as a scipy CSR matrix, for fitting on thousands of questions (needs scipy)."""
    from scipy.sparse import csr_matrix

    size = tokenizer.get_vocab_size()
    data, columns, pointers = [], [], [0]
    for counts, length in _counted(tokenizer, texts, max_length):
        columns += [*counts, size]
        data += [*map(float, counts.values()), length / LENGTH_SCALE]
        pointers.append(len(columns))
    return csr_matrix((np.array(data), np.array(columns, dtype=np.int64), np.array(pointers)),
                      shape=(len(texts), size + 1))


@dataclass
class BagOfWordsRouter:
    """Fitted weights: `token_weights[id]` (3 logits per token id), `length_weight`, `bias`."""

    vocabulary: list[str]
    token_weights: np.ndarray  # [vocabulary + 2, 3] in A, B, C order; [PAD]'s row is 0
    length_weight: np.ndarray  # [3], per word (already divided by LENGTH_SCALE)
    bias: np.ndarray  # [3]
    max_length: int = MAX_LENGTH
    card: dict[str, Any] = field(default_factory=dict)

    @property
    def tokenizer(self):
        return _tokenizer(self.vocabulary)

    def logits(self, texts: Sequence[str]) -> np.ndarray:
        """[n, 3] exactly as the ONNX graph computes them (float32 weights)."""
        x = features(self.tokenizer, texts, self.max_length)
        weights = np.vstack([self.token_weights.astype(np.float32),
                             (self.length_weight * LENGTH_SCALE).astype(np.float32)[None, :]])
        return (x @ weights + self.bias.astype(np.float32)).astype(np.float32)

    def probabilities(self, texts: Sequence[str]) -> np.ndarray:
        """[n, 3] softmax of `logits`, as the classifier client turns the served logits into them."""
        logits = self.logits(texts).astype(np.float64)
        exps = np.exp(logits - logits.max(axis=1, keepdims=True))
        return exps / exps.sum(axis=1, keepdims=True)

    def route_many(self, texts: Sequence[str]) -> list[str]:
        """The argmax tier per text (exact ties to the cheaper tier)."""
        logits = self.logits(texts)
        return [TIER_VALUES[int(np.argmax(row >= row.max() - 1e-9))] for row in logits]

    # -- the committed artefact: plain JSON, rounded so it diffs and hashes the same everywhere
    def to_json(self) -> str:
        return json.dumps({
            "kind": KIND, "format": FORMAT, "max_length": self.max_length, "labels": list(TIER_VALUES),
            "vocabulary": self.vocabulary,
            "token_weights": [[round(float(v), 6) for v in row] for row in self.token_weights],
            "length_weight": [round(float(v), 6) for v in self.length_weight],
            "bias": [round(float(v), 6) for v in self.bias],
            "card": self.card,
        }, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> BagOfWordsRouter:
        data = json.loads(text)
        if data.get("kind") != KIND or data.get("format") != FORMAT:
            raise ConfigurationError(f"not a {KIND} router (format {FORMAT}): kind {data.get('kind')!r}, "
                                     f"format {data.get('format')!r}")
        router = cls(list(data["vocabulary"]), np.asarray(data["token_weights"], np.float64),
                     np.asarray(data["length_weight"], np.float64), np.asarray(data["bias"], np.float64),
                     int(data["max_length"]), dict(data.get("card", {})))
        if router.token_weights.shape != (len(router.vocabulary) + 2, len(TIER_VALUES)):
            raise ConfigurationError(f"token_weights has shape {router.token_weights.shape}, expected "
                                     f"({len(router.vocabulary) + 2}, {len(TIER_VALUES)})")
        return router

    def save(self, path: Path) -> str:
        """Write `router.json`; returns its sha256."""
        text = self.to_json()
        Path(path).write_text(text, encoding="utf-8")
        return hashlib.sha256(text.encode()).hexdigest()

    @classmethod
    def load(cls, path: Path) -> BagOfWordsRouter:
        return cls.from_json(Path(path).read_text(encoding="utf-8"))


def _fit_logistic(x: np.ndarray, labels: Sequence[str], c: float, class_weight: str | None,
                  vocabulary_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(token_weights, length_weight, bias)` of one logistic regression, in A, B, C order."""
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(C=c, class_weight=class_weight, max_iter=5000).fit(x, list(labels))
    classes = [str(k) for k in model.classes_]
    coef, intercept = np.asarray(model.coef_), np.asarray(model.intercept_)
    if len(classes) == 2:  # one row for two classes: P(second) = sigmoid(row)
        coef, intercept = np.vstack([np.zeros_like(coef), coef]), np.concatenate([[0.0], intercept])
    weights = np.zeros((x.shape[1], len(TIER_VALUES)))
    bias = np.full(len(TIER_VALUES), MISSING_CLASS_LOGIT)
    for row, tier in enumerate(classes):
        column = TIER_VALUES.index(tier)
        weights[:, column], bias[column] = coef[row], intercept[row]
    return weights[:vocabulary_size], weights[vocabulary_size] / LENGTH_SCALE, bias


def fit_fixed(examples: Sequence[LabelledQuery], c: float, class_weight: str | None,
              min_count: int = 2) -> BagOfWordsRouter:
    """The router fitted on `examples` with given hyper-parameters (vocabulary included)."""
    vocabulary = fit_vocabulary([e.question for e in examples], min_count)
    tokenizer = _tokenizer(vocabulary)
    x = sparse_features(tokenizer, [e.question for e in examples])
    token_weights, length_weight, bias = _fit_logistic(
        x, [e.label.value for e in examples], c, class_weight, tokenizer.get_vocab_size())
    token_weights[1] = 0.0  # [PAD] never counts
    return BagOfWordsRouter(vocabulary, token_weights, length_weight, bias)


def fit(examples: Sequence[LabelledQuery], min_count: int = 2, note: str = "",
        validation_share: float = DEFAULT_VAL_SHARE, refit: bool = False) -> BagOfWordsRouter:
    """Choose C and class weighting on the hash validation split; the router returned is the one
    fitted (vocabulary and weights) on the fitting part only, or with `refit` on every example.

    Retraining passes only promotion's `fit` part, a larger `validation_share` (the selection slice
    is then a further hash band of `fit`, so choosing never looks at the labels promotion judges
    on) and `refit` (the chosen settings fitted on all of `fit`, as much data as the champion had)."""
    if len({e.label for e in examples}) < 2:
        raise ConfigurationError(f"the {KIND} router needs labels of at least two tiers ({len(examples)} given)")
    fit_idx, val_idx = validation_split(examples, validation_share)
    fit_part, val_part = [examples[i] for i in fit_idx], [examples[i] for i in val_idx]
    if not val_part or len({e.label for e in fit_part}) < 2:
        raise ConfigurationError(f"the validation split left {len(fit_part)} fitting and {len(val_part)} "
                                 "validation labels: too few to choose hyper-parameters")

    def trained(part: Sequence[LabelledQuery], c: float, weight: str | None) -> BagOfWordsRouter:
        return fit_fixed(part, c, weight, min_count)

    grid = []
    for c in C_GRID:
        for weight in WEIGHTS:
            candidate = trained(fit_part, c, weight)
            report = validation_report(val_part, candidate.route_many([e.question for e in val_part]))
            grid.append({"params": {"C": c, "class_weight": weight}, "validation": report})
    best = max(grid, key=lambda g: (round(g["validation"]["macro_f1"], 9), round(g["validation"]["accuracy"], 9),
                                    -g["params"]["C"]))
    # The validation part stays held out, as `arag train` keeps it: promotion judges a challenger
    # against this router on exactly those labels, which a refit on them would have seen.
    router = trained(list(examples) if refit else fit_part, best["params"]["C"], best["params"]["class_weight"])
    router.card = {
        "note": note, "min_count": min_count, "vocabulary_size": len(router.vocabulary),
        "labels": {"all": label_counts(examples), "fit_part": label_counts(fit_part),
                   "validation": label_counts(val_part),
                   "sources": dict(sorted(Counter(e.source for e in examples).items()))},
        "validation_split": "sha256 of the normalised question (training.splits.validation_part)"
                            + (f", share {validation_share:g}" if validation_share != DEFAULT_VAL_SHARE else ""),
        "hyperparameters": best["params"],
        "selection": "C and class weighting with the highest validation macro-F1; ties: accuracy, then smaller C",
        "validation": best["validation"],
        "refit": ("on every given example (the selection slice included) with the chosen settings" if refit else
                  "none: the router is the one fitted on the fitting part (validation held out for promotion)"),
    }  # no clock time in it: the same labels give the same bytes
    return router


def model_card(router_path: Path) -> str:
    """`MODEL_CARD.md` for a committed router: what it is, what it learned from, how it was chosen,
    and its `test` figures when `evaluation.json` lies beside it (`arag model ship --test-report`)."""
    from adaptive_rag.pinned import file_sha256
    from adaptive_rag.training.time_price import TimeBudget

    router = BagOfWordsRouter.load(router_path)
    card, labels = router.card, router.card.get("labels", {})
    v = card.get("validation", {})

    def tiers(counts: Mapping[str, int]) -> str:
        return " / ".join(str(counts.get(t, 0)) for t in TIER_VALUES)

    lines = [
        f"# The shipped router: {KIND}", "",
        "Multinomial logistic regression on a question's word counts and its length in words "
        "(`adaptive_rag/training/bag_of_words.py`), published as a classifier version by `arag model ship` "
        "(an ONNX graph + a word tokenizer built from `router.json`, no torch).", "",
        f"- `router.json` sha256 `{file_sha256(router_path)}`; {len(router.vocabulary)} words "
        f"(seen at least {card.get('min_count')} times), max {router.max_length} words per question",
        f"- labels: {card.get('note', '')}",
        f"- labels A / B / C: all {tiers(labels.get('all', {}))}; fitted on (the fitting part) "
        f"{tiers(labels.get('fit_part', {}))}; validation {tiers(labels.get('validation', {}))}",
        f"- chosen: {card.get('hyperparameters')} ({card.get('selection')}); {card.get('refit')}",
        f"- validation ({card.get('validation_split')}): accuracy {v.get('accuracy', 0):.1%}, macro-F1 "
        f"{v.get('macro_f1', 0):.1%} on {v.get('n', 0)} labels",
    ]
    priced = card.get("time_budget")
    if priced:
        oof = priced["out_of_fold"]
        lines.append(
            f"- time budget: served with a price on time of {priced['price']:g} (tier costs A/B/C "
            f"{' / '.join(f'{c:.2f}' for c in priced['tier_costs'])} of C's time) to stay within "
            f"{TimeBudget(priced['budget'], priced.get('confidence')).describe()}; out of fold on {oof['n']} "
            f"`train` labels: F1 {100 * oof['f1']:.1f} (always B {100 * oof['always_b_f1']:.1f}) at "
            f"{oof['time_share_of_c']:.0%} of always C's time"
            + ("" if "time_share_upper" not in oof else f" (upper bound {oof['time_share_upper']:.0%})")
            + ("" if priced["within_budget"] else " (no price met the budget: the cheapest)"))
    evaluation_path = Path(router_path).parent / "evaluation.json"
    measured = json.loads(evaluation_path.read_text(encoding="utf-8"))["test_labels"] \
        if evaluation_path.is_file() else None
    if measured is not None and measured.get("router_sha256") != file_sha256(router_path):
        # Figures of another router's bytes (the router was refitted since): never shown as this one's.
        lines.append("- `test` labels: not measured for this router yet (`arag model ship --test-report`)")
    elif measured is not None:
        t = measured
        lo, hi = t["interval_95"]
        rlo, rhi = t["dataset_rule_interval_95"]
        lines += [
            f"- `test` labels ({t['label']}; reader {t['reader']}, {t['n']} questions, {t['date']}): "
            f"accuracy **{t['accuracy']:.1%}** [{lo:.1%}, {hi:.1%}]; the dataset-identity rule on the same "
            f"questions {t['dataset_rule_accuracy']:.1%} [{rlo:.1%}, {rhi:.1%}] (bootstrap 95 % intervals). "
            f"From `{t['command']}`.",
        ]
        if t["accuracy"] <= t["dataset_rule_accuracy"]:
            lines.append("- It does **not** beat the dataset-identity rule on the `test` labels. The rule needs to "
                         "know which benchmark a question came from, which live traffic never says; this "
                         "router reads only the question.")
    lines += ["", "Refit: `arag routers fit-words --labels-file models/router/labels.jsonl` (same bytes from "
              "the same labels and benchmark data); test figures: `arag model ship --test-report "
              "<eval dir>/report.json`.", ""]
    return "\n".join(lines)


# --- serving: the router as a classifier model version (ONNX + tokenizer), built without torch ----


def served_thresholds(router: BagOfWordsRouter | None = None) -> PolicyThresholds:
    """The policy a published bag-of-words version runs with: its own argmax (its hyper-parameters
    were chosen on validation; no threshold is layered on top), with the price on time its card
    holds when it was fitted for a time budget (`fit_time_price`)."""
    from adaptive_rag.routing.policy import PolicyThresholds
    from adaptive_rag.training.time_price import priced_thresholds

    argmax = PolicyThresholds(c_threshold=None, a_threshold=None,
                              note=f"argmax: the {KIND} router's own decision (chosen on validation)")
    priced = router.card.get("time_budget") if router is not None else None
    return argmax if not priced else priced_thresholds(argmax, priced)


def fit_time_price(router: BagOfWordsRouter, examples: Sequence[LabelledQuery], budget: float,
                   on_fold: Callable[[], None] | None = None, confidence: float | None = None) -> dict[str, Any]:
    """Choose the price on time that holds `budget` (a share of always C's time; with `confidence`,
    on the upper end of its bootstrap interval) out of fold (`training.time_price`): each fold's
    router is fitted as `router` was (its hyper-parameters, every other label). Stores the choice
    in the router's card and returns it."""
    from adaptive_rag.training.time_price import choose_time_price

    params = router.card.get("hyperparameters") or {}
    if "C" not in params:
        raise ConfigurationError("the router's card names no hyper-parameters: fit it with `fit` first")

    def fitted(part: Sequence[LabelledQuery]) -> Callable[[Sequence[str]], np.ndarray]:
        fold_router = fit_fixed(part, params["C"], params.get("class_weight"), router.card.get("min_count", 2))
        if on_fold is not None:
            on_fold()
        return fold_router.probabilities

    choice = choose_time_price(examples, budget, fitted, confidence=confidence)
    router.card = {**router.card, "time_budget": choice.card()}
    return router.card["time_budget"]


def onnx_model(router: BagOfWordsRouter):
    """The graph: logits = sum over real tokens of token_weights[id] + words x length_weight + bias."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    input_ids, attention_mask = CLASSIFIER_INPUTS
    nodes = [
        helper.make_node("Gather", ["token_weights", input_ids], ["per_token"], axis=0),  # [b, s, 3]
        helper.make_node("Cast", [attention_mask], ["mask"], to=TensorProto.FLOAT),  # [b, s]
        helper.make_node("Unsqueeze", ["mask", "last_axis"], ["mask3"]),  # [b, s, 1]
        helper.make_node("Mul", ["per_token", "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "seq_axis"], ["summed"], keepdims=0),  # [b, 3]
        helper.make_node("ReduceSum", ["mask", "seq_axis"], ["length"], keepdims=1),  # [b, 1]
        helper.make_node("Mul", ["length", "length_weight"], ["by_length"]),  # [b, 3]
        helper.make_node("Add", ["summed", "by_length"], ["partial"]),
        helper.make_node("Add", ["partial", "bias"], [CLASSIFIER_OUTPUT]),
    ]
    initializers = [
        numpy_helper.from_array(router.token_weights.astype(np.float32), "token_weights"),
        numpy_helper.from_array(router.length_weight.astype(np.float32)[None, :], "length_weight"),
        numpy_helper.from_array(router.bias.astype(np.float32)[None, :], "bias"),
        numpy_helper.from_array(np.array([2], np.int64), "last_axis"),
        numpy_helper.from_array(np.array([1], np.int64), "seq_axis"),
    ]
    graph = helper.make_graph(
        nodes, "bag_of_words_router",
        [helper.make_tensor_value_info(input_ids, TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info(attention_mask, TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info(CLASSIFIER_OUTPUT, TensorProto.FLOAT, ["batch", len(TIERS)])],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="adaptive-rag")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def onnx_parity(router: BagOfWordsRouter, onnx_path: Path, tokenizer_path: Path,
                texts: Sequence[str] = PARITY_TEXTS) -> float:
    """Max |logit difference| between ONNX Runtime (tokenized as the front door does) and numpy."""
    import onnxruntime as ort

    from adaptive_rag.routing.classifier_client import QueryTokenizer

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    ids, mask = QueryTokenizer(tokenizer_path, router.max_length)(list(texts))
    served = session.run([CLASSIFIER_OUTPUT], dict(zip(CLASSIFIER_INPUTS, (ids, mask))))[0]
    return float(np.abs(served - router.logits(texts)).max())


@dataclass(frozen=True)
class Published:
    version: int
    path: Path
    cached: bool  # an existing version already holds this router.json


def publish(router_path: Path, repository: Path, model_name: str = CLASSIFIER_MODEL,
            extra_info: Mapping[str, Any] | None = None) -> Published:
    """Make `router_path` a classifier model version in `repository`, unless a version built from
    the same bytes (sha256) is there already: then only its descriptive `extra_info` is refreshed
    (a second setup is instant).

    Written into a staging directory, checked (ONNX checker, ONNX Runtime vs numpy parity), then
    renamed into place, so a half-built version is never visible to Triton.
    """
    from adaptive_rag.pinned import file_sha256
    from adaptive_rag.routing.model_repository import config_pbtxt, next_version, versions, write_config
    from adaptive_rag.routing.policy import PolicyThresholds

    source_sha = file_sha256(Path(router_path))
    model_dir = Path(repository) / model_name
    for version in versions(model_dir):
        info_path = model_dir / str(version) / "classifier.json"
        info = json.loads(info_path.read_text(encoding="utf-8")) if info_path.is_file() else {}
        if info.get("source", {}).get("sha256") == source_sha:
            if extra_info and any(info.get(k) != v for k, v in extra_info.items()):
                # descriptive fields only (the figures measured since): the graph is untouched
                info_path.write_text(json.dumps({**info, **extra_info}, indent=2) + "\n", encoding="utf-8")
            return Published(version, model_dir / str(version), cached=True)
    router = BagOfWordsRouter.load(router_path)
    version = next_version(model_dir)
    staging = model_dir / f".staging-{version}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    import onnx

    onnx.save(onnx_model(router), str(staging / "model.onnx"))
    router.tokenizer.save(str(staging / "tokenizer.json"))
    diff = onnx_parity(router, staging / "model.onnx", staging / "tokenizer.json")
    if diff > PARITY_TOLERANCE:
        shutil.rmtree(staging, ignore_errors=True)
        raise ConfigurationError(f"{router_path}: ONNX parity failed (max |diff| {diff:.2e} > {PARITY_TOLERANCE:g})")
    info = {
        "labels": list(TIER_VALUES), "max_length": router.max_length, "kind": KIND, "version": version,
        "source": {"file": str(Path(router_path)), "sha256": source_sha},
        "model_sha256": file_sha256(staging / "model.onnx"), "onnx_parity_max_abs_diff": diff,
        "exported": time.strftime("%Y-%m-%dT%H:%M:%S"), **(extra_info or {}),
    }
    (staging / "classifier.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    served_thresholds(router).save(staging)
    staging.rename(model_dir / str(version))
    write_config(model_dir, config_pbtxt(model_name))
    return Published(version, model_dir / str(version), cached=False)
