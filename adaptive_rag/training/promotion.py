"""Champion / challenger: a trained run becomes the served version only when it loads, answers
and beats the served version on the validation split.

- Labels: the `validation` part of `train` (`adaptive_rag.training.splits`), never `test`, so the
  final yardstick stays out of model selection. The challenger must not have learnt from them
  (`arag retrain` trains on `fit` only).
- Both models are scored the same way: the exported ONNX graph in-process (`LocalOnnxClassifier`),
  argmax accuracy, macro-F1 and per-class recall. A challenger that does not load or gives
  non-finite probabilities is `failed` before anything is published.
- Publishing: the version is copied in under a staging name and renamed into place (keeping every
  older version), then `switch_served` loads it on Triton (EXPLICIT model control, when Triton
  URLs are given) and moves `served.json` only once it answers; the previous version stays loaded
  meanwhile, so no front door sees a gap. A Triton refusal leaves the old version served (`failed`).
- A tenant's own traffic is checked on its own: live validation labels are a few dozen beside the
  benchmark's hundreds, so a challenger slightly better on Wikipedia QA would win the overall
  score whatever it did to a support tenant, and one that learnt the tenant could never move it.
  Every tenant with at least `MIN_TENANT_LABELS` validation labels must be routed at least as
  accurately by the challenger as by the champion, or the challenger is refused. A challenger
  that routes some tenant better wins even when the overall score drops, by at most
  `max_overall_drop` (default `MAX_OVERALL_DROP`, 1 point: the most a tenant's gain may cost the
  benchmark questions) - but only a gain that is no accident of a few labels counts: on the
  labels where the two disagree, the challenger must be right often enough that an exact
  one-sided sign test (McNemar) gives p <= `TENANT_GAIN_ALPHA`. (One label more out of 14 once
  promoted a challenger that routed the tenant's test queries 3 points worse.)
- Every verdict (promoted, refused, failed), both scores, the per-tenant scores and the validation
  labels per tier are recorded in `model_promotions` when a `PromotionStore` is given.

Exporting a run needs the `train` extras (PyTorch); `promote_candidate` (an exported version
directory) and the scoring need only ONNX Runtime and the metrics.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adaptive_rag.contracts import CLASSIFIER_MODEL, TIERS
from adaptive_rag.errors import short_error
from adaptive_rag.routing.model_repository import (
    CONFIG_FILE, ModelVersion, ServingSwitchError, config_pbtxt, next_version, open_version,
    pin_served, served_version, switch_served, version_at,
)
from adaptive_rag.training.splits import tier_counts

if TYPE_CHECKING:
    from adaptive_rag.storage.promotions import PromotionStore

METRICS = ("macro_f1", "accuracy")
# Validation labels a class needs before its F1 counts toward the macro-F1 promotion compares: a
# class seen once moves macro-F1 by a third on one question (one tier-A validation label scored a
# champion 62.5 against a challenger's 96.3; over B and C alone they were 93.8 and 94.4).
MIN_CLASS_SUPPORT = 10
# Validation labels of one tenant's live traffic before its own accuracy can refuse a challenger.
MIN_TENANT_LABELS = 5
# The overall validation score (metric, 0-1) a challenger may give up for a tenant it routes better.
MAX_OVERALL_DROP = 0.01
# A tenant's gain counts when the sign test on the labels the two routers disagree on gives at most
# this p (4 of 4, 6 of 7 disagreements won; 1 of 1 or 4 of 5 is no evidence).
TENANT_GAIN_ALPHA = 0.1


@dataclass
class Verdict:
    """What a promotion decided. `verdict`: promoted | refused | failed; `version`: the number the
    challenger was published as (None when refused, or failed before publishing)."""

    promoted: bool
    challenger: dict | None
    champion: dict | None
    version: int | None
    reason: str
    verdict: str = "refused"
    metric: str = "macro_f1"
    champion_version: int | None = None
    served_version: int | None = None
    validation_counts: dict[str, int] = field(default_factory=dict)
    record_id: int | None = None
    # per tenant with live validation labels: labels, champion and challenger accuracy, checked
    tenants: dict[str, dict[str, Any]] = field(default_factory=dict)


def predict_version(version: ModelVersion, texts: Sequence[str]) -> list[str]:
    """The tier an exported version gives each text (argmax).

    Loading the graph and running it is the check that the version works at all: any exception
    (or a non-finite probability) means it must not be served."""
    import numpy as np

    from adaptive_rag.routers.local_classifier import LocalOnnxClassifier

    model = LocalOnnxClassifier(version)
    order = [t.value for t in TIERS]  # the classifier's output order
    predicted: list[str] = []
    for start in range(0, len(texts), 64):
        probabilities = model.probabilities(list(texts[start:start + 64]))
        if probabilities.shape[1:] != (len(TIERS),) or not np.isfinite(probabilities).all():
            raise ValueError(f"version {version.version} gives unusable probabilities "
                             f"(shape {probabilities.shape}, finite {bool(np.isfinite(probabilities).all())})")
        predicted.extend(order[i] for i in probabilities.argmax(axis=1).tolist())
    return predicted


def score_predictions(predicted: Sequence[str], labels: Sequence[str],
                      groups: Sequence[str | None] = ()) -> dict:
    """Accuracy, macro-F1 (`with_supported_macro_f1`) and per-class recall of predicted tiers;
    with `groups` (a tenant or None per label) also `tenants`: accuracy on each tenant's labels."""
    from adaptive_rag.training.classification import classification_metrics

    order = [t.value for t in TIERS]
    metrics = with_supported_macro_f1(classification_metrics(
        [order.index(label) for label in labels], [order.index(p) for p in predicted]))
    by_tenant: dict[str, list[bool]] = {}
    for tenant, guess, label in zip(groups, predicted, labels):
        if tenant is not None:
            by_tenant.setdefault(tenant, []).append(guess == label)
    metrics["tenants"] = {t: {"labels": len(hits), "accuracy": sum(hits) / len(hits), "hits": hits}
                          for t, hits in sorted(by_tenant.items())}
    return metrics


def sign_test(wins: int, losses: int) -> float:
    """One-sided exact p of at least `wins` successes in `wins + losses` fair coin flips (McNemar's
    exact test on the discordant pairs); 1.0 when there are none."""
    n = wins + losses
    if n == 0:
        return 1.0
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / 2 ** n


def score_version(version: ModelVersion, texts: Sequence[str], labels: Sequence[str],
                  groups: Sequence[str | None] = ()) -> dict:
    """`score_predictions` of an exported version on labelled texts (raises when it does not run)."""
    return score_predictions(predict_version(version, texts), labels, groups)


def tenant_check(challenger: dict, champion: dict, min_labels: int = MIN_TENANT_LABELS) -> dict[str, dict[str, Any]]:
    """Per tenant: its validation labels, both accuracies, whether it is `checked` (enough labels),
    whether the challenger is `worse` there (any drop), and whether it is `better` (more right,
    and the sign test on the labels the two disagree on gives p <= `TENANT_GAIN_ALPHA`)."""
    out: dict[str, dict[str, Any]] = {}
    for tenant, mine in challenger.get("tenants", {}).items():
        theirs = champion.get("tenants", {}).get(tenant, {})
        checked = mine["labels"] >= min_labels and "accuracy" in theirs
        pairs = list(zip(mine.get("hits", ()), theirs.get("hits", ())))
        wins = sum(c and not h for c, h in pairs)
        losses = sum(h and not c for c, h in pairs)
        p = sign_test(wins, losses) if pairs else (0.0 if mine["accuracy"] > theirs.get("accuracy", 1.0) else 1.0)
        out[tenant] = {"labels": mine["labels"], "challenger": mine["accuracy"],
                       "champion": theirs.get("accuracy"), "checked": checked,
                       "wins": wins, "losses": losses, "p": round(p, 4),
                       "worse": checked and mine["accuracy"] < theirs["accuracy"],
                       "better": checked and mine["accuracy"] > theirs["accuracy"] and p <= TENANT_GAIN_ALPHA}
    return out


def decide(challenger: dict, champion: dict, tenants: dict[str, dict[str, Any]], metric: str,
           min_gain: float = 0.0, max_overall_drop: float = MAX_OVERALL_DROP) -> tuple[bool, str]:
    """`(promote, why)`: never while a checked tenant is routed worse; yes when better overall by
    more than `min_gain`, or better for a checked tenant at an overall cost of at most
    `max_overall_drop`."""
    mine, theirs = challenger[metric], champion[metric]
    worse = [f"{t} {c['challenger']:.1%} < {c['champion']:.1%} on {c['labels']} labels"
             for t, c in tenants.items() if c["worse"]]
    better = [f"{t} {c['challenger']:.1%} > {c['champion']:.1%} on {c['labels']} labels"
              + (f" (won {c['wins']} of {c['wins'] + c['losses']} disagreements, p {c['p']:.3f})" if "wins" in c else "")
              for t, c in tenants.items() if c.get("better")]
    unproven = [f"{t} {c['challenger']:.1%} > {c['champion']:.1%} on {c['labels']} labels but won only "
                f"{c['wins']} of {c['wins'] + c['losses']} disagreements (p {c['p']:.3f} > {TENANT_GAIN_ALPHA:g})"
                for t, c in tenants.items() if c.get("checked") and not c.get("better") and not c["worse"]
                and c["challenger"] > (c["champion"] or 0.0) and "wins" in c]
    overall = f"{metric} {mine:.4f} vs {theirs:.4f}"
    if worse:
        return False, f"routes a tenant's own traffic worse: {'; '.join(worse)} ({overall})"
    if mine > theirs + min_gain:
        return True, f"better overall: {overall} (+ {min_gain:g} needed)"
    if better and mine >= theirs - max_overall_drop:
        return True, (f"routes a tenant's own traffic better: {'; '.join(better)}, at {overall} overall "
                      f"(a drop of at most {max_overall_drop:g} allowed)")
    if better:
        return False, (f"better for a tenant ({'; '.join(better)}) but {overall} overall drops by more "
                       f"than {max_overall_drop:g}")
    if unproven:
        return False, f"does not beat the champion: {overall} (+ {min_gain:g} needed); a tenant's gain is no evidence: {'; '.join(unproven)}"
    return False, f"does not beat the champion: {overall} (+ {min_gain:g} needed), no tenant routed better"


def with_supported_macro_f1(metrics: dict, min_support: int = MIN_CLASS_SUPPORT) -> dict:
    """`macro_f1` over the classes with at least `min_support` labels (every class present when
    none has that many); the plain mean over all present classes stays as `macro_f1_all`."""
    present = {label: c for label, c in metrics["per_class"].items() if c["support"]}
    counted = {label: c for label, c in present.items() if c["support"] >= min_support} or present
    f1s = [c["f1"] for c in counted.values()]
    return {**metrics, "macro_f1_all": metrics["macro_f1"],
            "macro_f1": sum(f1s) / len(f1s) if f1s else float("nan"),
            "macro_f1_classes": sorted(counted)}


def _plain(value: Any) -> Any:
    """Metrics as JSON any database takes (JSONB has no NaN)."""
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def promote(
    run_dir: Path,
    repository: Path,
    texts: list[str],
    labels: list[str],
    model_name: str = CLASSIFIER_MODEL,
    metric: str = "macro_f1",
    min_gain: float = 0.0,
    int8: bool = False,
    **options: Any,
) -> Verdict:
    """Export training run `run_dir` and promote it (`promote_candidate`, same options).

    An export that fails is a `failed` verdict (recorded), not an exception."""
    from adaptive_rag.training.export import export_run

    if not texts:
        raise ValueError("no validation labels to compare on")
    options.setdefault("challenger_run", str(run_dir))
    with tempfile.TemporaryDirectory() as tmp:
        try:
            candidate = export_run(Path(run_dir), Path(tmp), model_name, int8=int8)
        except Exception as exc:  # noqa: BLE001 - recorded as the challenger's failure
            return _failed(Path(repository) / model_name, metric, tier_counts(labels),
                           f"challenger export failed: {short_error(exc, 400, with_type=True)}", None, None, None, options)
        return promote_candidate(candidate.version_dir, repository, texts, labels, model_name,
                                 metric, min_gain, **options)


def promote_candidate(
    candidate_dir: Path,
    repository: Path,
    texts: Sequence[str],
    labels: Sequence[str],
    model_name: str = CLASSIFIER_MODEL,
    metric: str = "macro_f1",
    min_gain: float = 0.0,
    *,
    triton_urls: Sequence[str] = (),
    store: PromotionStore | None = None,
    action: str = "promote",
    challenger_run: str | None = None,
    prepare: Callable[[Path], None] | None = None,
    new_labels: int | None = None,
    label_watermark: int | None = None,
    details: dict[str, Any] | None = None,
    groups: Sequence[str | None] = (),
    max_overall_drop: float = MAX_OVERALL_DROP,
) -> Verdict:
    """Publish the exported version in `candidate_dir` as the next version and serve it, only
    when it loads and `decide` says so: better on `texts`/`labels` (validation) by `min_gain`, or
    better for a tenant at most `max_overall_drop` worse overall, and never worse on any tenant's
    own labels (`groups`: the tenant of each live label, None for a benchmark label).

    `prepare(version_dir)` runs on the staged copy before it is published (e.g. threshold
    calibration); `store` records the verdict (`action`: promote | retrain).
    """
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, not {metric!r}")
    if not texts:
        raise ValueError("no validation labels to compare on")
    texts, labels, groups = list(texts), list(labels), list(groups)
    model_dir = Path(repository) / model_name
    counts = tier_counts(labels)
    record = {"store": store, "action": action, "challenger_run": challenger_run, "new_labels": new_labels,
              "label_watermark": label_watermark, "details": dict(details or {}),
              "triton_urls": list(triton_urls)}
    champion_version = served_version(model_dir)
    try:
        challenger = score_version(version_at(Path(candidate_dir), model_name), texts, labels, groups)
    except Exception as exc:  # noqa: BLE001 - a challenger that does not load is never served
        return _failed(model_dir, metric, counts, f"challenger does not load or run: {short_error(exc, 400, with_type=True)}",
                       None, None, champion_version, record)
    champion, champion_error = None, None
    if champion_version is not None:
        try:
            champion = score_version(open_version(repository, model_name, champion_version), texts, labels, groups)
        except Exception as exc:  # noqa: BLE001 - a broken champion loses to a working challenger
            champion_error = short_error(exc, 400, with_type=True)
    tenants = tenant_check(challenger, champion) if champion is not None else {}
    record["details"]["tenants"] = tenants
    if champion is not None:
        promote_it, why = decide(challenger, champion, tenants, metric, min_gain, max_overall_drop)
        why = f"challenger against champion version {champion_version} on {len(texts)} validation labels: {why}"
    if champion is not None and not promote_it:
        verdict = Verdict(
            False, challenger, champion, None, why,
            verdict="refused", metric=metric, champion_version=champion_version,
            served_version=champion_version, validation_counts=counts, tenants=tenants,
        )
        return _recorded(verdict, model_name, record)

    # Publish: staged copy -> numbered version directory (older versions stay on disk). The
    # pointer is pinned first: without one, the new directory would be "the latest", served.
    model_dir.mkdir(parents=True, exist_ok=True)
    pin_served(model_dir)
    number = next_version(model_dir)
    staging = model_dir / f".staging-{number}"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(candidate_dir, staging)
    info_path = staging / "classifier.json"
    info = json.loads(info_path.read_text(encoding="utf-8")) if info_path.is_file() else {}
    info.update({"version": number, "promotion": {
        "metric": metric, "challenger": challenger[metric],
        "champion": champion[metric] if champion else None, "champion_version": champion_version,
        "validation": len(texts), "validation_counts": counts,
    }})
    info_path.write_text(json.dumps(info, indent=2), encoding="utf-8")
    if prepare is not None:
        try:
            prepare(staging)
        except Exception as exc:  # noqa: BLE001 - e.g. no outcomes to calibrate: keep defaults
            record["details"]["prepare_error"] = short_error(exc, 400, with_type=True)
    staging.rename(model_dir / str(number))
    if not (model_dir / CONFIG_FILE).is_file():
        exported = Path(candidate_dir).parent / CONFIG_FILE
        text = exported.read_text(encoding="utf-8") if exported.is_file() else config_pbtxt(model_name)
        (model_dir / CONFIG_FILE).write_text(text, encoding="utf-8")
    if champion is None:
        reason = ("no champion yet" if champion_version is None
                  else f"champion version {champion_version} does not load or run: {champion_error}")
    else:
        reason = why
    try:
        switch_served(model_dir, number, triton_urls, reason=f"{action}: {reason}")
    except ServingSwitchError as exc:
        info["promotion"]["verdict"] = "failed"
        (model_dir / str(number) / "classifier.json").write_text(json.dumps(info, indent=2), encoding="utf-8")
        return _failed(model_dir, metric, counts, f"version {number} was not served: {exc}",
                       challenger, champion, champion_version, record, version=number)
    verdict = Verdict(True, challenger, champion, number, reason, verdict="promoted", metric=metric,
                      champion_version=champion_version, served_version=number, validation_counts=counts,
                      tenants=tenants)
    return _recorded(verdict, model_name, record)


def _failed(model_dir: Path, metric: str, counts: dict[str, int], reason: str, challenger: dict | None,
            champion: dict | None, champion_version: int | None, record: dict[str, Any],
            version: int | None = None) -> Verdict:
    """A `failed` verdict; `version`: the number it was published as, though never served."""
    verdict = Verdict(False, challenger, champion, None, reason, verdict="failed", metric=metric,
                      champion_version=champion_version, served_version=served_version(model_dir),
                      validation_counts=counts)
    return _recorded(verdict, model_dir.name, record, challenger_version=version)


def _recorded(verdict: Verdict, model_name: str, record: dict[str, Any],
              challenger_version: int | None = None) -> Verdict:
    store: PromotionStore | None = record.get("store")
    if store is None:
        return verdict
    row = store.record(
        model_name, record.get("action") or "promote", verdict.verdict,
        challenger_run=record.get("challenger_run"),
        challenger_version=verdict.version if verdict.version is not None else challenger_version,
        champion_version=verdict.champion_version, served_version=verdict.served_version,
        metric=verdict.metric,
        challenger_score=verdict.challenger[verdict.metric] if verdict.challenger else None,
        champion_score=verdict.champion[verdict.metric] if verdict.champion else None,
        validation_counts=verdict.validation_counts, new_labels=record.get("new_labels"),
        label_watermark=record.get("label_watermark"), reason=verdict.reason,
        details=_plain({**record.get("details", {}), "challenger": verdict.challenger,
                        "champion": verdict.champion, "triton": record.get("triton_urls", [])}),
    )
    verdict.record_id = row.id
    return verdict


def rollback(
    repository: Path,
    model_name: str = CLASSIFIER_MODEL,
    to: int | None = None,
    *,
    triton_urls: Sequence[str] = (),
    store: PromotionStore | None = None,
    reason: str = "",
) -> int:
    """Serve version `to` (default: the one served before the current one) again; returns it.

    The same switch as a promotion (Triton loads it first; the current one stays loaded until
    front doors have moved), recorded as a `rollback`. Raises `ServingSwitchError` when there is
    nothing to return to or the version does not load (the served version is then unchanged)."""
    from adaptive_rag.routing.model_repository import read_served

    model_dir = Path(repository) / model_name
    current = served_version(model_dir)
    if current is None:
        raise ServingSwitchError(f"no version under {model_dir}")
    if to is None:
        state = read_served(model_dir)
        to = state.previous if state is not None else None
        if to is None:
            raise ServingSwitchError(
                f"version {current} is the first one served from {model_dir}: nothing to roll back to "
                "(name one with --to)")
    if to == current:
        raise ServingSwitchError(f"version {to} is already served")
    why = reason or f"rollback from version {current} to {to}"
    try:
        switch_served(model_dir, to, triton_urls, reason=why)
    except ServingSwitchError as exc:
        if store is not None:
            store.record(model_name, "rollback", "failed", champion_version=current, served_version=current,
                         challenger_version=to, reason=f"{why}: {exc}",
                         details={"triton": list(triton_urls)})
        raise
    if store is not None:
        store.record(model_name, "rollback", "rolled_back", champion_version=current, served_version=to,
                     challenger_version=to, reason=why, details={"triton": list(triton_urls)})
    return to
