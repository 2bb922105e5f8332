"""Does the router learn a support domain from its own traffic? Replay help-centre questions
through the real service, give the feedback a support agent would, and let the retraining loop
(`arag relabel` + `arag retrain`) do the rest; measure routing before and after every round.

    .venv/bin/python -m lab.experiments.domain_adaptation               # 3 rounds: reports/domain_adaptation/
    .venv/bin/python -m lab.experiments.domain_adaptation --quick       # 1 round, 2 per kind, gemma-270m:
                                                                   # var/domain_adaptation/quick/report/
    .venv/bin/python -m lab.experiments.domain_adaptation --render DIR  # report.md + PNG again from DIR/report.json

The stack is the lab's (`lab.harness.stack`) on the demo's embedded defaults (local Triton, tier worker
pools A, B, C and shadow on the filesystem broker, the gRPC front door, SQLite), with
`ARAG_SHADOW_SHARE=1.0` so every answered query also runs on its neighbouring tier, a fresh model
repository holding the starting router as version 1 (the shipped bag-of-words router published
with `arag model ship`, or `--router`; fitted here with `arag routers fit-words` when the
repository ships none), a labels database (the stack's SQLite) seeded with the benchmark `train`
labels that router was fitted on (its label file + the binary fill), and the support suite's COVID
FAQ (`adaptive_rag.evaluation.support`) imported into tenant `support` through the KnowledgeBase
gRPC API. Single step abstains below the BM25 threshold chosen on the support `train` split, as
`arag eval --suite support` does (`--abstain-min-score`).

Measured before any round and after each: the served router's tier on every support `test` query
through the `Route` RPC (nothing runs), against the suite's gold tiers (tier accuracy with a
bootstrap 95 % interval, under-retrieval = routed to a cheaper tier than the gold one, over- =
to a dearer one), and its accuracy on the benchmark `test` labels (`arag eval --report-only
--classifier-version N` over a copy of an existing results directory, `--eval-dir`).

A round: `--per-kind` new support `train` queries of each kind through `Answer` (a unique
client_request_id each), then `SubmitFeedback` derived from the gold (`agent_feedback`: thumbs up
when the gold FAQ answer backs the answer - a yes/no that agrees with it, or at least
`--support-threshold` of the answer's content words in it -, for small talk
when a reply came, for out-of-KB questions when it abstained; thumbs down otherwise), then, once
every shadow run has finished, `arag relabel` and `arag retrain` (a challenger trained on the
`fit` part of every `train` label, promoted only when better on `validation`; then the tenant's
prior shift over the served version, kept only when it routes the tenant's live `train` labels
better under cross-validation), then the measurements again (once the front door routes with the
new version and prior).

Pure logic (feedback rule, tier accounting, paired changes, round bookkeeping, the report) is in
the functions above `# --- the service`, unit-tested in tests/unit/test_domain_adaptation.py.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from adaptive_rag.evaluation.metrics import f1_score, normalize_answer
from adaptive_rag.training.promotion import MIN_TENANT_LABELS
from adaptive_rag.training.splits import LIVE_SHARE, MAX_LIVE_REPEATS
from adaptive_rag.evaluation.support import (
    GOLD_TIER, JOINED, KINDS, SMALL_TALK, SupportQuery, mean_with_interval,
)

REPO = Path(__file__).resolve().parents[2]
ARAG = Path(sys.executable).with_name("arag")
TENANT = "support"
TIER_ORDER = ("A", "B", "C")
DEFAULT_SUPPORT_THRESHOLD = 0.6
MAX_BENCHMARK_DROP_POINTS = 1.0
DEFAULT_EVAL_DIR = REPO / "var" / "eval-qwen15"
DEFAULT_LABELS_DB = REPO / "var" / "labels-qwen15" / "labels.db"
SHIPPED_ROUTER = REPO / "models" / "router" / "router.json"
QUICK_READER = "gemma-270m"
# Variables that would point the stack somewhere other than its own fresh parts (labels database,
# model repository, Triton, router): this benchmark needs those to start empty / as described.
OWN_PARTS = ("DATABASE_URL", "TRITON_GRPC_URL", "TRITON_URL", "ARAG_TRITON_CONTROL_URLS", "ARAG_ROUTER",
             "ARAG_ROUTER_DIR")


# --- pure logic ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AgentVerdict:
    """The rating a support agent gives one answer, and why (`support`: the share of the answer
    the gold FAQ answer backs, `f1`: token F1 against it, where it was compared)."""

    rating: int  # 1 thumbs up, -1 thumbs down
    f1: float | None
    reason: str
    support: float | None = None


# Words that carry no claim: an answer is judged by the rest.
FILLER = frozenset(
    "a an the and or of to in on at for by with from as is are was were be been it its this that these "
    "those you your yours i we our they their he she his her can could should would may might will do does "
    "did not if then than so such also about into over only just very more most".split())
POLARITY = {"yes": 1, "no": -1}
NEGATIONS = ("no", "not", "never", "cannot", "dont", "doesnt", "isnt", "arent", "wont", "unlikely")
PREFIX = 4  # "stay" / "staying", "hand" / "hands": one word for the agent (words of 4+ letters)


def _claims(text: str) -> list[str]:
    return [t for t in normalize_answer(text).split() if t not in FILLER]


def _stem(token: str) -> str:
    return token[:PREFIX]


def gold_polarity(gold: str) -> int:
    """1 when the FAQ answer says yes, -1 when it says no or denies (a negation in its first
    sentence), 0 when it does not say."""
    words = normalize_answer(gold).split()
    if words and words[0] in POLARITY:
        return POLARITY[words[0]]
    first = normalize_answer(gold.split(".")[0]).split()
    return -1 if any(w in NEGATIONS for w in first) else 1 if first else 0


def supported_share(answer: str, gold: str) -> float:
    """The share of the answer's content words (filler dropped; a word of four letters or more
    matches one with the same first four) that the gold answer contains: a short, right answer scores 1 against a long FAQ
    entry, where token F1 punishes it for everything it leaves out."""
    claims = _claims(answer)
    if not claims:
        return 0.0
    words = set(normalize_answer(gold).split())
    stems = {_stem(w) for w in words if len(w) >= PREFIX}
    return sum(t in words or (len(t) >= PREFIX and _stem(t) in stems) for t in claims) / len(claims)


def agent_feedback(query: SupportQuery, answer: str | None, answerable: bool,
                   threshold: float = DEFAULT_SUPPORT_THRESHOLD) -> AgentVerdict:
    """What an agent who knows the FAQ says: up when the gold FAQ answer backs what the customer
    was told (a yes/no that agrees with it, or at least `threshold` of the answer's content words
    in it: `supported_share`), a reply to small talk, or an abstention on a question the FAQ does
    not cover; down for everything else, including a failed request (`answer` None: the customer
    got nothing). A joined question's gold is both parts' answers together, so a bare "yes"
    there is judged by its words like any answer (it backs nothing)."""
    if answer is None:
        return AgentVerdict(-1, None, "the request failed: no answer")
    if query.expect_abstain:
        if not answerable:
            return AgentVerdict(1, None, "abstained on a question the FAQ does not cover")
        return AgentVerdict(-1, None, "answered a question the FAQ does not cover")
    if query.kind == SMALL_TALK:
        if answerable and answer.strip():
            return AgentVerdict(1, None, "replied to small talk")
        return AgentVerdict(-1, None, "no reply to small talk")
    if not answerable or not answer.strip():
        return AgentVerdict(-1, 0.0, "abstained on a question the FAQ answers", 0.0)
    f1 = f1_score(answer, query.gold_answers)
    claims = _claims(answer)
    if query.kind != JOINED and len(claims) == 1 and claims[0] in POLARITY:
        if any(gold_polarity(gold) == POLARITY[claims[0]] for gold in query.gold_answers):
            return AgentVerdict(1, f1, f"'{claims[0]}' agrees with the FAQ", 1.0)
        return AgentVerdict(-1, f1, f"'{claims[0]}' is not what the FAQ says", 0.0)
    share = max(supported_share(answer, gold) for gold in query.gold_answers)
    if share >= threshold:
        return AgentVerdict(1, f1, f"{share:.0%} of the answer backed by the FAQ >= {threshold:.0%}", share)
    return AgentVerdict(-1, f1, f"{share:.0%} of the answer backed by the FAQ < {threshold:.0%}", share)


def retrieval_error(routed: str, gold: str) -> str:
    """`under` (a cheaper tier than the gold one: retrieval the answer needed is skipped),
    `over` (a dearer one: time spent for nothing) or `exact`."""
    diff = TIER_ORDER.index(routed) - TIER_ORDER.index(gold)
    return "under" if diff < 0 else "over" if diff > 0 else "exact"


@dataclass(frozen=True)
class RoutedQuery:
    """One support `test` query as the served router routed it (`Route`)."""

    query_id: str
    kind: str
    gold: str
    tier: str
    model_version: int = 0
    fallback: bool = False

    @property
    def correct(self) -> float:
        return float(self.tier == self.gold)


def summarise_routes(rows: Sequence[RoutedQuery]) -> dict[str, Any]:
    """Tier accuracy (mean + bootstrap 95 % interval), under / exact / over counts and the tiers
    routed to, overall and per query kind; which model versions decided and how many fallbacks."""
    def cell(items: Sequence[RoutedQuery]) -> dict[str, Any]:
        errors = Counter(retrieval_error(r.tier, r.gold) for r in items)
        routed = Counter(r.tier for r in items)
        return {"n": len(items), "accuracy": mean_with_interval([r.correct for r in items]),
                "under": errors["under"], "exact": errors["exact"], "over": errors["over"],
                "routed": {t: routed[t] for t in TIER_ORDER}}

    by_kind: dict[str, list[RoutedQuery]] = defaultdict(list)
    for row in rows:
        by_kind[row.kind].append(row)
    return {
        **cell(rows),
        "kinds": {kind: cell(by_kind[kind]) for kind in KINDS if by_kind.get(kind)},
        "model_versions": dict(sorted(Counter(r.model_version for r in rows).items())),
        "fallbacks": sum(r.fallback for r in rows),
    }


def paired_change(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, Any] | None:
    """Mean of after - before over the queries both hold, with a paired bootstrap 95 % interval
    (the same queries routed twice: only the router changed)."""
    deltas = [after[key] - before[key] for key in before if key in after]
    if not deltas:
        return None
    return {**mean_with_interval(deltas), "changed": sum(d != 0 for d in deltas)}


def change_wording(change: Mapping[str, Any] | None, what: str = "support-test tier accuracy") -> str:
    """One honest sentence about a paired change: improved / dropped only when the interval
    excludes 0, otherwise "no measurable change"."""
    if not change or change.get("mean") is None:
        return f"{what}: not measured"
    mean, low, high = (100 * change[k] for k in ("mean", "low", "high"))
    if not change.get("changed"):
        return f"{what} did not change: every query was routed as before"
    span = f"{mean:+.1f} points [{low:+.1f}, {high:+.1f}]"
    if low > 0:
        return f"{what} improved: {span} (paired bootstrap 95 % interval above 0)"
    if high < 0:
        return f"{what} dropped: {span} (paired bootstrap 95 % interval below 0)"
    return (f"{what} did not change measurably: {span}; the interval includes 0 "
            f"({change['changed']} of {change['n']} queries routed differently)")


def round_queries(train: Sequence[SupportQuery], round_index: int, per_kind: int) -> list[SupportQuery]:
    """Round `round_index`'s (0-based) share of the `train` queries: per kind the next
    `per_kind` in the given (stable, interleaved) order, so no query is replayed twice."""
    low, high = round_index * per_kind, (round_index + 1) * per_kind
    seen: Counter[str] = Counter()
    chosen = []
    for query in train:
        if low <= seen[query.kind] < high:
            chosen.append(query)
        seen[query.kind] += 1
    return chosen


def live_label_counts(labels: Iterable[Any], kind_of: Mapping[str, str]) -> dict[str, Any]:
    """Live labels (rows with `.label`, `.split`, `.request_id`) counted: in all, per split, per
    tier, per tier within `train` (what retraining learns from) and per query kind x tier (which
    tier each kind of support question is taught)."""
    rows = list(labels)
    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    for row in rows:
        by_kind[kind_of.get(row.request_id or "", "other")][row.label] += 1
    return {
        "total": len(rows),
        "train": sum(r.split == "train" for r in rows),
        "test": sum(r.split == "test" for r in rows),
        "by_tier": {t: sum(r.label == t for r in rows) for t in TIER_ORDER},
        "train_by_tier": {t: sum(r.label == t and r.split == "train" for r in rows) for t in TIER_ORDER},
        "by_kind": {k: {t: by_kind[k][t] for t in TIER_ORDER} for k in (*KINDS, "other") if k in by_kind},
    }


def benchmark_check(start: Mapping[str, Any] | None, now: Mapping[str, Any] | None,
                    max_drop_points: float = MAX_BENCHMARK_DROP_POINTS) -> dict[str, Any] | None:
    """The benchmark-test accuracy's change against the start (points) and whether it stayed
    within the allowed drop; None when either side was not measured."""
    if not start or not now:
        return None
    change = 100 * (now["estimate"] - start["estimate"])
    return {"start": start["estimate"], "now": now["estimate"], "n": now.get("n"),
            "change_points": change, "max_drop_points": max_drop_points,
            "pass": change >= -max_drop_points - 1e-9}


def eval_strategies(generator: Mapping[str, Any]) -> list[str]:
    """The A, B, C strategies of a results directory (its generator.json: the multi-step
    variant it ran as tier C)."""
    multi = (generator.get("multi_step_knobs") or {}).get("multi_step") or "ircot"
    return ["no_retrieval", "single_step", multi]


def last_json_object(text: str) -> dict[str, Any] | None:
    """The last top-level JSON object printed in `text` (what `arag retrain` ends with)."""
    lines = text.splitlines()
    for start in range(len(lines) - 1, -1, -1):
        if lines[start].startswith("{"):
            try:
                found = json.loads("\n".join(lines[start:]))
            except ValueError:
                continue
            return found if isinstance(found, dict) else None
    return None


def cumulative_labels(report: Mapping[str, Any]) -> list[int]:
    """Live labels collected at each measurement point (0 at the start, then after each round)."""
    return [0, *(r["live_labels"]["total"] for r in report.get("rounds", []))]


def gold_agreement(by_kind: Mapping[str, Mapping[str, int]]) -> tuple[int, int]:
    """(live labels equal to their query kind's gold tier, live labels of a known kind): whether
    the traffic teaches the tiers the suite calls right."""
    agree = total = 0
    for kind, tiers in by_kind.items():
        if kind in GOLD_TIER:
            agree += tiers.get(GOLD_TIER[kind].value, 0)
            total += sum(tiers.values())
    return agree, total


def in_sample_champion(held_out: Mapping[str, Any] | None, retrain: Mapping[str, Any] | None,
                       metric: str = "macro_f1", margin: float = 0.01) -> str | None:
    """A sentence when the starting router scored clearly better in promotion than on its own
    held-out validation: it was refitted on the labels promotion judges on, so the comparison
    favours it."""
    if not held_out or not retrain or retrain.get("champion_version") != 1:
        return None
    score, before = retrain.get("champion_score"), held_out.get(metric)
    if score is None or before is None or score <= before + margin:
        return None
    return (f"The starting router (v1) scored {100 * score:.1f} {metric} on promotion's validation labels but "
            f"{100 * before:.1f} when those were held out while its settings were chosen: `arag routers "
            "fit-words` refits on every `train` label, validation part included, so promotion compares a "
            "challenger that never saw the validation labels with a champion that was fitted on them.")


# --- report ------------------------------------------------------------------------------------------


def _pct(cell: Mapping[str, Any] | None) -> str:
    if not cell or cell.get("mean", cell.get("estimate")) is None:
        return "-"
    mean = cell.get("mean", cell.get("estimate"))
    return f"{100 * mean:.1f} [{100 * cell['low']:.1f}, {100 * cell['high']:.1f}]"


def _tiers(counts: Mapping[str, int] | None) -> str:
    return " / ".join(str((counts or {}).get(t, 0)) for t in TIER_ORDER)


def _verdict_cell(retrain: Mapping[str, Any] | None) -> str:
    if not retrain:
        return "-"
    status = retrain.get("status", "?")
    metric = retrain.get("metric") or "macro_f1"
    challenger, champion = retrain.get("challenger_score"), retrain.get("champion_score")
    if challenger is None or champion is None:
        return status
    cell = f"{status} ({metric} {100 * challenger:.1f} vs {100 * champion:.1f}"
    for tenant, check in (retrain.get("tenants") or {}).items():
        if check.get("champion") is not None:
            cell += (f"; {tenant}'s own {check['labels']} labels {100 * check['challenger']:.0f} vs "
                     f"{100 * check['champion']:.0f}{'' if check.get('checked') else ', too few to check'}")
    return cell + ")"


def _benchmark_cell(measure: Mapping[str, Any] | None) -> str:
    acc = (measure or {}).get("accuracy")
    return f"{_pct(acc)} (n={acc['n']})" if acc else "-"


def _check_cell(check: Mapping[str, Any] | None) -> str:
    if not check:
        return "-"
    return f"{check['change_points']:+.1f} ({'pass' if check['pass'] else 'FAIL'})"


def render_markdown(report: Mapping[str, Any]) -> str:
    """report.md: the setup, an honest summary, the per-round table, per-kind accuracy, what the
    replay taught, and the definitions."""
    meta, start, rounds = report["meta"], report["start"], report.get("rounds", [])
    lines = ["# Domain adaptation: does the router learn a support domain from its traffic?", "",
             f"Command: `{meta.get('command', '')}`", ""]
    for key in ("date", "machine", "reader", "stack", "starting_router", "seeded_labels", "shadow_share",
                "support_threshold", "abstain_min_score", "per_kind", "rounds", "retrain", "eval_dir"):
        if key in meta:
            lines.append(f"- {key.replace('_', ' ')}: {meta[key]}")
        held_out = meta.get("starting_router_validation")
        if key == "starting_router" and held_out:
            lines.append(f"- starting router's validation when fitted (held out while choosing its settings): "
                         f"accuracy {100 * held_out['accuracy']:.1f} %, macro-F1 {100 * held_out['macro_f1']:.1f} % "
                         f"on {held_out['n']} labels")
    lines += [""]
    for note in meta.get("notes", []):
        lines.append(f"> {note}")
    if meta.get("notes"):
        lines.append("")
    lines += ["## Summary", ""]
    lines += [f"- {s}" for s in report.get("summary", [])]
    lines += ["", "## Per round", "",
              "Support test: tier accuracy against the suite's gold tiers, every `test` query routed with "
              "`Route` (bootstrap 95 % interval); under / over: routed to a cheaper / dearer tier than the gold "
              "one. Benchmark test: the served version's accuracy on the benchmark `test` labels (`arag eval "
              f"--report-only`), and its change in points against the start (allowed: a drop of at most "
              f"{MAX_BENCHMARK_DROP_POINTS:g} point).", "",
              "| round | live labels (new) | live labels A / B / C | retrain verdict (validation) | served | "
              "tenant prior (cross-validated vs champion, on its live `train` labels) | "
              "support-test accuracy | under | over | change vs start | benchmark-test accuracy | "
              "change (points) | wall time |",
              "| --- | ---: | ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    s = start["support"]
    lines.append(f"| start | 0 | - | - | v{start.get('served_version')} | - | {_pct(s['accuracy'])} | {s['under']} | "
                 f"{s['over']} | - | {_benchmark_cell(start.get('benchmark'))} | - | "
                 f"{start.get('seconds', 0):.0f} s |")
    for r in rounds:
        s, labels = r["support"], r["live_labels"]
        change = r.get("support_change")
        change_text = (f"{100 * change['mean']:+.1f} [{100 * change['low']:+.1f}, {100 * change['high']:+.1f}]"
                       if change else "-")
        lines.append(
            f"| {r['round']} | {labels['total']} ({r.get('new_labels', 0)}) | {_tiers(labels['by_tier'])} | "
            f"{_verdict_cell(r.get('retrain'))} | v{r.get('served_version')} | {_prior_cell(r.get('retrain'))} | "
            f"{_pct(s['accuracy'])} | "
            f"{s['under']} | {s['over']} | {change_text} | {_benchmark_cell(r.get('benchmark'))} | "
            f"{_check_cell(r.get('benchmark_check'))} | {r['seconds']['total']:.0f} s |")
    points = [("start", start), *((f"round {r['round']}", r) for r in rounds)]
    lines += ["", "## Support-test tier accuracy per query kind", "",
              "| kind (gold tier) | n | " + " | ".join(name for name, _ in points) + " |",
              "| --- | ---: | " + " | ".join("---:" for _ in points) + " |"]
    for kind in KINDS:
        cells = [p["support"]["kinds"].get(kind) for _, p in points]
        if not any(cells):
            continue
        n = next(c["n"] for c in cells if c)
        row = [f"{_pct(c['accuracy'])} ({_tiers(c['routed'])})" if c else "-" for c in cells]
        lines.append(f"| {kind} ({GOLD_TIER[kind].value}) | {n} | " + " | ".join(row) + " |")
    lines += ["", "Each cell: accuracy [interval] (queries routed A / B / C).", ""]
    if rounds:
        lines += ["## What the replay taught", "",
                  "Per round: the support `train` queries answered, the agent's thumbs up / down, the mean token "
                  "F1 of in-KB answers against the gold FAQ answer, the tiers the router chose while answering, and "
                  "the live labels `arag relabel` made of them (cumulative, per kind: A / B / C).", "",
                  "| round | queries | failed | shadow runs missing | up / down | mean F1 (in-KB) | routed A / B / C | "
                  "labels per kind (A / B / C) | retrain | times (s) |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |"]
        for r in rounds:
            replay = r["replay"]
            kinds = "; ".join(f"{k} {_tiers(v)}" for k, v in r["live_labels"]["by_kind"].items())
            f1 = replay.get("mean_f1")
            retrain = r.get("retrain") or {}
            extra = []
            if retrain.get("challenger_version"):
                extra.append(f"challenger v{retrain['challenger_version']}")
            if retrain.get("fit") is not None:
                extra.append(f"fit {retrain['fit']}, validation {retrain.get('validation')}")
            if retrain.get("validation_counts"):
                extra.append(f"validation A / B / C {_tiers(retrain['validation_counts'])}")
            if retrain.get("reason"):
                extra.append(retrain["reason"])
            times = ", ".join(f"{k} {v:.0f}" for k, v in r["seconds"].items() if k != "total")
            lines.append(
                f"| {r['round']} | {replay['queries']} | {replay['failed']} | {replay['shadow_missing']} | "
                f"{replay['up']} / {replay['down']} | {'-' if f1 is None else f'{100 * f1:.1f}'} | "
                f"{_tiers(replay['routed'])} | {kinds} | {'; '.join(extra) or '-'} | {times} |")
        lines.append("")
    lines += ["## Definitions", "",
              "- Gold tiers (the support suite): paraphrase B, faq B, small_talk A, joined C, out_of_kb B (must "
              "abstain). Small talk is tier A at admission (the small-talk detector), before any router.",
              f"- Feedback (`agent_feedback`): thumbs up when the gold FAQ answer backs the answer: a yes/no that "
              f"agrees with the FAQ's, or at least {meta.get('support_threshold_value', DEFAULT_SUPPORT_THRESHOLD):.0%} "
              "of the answer's content words found in it (max over duplicate entries; a joined question's two "
              "answers concatenated), for small talk when a reply came, for out-of-KB "
              "questions when the service abstained; thumbs down otherwise (also for a failed request).",
              "- Live labels (`arag relabel`): the cheapest tier known right; with thumbs only, a shadow run "
              "counts as right only when its answer is the same text as the primary's. A thumbs down on A "
              "teaches B, on B (its C shadow said something else) teaches C; never past a failing C: B and C "
              "both wrong teaches B, C alone known wrong teaches nothing. Live labels go 60/40 to train/test "
              "by a hash of the question; only `train` ones reach retraining.",
              "- Retraining (`arag retrain`): a challenger trained on the `fit` part of every `train` label "
              "(the seeded benchmark labels + live ones, each live label repeated so live labels make up to "
              f"{LIVE_SHARE:.0%} of what it learns from, at most {MAX_LIVE_REPEATS} times), promoted only when "
              "its validation score (macro-F1) beats the served version's and it routes the tenant's own "
              f"validation labels at least as accurately (checked from {MIN_TENANT_LABELS} such labels); "
              "otherwise the served router stays.",
              "- Tenant prior (`adaptive_rag.training.tenant_adaptation`, after every verdict): offsets on the "
              "served version's log-probabilities for A and C (B fixed), fitted by penalised maximum likelihood "
              "on the tenant's live `train` labels (small talk left out); kept only when its tier accuracy under "
              "5-fold cross-validation by question beats the current prior's (none at first) on the same "
              "labels. It changes this tenant's routing only: the benchmark test is routed without it.",
              "- Changes against the start are paired (the same test queries): mean difference of per-query "
              "correctness with a bootstrap 95 % interval.", ""]
    if report.get("plot"):
        lines += [f"![support-test tier accuracy against live labels]({report['plot']})", ""]
    return "\n".join(lines)


def plot_rounds(report: Mapping[str, Any], path: Path) -> None:
    """Support-test tier accuracy (interval bars; per kind in thin lines) and, when measured, the
    benchmark-test accuracy against the live labels collected, one point per measurement."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [report["start"], *report.get("rounds", [])]
    labels = cumulative_labels(report)
    names = ["start", *(f"r{r['round']} {(r.get('retrain') or {}).get('status', '')}".strip()
                        for r in report.get("rounds", []))]
    bench = [p.get("benchmark", {}) or {} for p in points]
    has_bench = any(b.get("accuracy") for b in bench)
    fig, axes = plt.subplots(1, 2 if has_bench else 1, figsize=(11 if has_bench else 6, 4.2), squeeze=False)
    left = axes[0][0]
    for kind in KINDS:
        ys = [100 * p["support"]["kinds"][kind]["accuracy"]["mean"] if kind in p["support"]["kinds"] else None
              for p in points]
        if all(y is not None for y in ys):
            left.plot(labels, ys, lw=0.8, alpha=0.5, marker=".", label=f"{kind} ({GOLD_TIER[kind].value})")
    acc = [p["support"]["accuracy"] for p in points]
    ys = [100 * a["mean"] for a in acc]
    left.errorbar(labels, ys, yerr=[[y - 100 * a["low"] for y, a in zip(ys, acc)],
                                    [100 * a["high"] - y for y, a in zip(ys, acc)]],
                  fmt="o-", color="black", capsize=4, lw=2, label="all test queries")
    for x, y, name in zip(labels, ys, names):
        left.annotate(name, (x, y), fontsize=8, xytext=(4, -12), textcoords="offset points")
    left.set_xlabel("live labels collected")
    left.set_ylabel("support-test tier accuracy (%)")
    left.set_title("support test (Route), 95 % bootstrap interval")
    left.set_ylim(-2, 102)
    left.grid(alpha=0.3)
    left.legend(fontsize=7, loc="lower left")
    if has_bench:
        right = axes[0][1]
        xs = [x for x, b in zip(labels, bench) if b.get("accuracy")]
        cells = [b["accuracy"] for b in bench if b.get("accuracy")]
        ys = [100 * c["estimate"] for c in cells]
        right.errorbar(xs, ys, yerr=[[y - 100 * c["low"] for y, c in zip(ys, cells)],
                                     [100 * c["high"] - y for y, c in zip(ys, cells)]],
                       fmt="s-", color="tab:blue", capsize=4)
        if bench[0].get("accuracy"):
            floor = 100 * bench[0]["accuracy"]["estimate"] - MAX_BENCHMARK_DROP_POINTS
            right.axhline(floor, ls="--", color="tab:red", lw=1, label=f"start - {MAX_BENCHMARK_DROP_POINTS:g} point")
            right.legend(fontsize=7)
        right.set_xlabel("live labels collected")
        right.set_ylabel("benchmark-test accuracy (%)")
        right.set_title(f"benchmark test labels (n={cells[0]['n']})")
        right.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


PLOT_FILE = "accuracy_vs_labels.png"


def write_report(report: dict[str, Any], out: Path) -> list[Path]:
    """report.json, report.md and the PNG in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    report["plot"] = PLOT_FILE
    plot_rounds(report, out / PLOT_FILE)
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n", encoding="utf-8")
    (out / "report.md").write_text(render_markdown(report), encoding="utf-8")
    return [out / "report.json", out / "report.md", out / PLOT_FILE]


def summary_lines(report: Mapping[str, Any]) -> list[str]:
    """The report's summary: where support-test accuracy started and ended (paired change, in
    honest words), every retrain verdict, and the benchmark-test check per round."""
    start, rounds = report["start"], report.get("rounds", [])
    lines = [f"Start (v{start.get('served_version')}): support-test tier accuracy {_pct(start['support']['accuracy'])} "
             f"%, under {start['support']['under']}, over {start['support']['over']} of {start['support']['n']}."]
    if not rounds:
        return lines + ["No round ran."]
    last = rounds[-1]
    lines.append(f"After round {last['round']} (v{last.get('served_version')}, {last['live_labels']['total']} live "
                 f"labels, {last['live_labels']['train']} of them in `train`): {_pct(last['support']['accuracy'])} %, "
                 f"under {last['support']['under']}, over {last['support']['over']}; "
                 + change_wording(last.get("support_change")) + ".")
    verdicts = ", ".join(f"round {r['round']} {(r.get('retrain') or {}).get('status', '-')}" for r in rounds)
    lines.append(f"Retrain verdicts: {verdicts}.")
    priors = [(r["round"], tenant_prior(r.get("retrain"))) for r in rounds]
    if any(p for _, p in priors):
        lines.append("Tenant prior verdicts: " + ", ".join(
            f"round {n} {_prior_cell({'tenant_priors': [p]}) if p else '-'}" for n, p in priors) + ".")
    if not any(r.get("benchmark_check") for r in rounds):
        lines.append("Benchmark-test accuracy: not measured (no results directory).")
    else:
        checks = [f"round {r['round']} {_check_cell(r.get('benchmark_check'))}" for r in rounds]
        failed = [r for r in rounds if r.get("benchmark_check") and not r["benchmark_check"]["pass"]]
        lines.append(f"Benchmark-test accuracy change against the start (points; must not drop by more than "
                     f"{MAX_BENCHMARK_DROP_POINTS:g}): " + ", ".join(checks) + ("." if not failed else
                     f"; FAILED in {len(failed)} round(s)."))
    agree, known = gold_agreement(last["live_labels"].get("by_kind", {}))
    if known:
        lines.append(f"Live labels equal to the suite's gold tier of their query kind: {agree} of {known}; the "
                     "others teach the router a tier the suite calls wrong.")
    retrain = last.get("retrain") or {}
    if retrain.get("fit") is not None:
        used = retrain["fit"] + (retrain.get("validation") or 0)
        lines.append(f"Live `train` labels were {last['live_labels']['train']} of the {used} `train` labels of "
                     f"the last retrain ({100 * last['live_labels']['train'] / max(used, 1):.1f} %); the rest are "
                     "the seeded benchmark labels, and promotion's validation part is drawn from all of them.")
    note = next((n for n in (in_sample_champion(report["meta"].get("starting_router_validation"), r.get("retrain"))
                             for r in rounds) if n), None)
    if note:
        lines.append(note)
    promoted_prior = any((tenant_prior(r.get("retrain")) or {}).get("verdict") == "promoted" for r in rounds)
    if all((r.get("retrain") or {}).get("status") != "promoted" for r in rounds) and not promoted_prior:
        lines.append("Neither a challenger nor a tenant prior was promoted, so routing never changed: the "
                     "support-test figures after each round are the starting router's.")
    return lines


# --- the service ----------------------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


@dataclass
class AnswerOutcome:
    """What `Answer` gave for one query (`code` OK, or the final gRPC status)."""

    code: str
    request_id: str | None = None
    tier: str | None = None
    strategy: str = ""
    answer: str | None = None
    answerable: bool = False
    model_version: int = 0
    fallback: bool = False
    seconds: float = 0.0
    detail: str = ""


class SupportClient:
    """A gRPC client of the front door on the stubs generated from the .proto: `Answer` (with the
    documented retries: UNAVAILABLE / RESOURCE_EXHAUSTED -> the same client_request_id again after
    `retry-after`; DEADLINE_EXCEEDED -> `GetResult` with the `x-request-id` trailer),
    `SubmitFeedback` and `Route`."""

    def __init__(self, channel: Any, api_key: str, call_timeout_s: float = 600.0, budget_s: float = 1200.0) -> None:
        from services.frontdoor.stubs import pb2, pb2_grpc

        self.pb2 = pb2
        self.stub = pb2_grpc.AdaptiveRagStub(channel)
        self.metadata = (("authorization", f"Bearer {api_key}"),)
        self.call_timeout_s = call_timeout_s
        self.budget_s = budget_s

    @staticmethod
    def _trailer(call: Any, key: str) -> str | None:
        try:
            return next((v for k, v in (call.trailing_metadata() or ()) if k == key), None)
        except Exception:  # noqa: BLE001 - no metadata on a call that never reached the server
            return None

    def _tier(self, value: int) -> str | None:
        return self.pb2.Tier.Name(value)[-1] if value else None

    def _outcome(self, reply: Any, started: float) -> AnswerOutcome:
        return AnswerOutcome("OK", reply.request_id, self._tier(reply.tier), reply.strategy, reply.answer,
                             reply.answerable, reply.classifier.model_version, reply.classifier.fallback,
                             time.perf_counter() - started)

    def answer(self, text: str, client_request_id: str) -> AnswerOutcome:
        import grpc

        started = time.perf_counter()
        deadline = time.monotonic() + self.budget_s
        request = self.pb2.AnswerRequest(query_text=text, client_request_id=client_request_id)
        while True:
            left = deadline - time.monotonic()
            try:
                reply, _ = self.stub.Answer.with_call(request, timeout=max(1.0, min(self.call_timeout_s, left)),
                                                      metadata=self.metadata)
                return self._outcome(reply, started)
            except grpc.RpcError as exc:
                code, request_id = exc.code().name, self._trailer(exc, "x-request-id")
                if code in ("UNAVAILABLE", "RESOURCE_EXHAUSTED") and left > 5:
                    time.sleep(float(self._trailer(exc, "retry-after") or 2.0))
                    continue
                if code == "DEADLINE_EXCEEDED" and request_id and left > 5:
                    return self._poll(request_id, deadline, started)
                return AnswerOutcome(code, request_id, seconds=time.perf_counter() - started,
                                     detail=(exc.details() or "")[:300])

    def _poll(self, request_id: str, deadline: float, started: float) -> AnswerOutcome:
        import grpc

        code, detail = "DEADLINE_EXCEEDED", ""
        while time.monotonic() < deadline:
            try:
                reply = self.stub.GetResult(self.pb2.GetResultRequest(request_id=request_id), timeout=30,
                                            metadata=self.metadata)
                return self._outcome(reply, started)
            except grpc.RpcError as exc:
                code, detail = exc.code().name, (exc.details() or "")[:300]
                if code not in ("FAILED_PRECONDITION", "UNAVAILABLE", "DEADLINE_EXCEEDED"):
                    break
                time.sleep(2.0)
        return AnswerOutcome(code, request_id, seconds=time.perf_counter() - started, detail=detail)

    def feedback(self, request_id: str, rating: int, comment: str = "") -> int:
        reply = self.stub.SubmitFeedback(
            self.pb2.FeedbackRequest(request_id=request_id, rating=rating, comment=comment[:500]),
            timeout=30, metadata=self.metadata)
        return reply.feedback_id

    def route(self, text: str) -> Any:
        return self.stub.Route(self.pb2.RouteRequest(query_text=text), timeout=30, metadata=self.metadata)


def run_cli(args: Sequence[str], env: Mapping[str, str], log_path: Path, timeout_s: float = 4 * 3600) -> tuple[int, str]:
    """An `arag` command as a deployment runs it (its own process); output kept in `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([str(ARAG), *args], env=dict(env), cwd=REPO, capture_output=True, text=True,
                          timeout=timeout_s, stdin=subprocess.DEVNULL)
    output = done.stdout + ("\n" + done.stderr if done.stderr.strip() else "")
    log_path.write_text(f"$ arag {shlex.join(args)}\n{output}\n(exit {done.returncode})\n", encoding="utf-8")
    return done.returncode, done.stdout


@dataclass
class StartingRouter:
    path: Path
    labels_file: Path | None
    how: str

    def held_out_validation(self) -> dict[str, Any] | None:
        """The validation figures on its card: measured while choosing its settings, before the
        refit on every label (so held out then)."""
        try:
            return json.loads(self.path.read_text(encoding="utf-8"))["card"]["validation"]
        except (OSError, ValueError, KeyError):
            return None


def starting_router(args: argparse.Namespace, scratch: Path, env: Mapping[str, str]) -> StartingRouter:
    """`--router`, else the router the repository ships, else one fitted here with `arag routers
    fit-words` on the labels database `--labels-db` (a copy; binary fill for the rest), or on the
    binary fill alone when there is none."""
    def labels_beside(path: Path) -> Path | None:
        found = path.parent / "labels.jsonl"
        return found if found.is_file() else None

    if args.router is not None:
        path = args.router / "router.json" if args.router.is_dir() else args.router
        if not path.is_file():
            raise SystemExit(f"--router: no router.json at {args.router}")
        return StartingRouter(path.resolve(), labels_beside(path), f"--router {args.router}")
    if SHIPPED_ROUTER.is_file():
        return StartingRouter(SHIPPED_ROUTER, labels_beside(SHIPPED_ROUTER),
                              f"the shipped router {SHIPPED_ROUTER.relative_to(REPO)}")
    out = scratch / "router"
    fit = ["routers", "fit-words", "--out", str(out), "--data-dir", str(args.data_dir)]
    if args.labels_db.is_file():
        copy = scratch / "labels-source.db"
        shutil.copyfile(args.labels_db, copy)  # fit-words migrates the database it reads: not the original
        fit += ["--database-url", f"sqlite:///{copy}"]
        source = args.labels_db.relative_to(REPO) if args.labels_db.is_relative_to(REPO) else args.labels_db
        how = (f"none shipped (no {SHIPPED_ROUTER.relative_to(REPO)}): fitted here with `arag routers fit-words` "
               f"on the labels of {source} (a copy) + the binary fill")
    else:
        empty = scratch / "no-labels.jsonl"
        empty.write_text("", encoding="utf-8")
        fit += ["--labels-file", str(empty)]
        how = (f"none shipped and no labels database at {args.labels_db}: fitted here with `arag routers "
               "fit-words` on the binary fill alone (every benchmark `train` question labelled by its dataset's bias)")
    code, _ = run_cli(fit, env, scratch / "logs" / "fit-words.log", timeout_s=1800)
    if code != 0:
        raise SystemExit(f"arag routers fit-words failed: see {scratch / 'logs' / 'fit-words.log'}")
    return StartingRouter(out / "router.json", labels_beside(out / "router.json"), how)


def seed_labels(engine: Any, labels_file: Path | None, data_dir: Path) -> dict[str, Any]:
    """The starting router's `train` labels into the labels database: its label file (what the
    reader was run on) + a binary label for every other benchmark `train` question, exactly what
    `arag routers fit-words` fits on."""
    from adaptive_rag.cli.routers import binary_labels
    from adaptive_rag.storage.db import session_factory
    from adaptive_rag.storage.labels import read_label_file

    rows = [r for r in read_label_file(labels_file) if r.split == "train"] if labels_file else []
    from_file = len(rows)
    rows += binary_labels(data_dir, {(r.dataset, r.question_id) for r in rows})
    with session_factory(engine)() as session:
        session.add_all(rows)
        session.commit()
    return {"from_label_file": from_file, "binary_fill": len(rows) - from_file, "total": len(rows),
            "by_tier": dict(sorted(Counter(r.label for r in rows).items())),
            "sources": dict(sorted(Counter(r.label_source for r in rows).items()))}


def auto_abstain_threshold(suite: Any, settings: Any) -> dict[str, Any] | None:
    """The BM25 threshold below which single step abstains, best by Youden's J on the support
    `train` split (as `arag eval --suite support` chooses it; retrieval only, no `test` query)."""
    import tempfile

    from adaptive_rag.evaluation.support import HIT_K, threshold_sweep
    from adaptive_rag.retrieval.tantivy_index import TantivyRetriever

    with tempfile.TemporaryDirectory(prefix="arag-domain-kb-") as work:
        index = TantivyRetriever.build(Path(work) / "index", suite.passages, title_boost=settings.title_boost)
        sweep = threshold_sweep(suite.select("train"), index, max(HIT_K, settings.top_k))
    return sweep["best"]


def wait_for_version(client: SupportClient, version: int, probe: str, timeout_s: float = 180.0,
                     prior_revision: int | None = None) -> bool:
    """Route `probe` until the served `version` decides it (the front door polls served.json) and,
    with `prior_revision`, with that revision of the tenant's prior (it polls the priors file too)."""
    deadline = time.monotonic() + timeout_s
    wanted = f"tenant prior r{prior_revision}:" if prior_revision else None
    while time.monotonic() < deadline:
        try:
            reply = client.route(probe)
            if (reply.classifier.model_version == version and not reply.classifier.fallback
                    and (wanted is None or wanted in reply.classifier.reason)):
                return True
        except Exception:  # noqa: BLE001 - the front door may be switching: ask again
            pass
        time.sleep(1.0)
    return False


def measure_support(client: SupportClient, queries: Sequence[SupportQuery],
                    sink: Path) -> tuple[dict[str, Any], dict[str, float]]:
    """Every support `test` query through `Route`: the summary and per-query correctness."""
    rows = []
    with sink.open("w", encoding="utf-8") as out:
        for query in queries:
            reply = client.route(query.query)
            row = RoutedQuery(query.id, query.kind, query.gold_tier.value, client.pb2.Tier.Name(reply.tier)[-1],
                              reply.classifier.model_version, reply.classifier.fallback)
            rows.append(row)
            out.write(json.dumps(asdict(row)) + "\n")
    return summarise_routes(rows), {r.query_id: r.correct for r in rows}


@dataclass
class EvalSource:
    """A snapshot of an evaluation results directory and how to report over it."""

    snapshot: Path
    strategies: list[str]
    reader: str | None
    outcomes: int


def snapshot_eval_dir(eval_dir: Path, scratch: Path) -> EvalSource | None:
    """Copy results.jsonl + generator.json once (the evaluation may still be writing), so every
    measurement routes the same questions; None when there is nothing to report over."""
    results = eval_dir / "results.jsonl"
    if not results.is_file():
        return None
    snapshot = scratch / "eval-snapshot"
    snapshot.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(results, snapshot / "results.jsonl")
    generator = {}
    if (eval_dir / "generator.json").is_file():
        shutil.copyfile(eval_dir / "generator.json", snapshot / "generator.json")
        generator = json.loads((eval_dir / "generator.json").read_text(encoding="utf-8"))
    lines = sum(1 for line in (snapshot / "results.jsonl").read_text(encoding="utf-8").splitlines() if line.strip())
    return EvalSource(snapshot, eval_strategies(generator), generator.get("llm"), lines)


def measure_benchmark(source: EvalSource | None, version: int, tag: str, scratch: Path, data_dir: Path,
                      env: Mapping[str, str]) -> dict[str, Any] | None:
    """`arag eval --report-only --classifier-version N` over a fresh copy of the snapshot: the
    version's accuracy on the benchmark `test` labels (tier_agreement["adaptive"]) and its
    under- / over-retrieval there."""
    if source is None:
        return None
    out = scratch / "eval" / tag
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for name in ("results.jsonl", "generator.json"):
        if (source.snapshot / name).is_file():
            shutil.copyfile(source.snapshot / name, out / name)
    no_routers = scratch / "eval" / "no-routers"  # learned routers under var/routers would add rows
    no_routers.mkdir(parents=True, exist_ok=True)
    run_env = {**env, **({"ARAG_READER": source.reader} if source.reader else {})}
    code, _ = run_cli(["eval", "--report-only", "--out", str(out), "--data-dir", str(data_dir),
                       "--strategies", ",".join(source.strategies), "--multi-step", source.strategies[2],
                       "--classifier-version", str(version), "--routers", str(no_routers)],
                      run_env, scratch / "logs" / f"eval-{tag}.log", timeout_s=1800)
    report_path = out / "report.json"
    if code != 0 or not report_path.is_file():
        return {"error": f"arag eval --report-only exited {code}: see {scratch / 'logs' / f'eval-{tag}.log'}"}
    report = json.loads(report_path.read_text(encoding="utf-8"))
    cell = (report.get("tier_agreement") or {}).get("adaptive")
    if not cell:
        return {"error": "the report has no adaptive row", "absent": (report.get("meta") or {}).get("absent_rows")}
    return {"version": version, "accuracy": cell["accuracy"], "routed": cell.get("routed"),
            "retrieval_errors": (report.get("retrieval_errors") or {}).get("adaptive"),
            "adaptive_row": (report.get("meta") or {}).get("adaptive_row")}


def pending_shadows(engine: Any, request_ids: Iterable[str]) -> set[str]:
    """The requests among `request_ids` whose shadow run has no result row yet."""
    from sqlalchemy import select

    from adaptive_rag.contracts import ResultKind
    from adaptive_rag.storage.db import session_factory
    from adaptive_rag.storage.models import QueryResult

    wanted = set(request_ids)
    if not wanted:
        return set()
    with session_factory(engine)() as session:
        done = set(session.scalars(select(QueryResult.request_id).where(
            QueryResult.kind == ResultKind.SHADOW.value, QueryResult.request_id.in_(list(wanted)))))
    return wanted - done


def replay_round(client: SupportClient, queries: Sequence[SupportQuery], round_no: int, run_id: str,
                 threshold: float, sink: Path) -> list[dict[str, Any]]:
    """Answer each query, then rate the answer as the agent would (`agent_feedback`)."""
    rows = []
    with sink.open("a", encoding="utf-8") as out:
        for number, query in enumerate(queries, 1):
            outcome = client.answer(query.query, f"da-{run_id}-r{round_no}-{query.id}")
            verdict = agent_feedback(query, outcome.answer if outcome.code == "OK" else None,
                                     outcome.answerable, threshold)
            feedback_id = None
            if outcome.request_id:
                feedback_id = client.feedback(outcome.request_id, verdict.rating, f"support agent: {verdict.reason}")
            row = {"round": round_no, "query_id": query.id, "kind": query.kind, "gold": query.gold_tier.value,
                   **asdict(outcome), "rating": verdict.rating, "f1": verdict.f1, "support": verdict.support,
                   "reason": verdict.reason,
                   "feedback_id": feedback_id}
            rows.append(row)
            out.write(json.dumps(row) + "\n")
            out.flush()
            log(f"  round {round_no} {number}/{len(queries)} {query.kind:<10} {outcome.code} tier {outcome.tier} "
                f"({outcome.strategy or '-'}) {outcome.seconds:5.1f} s -> {'up' if verdict.rating > 0 else 'down'} "
                f"({verdict.reason})")
    return rows


def replay_summary(rows: Sequence[Mapping[str, Any]], shadow_missing: int) -> dict[str, Any]:
    """What one round's replay did: queries, failures, thumbs, mean in-KB F1, tiers routed."""
    f1s = [r["f1"] for r in rows if r.get("f1") is not None]
    routed = Counter(r["tier"] for r in rows if r.get("tier"))
    return {"queries": len(rows), "per_kind": dict(Counter(r["kind"] for r in rows)),
            "failed": sum(r["code"] != "OK" for r in rows), "shadow_missing": shadow_missing,
            "up": sum(r["rating"] > 0 for r in rows), "down": sum(r["rating"] < 0 for r in rows),
            "mean_f1": sum(f1s) / len(f1s) if f1s else None,
            "routed": {t: routed[t] for t in TIER_ORDER},
            "answer_seconds": sum(r["seconds"] for r in rows)}


def retrain_summary(record: Any, printed: Mapping[str, Any] | None) -> dict[str, Any]:
    """The verdict from `model_promotions` (both validation scores of the chosen metric), plus
    accuracy and macro-F1 of both as `arag retrain` printed them."""
    data: dict[str, Any] = {}
    if record is not None:
        data.update({k: getattr(record, k) for k in (
            "verdict", "reason", "challenger_version", "champion_version", "served_version", "metric",
            "challenger_score", "champion_score", "validation_counts", "new_labels")})
        data["status"] = data.pop("verdict")
        details = getattr(record, "details", None) or {}
        data.update({k: details[k] for k in ("family", "tenants", "tenant_priors") if k in details})
    if printed:
        data.setdefault("status", printed.get("status"))
        data.setdefault("reason", printed.get("reason"))
        data.update({k: printed.get(k) for k in ("fit", "validation", "challenger", "champion") if k in printed})
        data.setdefault("family", printed.get("family"))
        data.setdefault("tenant_priors", printed.get("tenant_priors"))
    return data


def tenant_prior(retrain: Mapping[str, Any] | None, tenant: str = TENANT) -> dict[str, Any] | None:
    """The retrain's verdict on `tenant`'s prior shift, if it judged one."""
    return next((v for v in (retrain or {}).get("tenant_priors") or [] if v.get("tenant") == tenant), None)


def _prior_cell(retrain: Mapping[str, Any] | None) -> str:
    prior = tenant_prior(retrain)
    if not prior:
        return "-"
    if prior.get("challenger_accuracy") is None:
        return f"{prior.get('verdict')} ({prior.get('reason', '')})"
    offsets = prior.get("challenger_offsets") or [0, 0, 0]
    revision = f" r{prior['revision']}" if prior.get("revision") else ""
    return (f"{prior['verdict']}{revision} ({100 * prior['challenger_accuracy']:.1f} vs "
            f"{100 * prior['champion_accuracy']:.1f} on {prior['labels']}; A {offsets[0]:+.2f}, C {offsets[2]:+.2f})")


@contextmanager
def environment(values: Mapping[str, str], drop: Sequence[str] = ()) -> Iterator[list[str]]:
    """These variables for this block (children inherit them); `drop`ped ones removed. Yields
    the names that were dropped."""
    saved = dict(os.environ)
    dropped = [name for name in drop if name in os.environ]
    try:
        for name in dropped:
            del os.environ[name]
        os.environ.update(values)
        yield dropped
    finally:
        os.environ.clear()
        os.environ.update(saved)


def machine() -> str:
    return (f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}, load "
            f"{', '.join(f'{x:.2f}' for x in os.getloadavg())} at the start")


@dataclass
class Bench:
    """The running benchmark: what a measurement and a round need."""

    args: argparse.Namespace
    client: SupportClient
    engine: Any
    database_url: str
    triton_url: str
    repository: Path
    model_name: str
    cli_env: dict[str, str]
    test: list[SupportQuery]
    eval_source: EvalSource | None
    notes: list[str]
    run_id: str
    kind_of: dict[str, str] = field(default_factory=dict)
    labels_before: int = 0

    @property
    def scratch(self) -> Path:
        return self.args.scratch

    def measure(self, tag: str, prior_revision: int | None = None) -> dict[str, Any]:
        """Support test through `Route` and benchmark test through `arag eval --report-only`, with
        the version served now (once the front door routes with it, and with the tenant's prior
        `prior_revision` when one was just promoted)."""
        from adaptive_rag.routing.model_repository import served_version

        t0 = time.perf_counter()
        version = served_version(self.repository / self.model_name)
        probe = next(q.query for q in self.test if q.kind != SMALL_TALK)
        if not wait_for_version(self.client, version, probe, prior_revision=prior_revision):
            prior = f" and tenant prior r{prior_revision}" if prior_revision else ""
            self.notes.append(f"{tag}: the front door did not route with v{version}{prior} within 180 s")
        support, correct = measure_support(self.client, self.test, self.scratch / f"routes-{tag}.jsonl")
        t1 = time.perf_counter()
        bench = measure_benchmark(self.eval_source, version, tag, self.scratch, self.args.data_dir, self.cli_env)
        log(f"{tag}: v{version} support-test accuracy {_pct(support['accuracy'])}, under {support['under']}, "
            f"over {support['over']} (n={support['n']}); benchmark-test {_benchmark_cell(bench)}")
        return {"served_version": version, "support": support, "correct": correct, "benchmark": bench,
                "seconds_route": t1 - t0, "seconds_eval": time.perf_counter() - t1}

    def one_round(self, index: int, train: Sequence[SupportQuery], start: Mapping[str, Any]) -> dict[str, Any] | None:
        """Replay + feedback, wait for the shadow runs, relabel, retrain, measure; None when no
        `train` query is left."""
        from adaptive_rag.storage import LabelStore, PromotionStore

        args, number, scratch = self.args, index + 1, self.scratch
        t_round = time.perf_counter()
        queries = round_queries(train, index, args.per_kind)
        if not queries:
            self.notes.append(f"round {number}: no support `train` queries left; stopped")
            return None
        short = {k: n for k, n in Counter(q.kind for q in queries).items() if n < args.per_kind}
        if short:
            self.notes.append(f"round {number}: fewer than {args.per_kind} `train` queries left for {short}")
        log(f"round {number}: {len(queries)} support `train` queries through Answer")
        rows = replay_round(self.client, queries, number, self.run_id, args.support_threshold, scratch / "replay.jsonl")
        self.kind_of.update({r["request_id"]: r["kind"] for r in rows if r.get("request_id")})
        t_replay = time.perf_counter()
        expecting = [r["request_id"] for r in rows
                     if r.get("request_id") and r["code"] == "OK" and r["strategy"] != "small_talk"]
        waited_until = time.monotonic() + args.shadow_wait
        missing = pending_shadows(self.engine, expecting)
        while missing and time.monotonic() < waited_until:
            time.sleep(2.0)
            missing = pending_shadows(self.engine, missing)
        log(f"round {number}: shadow runs done ({len(expecting) - len(missing)}/{len(expecting)})")
        t_shadow = time.perf_counter()
        run_cli(["relabel", "--database-url", self.database_url], self.cli_env,
                scratch / "logs" / f"relabel-round-{number}.log", timeout_s=1800)
        counts = live_label_counts(LabelStore(self.engine).labels(split=None, origin="live"), self.kind_of)
        t_relabel = time.perf_counter()
        log(f"round {number}: {counts['total']} live labels (A / B / C {_tiers(counts['by_tier'])}, "
            f"{counts['train']} in train); retraining")
        run_dir = scratch / "runs" / f"round-{number}"
        shutil.rmtree(run_dir, ignore_errors=True)
        retrain_args = ["retrain", "--database-url", self.database_url, "--repository", str(self.repository),
                        "--triton-url", self.triton_url, "--out", str(run_dir), "--epochs", str(args.epochs),
                        "--threads", str(args.train_threads)]
        if args.max_steps_per_epoch:
            retrain_args += ["--max-steps-per-epoch", str(args.max_steps_per_epoch)]
        _, printed = run_cli(retrain_args, self.cli_env, scratch / "logs" / f"retrain-round-{number}.log")
        recent = [r for r in PromotionStore(self.engine).recent(self.model_name, 5) if r.action == "retrain"]
        retrain = retrain_summary(recent[0] if recent else None, last_json_object(printed))
        t_retrain = time.perf_counter()
        log(f"round {number}: retrain {_verdict_cell(retrain)}; {retrain.get('reason', '')}; "
            f"tenant prior {_prior_cell(retrain)}")
        prior = tenant_prior(retrain) or {}
        after = self.measure(f"round-{number}", prior.get("revision") if prior.get("verdict") == "promoted" else None)
        t_end = time.perf_counter()
        new_labels, self.labels_before = counts["total"] - self.labels_before, counts["total"]
        return {
            "round": number, "replay": replay_summary(rows, len(missing)), "live_labels": counts,
            "new_labels": new_labels, "retrain": retrain, "served_version": after["served_version"],
            "support": after["support"], "benchmark": after["benchmark"],
            "support_change": paired_change(start["correct"], after["correct"]),
            "benchmark_check": benchmark_check((start.get("benchmark") or {}).get("accuracy"),
                                               (after.get("benchmark") or {}).get("accuracy")),
            "seconds": {"replay": t_replay - t_round, "shadows": t_shadow - t_replay,
                        "relabel": t_relabel - t_shadow, "retrain": t_retrain - t_relabel,
                        "measure": t_end - t_retrain, "total": t_end - t_round},
        }


def close_report(report: dict[str, Any], finished: str) -> dict[str, Any]:
    """The report as written: per-query correctness dropped, when it finished, its summary."""
    report["start"].pop("correct", None)
    report["meta"]["finished"] = finished
    report["summary"] = summary_lines(report)
    return report


def checkpoint(report: dict[str, Any], args: argparse.Namespace) -> None:
    """The rounds done so far, written as a report marked in progress: a run stopped later (it
    takes hours with the default reader) keeps its finished rounds."""
    if args.report_dir is None:
        return
    partial = close_report(json.loads(json.dumps(report, default=str)),
                           f"in progress: {len(report['rounds'])} of {args.rounds} rounds done")
    write_report(partial, args.report_dir)
    log(f"checkpoint: {args.report_dir / 'report.md'} ({len(report['rounds'])} of {args.rounds} rounds)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The whole benchmark: start, measure, rounds; returns the report (written by `main`)."""
    import grpc
    from rich.console import Console

    from adaptive_rag.evaluation.support import FAQ_FILE, build_suite
    from adaptive_rag.settings import ClassifierSettings, Settings, multi_step_strategy
    from lab.harness.stack import lab_stack

    scratch: Path = args.scratch
    started_at = datetime.now(timezone.utc)
    run_id = started_at.strftime("%Y%m%d%H%M%S")
    repository = scratch / "model_repository"
    shutil.rmtree(repository, ignore_errors=True)
    base_env = {"ARAG_DATA_DIR": str(args.data_dir), **({"ARAG_READER": args.reader} if args.reader else {})}
    notes: list[str] = []
    with environment(base_env, drop=OWN_PARTS) as dropped:
        if dropped:
            notes.append(f"ignored {', '.join(dropped)} from the environment: this benchmark starts its own labels "
                         "database, model repository and Triton")
        settings = Settings()
        suite = build_suite(args.data_dir, settings)
        train, test = suite.select("train"), suite.select("test")
        abstain = args.abstain_min_score
        abstain_note = f"{abstain} (--abstain-min-score)"
        if abstain == "auto":
            best = auto_abstain_threshold(suite, settings)
            abstain = f"{best['threshold']:g}" if best else "0"
            abstain_note = (f"{abstain} (auto: best Youden's J on the support `train` split: out-of-KB abstain "
                            f"{100 * best['out_of_kb_abstain']:.1f} %, false abstain "
                            f"{100 * best['false_abstain']:.1f} %)" if best else "0 (auto: no sweep possible)")
        log(f"single-step abstain threshold {abstain_note}")
        router = starting_router(args, scratch, os.environ)
        log(f"starting router: {router.how} ({router.path})")
        code, shipped = run_cli(["model", "ship", "--router", str(router.path), "--repository", str(repository)],
                                os.environ, scratch / "logs" / "model-ship.log", timeout_s=900)
        if code != 0:
            raise SystemExit(f"arag model ship failed: see {scratch / 'logs' / 'model-ship.log'}")
        log(shipped.strip())
        model_name = ClassifierSettings(_env_file=None).classifier_model
        stack_env = {"ARAG_MODEL_REPOSITORY": str(repository), "ARAG_SHADOW_SHARE": "1.0",
                     "ARAG_ABSTAIN_MIN_SCORE": abstain, "ARAG_MODEL_POLL": "2"}
        with environment(stack_env):
            library = Settings()
            meta: dict[str, Any] = {
                "command": shlex.join(["python", "-m", "lab.experiments.domain_adaptation", *args.argv]),
                "date": started_at.strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
                "reader": f"{library.reader} (tier C: {multi_step_strategy(library)})"
                          + (" - a quick run with the smallest reader: mechanics, not quality" if args.quick else ""),
                "starting_router": router.how,
                "starting_router_validation": router.held_out_validation(),
                "shadow_share": "1.0 (every answered query also runs its neighbouring tier)",
                "support_threshold": f"{args.support_threshold:g} (share of the answer's content words the "
                                     "gold FAQ answer contains, for a thumbs up)",
                "support_threshold_value": args.support_threshold, "abstain_min_score": abstain_note,
                "per_kind": args.per_kind, "rounds": args.rounds,
                "retrain": f"`arag retrain --epochs {args.epochs}"
                           + (f" --max-steps-per-epoch {args.max_steps_per_epoch}" if args.max_steps_per_epoch else "")
                           + f" --threads {args.train_threads}` (the served version's family: the shipped "
                             "bag-of-words router is retrained as one; `--epochs`/`--threads` only matter for a "
                             "MiniLM; promoted on validation macro-F1 and the tenant's own validation labels), then "
                             "the tenant's prior shift over the served version (kept when better under cross-validation)",
                "notes": notes,
            }
            console = Console(highlight=False)
            with lab_stack(scratch / "stack", knowledge_base=args.data_dir / FAQ_FILE, tenants=(TENANT,),
                           console=console) as running:
                meta["stack"] = "; ".join(f"{k}: {v}" for k, v in running.using.items())
                database_url = running.settings.library.database_url
                triton_url = running.settings.classifier.triton_grpc_url
                seeded = seed_labels(running.store.engine, router.labels_file, args.data_dir)
                meta["seeded_labels"] = (
                    f"{seeded['total']} benchmark `train` labels A / B / C {_tiers(seeded['by_tier'])} "
                    f"({seeded['from_label_file']} from the router's label file, {seeded['binary_fill']} binary "
                    f"fill; sources {seeded['sources']})")
                log(f"labels database {database_url}: {meta['seeded_labels']}")
                cli_env = {**os.environ, "DATABASE_URL": database_url, "ARAG_MODEL_REPOSITORY": str(repository)}
                eval_source = snapshot_eval_dir(args.eval_dir, scratch)
                if eval_source is None:
                    meta["eval_dir"] = (f"{args.eval_dir}: absent (no results.jsonl): benchmark-test accuracy "
                                        "not measured")
                    notes.append(meta["eval_dir"])
                else:
                    meta["eval_dir"] = (f"{args.eval_dir} (a snapshot of {eval_source.outcomes} outcomes taken at "
                                        f"the start; reader {eval_source.reader}; tiers "
                                        f"{', '.join(eval_source.strategies)})")
                with grpc.insecure_channel(running.address) as channel:
                    client = SupportClient(channel, running.api_key(TENANT), args.call_timeout, args.budget)
                    bench = Bench(args, client, running.store.engine, database_url, triton_url, repository,
                                  model_name, cli_env, test, eval_source, notes, run_id)
                    t0 = time.perf_counter()
                    start = bench.measure("start")
                    start["seconds"] = time.perf_counter() - t0
                    report: dict[str, Any] = {"meta": meta, "start": start, "rounds": []}
                    for index in range(args.rounds):
                        try:
                            done = bench.one_round(index, train, start)
                        except Exception as exc:  # noqa: BLE001 - keep the rounds done so far in the report
                            notes.append(f"round {index + 1} stopped: {type(exc).__name__}: {exc}"[:600])
                            log(notes[-1])
                            break
                        if done is None:
                            break
                        report["rounds"].append(done)
                        checkpoint(report, args)
            meta["leftovers"] = [f"{pid} {cmd[:120]}" for pid, cmd in running.leftovers]
            if running.leftovers:
                notes.append(f"{len(running.leftovers)} process(es) still running after the stop were killed")
    meta["wall_time_s"] = round((datetime.now(timezone.utc) - started_at).total_seconds())
    return close_report(report, datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.experiments.domain_adaptation",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help=f"1 round, 2 queries per kind, {QUICK_READER}, a 1-epoch capped retrain; report in "
                             "var/domain_adaptation/quick/report")
    parser.add_argument("--reader", default=None, help="ARAG_READER of the stack (default: the configured one; "
                                                       f"--quick: {QUICK_READER})")
    parser.add_argument("--per-kind", type=int, default=None,
                        help="new support `train` queries per kind per round (default 10; --quick 2)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 3; --quick 1)")
    parser.add_argument("--support-threshold", type=float, default=DEFAULT_SUPPORT_THRESHOLD,
                        help="share of the answer's content words in the gold FAQ answer at or above which the "
                             "agent gives a thumbs up")
    parser.add_argument("--abstain-min-score", default="auto",
                        help="ARAG_ABSTAIN_MIN_SCORE of the stack: a number, or auto (best on the support train split)")
    parser.add_argument("--router", type=Path, default=None,
                        help="the starting bag-of-words router (router.json or its folder; default: the shipped one)")
    parser.add_argument("--labels-db", type=Path, default=DEFAULT_LABELS_DB,
                        help="labels to fit a starting router on when none is shipped and no --router is given")
    parser.add_argument("--eval-dir", type=Path, default=DEFAULT_EVAL_DIR,
                        help="an `arag eval` results directory for the benchmark-test accuracy (skipped when absent)")
    parser.add_argument("--data-dir", type=Path, default=None, help="benchmark + support data (default: ARAG_DATA_DIR)")
    parser.add_argument("--epochs", type=int, default=None, help="arag retrain --epochs (default 3; --quick 1)")
    parser.add_argument("--max-steps-per-epoch", type=int, default=None, help="arag retrain cap (--quick: 10)")
    parser.add_argument("--train-threads", type=int, default=2, help="torch threads of arag retrain")
    parser.add_argument("--call-timeout", type=float, default=600.0, help="deadline of one Answer call (s)")
    parser.add_argument("--budget", type=float, default=1200.0,
                        help="s spent on one query at most (GetResult after the call's deadline)")
    parser.add_argument("--shadow-wait", type=float, default=None,
                        help="s to wait for a round's shadow runs (default 1800; --quick 600)")
    parser.add_argument("--out", type=Path, default=None, help="report folder (default reports/domain_adaptation; "
                                                               "--quick: var/domain_adaptation/quick/report)")
    parser.add_argument("--scratch", type=Path, default=None,
                        help="default var/domain_adaptation/<run> (--quick: var/domain_adaptation/quick)")
    parser.add_argument("--render", type=Path, default=None, help="only write report.md and the PNG from DIR/report.json")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.render:
        report = json.loads((args.render / "report.json").read_text(encoding="utf-8"))
        report["summary"] = summary_lines(report)
        write_report(report, args.render)
        log(f"report: {args.render / 'report.md'}")
        return 0
    quick = args.quick
    args.reader = args.reader or (QUICK_READER if quick else None)
    args.per_kind = args.per_kind or (2 if quick else 10)
    args.rounds = args.rounds or (1 if quick else 3)
    args.epochs = args.epochs or (1 if quick else 3)
    args.max_steps_per_epoch = args.max_steps_per_epoch or (10 if quick else None)
    args.shadow_wait = args.shadow_wait or (600.0 if quick else 1800.0)
    if args.data_dir is None:
        from adaptive_rag.settings import Settings

        args.data_dir = Settings().data_dir
    args.data_dir = args.data_dir.resolve()
    args.eval_dir = args.eval_dir.resolve()
    args.labels_db = args.labels_db.resolve()
    if args.abstain_min_score != "auto":
        try:
            float(args.abstain_min_score)
        except ValueError:
            parser.error("--abstain-min-score takes a number or auto")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    default_out = REPO / "var/domain_adaptation/quick/report" if quick else REPO / "reports/domain_adaptation"
    out = (args.out or default_out).resolve()
    args.scratch = (args.scratch or REPO / "var" / "domain_adaptation" / ("quick" if quick else stamp)).resolve()
    if args.scratch.exists() and quick:
        shutil.rmtree(args.scratch)
    args.scratch.mkdir(parents=True, exist_ok=True)
    from services.demo.local import install_stop_signals

    install_stop_signals()
    log(f"scratch {args.scratch}; report {out}")
    args.report_dir = out
    report = run(args)
    report["meta"]["scratch"] = str(args.scratch.relative_to(REPO) if args.scratch.is_relative_to(REPO) else args.scratch)
    for path in write_report(report, out):
        log(f"wrote {path}")
    for line in report["summary"]:
        log(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
