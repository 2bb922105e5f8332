"""Follow-up turns: does rewriting a follow-up into a standalone question bring its retrieval back
to what the same question asked standalone gets?

Knowledge base: the support suite's COVID FAQ (`adaptive_rag.evaluation.support`), indexed like
the suite indexes it (tantivy, the tenant chunking). Turns: `support_data/follow_ups.jsonl`, 40
two-turn conversations written for this experiment (a previous question, the follow-up as a user
types it, the same question written standalone, the FAQ rows that answer it). The rewrite
rules were written before these turns; the later rule for a turn that names no subject of its own
(`follow_up.names_no_subject`) left their figures unchanged (`reports/support/`).

Rows, each the top-5 retrieval of one query per turn, scored hit@5 (an FAQ row answering it
among the first five passages' documents):
- `standalone`: the standalone question (the reference: the target is rewriting >= 90 % of it);
- `as_typed`: the follow-up searched as it was typed (no conversation);
- `concatenated`: the previous question and the follow-up searched together (the simple baseline);
- `rules`: `strategies.follow_up.standalone_question` without a reader (rules, else the previous
  topic added);
- `rules+reader` (`--reader`): the same with the configured reader for what no rule fits.

Intervals: percentile bootstrap over turns; differences paired by turn. Writes `records.jsonl`,
`summary.json` and `README.md` under `--out`.

    python -m lab.experiments.follow_ups --data-dir ../shared/data --out reports/conversations [--reader]
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from adaptive_rag.evaluation.datasets import split_of
from adaptive_rag.evaluation.support import SUITE, build_suite, doc_id_of, retrieval_hits
from adaptive_rag.ports import LLM, Retriever
from adaptive_rag.settings import Settings
from adaptive_rag.strategies.follow_up import Turn, standalone_question
from lab.harness.stats import mean_interval, paired_difference_interval

TURNS_FILE = Path(__file__).resolve().parents[2] / "adaptive_rag" / "evaluation" / "support_data" / "follow_ups.jsonl"
K = 5
ROWS = ("standalone", "as_typed", "concatenated", "rules", "rules+reader")
TARGET = 0.90  # the rewritten turn's hit@5 against the standalone question's


def load_turns(path: Path = TURNS_FILE) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def hit(retriever: Retriever, query: str, gold: Sequence[str]) -> tuple[float, float, list[str]]:
    """(hit@1, hit@5, the top five documents) of `query`."""
    found = retriever.search(query, K)
    docs = [doc_id_of(p.id, p.doc_id) for p in found]
    first, five = retrieval_hits(docs, [tuple(gold)], K)
    return first, five, docs


def run(retriever: Retriever, turns: list[dict[str, Any]], row_of_doc: dict[int, str],
        llm: LLM | None) -> list[dict[str, Any]]:
    records = []
    for turn in turns:
        gold = [row_of_doc[r] for r in turn["gold_rows"]]
        history = [Turn(turn["previous"])]
        queries = {
            "standalone": turn["standalone"],
            "as_typed": turn["follow_up"],
            "concatenated": f"{turn['previous']} {turn['follow_up']}",
        }
        ruled = standalone_question(turn["follow_up"], history)
        queries["rules"] = ruled.question
        methods = {"rules": ruled.method.value}
        seconds = {}
        if llm is not None:
            start = time.perf_counter()
            read = standalone_question(turn["follow_up"], history, llm)
            seconds["rules+reader"] = time.perf_counter() - start
            queries["rules+reader"] = read.question
            methods["rules+reader"] = read.method.value
        hits_1, hits, tops = {}, {}, {}
        for row, query in queries.items():
            hits_1[row], hits[row], tops[row] = hit(retriever, query, gold)
        records.append({"id": turn["id"], "split": split_of(SUITE, turn["id"]), "previous": turn["previous"],
                        "follow_up": turn["follow_up"], "gold_docs": gold, "queries": queries,
                        "methods": methods, "hit_5": hits, "hit_1": hits_1, "top_5": tops,
                        "rewrite_seconds": seconds})
    return records


def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    rows = [row for row in ROWS if all(row in r["hit_5"] for r in records)]
    summary: dict[str, Any] = {"turns": len(records), "k": K, "rows": {}, "vs_standalone": {},
                               "differences": {}, "methods": {}}
    summary["hit_1"] = {}
    for row in rows:
        for metric, table in (("hit_5", summary["rows"]), ("hit_1", summary["hit_1"])):
            values = [r[metric][row] for r in records]
            interval = mean_interval(values)
            table[row] = interval.as_dict() if interval else {"estimate": sum(values) / len(values)}
    reference = summary["rows"]["standalone"]["estimate"]
    for row in rows:
        if row != "standalone" and reference:
            summary["vs_standalone"][row] = summary["rows"][row]["estimate"] / reference
    for row in rows:
        if row in ("as_typed", "standalone"):
            continue
        diff = paired_difference_interval([r["hit_5"]["as_typed"] for r in records],
                                          [r["hit_5"][row] for r in records])
        summary["differences"][f"{row} - as_typed"] = diff.as_dict() if diff else None
        diff = paired_difference_interval([r["hit_5"]["standalone"] for r in records],
                                          [r["hit_5"][row] for r in records])
        summary["differences"][f"{row} - standalone"] = diff.as_dict() if diff else None
    for row in ("rules", "rules+reader"):
        if row in rows:
            counts: dict[str, int] = {}
            for r in records:
                counts[r["methods"][row]] = counts.get(r["methods"][row], 0) + 1
            summary["methods"][row] = counts
    summary["target"] = {"ratio": TARGET, "met_by": [row for row, ratio in summary["vs_standalone"].items()
                                                     if row.startswith("rules") and ratio >= TARGET]}
    return summary


def readme(summary: dict[str, Any], per_split: dict[str, Any], command: str, meta: dict[str, Any]) -> str:
    def cell(stats: dict[str, Any]) -> str:
        if "low" in stats:
            return f"{100 * stats['estimate']:.1f} % [{100 * stats['low']:.1f}, {100 * stats['high']:.1f}]"
        return f"{100 * stats['estimate']:.1f} %"

    lines = [
        "# Follow-up turns: retrieval with and without rewriting",
        "",
        "Does rewriting a follow-up (\"how does it spread?\" after \"What is a novel coronavirus?\") into a",
        "standalone question bring its retrieval back to what the standalone question gets? Knowledge",
        f"base: the support suite's COVID FAQ ({meta['passages']} passages, tantivy, top {K}). Turns:",
        f"{summary['turns']} two-turn conversations written for this experiment",
        "(`adaptive_rag/evaluation/support_data/follow_ups.jsonl`) by the author of the rewrite rules,",
        "after the rules were written and without changing them afterwards: an optimistic setting for",
        "the rules (a set written by someone else, or real users' turns, may do worse).",
        "",
        "| row | hit@5 (all turns) [95 % CI] | vs standalone | " + " | ".join(f"hit@5 {s}" for s in per_split)
        + " | hit@1 (all turns) [95 % CI] |",
        "| --- | --- | --- | " + " | ".join("---" for _ in per_split) + " | --- |",
    ]
    for row, stats in summary["rows"].items():
        ratio = summary["vs_standalone"].get(row)
        lines.append(f"| `{row}` | {cell(stats)} | {'-' if ratio is None else f'{100 * ratio:.0f} %'} | "
                     + " | ".join(cell(s["rows"][row]) for s in per_split.values())
                     + f" | {cell(summary['hit_1'][row])} |")
    lines += ["", "Paired differences (hit@5 points, 95 % CI):", ""]
    for name, diff in summary["differences"].items():
        if diff:
            lines.append(f"- {name}: {100 * diff['estimate']:+.1f} [{100 * diff['low']:+.1f}, {100 * diff['high']:+.1f}]")
    lines += ["", "How the turns were rewritten: " + "; ".join(
        f"`{row}`: " + ", ".join(f"{m} {n}" for m, n in sorted(counts.items()))
        for row, counts in summary["methods"].items()) + ".", ""]
    met = summary["target"]["met_by"]
    lines += [f"Target (issue: a rewritten follow-up's hit@5 >= {100 * TARGET:.0f} % of the standalone "
              f"question's): {'met by ' + ', '.join(f'`{m}`' for m in met) if met else 'not met'} on these turns.",
              "", "Rows: `standalone` the question written to stand alone (the reference); `as_typed` the follow-up",
              "alone; `concatenated` the previous question and the follow-up searched together (the simple",
              "baseline); `rules` the rewrite without a reader (rules, else the previous topic added);",
              "`rules+reader` the rewrite with the reader for what no rule fits.", "",
              "Command:", "", "```", command, "```", "",
              f"Run: {meta['when']}, {meta['machine']}; reader: {meta['reader']}.",
              "Records (every turn's queries, hits and top five documents): `records.jsonl`; figures: `summary.json`."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=Path("reports/conversations"))
    parser.add_argument("--reader", action="store_true", help="also rewrite with the configured reader")
    args = parser.parse_args(argv)
    settings = Settings(**({"data_dir": args.data_dir} if args.data_dir else {}))
    suite = build_suite(settings.data_dir, settings)
    row_of_doc = {entry.row: entry.doc_id for entry in suite.entries}
    llm = None
    if args.reader:
        from adaptive_rag.llm import build_llm

        llm = build_llm(settings)
    from adaptive_rag.retrieval.tantivy_index import TantivyRetriever

    with tempfile.TemporaryDirectory(prefix="arag-follow-ups-") as work:
        retriever = TantivyRetriever.build(Path(work) / "index", suite.passages, title_boost=settings.title_boost)
        records = run(retriever, load_turns(), row_of_doc, llm)
    summary = summarise(records)
    per_split = {split: summarise([r for r in records if r["split"] == split]) for split in ("train", "test")}
    meta = {"passages": len(suite.passages), "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": f"{platform.machine()}, {platform.python_version()}",
            "reader": (settings.llm_base_url or settings.reader) if args.reader else "none (rules only)"}
    command = "python -m lab.experiments.follow_ups " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "records.jsonl").open("w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    (args.out / "summary.json").write_text(json.dumps(
        {"all": summary, "per_split": per_split, "meta": meta, "command": command}, indent=2) + "\n")
    (args.out / "README.md").write_text(readme(summary, per_split, command, meta))
    print((args.out / "README.md").read_text())


if __name__ == "__main__":
    main()
