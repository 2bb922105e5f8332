"""One retraining run: the code behind `arag retrain` and the scheduled job (workers/retraining.py).

    lock -> (relabel) -> enough new labels? -> train a challenger on `fit` -> promote on
    `validation` (calibrated, loaded by Triton, then served) -> fit each tenant's prior for the
    served version -> one `model_promotions` row

- The challenger's family (`family`, `ARAG_RETRAIN_FAMILY`): `auto` retrains what is served - the
  linear bag-of-words router a fresh clone ships (`words`: seconds, no torch; its hyper-parameters
  chosen on a hash band of `fit`, never on `validation`) or the fine-tuned MiniLM (`encoder`).

- The lock (`job_lock`: a PostgreSQL advisory lock, or an flock beside the model repository) makes
  a second run that starts while one is going record `skipped` and return at once, so a slow
  run and the next schedule never train or publish side by side.
- `min_new_labels`: a run trains only when that many `train` labels arrived since the last
  retrain that reached a verdict (the watermark it recorded); otherwise `skipped`.
- Labels: every `train` label (benchmark and live) split by `adaptive_rag.training.splits`; the
  challenger learns from `fit` (live labels repeated up to `live_share` of it), promotion compares
  on `validation` overall and per tenant; `test` only fills the model card, never chooses.
- Tenant priors (`adaptive_rag.training.tenant_adaptation`): after the verdict, every tenant
  with enough live `train` labels gets a prior shift over the served version, kept only when it
  routes those labels better under cross-validation. The global router learns from thousands of
  benchmark labels; the prior is where a tenant's few dozen labels act. Recorded in the row's
  `details.tenant_priors`.
Needs the `train` extras (torch) only when it trains.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adaptive_rag.errors import ConfigurationError
from adaptive_rag.settings import ClassifierSettings
from adaptive_rag.storage import (
    JobBusyError, LabelStore, PromotionStore, job_lock, make_engine, upgrade_database,
)
from adaptive_rag.training.calibration import calibrate_version
from adaptive_rag.training.promotion import Verdict
from adaptive_rag.training.splits import (
    LIVE_SHARE, VALIDATION_SHARE, partition, tier_counts, validation_columns,
)

if TYPE_CHECKING:
    from adaptive_rag.training.time_price import TimeBudget

Log = Callable[[str], None]


@dataclass
class RetrainOptions:
    """What `arag retrain` takes (the scheduled job uses the defaults and the settings)."""

    out: Path | None = None  # run directory (default var/classifier/runs/<time>)
    epochs: int = 3
    max_steps_per_epoch: int | None = None
    learning_rate: float | None = None
    seed: int = 13
    threads: int | None = None
    metric: str = "macro_f1"
    min_gain: float = 0.0
    int8: bool = False
    min_new_labels: int = 0  # 0: train whatever arrived
    relabel: bool = False  # turn feedback into live labels first (the scheduled job does)
    triton_urls: tuple[str, ...] = ()  # load on these Tritons before serving (EXPLICIT mode)
    calibrate: bool = True  # thresholds of the promoted version from its validation slice
    live_share: float = LIVE_SHARE  # live labels repeated up to this share of `fit` (`splits.weighted_live`)
    family: str = "auto"  # auto | words | encoder (`resolve_family`)
    tenant_priors: bool = True  # fit each tenant's prior over the served version after the verdict
    lock_wait_s: float = 0.0


@dataclass
class RetrainOutcome:
    """What one run did: `status` promoted | refused | failed | skipped, and why."""

    status: str
    reason: str
    new_labels: int | None = None
    fit: int = 0
    validation: int = 0
    run_dir: Path | None = None
    verdict: Verdict | None = None
    record_id: int | None = None
    relabelled: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """JSON-ready: what `arag retrain` prints and the Celery task returns."""
        data: dict[str, Any] = {
            "status": self.status, "reason": self.reason, "new_labels": self.new_labels,
            "fit": self.fit, "validation": self.validation,
            "run_dir": str(self.run_dir) if self.run_dir else None, "record_id": self.record_id,
        }
        if self.relabelled is not None:
            data["relabel"] = self.relabelled
        for key in ("family", "tenant_priors"):
            if key in self.extra:
                data[key] = self.extra[key]
        if self.verdict is not None:
            v = self.verdict
            data.update({
                "promoted": v.promoted, "version": v.version, "served_version": v.served_version,
                "champion_version": v.champion_version, "metric": v.metric,
                "validation_counts": v.validation_counts,
                "challenger": v.challenger and {k: v.challenger[k] for k in ("accuracy", "macro_f1")},
                "champion": v.champion and {k: v.champion[k] for k in ("accuracy", "macro_f1")},
                "tenants": v.tenants,
            })
        return data


def control_urls(classifier: ClassifierSettings, url: str | None = None, enabled: bool = True) -> list[str]:
    """The Tritons a promotion or rollback loads the version on: `url` if given, else
    `ARAG_TRITON_CONTROL_URLS`, else `TRITON_GRPC_URL` when it was set (not its default)."""
    if not enabled:
        return []
    given = url or classifier.triton_control_urls
    if not given and "triton_grpc_url" in classifier.model_fields_set:
        given = classifier.triton_grpc_url
    # `dns:///` entries stay as they are: the switch resolves them when it loads (every pod then).
    return [u.strip() for u in (given or "").split(",") if u.strip()]


def publish_lock(engine, classifier: ClassifierSettings, wait_s: float = 600.0):
    """The lock around changing what is served (promotion, rollback): short, so a rollback
    during a long retrain's training still goes through; waits for a running publication."""
    name = classifier.classifier_model
    return job_lock(engine, f"publish:{name}", Path(classifier.model_repository) / f".{name}.publish.lock", wait_s)


FAMILIES = ("auto", "words", "encoder")


def resolve_family(family: str, repository: Path, model: str) -> str:
    """`words` or `encoder`: `auto` follows the served version's kind (the shipped router is
    bag-of-words; a repository without a version, or with an encoder one, retrains the encoder)."""
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, not {family!r}")
    if family != "auto":
        return family
    from adaptive_rag.training.bag_of_words import KIND
    from adaptive_rag.routing.model_repository import served_version

    served = served_version(Path(repository) / model)
    if served is None:
        return "encoder"
    info_path = Path(repository) / model / str(served) / "classifier.json"
    info = json.loads(info_path.read_text(encoding="utf-8")) if info_path.is_file() else {}
    return "words" if info.get("kind") == KIND else "encoder"


def served_time_budget(repository: Path, model: str) -> TimeBudget | None:
    """The time budget (a share of always C's time, and the confidence it is held with) the served
    version's policy is priced for, if any: a retrained router is priced for the same budget,
    never silently served without it."""
    from adaptive_rag.routing.model_repository import served_version
    from adaptive_rag.routing.policy import PolicyThresholds
    from adaptive_rag.training.time_price import TimeBudget

    served = served_version(Path(repository) / model)
    if served is None:
        return None
    thresholds = PolicyThresholds.load_or_default(Path(repository) / model / str(served))
    budget = thresholds.metrics.get("time_budget")
    if thresholds.time_price is None or budget is None:
        return None
    confidence = thresholds.metrics.get("time_budget_confidence")
    return TimeBudget(float(budget), None if confidence is None else float(confidence))


def train_words(rows, out: Path, live_share: float, note: str, time_budget: TimeBudget | None = None) -> Path:
    """Fit the bag-of-words router on `rows` (the `fit` part; live labels weighted; settings
    chosen on a hash band of it, then refitted on all of it), priced on time for `time_budget`
    when given (`bag_of_words.fit_time_price`, out of fold on the rows with every tier's outcome),
    write `router.json` and its card into `out`, export it as a candidate version under
    `out/export`; returns the candidate's version directory."""
    from adaptive_rag.training.bag_of_words import fit, fit_time_price, model_card, publish
    from adaptive_rag.training.learned_routers import examples_from_labels
    from adaptive_rag.training.splits import weighted_live

    weighted = weighted_live(list(rows), lambda row: row.dataset, live_share)
    # The selection slice: the hash band just above promotion's validation part, inside `fit`.
    examples = examples_from_labels(weighted)
    router = fit(examples, note=note, validation_share=2 * VALIDATION_SHARE, refit=True)
    if time_budget is not None:
        fit_time_price(router, examples, time_budget.share, confidence=time_budget.confidence)
    out.mkdir(parents=True, exist_ok=True)
    router.save(out / "router.json")
    (out / "MODEL_CARD.md").write_text(model_card(out / "router.json"), encoding="utf-8")
    return publish(out / "router.json", out / "export").path


def retrain(
    database_url: str, classifier: ClassifierSettings, options: RetrainOptions | None = None,
    log: Log = print,
) -> RetrainOutcome:
    """One run under the lock; every outcome (including a busy lock) is one `model_promotions` row."""
    options = options or RetrainOptions()
    upgrade_database(database_url)
    engine = make_engine(database_url)
    promotions = PromotionStore(engine)
    model = classifier.classifier_model
    repository = Path(classifier.model_repository)
    try:
        with job_lock(engine, f"retrain:{model}", repository / f".{model}.retrain.lock", options.lock_wait_s):
            return _retrain_locked(engine, promotions, classifier, options, log)
    except JobBusyError as exc:
        row = promotions.record(model, "retrain", "skipped", reason=f"another retrain is running: {exc}")
        log(f"skipped: {exc}")
        return RetrainOutcome("skipped", row.reason, record_id=row.id)
    finally:
        engine.dispose()


def _retrain_locked(engine, promotions: PromotionStore, classifier: ClassifierSettings,
                    options: RetrainOptions, log: Log) -> RetrainOutcome:
    model = classifier.classifier_model
    relabelled = None
    if options.relabel:
        from dataclasses import asdict

        from adaptive_rag.training.relabel import relabel_from_records

        relabelled = asdict(relabel_from_records(engine))
        log(f"relabel: {relabelled}")
    new, watermark = promotions.new_train_labels(model)
    if options.min_new_labels and new < options.min_new_labels:
        reason = (f"{new} new `train` labels since the last retrain, fewer than the "
                  f"{options.min_new_labels} asked for")
        row = promotions.record(model, "retrain", "skipped", new_labels=new, label_watermark=None, reason=reason)
        log(f"skipped: {reason}")
        return RetrainOutcome("skipped", reason, new_labels=new, record_id=row.id, relabelled=relabelled)

    labels = LabelStore(engine)
    train_rows = labels.labels(split="train")
    fit, validation = partition(train_rows, lambda row: row.question, VALIDATION_SHARE)
    test_rows = labels.labels(split="test")
    outcome = RetrainOutcome("failed", "", new_labels=new, fit=len(fit), validation=len(validation),
                             relabelled=relabelled)
    if not fit or not validation:
        outcome.reason = (f"need `train` labels on both sides of the validation split (fit {len(fit)}, "
                          f"validation {len(validation)}): run `arag label` / `arag relabel` first")
        row = promotions.record(model, "retrain", "failed", new_labels=new, reason=outcome.reason)
        outcome.record_id = row.id
        return outcome

    out = Path(options.out or Path("var/classifier/runs") / time.strftime("%Y%m%d-%H%M%S"))
    outcome.run_dir = out
    family = resolve_family(options.family, Path(classifier.model_repository), model)
    outcome.extra["family"] = family
    if family == "words":
        outcome = _retrain_words(engine, promotions, classifier, options, log, outcome, fit, validation,
                                 len(test_rows), new, watermark, out)
    else:
        outcome = _retrain_encoder(engine, promotions, classifier, options, log, outcome, labels, fit,
                                   validation, len(train_rows), test_rows, new, watermark, out)
    if outcome.verdict is not None and outcome.status in ("promoted", "refused") and options.tenant_priors:
        _adapt_tenants(engine, promotions, classifier, outcome, train_rows, log)
    return outcome


def _adapt_tenants(engine, promotions: PromotionStore, classifier: ClassifierSettings, outcome: RetrainOutcome,
                   train_rows: list, log: Log) -> None:
    """Each tenant's prior over the version served now (under the publish lock, so a rollback
    never interleaves); the verdicts join the run's row."""
    from adaptive_rag.routing.model_repository import open_version
    from adaptive_rag.training.tenant_adaptation import adapt_tenants

    try:
        with publish_lock(engine, classifier):
            served = open_version(Path(classifier.model_repository), classifier.classifier_model)
            verdicts = [v.summary() for v in adapt_tenants(train_rows, served, log)]
    except Exception as exc:  # noqa: BLE001 - the global verdict stands; the priors stay as they were
        verdicts = [{"verdict": "failed", "reason": f"{type(exc).__name__}: {exc}"}]
        log(f"tenant priors failed: {exc}")
    outcome.extra["tenant_priors"] = verdicts
    if outcome.record_id is not None:
        promotions.add_details(outcome.record_id, {"tenant_priors": verdicts})


def _retrain_encoder(engine, promotions: PromotionStore, classifier: ClassifierSettings, options: RetrainOptions,
                     log: Log, outcome: RetrainOutcome, labels: LabelStore, fit: list, validation: list,
                     trained_from: int, test_rows: list, new: int | None, watermark: int | None,
                     out: Path) -> RetrainOutcome:
    """The `encoder` family: fine-tune MiniLM on `fit` (torch) and promote it like any challenger."""
    from adaptive_rag.training.promotion import promote
    from adaptive_rag.training.training import Example, TrainConfig, train_classifier

    model = classifier.classifier_model

    def example(row) -> Example:
        return Example(row.question, row.label, row.question_id, row.dataset)

    config = TrainConfig(
        base=classifier.classifier_base, epochs=options.epochs, learning_rate=options.learning_rate,
        seed=options.seed, max_length=classifier.classifier_max_length,
        max_steps_per_epoch=options.max_steps_per_epoch, threads=options.threads,
        live_share=options.live_share,
    )
    note = (f"retrain: {len(fit)} `fit` labels of {trained_from} `train` labels (benchmark + live; "
            f"{len(validation)} validation labels held out for promotion, {tier_counts([r.label for r in validation])}). "
            f"Test: {len(test_rows)} `test` labels, reported only.")
    try:
        result = train_classifier([example(r) for r in fit], out, config,
                                  test_examples=[example(r) for r in test_rows], data_note=note, log=log)
    except Exception as exc:  # noqa: BLE001 - recorded; the served version is untouched
        return _run_failed(promotions, model, outcome, f"training failed: {type(exc).__name__}: {exc}", out, new)

    def prepare(version_dir: Path) -> None:
        if not options.calibrate:
            return
        try:
            calibrate_version(version_dir, labels)
        except ConfigurationError:
            log("no validation question has stored per-tier outcomes: default thresholds")

    def promote_run(texts: list[str], tiers: list[str], **common: Any) -> Verdict:
        return promote(result.run_dir, classifier.model_repository, texts, tiers, model, options.metric,
                       options.min_gain, options.int8, prepare=prepare, **common)

    return _publish(engine, promotions, classifier, options, log, outcome, validation, new, watermark,
                    Path(result.run_dir), promote_run,
                    {"fit": len(fit), "test_reported": len(test_rows), "epochs": options.epochs, "family": "encoder"})


def _retrain_words(engine, promotions: PromotionStore, classifier: ClassifierSettings, options: RetrainOptions,
                   log: Log, outcome: RetrainOutcome, fit: list, validation: list, tested: int,
                   new: int | None, watermark: int | None, out: Path) -> RetrainOutcome:
    """The `words` family: fit the bag-of-words router (seconds) and promote it like any challenger."""
    from adaptive_rag.training.promotion import promote_candidate

    model = classifier.classifier_model
    note = (f"retrain: {len(fit)} `fit` labels (benchmark + live, live repeated up to {options.live_share:.0%}); "
            f"{len(validation)} validation labels held out for promotion")
    budget = served_time_budget(classifier.model_repository, model)
    try:
        candidate = train_words(fit, out, options.live_share, note, time_budget=budget)
    except Exception as exc:  # noqa: BLE001 - recorded; the served version is untouched
        return _run_failed(promotions, model, outcome, f"training failed: {type(exc).__name__}: {exc}", out, new)
    priced = "" if budget is None else f", priced on time for {budget.describe()} as the served version"
    log(f"bag-of-words challenger fitted on {len(fit)} `fit` labels{priced}: {out / 'router.json'}")

    def promote_run(texts: list[str], tiers: list[str], **common: Any) -> Verdict:
        return promote_candidate(candidate, classifier.model_repository, texts, tiers, model, options.metric,
                                 options.min_gain, **common)

    return _publish(engine, promotions, classifier, options, log, outcome, validation, new, watermark, out,
                    promote_run, {"fit": len(fit), "test_reported": tested, "family": "words"})


def _publish(engine, promotions: PromotionStore, classifier: ClassifierSettings, options: RetrainOptions,
             log: Log, outcome: RetrainOutcome, validation: list, new: int | None, watermark: int | None,
             run_dir: Path, promote_run: Callable[..., Verdict], details: dict[str, Any]) -> RetrainOutcome:
    """Under the publish lock, `promote_run` the challenger on the validation labels (overall and
    per tenant, Triton loading it first); the outcome carries the recorded verdict."""
    with ExitStack() as held:
        try:
            held.enter_context(publish_lock(engine, classifier))
        except JobBusyError as exc:
            return _run_failed(promotions, classifier.classifier_model, outcome, f"could not publish: {exc}",
                               run_dir, new)
        texts, tiers, groups = validation_columns(validation)
        verdict = promote_run(
            texts, tiers, groups=groups, triton_urls=list(options.triton_urls), store=promotions,
            action="retrain", challenger_run=str(run_dir), new_labels=new, label_watermark=watermark,
            details={**details, "live_share": options.live_share},
        )
    outcome.status, outcome.reason, outcome.verdict = verdict.verdict, verdict.reason, verdict
    outcome.record_id = verdict.record_id
    log(f"{verdict.verdict}: {verdict.reason}")
    return outcome


def _run_failed(promotions: PromotionStore, model: str, outcome: RetrainOutcome, reason: str,
                run_dir: Path, new: int | None) -> RetrainOutcome:
    """A run that failed after its labels were counted: recorded; the served version is untouched."""
    outcome.reason = reason
    row = promotions.record(model, "retrain", "failed", challenger_run=str(run_dir), new_labels=new, reason=reason)
    outcome.record_id = row.id
    return outcome
