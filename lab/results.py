"""Recompute every headline figure of docs/results.md from the records committed under reports/.

    python -m lab.results [--docs docs/results.md] [--reports reports]

docs/results.md states each figure as one table row, `| figure | value | report |`. This module
holds, per figure name, how to compute that value from the report's raw records (outcomes,
per-call samples, ladder points, fault windows), formatted as the page writes it. It prints one
line per figure (name, value in the docs, recomputed value, OK or MISMATCH) and exits 1 when a
value differs, when the page states a figure this module cannot recompute, or when a figure here
is missing from the page: a figure that drifts from its records cannot go unnoticed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from adaptive_rag.evaluation.bootstrap import Interval, bootstrap_mean, difference_interval, mean_interval, ratio_interval
from adaptive_rag.evaluation.datasets import SINGLE_HOP
from lab.harness.stats import percentile

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DOCS = REPO / "docs" / "results.md"
DEFAULT_REPORTS = REPO / "reports"

Key = tuple[str, str]  # (dataset, question id)


# --- reading the records -----------------------------------------------------------------------


def read_json(path: Path) -> Any:
    """A JSON file, gzipped when its name ends in .gz."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return json.load(handle)


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """The records of a JSON-lines file, gzipped when its name ends in .gz."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


# --- formatting as the page writes it -----------------------------------------------------------


def points(interval: Interval) -> str:
    """An F1 (0-1) as points with its interval: `25.7 [22.7, 28.8]`."""
    return f"{100 * interval.estimate:.1f} [{100 * interval.low:.1f}, {100 * interval.high:.1f}]"


def signed_points(interval: Interval) -> str:
    """A difference of F1s as signed points: `-0.6 [-1.7, +0.5]`."""
    return f"{100 * interval.estimate:+.1f} [{100 * interval.low:+.1f}, {100 * interval.high:+.1f}]"


def percent(interval: Interval) -> str:
    return f"{100 * interval.estimate:.1f} % [{100 * interval.low:.1f}, {100 * interval.high:.1f}]"


# --- quality: the test-split evaluation of the default reader ------------------------------------

EVAL = "eval-qwen-1.5b-t400"


@dataclass(frozen=True)
class Evaluation:
    """Every (question, strategy) outcome of one evaluation and each recorded router's routes."""

    outcomes: dict[Key, dict[str, dict[str, Any]]]
    routes: dict[str, dict[Key, str]]
    tier_strategy: dict[str, str]  # the strategy of each tier in this evaluation (its report's oracle tiers)

    @classmethod
    def load(cls, folder: Path) -> Evaluation:
        outcomes: dict[Key, dict[str, dict[str, Any]]] = defaultdict(dict)
        for row in read_jsonl(folder / "results.jsonl.gz"):
            outcomes[(row["dataset"], row["question_id"])][row["strategy"]] = row
        routes = {
            row: {tuple(key.split("/", 1)): decision["tier"] for key, decision in recorded["questions"].items()}
            for row, recorded in read_json(folder / "routes.json.gz").items()
        }
        tiers = read_json(folder / "report.json")["meta"]["oracle_tiers"]
        return cls(dict(outcomes), routes, dict(zip("ABC", tiers)))

    def tier_questions(self) -> list[Key]:
        """The questions every tier's strategy answered (the rows on all 583)."""
        return [k for k, by in self.outcomes.items() if all(s in by for s in self.tier_strategy.values())]

    def f1_by_tier(self, tiers: Mapping[Key, str]) -> dict[Key, float]:
        return {k: self.outcomes[k][self.tier_strategy[tier]]["f1"] for k, tier in tiers.items()}

    def fixed(self, tier: str) -> dict[Key, str]:
        return {k: tier for k in self.tier_questions()}

    def dataset_rule(self) -> dict[Key, str]:
        """B for the single-hop sets, C for the multi-hop ones: the rule knows the source."""
        return {k: "B" if k[0] in SINGLE_HOP else "C" for k in self.tier_questions()}

    def oracle(self) -> dict[Key, str]:
        """The cheapest tier answering correctly (EM or Acc), else the dataset-identity rule."""
        rule = self.dataset_rule()
        labels = {}
        for key in self.tier_questions():
            correct = [t for t, s in self.tier_strategy.items()
                       if self.outcomes[key][s]["em"] > 0 or self.outcomes[key][s]["acc"] > 0]
            labels[key] = correct[0] if correct else rule[key]
        return labels

    def routed(self, row: str) -> dict[Key, str]:
        """A recorded router's tiers, in the questions' order (the bootstrap draws by position)."""
        routes = self.routes[row]
        return {k: routes[k] for k in self.tier_questions() if k in routes}


def _evaluation(reports: Path) -> Evaluation:
    return _cached(("eval", reports), lambda: Evaluation.load(reports / EVAL))


def row_f1(tiers: Callable[[Evaluation], Mapping[Key, str]]) -> Callable[[Path], str]:
    def compute(reports: Path) -> str:
        ev = _evaluation(reports)
        return points(mean_interval(ev.f1_by_tier(tiers(ev))))
    return compute


def row_minus_fixed(tiers: Callable[[Evaluation], Mapping[Key, str]], fixed: str = "B",
                    multi_hop_only: bool = False) -> Callable[[Path], str]:
    """A row minus always one tier (B unless said), paired per question; with `multi_hop_only`, on
    the three multi-hop sets alone (each set weighs the same)."""
    def compute(reports: Path) -> str:
        ev = _evaluation(reports)
        mine = {k: f1 for k, f1 in ev.f1_by_tier(tiers(ev)).items() if not (multi_hop_only and k[0] in SINGLE_HOP)}
        return signed_points(difference_interval(mine, ev.f1_by_tier(ev.fixed(fixed))))
    return compute


def time_ratio(tiers: Callable[[Evaluation], Mapping[Key, str]], baseline: str) -> Callable[[Path], str]:
    """A row's seconds per question over a fixed tier's on the same questions (each set weighs the
    same, resampled question by question): `2.73x [2.68, 2.77]`."""
    def compute(reports: Path) -> str:
        ev = _evaluation(reports)
        seconds = {k: ev.outcomes[k][ev.tier_strategy[t]]["seconds"] for k, t in tiers(ev).items()}
        base = {k: ev.outcomes[k][ev.tier_strategy[baseline]]["seconds"] for k in ev.tier_questions()}
        ratio = ratio_interval(seconds, base)
        return f"{ratio.estimate:.2f}x [{ratio.low:.2f}, {ratio.high:.2f}]"
    return compute


def lab_routes(folder: str, row: str, figure: Callable[[Callable[[Evaluation], Mapping[Key, str]]],
                                                         Callable[[Path], str]]) -> Callable[[Path], str]:
    """`figure` of the tiers a lab replay recorded for `row` (`<folder>/records.jsonl.gz`: per
    question, each row's tier), over the evaluation's own outcomes."""
    def compute(reports: Path) -> str:
        recorded = {(r["dataset"], r["question_id"]): r["rows"][row]["tier"]
                    for r in read_jsonl(reports / folder / "records.jsonl.gz")}
        return figure(lambda ev: {k: recorded[k] for k in ev.tier_questions() if k in recorded})(reports)
    return compute


def replayed(folder: str, row: str, versus: str) -> Callable[[Path], str]:
    """A lab replay's row against another of its rows (`<folder>/records.jsonl.gz`: per question,
    each row's tier, F1 and seconds, recomputed from the outcomes it was run on): `versus` "always B"
    gives the F1 difference in points, "always C" the time ratio."""
    def compute(reports: Path) -> str:
        records = list(read_jsonl(reports / folder / "records.jsonl.gz"))

        def keyed(name: str, value: str) -> dict[Key, float]:
            return {(r["dataset"], r["question_id"]): float(r["rows"][name][value]) for r in records}
        if versus == "always B":
            return signed_points(difference_interval(keyed(row, "f1"), keyed(versus, "f1")))
        ratio = ratio_interval(keyed(row, "seconds"), keyed(versus, "seconds"))
        return f"{ratio.estimate:.2f}x [{ratio.low:.2f}, {ratio.high:.2f}]"
    return compute


def routing_accuracy(tiers: Callable[[Evaluation], Mapping[Key, str]]) -> Callable[[Path], str]:
    """Accuracy on the test labels, pooled over questions as a classifier's accuracy."""
    def compute(reports: Path) -> str:
        ev = _evaluation(reports)
        labels = ev.oracle()
        hits = [float(t == labels[k]) for k, t in tiers(ev).items() if k in labels]
        return percent(bootstrap_mean({"all": hits}))
    return compute


# --- quality: the support suite and retrieval ---------------------------------------------------

SUPPORT_GOLD = {"talk": "A", "joined": "C"}  # by query-id prefix; every other kind's gold tier is B
SUPPORT_STRATEGY_TIER = {"small_talk": "A", "decompose": "C"}


def support_tier_accuracy(reports: Path) -> str:
    """The router's tier per query is the tier of the strategy it ran besides always B's single
    step (small talk: A, decompose: C; none: B); gold tiers follow the query's kind."""
    routed: dict[str, str] = {}
    for row in read_jsonl(reports / "support" / "results.jsonl.gz"):
        routed.setdefault(row["query_id"], "B")
        if row["strategy"] in SUPPORT_STRATEGY_TIER:
            routed[row["query_id"]] = SUPPORT_STRATEGY_TIER[row["strategy"]]
    gold = {q: SUPPORT_GOLD.get(q.split("-", 1)[0], "B") for q in routed}
    router = sum(routed[q] == gold[q] for q in routed) / len(routed)
    always_b = sum(gold[q] == "B" for q in routed) / len(routed)
    return f"{100 * router:.1f} % vs {100 * always_b:.1f} % (always B), n {len(routed)}"


def abstention(kb: str, row: str) -> Callable[[Path], str]:
    """Uncovered questions abstained / covered ones abstained on the `test` split of one
    knowledge base, for one row of thresholds."""
    def compute(reports: Path) -> str:
        records = [r for r in read_jsonl(reports / "abstention" / "records.jsonl.gz")
                   if r["kb"] == kb and r["split"] == "test"]
        caught = [float(r["abstained"][row]) for r in records if not r["covered"]]
        false = [float(r["abstained"][row]) for r in records if r["covered"]]
        return f"{percent(bootstrap_mean({'all': caught}))} / {percent(bootstrap_mean({'all': false}))}"
    return compute


def abstention_signals_picked(kb: str) -> Callable[[Path], str]:
    """Caught / false on one knowledge base's `test` split for the dense rule picked on `train`
    (`reports/abstention/signals`), from its records and the knowledge base's probes."""
    def compute(reports: Path) -> str:
        from lab.experiments.abstention_signals import SignalRecord, candidate_rules

        folder = reports / "abstention" / "signals"
        report = read_json(folder / "report.json")
        rule = next(r for r in candidate_rules() if r.name == report["picked"])
        threshold = rule.dense_threshold(report["probes"][kb])
        records = [SignalRecord(**r) for r in read_jsonl(folder / "records.jsonl.gz")
                   if r["kb"] == kb and r["split"] == "test"]
        caught = [float(rule.abstains(r, threshold)) for r in records if not r.covered]
        false = [float(rule.abstains(r, threshold)) for r in records if r.covered]
        return f"{percent(bootstrap_mean({'all': caught}))} / {percent(bootstrap_mean({'all': false}))}"
    return compute


def abstention_signals_ceilings(reports: Path) -> str:
    """The best pair of thresholds on relevance and dense, labels used, at <= 5 % false: per help
    centre, `train` / `test` caught."""
    from lab.experiments.abstention_signals import SignalRecord, ceiling_either

    records = [SignalRecord(**r) for r in read_jsonl(reports / "abstention" / "signals" / "records.jsonl.gz")]
    parts = []
    for kb, label in (("help-centre", "demo help centre"), ("quillbill", "Quillbill")):
        cells = []
        for split in ("train", "test"):
            mine = [r for r in records if r.kb == kb and r.split == split]
            cells.append(100 * ceiling_either([(r.relevance, r.dense) for r in mine if r.covered],
                                              [(r.relevance, r.dense) for r in mine if not r.covered]))
        parts.append(f"{label} {cells[0]:.1f} / {cells[1]:.1f} %")
    return "; ".join(parts)


def follow_up_ratios(reports: Path) -> str:
    """Per knowledge base of the support suite, every follow-up turn's hit@5 as typed and rewritten
    by the rules, each as a ratio to the same question asked standalone (paired over turns)."""
    parts = []
    for label, path in (("COVID FAQ", "report.json"), ("help centre", "help_centre/report.json"),
                        ("Quillbill", "quillbill/report.json")):
        records = read_json(reports / "support" / "per_kb" / path)["knowledge_base"]["follow_ups_all_turns"]["records"]
        hits = {row: {("all", r["id"]): r["hit_5"][row] for r in records} for row in ("standalone", "as_typed", "rewritten")}
        cells = [ratio_interval(hits[row], hits["standalone"]) for row in ("as_typed", "rewritten")]
        parts.append(f"{label} ({len(records)} turns): " + " / ".join(
            f"{100 * c.estimate:.0f} % [{100 * c.low:.0f}, {100 * c.high:.0f}]" for c in cells))
    return "; ".join(parts)


def follow_up_reader_ratios(reports: Path) -> str:
    """Per knowledge base, every follow-up turn's hit@5 rewritten as the front door does with a
    reader (rules, then the reader for what no rule fits), as a ratio to the standalone question's
    (paired over turns), from the follow-up rewriting experiment's records."""
    records = list(read_jsonl(reports / "conversations" / "reader" / "records.jsonl"))
    parts = []
    for label, kb in (("COVID FAQ", "covid-faq"), ("help centre", "help-centre"), ("Quillbill", "quillbill")):
        mine = [r for r in records if r["kb"] == kb]
        hits = {row: {("all", r["id"]): r["hit_5"][row] for r in mine} for row in ("standalone", "rules+reader")}
        c = ratio_interval(hits["rules+reader"], hits["standalone"])
        parts.append(f"{label} ({len(mine)} turns): {100 * c.estimate:.0f} % [{100 * c.low:.0f}, {100 * c.high:.0f}]")
    return "; ".join(parts)


def support_knowledge_base(path: str, split: str | None = "test") -> Callable[[Path], str]:
    """One knowledge base of the support suite, retrieval alone, from its per-question records:
    in-KB hit@5; questions it must abstain on caught / in-KB ones abstained, with the automatic
    threshold and with none (`split` None: every question, both splits)."""
    def compute(reports: Path) -> str:
        records = [r for r in read_json(reports / "support" / "per_kb" / path)["knowledge_base"]["records"]
                   if split is None or r["split"] == split]
        hits = [r["hit_5"] for r in records if r["in_kb"]]

        def gate(row: str) -> str:
            caught = [float(r["abstained"][row]) for r in records if not r["in_kb"]]
            false = [float(r["abstained"][row]) for r in records if r["in_kb"]]
            return f"{percent(bootstrap_mean({'all': caught}))} / {percent(bootstrap_mean({'all': false}))}"

        return (f"hit@5 {percent(bootstrap_mean({'all': hits}))}; automatic {gate('automatic')}; "
                f"none {gate('none')} (n {len(hits)} in-KB, {len(records) - len(hits)} to abstain on)")
    return compute


def reader_gate(row: str) -> Callable[[Path], str]:
    """Caught / false abstained on each knowledge base's `test` sample: the retrieval gate alone,
    then with one reader gate after it (its threshold picked on `train` again, as the experiment
    does), from the question records and the cached reader replies."""
    def compute(reports: Path) -> str:
        from lab.experiments import reader_gate as rg

        folder = reports / "reader_gate"
        summary = rg.summarise(list(read_jsonl(folder / "questions.jsonl")),
                               list(read_jsonl(folder / "reader_records.jsonl")), {}, {})
        parts = []
        for kb, data in summary["splits"]["test"].items():
            alone, gated = data["rows"][rg.RETRIEVAL], data["rows"][row]
            parts.append(
                f"{rg.KB_LABELS[kb]} {100 * alone['caught']['estimate']:.1f} / {100 * alone['false_abstain']['estimate']:.1f} % -> "
                f"{rg._pct(gated['caught'])} / {rg._pct(gated['false_abstain'])} (n {data['n_out']} / {data['n_in']})")
        return "; ".join(parts)
    return compute


def small_talk(reports: Path) -> str:
    """Real users' small talk recognised (Rasa demo utterances; an acknowledgement prompt is not a
    recognition) and real test-split requests given any canned reply, learned detector vs rules."""
    rows = list(read_jsonl(reports / "small_talk" / "records.jsonl.gz"))

    def recall(detector: str) -> Interval:
        return bootstrap_mean({"all": [float(r["decided"] not in (None, "acknowledgement")) for r in rows
                                       if r["set"] == "rasa-demo" and r["kind"] == "small_talk"
                                       and r["detector"] == detector]})

    canned = [r["decided"] is not None for r in rows if r["set"] == "real-requests" and r["detector"] == "learned"]
    return (f"{percent(recall('learned'))} (rules {100 * recall('rules').estimate:.1f} %); "
            f"{sum(canned)} of {len(canned):,} real requests canned")


def retrieval_recall(reports: Path) -> str:
    recall = read_json(reports / "retrieval" / "retrieval.json")["recall"]
    return " / ".join(f"{recall[d]['5']:.3f}" for d in ("hotpotqa", "2wiki", "musique"))


def chain_reader_test(reports: Path) -> str:
    """Tier C `evidence@5` minus single step reading the top 5 passages whole (B before its
    120-token sentence evidence), F1 on the recorded `test` questions (paired per question, the
    mean of the three sets' means), and C's time per question over that single step's."""
    rows = list(read_jsonl(reports / "chain_reader" / "test.jsonl"))
    by = {(r["strategy"], r["dataset"], r["question_id"]): r for r in rows}
    differences: dict[str, list[float]] = defaultdict(list)
    seconds = {"evidence@5": 0.0, "single_step": 0.0}
    # the experiment's order (sets 2Wiki, MuSiQue, HotpotQA; questions by id): the same resamples
    order = {"2wiki": 0, "musique": 1, "hotpotqa": 2}
    for strategy, dataset, qid in sorted(by, key=lambda k: (order.get(k[1], 3), k[2])):
        base = by.get(("single_step", dataset, qid))
        if strategy == "evidence@5" and base is not None:
            row = by[(strategy, dataset, qid)]
            differences[dataset].append(row["f1"] - base["f1"])
            seconds["evidence@5"] += row["seconds"]
            seconds["single_step"] += base["seconds"]
    n = sum(len(v) for v in differences.values())
    interval = bootstrap_mean(dict(differences))
    verdict = "not shown to beat it" if interval.low <= 0 else "beats it"
    return (f"{signed_points(interval)} F1 points, n {n}; "
            f"{seconds['evidence@5'] / seconds['single_step']:.2f}x its time ({verdict})")


def evidence_complete_at_5(reports: Path) -> str:
    """`test` share of questions with every supporting passage among 5: the chain chosen on
    `train` against B's retrieval, per multi-hop dataset."""
    hits: dict[tuple[str, str], list[float]] = defaultdict(list)
    for row in read_jsonl(reports / "evidence" / "records.jsonl.gz"):
        if row["split"] == "test" and row["gatherer"] in ("chain", "bm25"):
            hits[(row["group"], row["gatherer"])].append(row["complete@5"])
    share = {key: 100 * sum(values) / len(values) for key, values in hits.items()}
    return " / ".join(f"{share[(d, 'chain')]:.1f} % vs {share[(d, 'bm25')]:.1f} %"
                      for d in ("2wiki", "musique", "hotpotqa"))


def backend_latency(reports: Path) -> str:
    backends = read_json(reports / "retrieval_backends" / "results.json")["backends"]
    p50 = {name: backends[name]["latency_1"]["p50"] for name in ("tantivy", "opensearch")}
    return f"{p50['tantivy']:.2f} ms vs {p50['opensearch']:.2f} ms"


# --- serving ------------------------------------------------------------------------------------


def _ceiling_tier(reports: Path, run: str) -> dict[str, Any]:
    report = read_json(reports / "load" / "ceiling-servers" / run / "report.json")
    (tier,) = report["modes"]["instant"]["tiers"].values()
    return tier


def ceiling(run: str) -> Callable[[Path], str]:
    """The highest ladder rate sustained."""
    def compute(reports: Path) -> str:
        sustained = [p["rate"] for p in _ceiling_tier(reports, run)["points"] if p["what"] == "ladder" and p["sustained"]]
        return f"{max(sustained):.1f} Answers/s"
    return compute


def overhead_at_half_ceiling(run: str) -> Callable[[Path], str]:
    def compute(reports: Path) -> str:
        (point,) = [p for p in _ceiling_tier(reports, run)["points"] if p["what"] == "at50"]
        overhead = point["overhead_ms"]
        return f"{overhead['p50']:.1f} / {overhead['p99']:.1f} ms"
    return compute


def overhead_one_client(reports: Path) -> str:
    """The after tree (c823e17) of the latest one-client measurement, from its per-request samples."""
    overheads = [s["overhead_ms"] for s in read_jsonl(reports / "load" / "frontdoor-since-5213067" / "samples.jsonl.gz")
                 if s["tree"] == "after" and s["concurrency"] == 1 and s["status"] == "OK"]
    return f"{percentile(overheads, 50):.1f} / {percentile(overheads, 99):.1f} ms"


def cpu_per_answer_ratio(folder: str, clients: int) -> Callable[[Path], str]:
    """After/before CPU per Answer of both trees' processes, as the lever report gives it."""
    def compute(reports: Path) -> str:
        ratios = read_json(reports / "load" / folder / "summary.json")["cpu"]["ratios"]
        (ratio,) = [r for r in ratios if r["concurrency"] == clients]
        low, high = ratio["total_ci95"]
        return f"{ratio['total']:.2f}x [{low:.2f}, {high:.2f}]"
    return compute


def mixed_tier_a_p95(reports: Path) -> str:
    """Tier A's p95 at 80 % of the mixed ceiling (1.44 of 1.8 queries/s), over every tier-A call
    of the run, as its summary counts them."""
    records = reports / "load" / "mixed-ceiling" / "rate-1.44" / "locust_requests.jsonl.gz"
    latencies = [r["ms"] for r in read_jsonl(records) if r["ok"] and r.get("tier") == "A"]
    return f"{percentile(latencies, 95):.0f} ms (n {len(latencies)})"


def queue_isolation_wait(reports: Path) -> str:
    """Tier A's queue wait p50 with a C backlog: separate queues from the samples; the shared
    queue's censored lower bound as the run's cells give it."""
    waits = [s["queue_wait_ms"] for s in read_jsonl(reports / "queue_isolation" / "samples.jsonl.gz")
             if s["mode"] == "separate" and s["phase"] == "backlog" and s["planned_tier"] == "A"
             and s.get("queue_wait_ms") is not None]
    shared = read_json(reports / "queue_isolation" / "summary.json")["cells"]["shared/backlog"]["A"]
    bound = ">= " if shared["queue_wait_p50_lower_bound"] else ""
    return f"{percentile(waits, 50):.1f} ms vs {bound}{shared['queue_wait_p50_ms']:,.1f} ms"


def fair_share_quiet_p95(reports: Path) -> str:
    latencies: dict[str, list[float]] = defaultdict(list)
    for phase in read_jsonl(reports / "fair_share" / "phases.jsonl.gz"):
        for call in phase.get("calls", []):
            if call["role"] == "quiet" and call["status"] == "OK":
                latencies[call["phase"]].append(call["latency_ms"])
    solo, fair = percentile(latencies["solo"], 95), percentile(latencies["fair"], 95)
    return f"{fair:.0f} ms vs {solo:.0f} ms alone ({fair / solo:.2f}x)"


def reliability(reports: Path) -> str:
    report = read_json(reports / "reliability" / "report.json")
    windows = [r for r in report["rows"] if r.get("fault")]
    met = sum(r["lost"] == 0 and r.get("stranded", 0) == 0 and r["duplicates"] == 0 and r["wrong_codes"] == 0
              and r["recovery_s"] is not None and r["recovery_s"] <= 30 for r in windows)
    counted = [*windows, report["tail"]]  # the report's totals: the fault windows and the tail after them
    sent = sum(r["sent"] for r in counted)
    lost = sum(r["lost"] for r in counted)
    duplicates = sum(r["duplicates"] for r in counted)
    wrong = sum(r["wrong_codes"] for r in counted)
    slowest = max(r["recovery_s"] if r["recovery_s"] is not None else math.inf for r in windows)
    # a campaign with the client's own accounting (lost as the client saw it) also counts second runs
    reran = (f"; {sum(r['reruns'] for r in counted)} ran more than once (+{sum(r['extra_runs'] for r in counted)} runs)"
             if all("extra_runs" in r for r in counted) else "")
    return (f"{met} of {len(windows)} windows; {lost} lost, {duplicates} duplicated, {wrong} wrong codes "
            f"of {sent:,} sent{reran}; slowest recovery {slowest:.0f} s")


def reliability_multihost(reports: Path) -> str:
    """The multi-host campaign's headline from its windows (the report's own accounting)."""
    report = read_json(reports / "reliability_multihost" / "report.json")
    windows = report["rows"]
    met = sum(r["lost"] == 0 and r["twice_different"] == 0 and r["stranded"] == 0 and r["duplicates"] == 0
              and r["wrong_codes"] == 0 and r["recovery_s"] is not None and r["recovery_s"] <= 30 for r in windows)
    counted = [*windows, report["tail"]]
    recoveries = [r["recovery_s"] for r in windows]
    slowest = ("not recovered in " + str(sum(x is None for x in recoveries)) + " window(s)"
               if None in recoveries else f"slowest recovery {max(recoveries):.0f} s")
    return (f"{met} of {len(windows)} windows; {sum(r['lost'] for r in counted)} lost, "
            f"{sum(r['twice_different'] for r in counted)} delivered twice differently of "
            f"{sum(r['sent'] for r in counted):,} sent; {sum(r['reruns'] for r in counted)} ran more than once "
            f"(+{sum(r['extra_runs'] for r in counted)} runs); {slowest}")


def tracing_extra_cpu(reports: Path) -> str:
    """CPU per request of tracing to files minus tracing off, each mode's lower run kept."""
    runs = read_json(reports / "tracing" / "overhead.json")
    lowest = {mode: min(r["cpu_us_per_request"] for r in runs if r["mode"] == mode) for mode in ("off", "file")}
    return f"+{lowest['file'] - lowest['off']:.0f} us ({lowest['off']:.0f} -> {lowest['file']:.0f} us)"


def llm_serving_ratio(reports: Path) -> str:
    table = read_json(reports / "llm_serving" / "report.json")["table"]["A"]
    server, embedded = table["server"]["8"]["answers_per_s"], table["embedded-t2"]["8"]["answers_per_s"]
    return f"{server / embedded:.2f}x ({server:.2f} vs {embedded:.2f} Answers/s)"


def setup_demo(reports: Path) -> str:
    cases = {c["case"]: c for c in read_json(reports / "setup" / "report.json")["results"]}
    demo, old = cases["b"], cases["a"]
    return (f"{demo['seconds_total']:.1f} s, {demo['site_packages_mb']:,.0f} MB "
            f"(old all-in-one: {old['seconds_total']:.1f} s, {old['site_packages_mb']:,.0f} MB)")


def hostile_inputs(reports: Path) -> str:
    rows = read_json(reports / "security" / "hostile-inputs.json")["rows"]
    return f"{sum(r['passed'] for r in rows)} / {len(rows)}"


def domain_adaptation(reports: Path) -> str:
    report = read_json(reports / "domain_adaptation" / "report.json")
    accuracies = [report["start"]["support"]["accuracy"]["mean"]]
    accuracies += [r["support"]["accuracy"]["mean"] for r in report["rounds"]]
    return " -> ".join(f"{100 * a:.1f} %" for a in accuracies)


# --- the figures and the check ------------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    """One row of docs/results.md: its name (the row's first cell) and how to recompute its value."""

    name: str
    compute: Callable[[Path], str]


def small_talk_latency(reports: Path) -> str:
    """Small talk end to end, p50, with the reader busy vs the idle stack, from the calls."""
    calls = [c for c in read_jsonl(reports / "small_talk_latency" / "calls.jsonl")
             if c["kind"] == "small_talk" and c["code"] == "OK"]
    loaded = [c["latency_ms"] for c in calls if c["phase"] == "loaded"]
    idle = [c["latency_ms"] for c in calls if c["phase"] == "idle"]
    return (f"{percentile(loaded, 50):.1f} ms vs {percentile(idle, 50):.1f} ms idle "
            f"(n {len(loaded)} / {len(idle)})")


def two_part_answers(reports: Path) -> str:
    """Two-part support questions: replies with both parts per way, and C by parts' median time
    over B's, from the answers."""
    rows = list(read_jsonl(reports / "two_part_answers" / "answers.jsonl"))

    def both(way: str) -> str:
        mine = [r for r in rows if r["way"] == way]
        return f"{sum(all(x >= 0.5 for x in r['part_recall']) for r in mine)} of {len(mine)}"

    def med(way: str) -> float:
        return percentile([r["seconds"] for r in rows if r["way"] == way], 50) or 0.0

    return (f"both parts {both('C parts')} by parts vs {both('B')} B, {both('C whole')} decompose; "
            f"{med('C parts') / med('B'):.2f}x B's median time")


def multi_part_routing(reports: Path) -> str:
    """Quillbill (held out): multi-part questions reaching C and single questions sent to C, with
    the shipped router and the escalation, from the per-question records."""
    rows = [r for r in read_jsonl(reports / "multi_part_routing" / "questions.jsonl") if r["kb"] == "quillbill"]
    multi = [r for r in rows if r["form"] != "single"]
    single = [r for r in rows if r["form"] == "single"]
    reached = sum(r["shipped_tier"] == "C" for r in multi)
    false = sum(r["shipped_tier"] == "C" for r in single)
    return (f"{reached} of {len(multi)} reach C ({100 * reached / len(multi):.1f} %); "
            f"{false} of {len(single)} single to C ({100 * false / len(single):.1f} %)")


def soak(reports: Path) -> str:
    """Per phase of the soak, the processes whose own RSS (without shared memory) grew within the
    limit and whose descriptors stayed flat after the warm-up, and the worst slope, from the samples."""
    from lab.experiments.soak import summarize

    folder = reports / "soak"
    phases = {name: {"warmup_minutes": ph["warmup_minutes"]}
              for name, ph in read_json(folder / "summary.json")["phases"].items()}
    summary = summarize(list(read_jsonl(folder / "samples.jsonl")), phases)
    out = []
    for name, ph in summary["phases"].items():
        worst = max((p for p in ph["processes"] if p["verdict"] != "not judged"),
                    key=lambda p: p[p["judged_on"]]["pct_per_h"], default=None)
        label = "own RSS" if worst and worst["judged_on"] == "own" else "RSS"
        out.append(f"{name}: {ph['judged'] - ph['failed']} of {ph['judged']} processes pass"
                   + (f", worst {label} {worst[worst['judged_on']]['pct_per_h']:+.1f} %/h ({worst['role']})"
                      if worst else ""))
    return "; ".join(out)


def reader_limit(reports: Path) -> str:
    """Tier B at one client against llama-bench (whole prompt, prefilled tokens), two-part answers
    against B, and the closed loop's computed tokens/s against llama-batched-bench, from the records."""
    from lab.experiments.reader_limit import Answer, summarize

    folder = reports / "reader_limit"
    answers = [Answer(**row) for row in read_jsonl(folder / "answers.jsonl")]
    bench = list(read_jsonl(folder / "bench.jsonl"))
    pg = {(row["n_prompt"], row["n_gen"]): row for row in bench if row["tool"] == "llama-bench"}
    out = summarize(answers, pg, [row for row in bench if row["tool"] == "llama-batched-bench"],
                    list(read_jsonl(folder / "windows.jsonl")))
    one, sat = out["one_client"]["server"], out["saturation"]
    return (f"B p50 {one['p50_s']:.2f} s, {one['ratio_to_model_p50']:.2f}x llama-bench (whole prompt), "
            f"{one['ratio_to_model_computed_p50']:.2f}x (prefilled tokens); two-part {one['two_part_over_b_p50']:.2f}x B; "
            f"{sat['clients']} clients {sat['computed_tokens_per_s']:.1f} tokens/s, "
            f"{sat['ratio_to_batched_bench']:.2f}x llama-batched-bench")


def evidence_budget(group: str) -> Callable[[Path], str]:
    """Tier B with the evidence budget vs whole passages, side by side on `test` questions of
    `group` (`help-centre`, `support`, `benchmark`): the ratio of p50 latencies (paired interval),
    prefilled tokens p50, and the paired F1 / hit differences, from the answers."""
    def compute(reports: Path) -> str:
        from lab.experiments.evidence_budget import Answer, summarize

        answers = [Answer(**row) for row in read_jsonl(reports / "evidence_budget" / "answers.jsonl")]
        summary = summarize(answers, {})["groups"][group]
        ratio, f1, hit = summary["p50_ratio"], summary["f1_diff"], summary["hit_diff"]
        whole, budget = summary["whole"], summary["budget"]
        return (f"p50 {whole['p50_s']:.1f} -> {budget['p50_s']:.1f} s, {ratio['estimate']:.2f}x "
                f"[{ratio['low']:.2f}, {ratio['high']:.2f}]; prefilled {whole['prefilled_tokens_p50']:.0f} -> "
                f"{budget['prefilled_tokens_p50']:.0f} tokens; F1 {f1['estimate']:+.3f} [{f1['low']:+.3f}, "
                f"{f1['high']:+.3f}], hit {hit['estimate']:+.3f} [{hit['low']:+.3f}, {hit['high']:+.3f}] "
                f"(n {summary['n']})")
    return compute


FIGURES: tuple[Figure, ...] = (
    Figure("Always A (no retrieval), F1", row_f1(lambda ev: ev.fixed("A"))),
    Figure("Always B (single step), F1", row_f1(lambda ev: ev.fixed("B"))),
    Figure("Always C (evidence), F1", row_f1(lambda ev: ev.fixed("C"))),
    Figure("Always C minus always B on the three multi-hop sets, F1 points",
           row_minus_fixed(lambda ev: ev.fixed("C"), multi_hop_only=True)),
    Figure("Always C, time vs always B", time_ratio(lambda ev: ev.fixed("C"), "B")),
    Figure("Dataset-identity rule, F1", row_f1(lambda ev: ev.dataset_rule())),
    Figure("Shipped router (classifier v1), F1", row_f1(lambda ev: ev.routed("adaptive"))),
    Figure("Oracle (cheapest correct tier), F1", row_f1(lambda ev: ev.oracle())),
    Figure("Shipped router minus always B, F1 points", row_minus_fixed(lambda ev: ev.routed("adaptive"))),
    Figure("Shipped router minus always C (the best fixed strategy), F1 points",
           row_minus_fixed(lambda ev: ev.routed("adaptive"), "C")),
    Figure("Shipped router, time vs always C", time_ratio(lambda ev: ev.routed("adaptive"), "C")),
    Figure("Learned LR router minus always B, F1 points", row_minus_fixed(lambda ev: ev.routed("learned lr"))),
    Figure("Learned LR router, time vs always C", time_ratio(lambda ev: ev.routed("learned lr"), "C")),
    Figure("Reward router priced by time (budget 60 % of always C's), minus always B, F1 points",
           row_minus_fixed(lambda ev: ev.routed("learned reward (reward-time)"))),
    Figure("Reward router priced by time, time vs always C",
           time_ratio(lambda ev: ev.routed("learned reward (reward-time)"), "C")),
    Figure("Shipped router priced on time (budget 60 % of always C's), minus always B, F1 points",
           lab_routes("time_budget", "priced router", row_minus_fixed)),
    Figure("Shipped router priced on time, time vs always C",
           lab_routes("time_budget", "priced router", lambda tiers: time_ratio(tiers, "C"))),
    Figure("Fresh test sample (questions 101-148 per set, MuSiQue has none), always C minus always B, F1 points",
           replayed("time_budget_fresh", "always C", "always B")),
    Figure("Fresh test sample, shipped router priced for 60 % with 95 % confidence, minus always B, F1 points",
           replayed("time_budget_fresh", "priced router (95% bound)", "always B")),
    Figure("Fresh test sample, shipped router priced for 60 % with 95 % confidence, time vs always C",
           replayed("time_budget_fresh", "priced router (95% bound)", "always C")),
    Figure("Oracle minus always B, F1 points", row_minus_fixed(lambda ev: ev.oracle())),
    Figure("Shipped router, accuracy on the test labels", routing_accuracy(lambda ev: ev.routed("adaptive"))),
    Figure("Dataset-identity rule, accuracy on the test labels", routing_accuracy(lambda ev: ev.dataset_rule())),
    Figure("Support suite, router tier accuracy", support_tier_accuracy),
    Figure("Abstention, support test, automatic threshold: caught / false", abstention("support", "automatic")),
    Figure("Abstention, support test, hand-tuned threshold: caught / false", abstention("support", "hand-tuned")),
    Figure("Abstention, demo help centre test, automatic threshold: caught / false", abstention("demo", "automatic")),
    Figure("Abstention, demo help centre test, automatic threshold or coverage below the train-picked floor: caught / false", abstention("demo", "automatic+coverage")),
    Figure("Abstention ceiling, best relevance and dense thresholds with the labels at <= 5 % false, train / test caught", abstention_signals_ceilings),
    Figure("Abstention, Quillbill (held out) test, automatic threshold or dense below the train-picked floor: caught / false", abstention_signals_picked("quillbill")),
    Figure("Abstention, demo help centre test, automatic threshold or dense below the train-picked floor: caught / false", abstention_signals_picked("help-centre")),
    Figure("Follow-up hit@5 vs the standalone question, as typed / rewritten by rules, all turns", follow_up_ratios),
    Figure("Follow-up hit@5 vs the standalone question, rewritten by rules + reader (the front door with a reader), all turns", follow_up_reader_ratios),
    Figure("Support per knowledge base, COVID FAQ test: in-KB hit@5; caught / false abstentions", support_knowledge_base("report.json")),
    Figure("Support per knowledge base, demo help centre test: in-KB hit@5; caught / false abstentions", support_knowledge_base("help_centre/report.json")),
    Figure("Support per knowledge base, Quillbill Markdown help centre (held out) test: in-KB hit@5; caught / false abstentions", support_knowledge_base("quillbill/report.json")),
    Figure("Support per knowledge base, Quillbill (held out), every question of both splits: in-KB hit@5; caught / false abstentions", support_knowledge_base("quillbill/report.json", None)),
    Figure("Reader gate after the retrieval gate, test sample: caught / false, retrieval alone -> with the train-picked calibrated support marker (p >= 0.7)", reader_gate("retrieval+support_abstain@t")),
    Figure("Small talk, Rasa demo recall; real requests given a canned reply", small_talk),
    Figure("Retrieval recall@5, HotpotQA / 2Wiki / MuSiQue", retrieval_recall),
    Figure("Search latency p50, tantivy vs OpenSearch", backend_latency),
    Figure("Evidence, all supporting passages among 5, chain vs B, 2Wiki / MuSiQue / HotpotQA", evidence_complete_at_5),
    Figure("Tier C evidence@5 minus single step on whole passages, test F1 (mean of 2Wiki, MuSiQue, HotpotQA)",
           chain_reader_test),
    Figure("Two-part support questions, support style: replies with both parts; time vs B", two_part_answers),
    Figure("Multi-part questions in seven forms, Quillbill (held out): reach C; single questions sent to C", multi_part_routing),
    Figure("Tier B evidence budget vs whole passages, demo help centre test: p50 latency ratio; F1 / hit difference", evidence_budget("help-centre")),
    Figure("Tier B evidence budget vs whole passages, support test (help centre + COVID FAQ): p50 latency ratio; F1 / hit difference", evidence_budget("support")),
    Figure("Tier B evidence budget vs whole passages, benchmark single-hop test: p50 latency ratio; F1 / hit difference", evidence_budget("benchmark")),
    Figure("Ceiling, distinct queries", ceiling("distinct")),
    Figure("Ceiling, repeated queries", ceiling("repeated")),
    Figure("Front-door overhead at half the ceiling, distinct, p50 / p99", overhead_at_half_ceiling("distinct")),
    Figure("Front-door overhead at half the ceiling, repeated, p50 / p99", overhead_at_half_ceiling("repeated")),
    Figure("Front-door overhead, one client, p50 / p99", overhead_one_client),
    Figure("Urllib3 LLM client, CPU per Answer after/before, 4 clients", cpu_per_answer_ratio("llm-client-urllib3", 4)),
    Figure("Mixed load end to end, tier A p95 at 80 % of the ceiling", mixed_tier_a_p95),
    Figure("Queue isolation, tier A queue wait p50 behind a C backlog, separate vs shared", queue_isolation_wait),
    Figure("Small talk end to end p50, the reader busy with B and C vs idle", small_talk_latency),
    Figure("Fair share, quiet tenant p95 under a 10x flood", fair_share_quiet_p95),
    Figure("Fault campaign", reliability),
    Figure("Fault campaign past one machine", reliability_multihost),
    Figure("Soak, processes within 5 %/h own RSS and flat descriptors after the warm-up", soak),
    Figure("Reader limit, demo help centre: one client, two-part answers, 16 clients", reader_limit),
    Figure("Tracing to files, extra CPU per request", tracing_extra_cpu),
    Figure("Shared llama-server vs a model per process, tier A, 8 clients", llm_serving_ratio),
    Figure("Demo install", setup_demo),
    Figure("Hostile inputs passed", hostile_inputs),
    Figure("Domain adaptation, support-test tier accuracy, start -> rounds 1-3", domain_adaptation),
)

_CACHE: dict[Any, Any] = {}


def _cached(key: Any, load: Callable[[], Any]) -> Any:
    """The evaluation's outcomes are read once for all of its figures."""
    if key not in _CACHE:
        _CACHE[key] = load()
    return _CACHE[key]


ROW = re.compile(r"^\|\s*(?P<name>[^|]+?)\s*\|\s*(?P<value>[^|]+?)\s*\|.*\]\(.*\)\s*\|\s*$")


def documented(docs: str) -> dict[str, str]:
    """The page's figures: every table row whose last cell links a report, by its first cell.
    Bold and backticks are formatting, not part of the value."""
    found = {}
    for line in docs.splitlines():
        match = ROW.match(line.strip())
        if match:
            found[match["name"]] = match["value"].replace("**", "").replace("`", "").strip()
    return found


@dataclass(frozen=True)
class Check:
    name: str
    documented: str | None
    recomputed: str | None

    @property
    def ok(self) -> bool:
        return self.documented is not None and self.documented == self.recomputed


def _recompute(figure: Figure, reports: Path) -> str | None:
    """The figure's value, or None (a failed check, with the reason on stderr) when its records
    are missing or no longer have the shape it reads."""
    try:
        return figure.compute(reports)
    except (OSError, KeyError, ValueError, TypeError) as error:
        print(f"{figure.name}: cannot recompute: {type(error).__name__}: {error}", file=sys.stderr)
        return None


def check(docs_path: Path = DEFAULT_DOCS, reports: Path = DEFAULT_REPORTS) -> list[Check]:
    """Each figure of the page against its recomputation; page rows nothing here recomputes and
    figures the page lacks come out as failed checks too."""
    stated = documented(docs_path.read_text(encoding="utf-8"))
    known = {f.name for f in FIGURES}
    checks = [Check(f.name, stated.get(f.name), _recompute(f, reports)) for f in FIGURES]
    checks += [Check(name, value, None) for name, value in stated.items() if name not in known]
    return checks


def render(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = [f"{'figure':<{width}}  {'value in docs':<40}  {'recomputed':<40}  verdict"]
    for c in checks:
        verdict = "OK" if c.ok else "MISMATCH"
        lines.append(f"{c.name:<{width}}  {c.documented or '(not in docs)':<40}  "
                     f"{c.recomputed or '(no recomputation)':<40}  {verdict}")
    failed = sum(not c.ok for c in checks)
    lines.append(f"{len(checks) - failed} of {len(checks)} figures recompute from the committed records"
                 + (f"; {failed} MISMATCH" if failed else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=Path, default=DEFAULT_DOCS, help="the results page (default docs/results.md)")
    parser.add_argument("--reports", type=Path, default=DEFAULT_REPORTS, help="the reports folder (default reports/)")
    args = parser.parse_args(argv)
    checks = check(args.docs, args.reports)
    print(render(checks))
    return 0 if all(c.ok for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
