"""Routing rows of the evaluation report, without extra LLM runs.

`arag eval` runs every tier's strategy (A, B, C) on every question; a routing row is then, per
question, the outcome of the tier its router picked. Every baseline a claim must beat is such a
row, so all of them stand on the same questions and the same answers: always A / B / C, the
dataset-identity rule, the question-form rules, the oracle (cheapest correct tier) and each
trained router (`LocalOnnxClassifier`: the exported model in-process through ONNX Runtime + its
policy, the same numbers as Triton). A further router is one more `RoutingRow`: a name and a
function from a question to a tier; the learned routers (`adaptive_rag.routers.learned`: logistic
regression, kNN over labelled queries, cost-aware reward regression) each get one from their saved
directory (`learned_router_row`).

A trained router's per-question routes are recorded (`routes.json` beside the outcomes), so a
report-only regeneration on a machine without that model version still shows its row, replayed
and marked as such.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from adaptive_rag.contracts import RoutingDecision, Tier
from adaptive_rag.evaluation.datasets import Question, dataset_tier
from adaptive_rag.evaluation.runner import Outcome
from adaptive_rag.routers import Router
from adaptive_rag.routers.embeddings import DEFAULT_ENCODER
from adaptive_rag.routing.rules import rules_router

if TYPE_CHECKING:
    from adaptive_rag.routers.learned import LearnedRouter
    from adaptive_rag.routers.llm_judge import LLMJudge
    from adaptive_rag.routers.local_classifier import LocalOnnxClassifier

# A router's answer for one question: a tier, a full decision, or None (no decision: skipped).
RouterOutput = Tier | RoutingDecision | None
RowKind = Literal["fixed", "router", "oracle"]
ROUTES_FILE = "routes.json"
ORACLE = "oracle"
DATASET_RULE = "dataset-identity rule"
QUESTION_FORM_RULES = "adaptive, rules only"  # the row's name since before the baselines
ADAPTIVE = "adaptive"
LEARNED_PREFIX = "learned "  # the rows of the learned routers: "learned knn", "learned lr (mpnet)", ...
LLM_JUDGE = "llm judge"


@dataclass(frozen=True)
class RoutingRow:
    """A report row made by routing each question to a tier.

    `timed`: the router runs at serving time, so its routing time is added to each answer's time
    (a decision may instead carry a recorded time in `classify_ms`). `info`: what made the row
    (classifier version, thresholds, ...), recorded in the report.
    """

    name: str
    route: Callable[[Question], RouterOutput]
    label: str = ""
    kind: RowKind = "router"
    timed: bool = False
    info: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""


@dataclass
class Routed:
    """A routing row's outcomes, the tier each question went to and how many went where."""

    outcomes: list[Outcome]
    tiers: dict[tuple[str, str], Tier]
    seconds: dict[tuple[str, str], float]  # routing time added per question
    counts: dict[str, int]


def route_row(
    row: RoutingRow,
    outcomes: Mapping[tuple[str, str, str], Outcome],
    questions: Iterable[Question],
    tiers: Sequence[str],
) -> Routed:
    """Per question, the outcome of the routed tier's strategy, renamed to the row.

    `tiers` names the A, B, C strategies. Questions lacking any tier's outcome are skipped, so
    every routing row of a report covers the same questions.
    """
    result = Routed([], {}, {}, {**{t.value: 0 for t in Tier}, "fallback": 0})
    for question in questions:
        per_tier = {t: outcomes.get((question.dataset, question.id, name)) for t, name in zip(Tier, tiers)}
        if any(o is None for o in per_tier.values()):
            continue
        start = time.perf_counter()
        decision = row.route(question)
        routing_s = time.perf_counter() - start if row.timed else 0.0
        if decision is None:
            continue
        reason = row.name
        if isinstance(decision, RoutingDecision):
            if not row.timed:
                routing_s = decision.classify_ms / 1000
            result.counts["fallback"] += decision.fallback
            decision, reason = decision.tier, decision.reason
        trace = f"routed {decision.value}: {reason}"
        picked = per_tier[decision]
        key = (question.dataset, question.id)
        result.tiers[key], result.seconds[key] = decision, routing_s
        result.counts[decision.value] += 1
        result.outcomes.append(replace(picked, strategy=row.name, seconds=picked.seconds + routing_s,
                                       trace=[*picked.trace, trace]))
    return result


def routed_outcomes(
    outcomes: Mapping[tuple[str, str, str], Outcome],
    questions: Iterable[Question],
    tiers: Sequence[str],
    router: Router,
    row_name: str = ADAPTIVE,
) -> tuple[list[Outcome], dict[str, int]]:
    """A query router's row (routing time included) and how many questions went to each tier."""
    routed = route_row(RoutingRow(row_name, lambda q: router.route(q.question), timed=True),
                       outcomes, questions, tiers)
    return routed.outcomes, routed.counts


# --- the rows ----------------------------------------------------------------------------------


def fixed_rows(tiers: Sequence[str]) -> list[RoutingRow]:
    """Always A, always B, always C, named by their strategies (the rows' names before routing)."""
    return [
        RoutingRow(name, lambda _q, t=tier: t, label=f"always {tier.value} ({name})", kind="fixed",
                   description=f"`{name}` for every question (tier {tier.value})")
        for tier, name in zip(Tier, tiers)
    ]


def dataset_rule_row() -> RoutingRow:
    """B for the single-hop sets, C for the multi-hop sets: knows the source, not the question."""
    return RoutingRow(DATASET_RULE, lambda q: dataset_tier(q.dataset), label=DATASET_RULE,
                      description="B for squad, nq, trivia; C for musique, hotpotqa, 2wiki "
                      "(`adaptive_rag.evaluation.datasets.dataset_tier`: knows the source, not the question)")


def question_form_row() -> RoutingRow:
    """The serving fallback's rules on the question text (`adaptive_rag.routing.rules.rule_tier`)."""
    return RoutingRow(QUESTION_FORM_RULES, lambda q: rules_router(q.question),
                      label=f"question-form rules ({QUESTION_FORM_RULES})", timed=True,
                      description="the serving fallback's rules on the question text "
                      "(`adaptive_rag.routing.rules.rule_tier`); routing time included")


def oracle_router(
    outcomes: Mapping[tuple[str, str, str], Outcome], tiers: Sequence[str]
) -> Callable[[Question], RouterOutput]:
    """The cheapest tier whose answer was correct (EM or Acc); when none was, the dataset-identity
    rule decides, as for the classifier's labels. Its tier is the question's test label."""

    def route(question: Question) -> RouterOutput:
        for tier, name in zip(Tier, tiers):
            found = outcomes.get((question.dataset, question.id, name))
            if found is None:
                return None
            if found.correct:
                return tier
        return dataset_tier(question.dataset) or Tier.B

    return route


def oracle_row(outcomes: Mapping[tuple[str, str, str], Outcome], tiers: Sequence[str]) -> RoutingRow:
    return RoutingRow(ORACLE, oracle_router(outcomes, tiers), label=ORACLE, kind="oracle",
                      description="the cheapest tier answering correctly (EM or Acc), else the "
                      "dataset-identity rule: the best any router over these tiers could do")


def cheapest_correct(
    outcomes: Mapping[tuple[str, str, str], Outcome], questions: Iterable[Question], tiers: Sequence[str],
) -> dict[tuple[str, str], Tier | None]:
    """Per question with every tier's outcome, the cheapest tier answering correctly (EM or Acc),
    or None when no tier did: what under- and over-retrieval are measured against."""
    found: dict[tuple[str, str], Tier | None] = {}
    for question in questions:
        per_tier = [outcomes.get((question.dataset, question.id, name)) for name in tiers]
        if any(o is None for o in per_tier):
            continue
        found[(question.dataset, question.id)] = next(
            (tier for tier, o in zip(Tier, per_tier) if o is not None and o.correct), None)
    return found


def learned_router_info(router: LearnedRouter, directory: Path) -> dict[str, Any]:
    """What a learned router row runs: its artefact, encoder, hyper-parameters and labels."""
    card = router.card
    encoder = card.get("encoder", {})
    validation = card.get("validation", {})
    return {
        "kind": router.kind, "path": str(directory), "artefact_sha256": router.artefact_sha256,
        "encoder": f"{encoder.get('name', '?')} (sha256 {str(encoder.get('identity', ''))[:12]})",
        "hyperparameters": card.get("hyperparameters", {}), "selection": card.get("selection"),
        "train_labels": card.get("labels", {}).get("fitted_on"),
        "validation": {k: round(v, 4) for k, v in (("accuracy", validation.get("accuracy")),
                                                     ("macro_f1", validation.get("macro_f1"))) if v is not None},
        "fitted": card.get("created"),
    }


def learned_router_row(router: LearnedRouter, directory: Path) -> RoutingRow:
    """A saved learned router as a report row (routing time included: it runs per question)."""
    directory = Path(directory)
    # "learned lr", "learned lr (mpnet-base)" for another encoder, "learned lr (<dir>)" for a
    # directory not named after its kind: rows of one report never share a name.
    encoder = str(router.card.get("encoder", {}).get("name") or DEFAULT_ENCODER)
    suffix = (directory.name if directory.name != router.kind
              else encoder if encoder != DEFAULT_ENCODER else "")
    name = LEARNED_PREFIX + router.kind + (f" ({suffix})" if suffix else "")
    info = learned_router_info(router, directory)
    params = ", ".join(f"{k} {v}" for k, v in info["hyperparameters"].items())
    return RoutingRow(name, lambda q: router.route(q.question), label=f"{name} ({params})", timed=True,
                      info=info, description=f"{router.card.get('description', router.kind)}; trained on "
                      "the `train` labels only, hyper-parameters chosen on them (a hash validation split, or "
                      "hash folds where the card says so); in-process, routing time included")


def learned_router_rows(paths: Sequence[Path]) -> tuple[list[RoutingRow], dict[str, str]]:
    """A row per saved router under `paths` (router directories or folders of them), and why a
    directory could not be used."""
    from adaptive_rag.errors import AdaptiveRagError
    from adaptive_rag.routers.learned import load_router, router_dirs

    rows, problems = [], {}
    for directory in router_dirs(paths):
        try:
            rows.append(learned_router_row(load_router(directory), directory))
        except (AdaptiveRagError, OSError, KeyError, ValueError) as exc:
            problems[str(directory)] = str(exc)
    return rows, problems


def llm_judge_row(judge: LLMJudge, reader: str) -> RoutingRow:
    """The reader asked which tier a question needs (`adaptive_rag.routers.llm_judge`); its one LLM
    call per question is counted in the answer's time (the decision's `classify_ms`)."""
    return RoutingRow(LLM_JUDGE, lambda q: judge.route(q.question), label=f"{LLM_JUDGE} ({reader})",
                      info={"reader": reader, "prompt": "adaptive_rag.prompts.router_judge"},
                      description="the reader picks the tier from one-line descriptions of A, B and C "
                      "(no passages); unparsed answers go to B; its LLM call's time included")


def classifier_info(classifier: LocalOnnxClassifier) -> dict[str, Any]:
    """The model version and thresholds a classifier row actually runs with."""
    version, thresholds = classifier.version, classifier.policy.thresholds
    exported_path = version.path / "classifier.json"
    exported = json.loads(exported_path.read_text(encoding="utf-8")) if exported_path.is_file() else {}
    quantization = exported.get("quantization")
    thresholds_file = version.path / "thresholds.json"
    return {
        "model": version.name, "version": version.version, "path": str(version.path),
        "base": exported.get("base"), "labels": (exported.get("train_config") or {}).get("labels", "both"),
        "exported": exported.get("exported"),
        "quantization": quantization.get("kind") if isinstance(quantization, Mapping) else "none (fp32)",
        "thresholds": {"c_threshold": thresholds.c_threshold, "a_threshold": thresholds.a_threshold,
                       "note": thresholds.note},
        "thresholds_file": str(thresholds_file) if thresholds_file.is_file() else "none (policy defaults)",
    }


def classifier_row(classifier: LocalOnnxClassifier, name: str = ADAPTIVE) -> RoutingRow:
    info = classifier_info(classifier)
    label = f"{name} (classifier v{info['version']})"
    if name != ADAPTIVE:  # a further version beside the served one: say what distinguishes it
        base = str(info.get("base") or "").rstrip("/").rsplit("/", 1)[-1]
        label = f"{name} ({info['labels']} labels, {base})"
    return RoutingRow(name, lambda q: classifier(q.question), label=label,
                      timed=True, info=info, description="the trained classifier and its policy, in-process "
                      "through ONNX Runtime (the graph Triton serves); routing time included")


def classifier_version_row_name(version: int) -> str:
    """The row of a further classifier version (a label ablation, another base): "adaptive v5"."""
    return f"{ADAPTIVE} v{version}"


# --- recorded routes ---------------------------------------------------------------------------


def _question_key(key: tuple[str, str]) -> str:
    return f"{key[0]}/{key[1]}"


def save_routes(path: Path, row: RoutingRow, routed: Routed) -> None:
    """Record a trained router's per-question tiers and routing times under its row name."""
    recorded = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    recorded[row.name] = {
        "info": dict(row.info), "recorded": time.strftime("%Y-%m-%d"),
        "questions": {_question_key(k): {"tier": t.value, "routing_s": routed.seconds[k]}
                      for k, t in routed.tiers.items()},
    }
    path.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def replayed_row(path: Path, name: str = ADAPTIVE) -> RoutingRow | None:
    """The row `name` as recorded in `path`, replayed (None when it was never recorded)."""
    recorded = json.loads(path.read_text(encoding="utf-8")).get(name) if path.is_file() else None
    if not recorded:
        return None
    routes = recorded["questions"]

    def route(question: Question) -> RouterOutput:
        found = routes.get(_question_key((question.dataset, question.id)))
        if found is None:
            return None
        return RoutingDecision(tier=Tier(found["tier"]), classify_ms=1000 * found["routing_s"],
                               reason="recorded route")

    info = {**recorded["info"], "replayed": f"routes recorded on {recorded['recorded']} in {path.name}; "
            "the model was not run for this report"}
    version = info.get("version")
    label = f"{name} (classifier v{version}, replayed)" if version is not None else f"{name} (replayed)"
    what = ("a learned router's" if name.startswith(LEARNED_PREFIX)
            else "the LLM judge's" if name == LLM_JUDGE else "a trained classifier's")
    return RoutingRow(name, route, label=label, info=info, description=f"{what} recorded routes, replayed; "
                      "recorded routing time included")


def recorded_names(path: Path) -> list[str]:
    """The rows whose routes `path` records."""
    return sorted(json.loads(path.read_text(encoding="utf-8"))) if path.is_file() else []
