"""`arag eval`, `arag retrieval-bench`: strategies and retrieval measured on the benchmark data;
`arag eval --suite support`: the router and abstention measured on the support suite."""

from __future__ import annotations

import json
import platform
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.table import Table

from adaptive_rag.cli.common import (
    MULTI_STEP, DataDir, Datasets, IndexDir, Retr, console, load_classifier_settings, load_settings, progress_bar,
    resolve_strategy,
)
from adaptive_rag.contracts import StrategyName, Tier
from adaptive_rag.errors import AdaptiveRagError
from adaptive_rag.strategies import STRATEGY_NAMES

if TYPE_CHECKING:
    from adaptive_rag.evaluation.adaptive import RoutingRow
    from adaptive_rag.evaluation.datasets import Question
    from adaptive_rag.evaluation.runner import Outcome
    from adaptive_rag.routers.local_classifier import LocalOnnxClassifier


BENCHMARK_STRATEGIES = ",".join(STRATEGY_NAMES)
DEFAULT_ROUTERS = Path("var/routers")
SUPPORT_FIXED_ROWS = "b"


def evaluate(
    out: Annotated[Optional[Path], typer.Option(help="report directory (results.jsonl makes it resumable); default reports/eval, or reports/support for --suite support")] = None,
    suite: Annotated[str, typer.Option(help="benchmark (the six QA sets) | support (the COVID FAQ as a help centre)")] = "benchmark",
    datasets: Datasets = None,
    limit: Annotated[Optional[int], typer.Option(help="questions per dataset (support: per query kind) of the split")] = None,
    skip: Annotated[int, typer.Option(min=0, help="benchmark only: questions per dataset passed over before --limit applies (a fresh sample of `test` that earlier runs of the first questions never read)")] = 0,
    strategies: Annotated[Optional[str], typer.Option(help=f"comma-separated strategies to run (default {BENCHMARK_STRATEGIES}); support: the fixed-tier rows beside the router, as tiers a,b,c (default {SUPPORT_FIXED_ROWS})")] = None,
    data_dir: DataDir = None,
    retriever: Retr = None,
    index_dir: IndexDir = None,
    multi_step: Annotated[Optional[str], typer.Option(help="C-tier variant for the oracle row")] = None,
    report_only: Annotated[bool, typer.Option(help="write the report from results.jsonl; run nothing")] = False,
    classifier_version: Annotated[Optional[int], typer.Option(help="model version for the \"adaptive\" row (default: the served one in ARAG_MODEL_REPOSITORY when trained, else the latest trained one)")] = None,
    split: Annotated[str, typer.Option(help="support only: test (report) | train (tuning)")] = "test",
    abstain_min_score: Annotated[Optional[str], typer.Option(help="retrieving strategies abstain below this BM25 top score, on top of the relevance threshold; a number, or \"auto\" (support: best on the train split)")] = None,
    reader_abstains: Annotated[Optional[bool], typer.Option("--reader-abstains/--no-reader-abstains", help="let the single-step reader say the passages lack the answer (default: ARAG_READER_ABSTAINS)")] = None,
    classifier_versions: Annotated[Optional[str], typer.Option(help="further trained classifier versions shown beside \"adaptive\", comma-separated (e.g. the silver-only, binary-only and mpnet-base runs of `arag train --labels/--base`): rows \"adaptive v<N>\"")] = None,
    routers: Annotated[Optional[list[Path]], typer.Option("--routers", help="saved learned routers (`arag routers train`), each a router directory or a folder of them; repeatable (default: var/routers when it exists)")] = None,
    uncertainty_tuning: Annotated[Optional[Path], typer.Option(help="the tuning.json of `arag routers tune-uncertainty` (same reader, `train` split): the uncertainty strategy's threshold and aggregate (default: ARAG_UNCERTAINTY_THRESHOLD / ARAG_UNCERTAINTY_AGGREGATE)")] = None,
    kb: Annotated[str, typer.Option("--kb", help="support only: covid-faq | help-centre (the demo help centre, written to OUT/help_centre) | quillbill (a Markdown help centre, OUT/quillbill) | all")] = "all",
    llm_judge: Annotated[bool, typer.Option("--llm-judge", help="add the LLM-judge router's row: the reader picks each question's tier (one LLM call per question, counted in its time); its routes are recorded and replayed by --report-only")] = False,
) -> None:
    """Evaluate strategies on the `test` split; writes report.json, report.md, f1_vs_time.png.

    When every tier's strategy ran, the report's rows are routings of the same outcomes: always
    A / B / C, the dataset-identity rule, the question-form rules ("adaptive, rules only"), the
    oracle and, if a trained classifier version is exported, "adaptive" (that classifier + its
    calibrated policy, run in-process through ONNX Runtime: the same graph Triton serves), and one
    row per learned router saved under `--routers` (logistic regression, kNN, reward regression);
    the routes of both are recorded in routes.json and replayed when the model is absent. Every F1
    and every claimed difference has a bootstrap 95 % interval; every routing row's under- and
    over-retrieval against the cheapest correct tier is tabulated.

    `--suite support` runs the support suite instead (`adaptive_rag.evaluation.support`): the
    small-talk detector + rules router and the fixed-tier rows over the FAQ knowledge base;
    writes report.json, report.md and support.png.
    """
    if suite not in ("benchmark", "support"):
        raise typer.BadParameter(f"unknown suite {suite!r}; choose benchmark or support")
    auto_threshold = abstain_min_score is not None and abstain_min_score.strip().lower() == "auto"
    min_score: float | None = None
    if abstain_min_score is not None and not auto_threshold:
        try:
            min_score = float(abstain_min_score)
        except ValueError:
            raise typer.BadParameter(f"--abstain-min-score takes a number or auto, not {abstain_min_score!r}") from None
    if suite == "support" and skip:
        raise typer.BadParameter("--skip is for --suite benchmark")
    if suite == "support":
        _evaluate_support(
            out or Path("reports/support"), limit, strategies or SUPPORT_FIXED_ROWS, data_dir,
            multi_step, report_only, split, min_score, auto_threshold, reader_abstains, kb,
        )
        return
    if split != "test":
        raise typer.BadParameter("--split is for --suite support; benchmark reports use the test split")
    if auto_threshold:
        raise typer.BadParameter("--abstain-min-score auto is for --suite support")
    out = out or Path("reports/eval")
    strategies = strategies or BENCHMARK_STRATEGIES
    from adaptive_rag.evaluation.datasets import interleaved, limit_per_dataset, load_questions
    from adaptive_rag.evaluation.report import (
        add_intervals, best_fixed_row, claims, markdown, points, router_goals, standard_claims, summarise,
        write_report,
    )
    from adaptive_rag.evaluation.runner import context_reset, load_outcomes, run_evaluation
    from adaptive_rag.strategies import SELF_ROUTING_NAMES, build_strategy, strategy_for_tier

    settings = load_settings(
        data_dir=data_dir, retriever=retriever, index_dir=index_dir, multi_step=multi_step,
        abstain_min_score=min_score, reader_abstains=reader_abstains,
    )
    if uncertainty_tuning is not None:
        settings = settings.model_copy(update=_tuned_uncertainty(uncertainty_tuning, settings.reader))
    chosen = datasets.split(",") if datasets else None
    questions = interleaved(limit_per_dataset(load_questions(settings.data_dir, chosen, split="test"), limit, skip))
    names = [resolve_strategy(s.strip(), settings) for s in strategies.split(",") if s.strip()]
    judge = None
    if report_only:
        outcomes = load_outcomes(out / "results.jsonl")
    else:
        from adaptive_rag.llm import build_llm
        from adaptive_rag.retrieval import open_retriever

        _same_generator(out, settings, names)
        retr, llm = open_retriever(settings), build_llm(settings)
        runners = {name: build_strategy(name, retr, llm, settings) for name in names}
        with progress_bar("evaluating", len(questions) * len(runners)) as advance:
            outcomes = run_evaluation(questions, runners, out / "results.jsonl", advance, context_reset(llm))
        if llm_judge:
            from adaptive_rag.evaluation.adaptive import llm_judge_row
            from adaptive_rag.routers.llm_judge import LLMJudge

            judge = llm_judge_row(LLMJudge(llm), settings.reader)
    rows = {
        name: [outcomes[(q.dataset, q.id, name)] for q in questions if (q.dataset, q.id, name) in outcomes]
        for name in names
    }
    tiers = [strategy_for_tier(t, settings) for t in Tier]
    described = {name: {"label": name, "kind": "strategy",
                         "description": f"`{name}` for every question (not a tier of the routing rows)"}
                 for name in names}
    for name in (n for n in names if n in SELF_ROUTING_NAMES):
        # It decides itself, per question, how much retrieval to spend: a router among the rows.
        described[name] = {"label": name, "kind": "router",
                           "description": f"`{name}` for every question: it picks its own retrieval "
                                          "per question; its time counts every reader call it made"}
    absent: dict[str, str] = {}
    agreement: dict[str, dict] = {}
    retrieval: dict[str, dict] = {}
    adaptive_meta: str | None = None
    if all(t in names for t in tiers):
        router_paths = routers if routers is not None else [p for p in (DEFAULT_ROUTERS,) if p.is_dir()]
        missing_paths = [str(p) for p in router_paths if not p.exists()]
        if missing_paths:
            raise typer.BadParameter(f"--routers: no such directory: {', '.join(missing_paths)}")
        try:
            extra_versions = [int(v) for v in (classifier_versions or "").split(",") if v.strip()]
        except ValueError:
            raise typer.BadParameter(f"--classifier-versions takes version numbers, not {classifier_versions!r}") from None
        rows, described, absent, agreement, adaptive_meta, retrieval = _routing_rows(
            rows, described, outcomes, questions, tiers, out, classifier_version, router_paths, extra_versions,
            judge,
        )
    elif llm_judge:
        raise typer.BadParameter("--llm-judge routes between the tiers: run every tier's strategy "
                                 f"({', '.join(tiers)}) in --strategies")
    rows = {row: found for row, found in rows.items() if found}
    described = {row: d for row, d in described.items() if row in rows}
    table = add_intervals(summarise(rows), rows)
    labels = {row: d["label"] for row, d in described.items()}
    router_rows = [row for row, d in described.items() if d["kind"] == "router"]
    fixed_names = [n for n in names if n in rows and n not in SELF_ROUTING_NAMES]
    specs = standard_claims(
        table, tiers, routers=router_rows,
        multi_step_rows=[tiers[2], *(n for n in fixed_names if n not in tiers)],
        fixed_rows=fixed_names, labels=labels,
    )
    best_fixed = best_fixed_row(table, fixed_names)
    goals = router_goals(table, rows, router_rows, best_fixed, tiers[2]) \
        if best_fixed and tiers[2] in table else {}
    date = time.strftime("%Y-%m-%d")
    from adaptive_rag.settings import DEFAULT_KNOBS, strategy_knob

    meta = {
        "command": "arag eval " + shlex.join(a for a in sys.argv[2:] if a != "--report-only"),
        **({"regeneration": f"Report-only regeneration from {out / 'results.jsonl'} (no answers were "
                            f"re-run) on {date}."} if report_only else {}),
        "split": "test",
        "questions": len(questions),
        "retriever": settings.retriever,
        "llm": settings.llm_base_url or str(settings.gguf_path or f"{settings.reader} (embedded)"),
        "top_k": settings.top_k, "max_steps": settings.max_steps,
        "max_passages": settings.max_passages,
        "oracle_tiers": tiers,
        "multi_step_row": tiers[2],
        **({"best_fixed_row": best_fixed} if best_fixed else {}),
        "multi_step_knobs": {name: strategy_knob(settings, name) for name in DEFAULT_KNOBS},
        **({UNCERTAINTY_KNOBS: _recorded_uncertainty(out, settings)} if StrategyName.UNCERTAINTY in rows else {}),
        **({"adaptive_row": adaptive_meta} if adaptive_meta else {}),
        "machine": f"{platform.machine()}, {platform.python_version()}",
        "date": date,
        **({"absent_rows": absent} if absent else {}),
    }
    found_claims = claims(specs, rows)
    for path in write_report(table, out, meta, described, found_claims, agreement, retrieval, goals):
        console.print(f"wrote {path}")
    console.print(markdown({row: {"average": c["average"]} for row, c in table.items() if "average" in c}, labels))
    for claim in found_claims:
        d = claim["f1_difference"]
        console.print(f"{claim['title']} ({claim['scope']}): {points(d['estimate'])} "
                      f"[{points(d['low'])}, {points(d['high'])}] F1 points; {claim['verdict']}")


def _routing_rows(
    rows: dict[str, list[Outcome]], described: dict[str, dict], outcomes: Mapping[tuple[str, str, str], Outcome],
    questions: Sequence[Question], tiers: Sequence[str], out: Path, classifier_version: int | None,
    router_paths: Sequence[Path] = (), extra_versions: Sequence[int] = (), judge: RoutingRow | None = None,
) -> tuple[dict[str, list[Outcome]], dict[str, dict], dict[str, str], dict[str, dict], str | None, dict[str, dict]]:
    """The routing rows over the tier outcomes (always A/B/C, the dataset-identity rule, the
    question-form rules, the trained classifier, the learned routers, the LLM judge, the oracle),
    in report order, with what made each, and every row's under- and over-retrieval; the trained
    classifier's, the learned routers' and the judge's routes are recorded, and replayed when the
    model is absent (or the judge was not asked)."""
    from adaptive_rag.evaluation.adaptive import (
        ADAPTIVE, LEARNED_PREFIX, LLM_JUDGE, ORACLE, ROUTES_FILE, cheapest_correct, classifier_row,
        classifier_version_row_name, dataset_rule_row, fixed_rows, learned_router_rows, oracle_row,
        question_form_row, recorded_names, replayed_row, route_row, save_routes,
    )
    from adaptive_rag.evaluation.report import retrieval_errors, tier_agreement
    from adaptive_rag.routers.local_classifier import LocalOnnxClassifier
    from adaptive_rag.routing.model_repository import open_version

    routing = [*fixed_rows(tiers), dataset_rule_row(), question_form_row()]
    classifier, missing = _trained_classifier(classifier_version)
    routes_path = out / ROUTES_FILE
    trained = classifier_row(classifier) if classifier is not None else replayed_row(routes_path)
    absent: dict[str, str] = {}
    if trained is not None:
        routing.append(trained)
    else:
        absent[ADAPTIVE] = f"{missing}, and {routes_path} records no routes of it"
    settings = load_classifier_settings()
    versions_rows = []
    for number in extra_versions:
        name = classifier_version_row_name(number)
        try:
            chosen = open_version(settings.model_repository, settings.classifier_model, number)
            versions_rows.append(classifier_row(LocalOnnxClassifier(chosen), name))
        except AdaptiveRagError as exc:
            recorded = replayed_row(routes_path, name)
            if recorded is not None:
                versions_rows.append(recorded)
            else:
                absent[name] = str(exc)
    learned, problems = learned_router_rows(router_paths)
    for directory, problem in problems.items():
        console.print(f"learned router {directory} not used: {problem}")
        absent[f"learned router {directory}"] = problem
    asked = [judge] if judge is not None else []
    live = {row.name for row in [*learned, *asked]}
    replayed = [replayed_row(routes_path, name) for name in recorded_names(routes_path)
                if (name.startswith(LEARNED_PREFIX) or name == LLM_JUDGE) and name not in live]
    recorded_rows = [*versions_rows, *learned, *asked]  # run here: their routes are recorded
    routing += [*recorded_rows, *(row for row in replayed if row is not None)]
    routing.append(oracle_row(outcomes, tiers))
    routed = {}
    for row in routing:
        if row not in asked:
            routed[row.name] = route_row(row, outcomes, questions, tiers)
            continue
        with progress_bar(f"routing ({row.name})", len(questions)) as advance:  # an LLM call each
            def counted(question: Question, route: Callable[[Question], Any] = row.route) -> Any:
                advance(1)
                return route(question)

            routed[row.name] = route_row(replace(row, route=counted), outcomes, questions, tiers)
    if classifier is not None and trained is not None:  # a replayed row is not recorded again
        save_routes(routes_path, trained, routed[trained.name])
        console.print(f"adaptive row: classifier version {classifier.version.version}, routed "
                      f"{routed[trained.name].counts}; routes recorded in {routes_path}")
    for row in recorded_rows:
        if row.info.get("replayed"):
            continue
        save_routes(routes_path, row, routed[row.name])
        console.print(f"{row.name}: routed {routed[row.name].counts}; routes recorded in {routes_path}")
    others = [name for name in rows if name not in tiers]  # strategies that are no tier (ircot)
    order = [*tiers, *others, *(row.name for row in routing if row.name not in tiers)]
    by_name = {row.name: row for row in routing}
    new_rows = {name: routed[name].outcomes if name in routed else rows[name] for name in order}
    new_described = {
        name: ({"label": by_name[name].label or name, "kind": by_name[name].kind,
                "description": by_name[name].description, "info": dict(by_name[name].info),
                "routed": routed[name].counts} if name in by_name else described[name])
        for name in order
    }
    agreement = tier_agreement(
        {name: r.tiers for name, r in routed.items() if name != ORACLE}, routed[ORACLE].tiers,
    )
    adaptive_meta = _describe_classifier(trained.info) if trained is not None else None
    retrieval = retrieval_errors({name: r.tiers for name, r in routed.items()},
                                 cheapest_correct(outcomes, questions, tiers))
    return new_rows, new_described, absent, agreement, adaptive_meta, retrieval


def _describe_classifier(info: Mapping[str, Any]) -> str:
    """The header line of the adaptive row: which model version and thresholds made it."""
    thresholds = info.get("thresholds") or {}
    text = (f"classifier `{info.get('model')}` version {info.get('version')} "
            f"(quantization: {info.get('quantization')}), policy c_threshold "
            f"{thresholds.get('c_threshold')}, a_threshold {thresholds.get('a_threshold')} "
            f"({thresholds.get('note')}; {info.get('thresholds_file')})")
    return text + (f"; {info['replayed']}" if info.get("replayed") else "")


def _evaluate_support(
    out: Path, limit: int | None, fixed: str, data_dir: Path | None, multi_step: str | None,
    report_only: bool, split: str, min_score: float | None, auto_threshold: bool,
    reader_abstains: bool | None, kb: str = "all",
) -> None:
    """`arag eval --suite support`: the router and the fixed-tier rows on the support suite, per
    knowledge base (the COVID FAQ in OUT, the others in OUT/help_centre and OUT/quillbill)."""
    from adaptive_rag.evaluation.support import COVID_FAQ, FIXED_ROWS, ROUTER_ROW, evaluate_support
    from adaptive_rag.evaluation.support_kbs import KNOWLEDGE_BASES, build_knowledge_base_suite

    if split not in ("train", "test"):
        raise typer.BadParameter(f"--split is train or test, not {split!r}")
    if kb != "all" and kb not in KNOWLEDGE_BASES:
        raise typer.BadParameter(f"--kb is {', '.join(KNOWLEDGE_BASES)} or all, not {kb!r}")
    settings = load_settings(
        data_dir=data_dir, multi_step=multi_step, abstain_min_score=min_score,
        reader_abstains=reader_abstains,
    )
    rows = [ROUTER_ROW]
    for name in (n.strip().lower() for n in fixed.split(",") if n.strip()):
        row = {"a": "always_a", "b": "always_b", "c": "always_c", StrategyName.NO_RETRIEVAL: "always_a",
               StrategyName.SINGLE_STEP: "always_b", MULTI_STEP: "always_c"}.get(name, name)
        if row not in FIXED_ROWS:
            raise typer.BadParameter(f"support rows are tiers a, b, c; not {name!r}")
        if row not in rows:
            rows.append(row)
    meta = {
        "command": "arag eval " + shlex.join(a for a in sys.argv[2:] if a != "--report-only"),
        "machine": f"{platform.machine()}, {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d"),
    }
    checks = Table(title=f"per knowledge base, retrieval alone ({split} split, every question)")
    for column in ("knowledge base", "hit@5 in-KB", "abstained: caught", "false", "follow-up hit@5 / standalone: as typed", "rewritten"):
        checks.add_column(column)
    for name in (KNOWLEDGE_BASES if kb == "all" else (kb,)):
        where = out if name == COVID_FAQ else out / name.replace("-", "_")
        result = evaluate_support(
            settings, where, rows, split=split, limit=limit, run=not report_only,
            auto_threshold=auto_threshold, meta=meta, progress=progress_bar,
            suite=build_knowledge_base_suite(name, settings),
        )
        for path in result.paths:
            console.print(f"wrote {path}")
        table = Table(title=f"support suite: {name} ({split} split)")
        for column in ("row", "n", "F1 in-KB", "hit@5", "false abstain", "out-of-KB abstain", "tier acc", "s/query"):
            table.add_column(column)
        for row, data in result.report["rows"].items():
            o = data["overall"]
            cells = [o["f1"], o["hit_5"], o["false_abstain"], o["out_of_kb_abstain"], o["tier_accuracy"]]
            table.add_row(row, str(o["n"]), *("-" if c["mean"] is None else f"{100 * c['mean']:.1f}" for c in cells),
                          f"{o['seconds']['mean']:.2f}" if o["seconds"]["mean"] is not None else "-")
        console.print(table)
        found = result.report["knowledge_base"]
        fu = found["follow_ups_all_turns"].get("vs_standalone", {})
        pct = lambda cell: "-" if not cell else f"{100 * cell['estimate']:.1f}"  # noqa: E731
        hit_5 = (found["retrieval"].get("in_kb") or {}).get("hit_5") or {}
        checks.add_row(name, "-" if hit_5.get("mean") is None else f"{100 * hit_5['mean']:.1f}",
                       pct(found["abstention"]["caught"]), pct(found["abstention"]["false_abstain"]),
                       pct(fu.get("as_typed")), pct(fu.get("rewritten")))
    console.print(checks)


def _trained_classifier(version: int | None) -> tuple[LocalOnnxClassifier | None, str]:
    """The exported classifier for the "adaptive" row, or None and why when only untrained ones
    exist."""
    from adaptive_rag.routers.local_classifier import LocalOnnxClassifier
    from adaptive_rag.routing.model_repository import open_version, served_version, versions

    settings = load_classifier_settings()
    model_dir = settings.model_repository / settings.classifier_model
    served = served_version(model_dir)  # what users get first, then the newest trained one
    candidates = [version] if version is not None else sorted(
        versions(model_dir), key=lambda n: (n != served, -n))
    for number in candidates:
        chosen = open_version(settings.model_repository, settings.classifier_model, number)
        if version is not None or not chosen.untrained:
            return LocalOnnxClassifier(chosen), ""
    missing = f"no trained classifier version under {model_dir}"
    console.print(f"{missing}: no \"adaptive\" row unless its routes were recorded")
    return None, missing


GENERATOR_FILE = "generator.json"
UNCERTAINTY_KNOBS = "uncertainty_knobs"


def _uncertainty_knobs(settings) -> dict[str, Any]:
    return {"threshold": settings.uncertainty_threshold, "aggregate": settings.uncertainty_aggregate}


def _tuned_uncertainty(path: Path, reader: str) -> dict[str, Any]:
    """The settings `arag routers tune-uncertainty` chose, from its tuning.json, for this reader."""
    try:
        tuned = json.loads(path.read_text(encoding="utf-8"))
        chosen, made_for, split = tuned["chosen"], tuned["reader"], tuned["split"]
        values = {"uncertainty_threshold": float(chosen["threshold"]),
                  "uncertainty_aggregate": chosen["aggregate"]}
        if values["uncertainty_aggregate"] not in ("min", "mean") or not 0.0 <= values["uncertainty_threshold"] <= 1.0:
            raise ValueError(f"threshold {values['uncertainty_threshold']} / aggregate {values['uncertainty_aggregate']!r}")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise typer.BadParameter(f"--uncertainty-tuning {path}: not a tuning.json of "
                                 f"`arag routers tune-uncertainty` ({type(exc).__name__}: {exc})") from None
    if split != "train":
        raise typer.BadParameter(f"--uncertainty-tuning {path} was tuned on {split!r}; only `train` may choose it")
    if made_for != reader:
        raise typer.BadParameter(f"--uncertainty-tuning {path} was tuned for reader {made_for!r}, "
                                 f"this evaluation reads with {reader!r}")
    return values


def _recorded_uncertainty(out: Path, settings) -> dict[str, Any]:
    """The threshold and aggregate the uncertainty row ran with (as recorded), else the settings'."""
    path = out / GENERATOR_FILE
    recorded = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    return recorded.get(UNCERTAINTY_KNOBS) or _uncertainty_knobs(settings)


def _same_generator(out: Path, settings, names: Sequence[str] = ()) -> None:
    """Outcomes are resumed by (dataset, question, strategy): a results file made with another
    reader or other multi-step knobs must not be continued (its answers would count as done).
    The uncertainty strategy's threshold and aggregate are recorded once it runs, and held to
    from then on."""
    from adaptive_rag.settings import DEFAULT_KNOBS, strategy_knob

    made_with: dict[str, Any] = {
        "llm": settings.llm_base_url or str(settings.gguf_path or settings.reader),
        "multi_step_knobs": {name: strategy_knob(settings, name) for name in DEFAULT_KNOBS},
    }
    if StrategyName.UNCERTAINTY in names:
        made_with[UNCERTAINTY_KNOBS] = _uncertainty_knobs(settings)
    path = out / GENERATOR_FILE
    if path.is_file():
        recorded = json.loads(path.read_text(encoding="utf-8"))
        compared = {k: v for k, v in recorded.items() if k != UNCERTAINTY_KNOBS or k in made_with}
        wanted = {k: v for k, v in made_with.items() if k != UNCERTAINTY_KNOBS or k in recorded}
        if compared != wanted:
            raise typer.BadParameter(
                f"{out / 'results.jsonl'} was made with {recorded}, this run would use {made_with}: "
                "choose another --out (or remove that directory to start over)"
            )
        if UNCERTAINTY_KNOBS in made_with and UNCERTAINTY_KNOBS not in recorded:
            path.write_text(json.dumps({**recorded, **made_with}, indent=2) + "\n", encoding="utf-8")
        return
    if (out / "results.jsonl").is_file():
        raise typer.BadParameter(
            f"{out / 'results.jsonl'} has outcomes of an unrecorded generator: choose another --out"
        )
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(made_with, indent=2) + "\n", encoding="utf-8")


def retrieval_bench(
    out: Annotated[Path, typer.Option()] = Path("reports/retrieval"),
    data_dir: DataDir = None,
    retriever: Retr = None,
    index_dir: IndexDir = None,
    split: Annotated[str, typer.Option(help="test | train (tune on train, report test)")] = "test",
) -> None:
    """Recall@2/5/10 of gold supporting paragraphs (HotpotQA, 2Wiki, MuSiQue) and query latency."""
    from adaptive_rag.evaluation.datasets import load_questions
    from adaptive_rag.evaluation.retrieval_eval import percentile, query_latencies, recall_at_k
    from adaptive_rag.retrieval import open_retriever

    settings = load_settings(data_dir=data_dir, retriever=retriever, index_dir=index_dir)
    retr = open_retriever(settings)
    questions = load_questions(settings.data_dir, ["hotpotqa", "2wiki", "musique"], split=split)
    with progress_bar("recall@k", len(questions)) as advance:
        recall = recall_at_k(retr, questions, (2, 5, 10), advance)
    all_questions = [q.question for q in load_questions(settings.data_dir)]
    latencies = query_latencies(retr, all_questions[:2000], k=5)
    result = {
        "retriever": settings.retriever,
        "split": split,
        "title_boost": settings.title_boost,
        "recall": recall,
        "latency_ms": {
            "queries": len(latencies),
            "p50": 1000 * percentile(latencies, 50), "p95": 1000 * percentile(latencies, 95),
            "p99": 1000 * percentile(latencies, 99),
        },
        "command": "arag retrieval-bench " + shlex.join(sys.argv[2:]),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "retrieval.json").write_text(json.dumps(result, indent=2))
    table = Table(title=f"recall of gold supporting paragraphs ({settings.retriever})")
    for column in ("dataset", "recall@2", "recall@5", "recall@10"):
        table.add_column(column)
    for dataset, values in recall.items():
        table.add_row(dataset, *(f"{values[k]:.3f}" for k in (2, 5, 10)))
    console.print(table)
    lat = result["latency_ms"]
    console.print(f"query latency over {lat['queries']} queries: p50 {lat['p50']:.2f} ms, p95 {lat['p95']:.2f} ms, p99 {lat['p99']:.2f} ms")
