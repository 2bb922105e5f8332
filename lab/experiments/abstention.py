"""Abstention by default: does each knowledge base's automatic threshold catch the questions it does
not cover without refusing the ones it does, on a knowledge base its design never saw too?

Two knowledge bases, each imported as a tenant's (`KnowledgeBaseService`: embedded tantivy, SQLite
records, the threshold derived on import):
- `support`: the COVID FAQ of the support suite (`adaptive_rag.evaluation.support`), its in-KB
  questions (paraphrase, faq, joined) and its out-of-KB ones (NQ-open, TriviaQA, SQuAD), small
  talk left out (answered at admission, before any retrieval);
- `demo`: the demo help centre (`demo/knowledge_base.jsonl`) with `demo/coverage_questions.json`:
  questions it covers, questions about the same products it does not cover, and off-topic ones,
  written for this experiment.

Rows, all judged by the gate every retrieving strategy runs before its reader
(`strategies.abstention.Abstention`), so no reader is needed:
- `none`: no threshold (only "nothing retrieved" abstains);
- `hand-tuned`: a raw BM25 threshold, the best by Youden's J on the support suite's `train`
  split (what `arag eval --suite support --abstain-min-score auto` tunes), set for the whole
  deployment as an operator would;
- `automatic`: each knowledge base's own relevance threshold, derived on import.

The report's figures use `--split` (default `test`); the candidate table (other ways to derive a
threshold) uses `train` only. Writes `records.jsonl.gz` (every question of both splits: top score,
relevance, which rows abstained), `report.json` and `report.md` under `--out`.

    python -m lab.experiments.abstention --data-dir ../shared/data --out reports/abstention
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from adaptive_rag.evaluation.abstention import (
    AUTOMATIC,
    HAND_TUNED,
    NONE,
    WITH_COVERAGE,
    GateRecord,
    KnowledgeBaseProbe,
    LabelledQuestion,
    auc,
    add_coverage_row,
    candidate_table,
    coverage_candidates,
    demo_questions,
    gate,
    import_knowledge_base,
    probe,
    summarise,
    write_records,
)
from adaptive_rag.evaluation.support import FAQ_FILE, IN_KB, SMALL_TALK, build_suite, faq_documents, threshold_sweep
from adaptive_rag.knowledge.calibration import FLOOR, QUANTILE, Calibration
from adaptive_rag.knowledge.importers import import_path
from adaptive_rag.settings import Settings
from adaptive_rag.strategies.abstention import Abstention

REPO = Path(__file__).resolve().parents[2]
ROWS = (NONE, HAND_TUNED, AUTOMATIC, WITH_COVERAGE)
COVERAGE_GRID = tuple(round(0.02 * i, 2) for i in range(0, 26))  # fixed floors 0 .. 0.5, picked on `train`
KIND_ORDER = ("paraphrase", "faq", "joined", "out_of_kb", "covered", "in_domain_uncovered", "off_topic")
CANDIDATE_FLOORS = (0.0, 0.4, 0.45, 0.5)
CANDIDATE_QUANTILES = (0.7, 0.8, 0.9, 0.95)
MAX_FALSE = 0.05  # the false-abstention budget a candidate must keep on every knowledge base


def _pct(cell: Mapping[str, Any] | None) -> str:
    if not cell:
        return "-"
    return f"{100 * cell['estimate']:.1f} [{100 * cell['low']:.1f}, {100 * cell['high']:.1f}]"


def _points(cell: Mapping[str, Any] | None) -> str:
    if not cell:
        return "-"
    return f"{100 * cell['estimate']:+.1f} [{100 * cell['low']:+.1f}, {100 * cell['high']:+.1f}]"


def markdown(report: Mapping[str, Any]) -> str:
    meta = report["meta"]
    lines = ["# Abstention report", "", f"Command: `{meta['command']}`", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items() if k != "command"]
    split = meta["split"]
    for kb, data in report["knowledge_bases"].items():
        counts = ", ".join(f"{kind} {n}" for kind, n in data["counts"].items())
        lines += ["", f"## {kb}: {data['description']}", "",
                  f"Automatic threshold {data['automatic_threshold']:g}: {data['calibration_note']}. "
                  f"Hand-tuned: BM25 top score {report['hand_tuned']['threshold']:.2f}. "
                  f"Coverage floor (automatic+coverage): {report.get('min_coverage', 0):g}.", "",
                  f"`{split}` split: {counts}. Percentages with bootstrap 95 % intervals.", "",
                  "| row | uncovered questions abstained (caught) | covered questions abstained (false) |",
                  "| --- | ---: | ---: |"]
        for row, cell in data["summary"]["rows"].items():
            lines.append(f"| {row} | {_pct(cell['caught'])} | {_pct(cell['false_abstain'])} |")
        kinds = [k for k in KIND_ORDER if k in next(iter(data["summary"]["rows"].values()))["kinds"]]
        lines += ["", "Abstained, per kind of question:", "",
                  "| row | " + " | ".join(kinds) + " |", "| --- |" + " ---: |" * len(kinds)]
        for row, cell in data["summary"]["rows"].items():
            lines.append(f"| {row} | " + " | ".join(_pct(cell["kinds"][k]) for k in kinds) + " |")
        lines += ["", "Paired differences (points, same questions):", ""]
        lines += [f"- {name}: {_points(diff)}" for name, diff in data["summary"]["differences"].items()]
        lines += ["", f"AUC on `train` (covered above uncovered): relevance {data['auc_train']['relevance']:.3f}, "
                      f"BM25 top score {data['auc_train']['top_score']:.3f}, "
                      f"coverage {data['auc_train']['coverage']:.3f}."]
    lines += ["", "## Other ways to derive the threshold (`train` split only)", "",
              "Caught / false abstentions (%) per knowledge base; each knowledge base's threshold in brackets.", "",
              "| candidate | " + " | ".join(report["knowledge_bases"]) + " |",
              "| --- |" + " ---: |" * len(report["knowledge_bases"])]
    for row in report["candidates"]:
        cells = [f"{100 * row['cells'][kb][0]:.0f} / {100 * row['cells'][kb][1]:.1f} ({row['thresholds'][kb]:.2f})"
                 for kb in report["knowledge_bases"]]
        name = f"**{row['candidate']}** (picked)" if row.get("picked") else row["candidate"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", f"Picked: the highest mean over the knowledge bases of caught minus false, among the "
                  f"candidates with at most {100 * MAX_FALSE:g} % false abstentions on each."]
    if report.get("coverage_candidates"):
        lines += ["", "## A coverage floor on top of the automatic threshold (`train` split only)", "",
                  "Caught / false abstentions (%) per knowledge base; picked by the same rule (the first on a tie; "
                  "a floor of 0 is the automatic threshold alone).", "",
                  "| candidate | " + " | ".join(report["knowledge_bases"]) + " |",
                  "| --- |" + " ---: |" * len(report["knowledge_bases"])]
        for row in report["coverage_candidates"]:
            cells = [f"{100 * row['cells'][kb][0]:.1f} / {100 * row['cells'][kb][1]:.1f}" for kb in report["knowledge_bases"]]
            name = f"**{row['candidate']}** (picked)" if row.get("picked") else row["candidate"]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def pick(table: list[dict[str, Any]], max_false: float = MAX_FALSE) -> list[dict[str, Any]]:
    """Mark the candidate with the highest mean (caught - false) over the knowledge bases among
    those with at most `max_false` false abstentions on every one (the first on a tie)."""
    def mean_j(row: Mapping[str, Any]) -> float:
        return sum(c - f for c, f in row["cells"].values()) / len(row["cells"])

    allowed = [row for row in table if all(f <= max_false for _, f in row["cells"].values())]
    if allowed:
        max(allowed, key=mean_j)["picked"] = True
    return table


def support_questions(suite: Any) -> list[LabelledQuestion]:
    """The support suite's queries a knowledge base is asked (small talk never reaches it)."""
    return [LabelledQuestion(q.id, q.query, q.kind, q.kind in IN_KB, q.split)
            for q in suite.queries if q.kind != SMALL_TALK]


def run(data_dir: Path, out: Path, split: str, command: str) -> dict[str, Any]:
    settings = Settings(_env_file=None, data_dir=data_dir)
    suite = build_suite(data_dir, settings)
    demo_docs = import_path(REPO / "demo" / "knowledge_base.jsonl")
    kbs: dict[str, tuple[list, list[LabelledQuestion], str]] = {
        "support": (faq_documents(data_dir / FAQ_FILE), support_questions(suite),
                    "the COVID FAQ (213 entries) with the support suite's questions"),
        "demo": (demo_docs, demo_questions(REPO / "demo" / "coverage_questions.json"),
                 f"the demo help centre ({len(demo_docs)} articles) with the coverage questions written for it"),
    }
    records: list[GateRecord] = []
    probes: dict[str, KnowledgeBaseProbe] = {}
    report: dict[str, Any] = {"knowledge_bases": {}}
    with tempfile.TemporaryDirectory(prefix="arag-abstention-") as work:
        services = {}
        for name, (documents, _, _) in kbs.items():
            (Path(work) / name).mkdir()
            services[name] = import_knowledge_base(documents, Path(work) / name)
        support_retriever = services["support"].index.retriever("probe")
        train = [q for q in suite.select("train") if q.kind != SMALL_TALK]
        sweep = threshold_sweep(train, support_retriever, settings.top_k)
        hand_tuned = sweep["best"]["threshold"]
        report["hand_tuned"] = {"threshold": hand_tuned, "note": "best Youden's J of the raw BM25 top score on "
                                "the support suite's train split (`threshold_sweep`)", **sweep["best"]}
        for name, (documents, questions, description) in kbs.items():
            info = services[name].describe("probe")
            retriever = services[name].index.retriever("probe")
            rows = {NONE: Abstention(), HAND_TUNED: Abstention(min_score=hand_tuned),
                    AUTOMATIC: Abstention(min_relevance=info.abstention.value)}
            mine = gate(name, retriever, questions, rows, settings.top_k)
            records += mine
            probes[name] = probe(name, retriever, info.chunks, info.calibration, [d.title for d in documents])
            chosen = [r for r in mine if r.split == split]
            train_records = [r for r in mine if r.split == "train"]
            counts = {kind: sum(r.kind == kind for r in chosen) for kind in KIND_ORDER if any(r.kind == kind for r in chosen)}
            report["knowledge_bases"][name] = {
                "description": description, "chunks": info.chunks, "automatic_threshold": info.abstention.value,
                "calibration": info.calibration,
                "calibration_note": Calibration.from_record(info.calibration).describe() if info.calibration else "-",
                "counts": counts,
                "auc_train": {
                    "relevance": auc([r.relevance or 0.0 for r in train_records if r.covered],
                                     [r.relevance or 0.0 for r in train_records if not r.covered]),
                    "top_score": auc([r.top_score for r in train_records if r.covered],
                                     [r.top_score for r in train_records if not r.covered]),
                    "coverage": auc([r.coverage or 0.0 for r in train_records if r.covered],
                                    [r.coverage or 0.0 for r in train_records if not r.covered]),
                },
                "reference": probes[name].reference, "titles": probes[name].titles,
            }
    train = [r for r in records if r.split == "train"]
    report["candidates"] = pick(candidate_table(train, probes, CANDIDATE_FLOORS, CANDIDATE_QUANTILES))
    # A coverage floor on top of the automatic threshold, picked the same way on `train` only; the
    # floor of 0 is the automatic threshold alone, so "nothing better" keeps the current rule.
    report["coverage_candidates"] = pick(coverage_candidates(train, COVERAGE_GRID))
    picked = next(row for row in report["coverage_candidates"] if row.get("picked"))
    report["min_coverage"] = picked["min_coverage"]
    add_coverage_row(records, picked["min_coverage"])
    for name, data in report["knowledge_bases"].items():
        data["summary"] = summarise([r for r in records if r.kb == name and r.split == split], ROWS)
    report["meta"] = {
        "command": command, "split": split, "rows": ", ".join(ROWS),
        "automatic": f"relevance below max({FLOOR:g}, the {QUANTILE:g} quantile of the reference questions' relevance)",
        "automatic+coverage": "the automatic threshold, or the top 5 passages carry less than the picked share of "
                              "the question's idf weight (a fixed floor picked on `train`)",
        "retriever": f"embedded tantivy, title boost {settings.title_boost:g}, top {settings.top_k}",
        "date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {platform.python_version()}",
    }
    out.mkdir(parents=True, exist_ok=True)
    write_records(records, out / "records.jsonl.gz")
    (out / "report.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    (out / "report.md").write_text(markdown(report), encoding="utf-8")
    return report


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--out", type=Path, default=Path("reports/abstention"))
    parser.add_argument("--split", choices=("train", "test"), default="test")
    args = parser.parse_args(argv)
    command = "python -m lab.experiments.abstention " + shlex.join(sys.argv[1:] if argv is None else argv)
    report = run(args.data_dir, args.out, args.split, command.strip())
    for kb, data in report["knowledge_bases"].items():
        for row, cell in data["summary"]["rows"].items():
            print(f"{kb:8s} {row:11s} caught {_pct(cell['caught'])}  false {_pct(cell['false_abstain'])}")
    print(f"wrote {args.out}/records.jsonl.gz, report.json, report.md")


if __name__ == "__main__":
    main()
