"""Follow-up rewriting as the product runs it with a reader, per knowledge base: does a follow-up
rewritten by the rules and, for what no rule fits, by the reader retrieve as well as the same
question asked standalone?

Knowledge bases: the support suite's (`adaptive_rag.evaluation.support_kbs`): the COVID FAQ and the
demo help centre (on which any rewrite prompt change is chosen, `train` turns only) and Quillbill
(held out: run only when named in `--kb`, its `test` turns read once at the end). Each indexed as
the support suite indexes it (tantivy, the tenant chunking, top 5).

Rows, each the top-5 retrieval of one query per turn, scored hit@5 (a gold document among the
first five passages' documents):
- `standalone`: the question written to stand alone (the reference; target: a rewritten turn's
  hit@5 >= 90 % of it);
- `as_typed`: the follow-up searched as it was typed (no conversation);
- `concatenated`: the previous question and the follow-up together (the simple baseline);
- `rules`: `strategies.follow_up.standalone_question` without a reader (what a deployment without
  an LLM endpoint runs: rules, else the previous topic added);
- `rules+reader` (`--reader`): the same call with the reader (what the front door runs when a
  reader is configured, `FrontDoorSettings.rewrite_with`): rules first, the reader
  (`prompts.rewrite` through `follow_up.by_reader`) for the turns that depend on the conversation
  and that no rule fits;
- `reader_unmarked` (`--reader`, a lab row, not the product): `rules+reader`, and the reader also
  for the turns the rules leave as sent because they show no sign of depending on the
  conversation ("how many can I have?"): would widening the reader's gate help?

Per turn the records keep each row's query, how it was made (`none` = unchanged, `rules`,
`reader`, `context`), its hit@5, the reader's seconds, and whether the rewrite asks two
questions where the standalone question asks one (`routing.rules.asks_several_things`, or two
question marks: the earlier question repeated; such a turn is escalated to tier C and its reply
answers a question the user did not ask, a cost hit@5 does not show). Intervals: percentile bootstrap over
turns (`adaptive_rag.evaluation.bootstrap`); the ratio to `standalone` resampled jointly, turn by
turn; differences paired by turn. `--report-only` renders the report again from `records.jsonl`
without a reader.

    nice -n 10 python -m lab.experiments.follow_up_rewriting --data-dir ../shared/data \\
        --kb covid-faq,help-centre --reader server --out reports/conversations/reader
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from adaptive_rag.evaluation.bootstrap import ratio_interval
from adaptive_rag.evaluation.support import FollowUpTurn, SupportSuite, doc_id_of, retrieval_hits
from adaptive_rag.evaluation.support_kbs import KNOWLEDGE_BASES, build_knowledge_base_suite
from adaptive_rag.ports import LLM, Retriever
from adaptive_rag.routing.rules import asks_several_things
from adaptive_rag.settings import Settings
from adaptive_rag.strategies.follow_up import RewriteMethod, Turn, by_reader, standalone_question
from lab.harness.stack import unwind_on_stop_signals
from lab.harness.stats import mean_interval, paired_difference_interval

K = 5
HELD_OUT = "quillbill"
ROWS = ("standalone", "as_typed", "concatenated", "rules", "rules+reader", "reader_unmarked")
REWRITE_ROWS = ("rules", "rules+reader", "reader_unmarked")
TARGET = 0.90  # a rewritten turn's hit@5 against the standalone question's
SPLITS = ("train", "test", "all")


def hit(retriever: Retriever, query: str, gold: Sequence[str]) -> tuple[float, list[str]]:
    """(hit@5, the top five documents) of `query`."""
    found = retriever.search(query, K)
    docs = [doc_id_of(p.id, p.doc_id) for p in found]
    return retrieval_hits(docs, [tuple(gold)], K)[1], docs


def _two_questions(query: str) -> bool:
    """Whether `query` asks two questions: the two-question rule's, or two question marks (the
    earlier question repeated before the follow-up)."""
    return asks_several_things(query) or query.count("?") > 1


def rewrite_turn(turn: FollowUpTurn, llm: LLM | None) -> tuple[dict[str, str], dict[str, str], dict[str, float]]:
    """The rewritten rows' queries, methods and reader seconds for one turn, through the product's
    `standalone_question` (and, for `reader_unmarked`, its `by_reader`)."""
    history = [Turn(turn.previous)]
    ruled = standalone_question(turn.follow_up, history)
    queries, methods, seconds = {"rules": ruled.question}, {"rules": ruled.method.value}, {}
    if llm is None:
        return queries, methods, seconds
    if ruled.method is RewriteMethod.CONTEXT:  # the only turns the reader sees in the product
        start = time.perf_counter()
        read = standalone_question(turn.follow_up, history, llm)
        seconds["rules+reader"] = time.perf_counter() - start
    else:
        read = ruled  # the same call: rules (or "as sent") decide before the reader is asked
    queries["rules+reader"], methods["rules+reader"] = read.question, read.method.value
    if ruled.method is RewriteMethod.NONE:
        start = time.perf_counter()
        try:
            widened = by_reader(llm, turn.follow_up, history)
        except Exception:  # noqa: BLE001 - as the product: the reader away leaves the turn as sent
            widened = None
        seconds["reader_unmarked"] = time.perf_counter() - start
        queries["reader_unmarked"] = widened or turn.follow_up
        methods["reader_unmarked"] = RewriteMethod.READER.value if widened else RewriteMethod.NONE.value
    else:
        queries["reader_unmarked"], methods["reader_unmarked"] = read.question, read.method.value
    return queries, methods, seconds


def run_knowledge_base(suite: SupportSuite, retriever: Retriever, turns: Sequence[FollowUpTurn],
                       llm: LLM | None) -> list[dict[str, Any]]:
    records = []
    for turn in turns:
        queries = {"standalone": turn.standalone, "as_typed": turn.follow_up,
                   "concatenated": f"{turn.previous} {turn.follow_up}"}
        rewritten, methods, seconds = rewrite_turn(turn, llm)
        queries.update(rewritten)
        hits, tops = {}, {}
        for row, query in queries.items():
            hits[row], tops[row] = hit(retriever, query, turn.gold)
        # A rewrite asking two questions where the standalone asks one is routed to tier C
        # (`rules.escalate_several_things`): a cost the hit@5 does not show.
        two = {row: _two_questions(queries[row]) and not _two_questions(turn.standalone)
               for row in REWRITE_ROWS if row in queries}
        records.append({"kb": suite.name, "id": turn.id, "split": turn.split, "previous": turn.previous,
                        "follow_up": turn.follow_up, "gold_docs": list(turn.gold), "queries": queries,
                        "methods": methods, "hit_5": hits, "top_5": tops, "reader_seconds": seconds,
                        "two_questions": two})
    return records


def _cell(interval: Any) -> dict[str, Any] | None:
    return interval.as_dict() if interval else None


def summarise(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """hit@5 per row, its ratio to `standalone` and paired differences, over `records`."""
    if not records:
        return {"turns": 0}
    rows = [row for row in ROWS if all(row in r["hit_5"] for r in records)]
    values = {row: [r["hit_5"][row] for r in records] for row in rows}
    keyed = {row: {("all", r["id"]): r["hit_5"][row] for r in records} for row in rows}
    summary: dict[str, Any] = {"turns": len(records), "k": K, "hit_5": {}, "vs_standalone": {},
                               "differences": {}, "methods": {}}
    for row in rows:
        interval = mean_interval(values[row])
        summary["hit_5"][row] = _cell(interval) or {"estimate": sum(values[row]) / len(values[row]), "n": len(records)}
        if row != "standalone":
            summary["vs_standalone"][row] = _cell(ratio_interval(keyed[row], keyed["standalone"]))
    for row in rows:
        if row in REWRITE_ROWS:
            summary["differences"][f"{row} - as_typed"] = _cell(paired_difference_interval(values["as_typed"], values[row]))
            if row != "rules":
                summary["differences"][f"{row} - rules"] = _cell(paired_difference_interval(values["rules"], values[row]))
            summary["methods"][row] = dict(sorted(Counter(r["methods"][row] for r in records).items()))
            summary.setdefault("two_questions", {})[row] = sum(
                _two_questions(r["queries"][row]) and not _two_questions(r["queries"]["standalone"]) for r in records)
    seconds = [r["reader_seconds"]["rules+reader"] for r in records if "rules+reader" in r["reader_seconds"]]
    summary["reader_calls"] = len(seconds)
    summary["reader_seconds_mean"] = sum(seconds) / len(seconds) if seconds else None
    summary["target_met_by"] = [row for row in REWRITE_ROWS if (summary["vs_standalone"].get(row) or {})
                                .get("estimate", 0) >= TARGET]
    return summary


def summaries(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per knowledge base and split (`train`, `test`, `all`)."""
    out: dict[str, dict[str, Any]] = {}
    for kb in dict.fromkeys(r["kb"] for r in records):
        mine = [r for r in records if r["kb"] == kb]
        present = {r["split"] for r in mine}
        splits = [s for s in SPLITS if s in present or (s == "all" and len(present) > 1)]
        out[kb] = {split: summarise([r for r in mine if split == "all" or r["split"] == split]) for split in splits}
    return out


def _pct(cell: dict[str, Any] | None) -> str:
    if not cell:
        return "-"
    if "low" in cell:
        return f"{100 * cell['estimate']:.0f} % [{100 * cell['low']:.0f}, {100 * cell['high']:.0f}]"
    return f"{100 * cell['estimate']:.0f} %"


def readme(found: dict[str, dict[str, Any]], command: str, meta: dict[str, Any]) -> str:
    lines = [
        "# Follow-up rewriting with the reader, per knowledge base",
        "",
        "Retrieval hit@5 of each follow-up turn (top 5, tantivy, the support suite's indexing) searched",
        "standalone (the reference), as typed, concatenated with the previous question, rewritten by the",
        "rules alone (`rules`, a deployment without an LLM endpoint), and rewritten as the front door",
        "does with a reader (`rules+reader`: rules first, the reader for the turns that depend on the",
        "conversation and that no rule fits). `reader_unmarked` is a lab row: the reader also for the",
        "turns the rules leave as sent. Ratios are to the standalone question's hit@5 (target >= 90 %),",
        "with 95 % bootstrap intervals over turns.",
        "",
    ]
    for kb, per_split in found.items():
        held = " (held out: its `test` turns read once)" if kb == HELD_OUT else ""
        lines += [f"## {kb}{held}", "",
                  "| split | turns | row | hit@5 | / standalone | methods | asks two questions |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for split, s in per_split.items():
            if not s.get("turns"):
                continue
            for row, cell in s["hit_5"].items():
                methods = ", ".join(f"{m} {n}" for m, n in s["methods"].get(row, {}).items())
                lines.append(f"| {split} | {s['turns']} | `{row}` | {_pct(cell)} | "
                             f"{_pct(s['vs_standalone'].get(row)) if row != 'standalone' else '-'} | {methods} | "
                             f"{s.get('two_questions', {}).get(row, '-')} |")
        lines.append("")
        for split, s in per_split.items():
            if s.get("turns") and s.get("reader_calls"):
                lines.append(f"- {split}: {s['reader_calls']} reader calls in `rules+reader`, "
                             f"{s['reader_seconds_mean']:.2f} s each on average")
        lines.append("")
    lines += ["Command:", "", "```", command, "```", "",
              f"Run: {meta['when']}, {meta['machine']}; reader: {meta['reader']}.",
              "Records (every turn's queries, methods, hits and top five documents): `records.jsonl`;",
              "figures: `summary.json`."]
    return "\n".join(lines) + "\n"


@contextmanager
def reader(kind: str, settings: Settings) -> Iterator[tuple[LLM | None, str]]:
    """The reader to rewrite with: `none`; `server`: the stack's shared `llama-server` (one slot,
    two threads) serving the embedded reader's GGUF; `embedded`: llama-cpp-python in process;
    `configured`: `build_llm(settings)` (LLM_BASE_URL when set)."""
    if kind == "none":
        yield None, "none (rules only)"
        return
    from adaptive_rag.llm import build_llm, embedded_model_path

    if kind == "server":
        from infra.local.llama_server import LlamaServerProcess

        model = embedded_model_path(settings)
        with LlamaServerProcess(model, parallel=1, threads=2) as server:
            served = settings.model_copy(update={"llm_base_url": server.base_url, "llm_api": "completions"})
            yield build_llm(served), f"llama-server (1 slot, 2 threads) serving {model.name}"
        return
    if kind == "embedded":
        settings = settings.model_copy(update={"llm_base_url": None})
        yield build_llm(settings), f"embedded {embedded_model_path(settings).name}"
        return
    yield build_llm(settings), settings.llm_base_url or f"embedded {settings.reader}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=Path("reports/conversations/reader"))
    parser.add_argument("--kb", default="covid-faq,help-centre",
                        help=f"comma-separated of {', '.join(KNOWLEDGE_BASES)} ({HELD_OUT} is held out: name it to run it)")
    parser.add_argument("--split", choices=("train", "test", "all"), default="all",
                        help="the turns to run (choose on train; the held-out KB's test read once)")
    parser.add_argument("--reader", choices=("none", "server", "embedded", "configured"), default="none")
    parser.add_argument("--report-only", action="store_true", help="render the report from records.jsonl")
    args = parser.parse_args(argv)
    unwind_on_stop_signals()  # SIGTERM stops the llama-server started here too
    args_list = list(argv if argv is not None else sys.argv[1:])
    command = "python -m lab.experiments.follow_up_rewriting " + shlex.join(a for a in args_list if a != "--report-only")
    records_path = args.out / "records.jsonl"
    if args.report_only:
        records = [json.loads(line) for line in records_path.read_text(encoding="utf-8").splitlines() if line.strip()]
        meta = json.loads((args.out / "summary.json").read_text(encoding="utf-8"))["meta"]
        command = json.loads((args.out / "summary.json").read_text(encoding="utf-8"))["command"]
    else:
        settings = Settings(**({"data_dir": args.data_dir} if args.data_dir else {}))
        names = [n.strip() for n in args.kb.split(",") if n.strip()]
        unknown = [n for n in names if n not in KNOWLEDGE_BASES]
        if unknown:
            parser.error(f"unknown --kb {', '.join(unknown)}")
        from adaptive_rag.retrieval.tantivy_index import TantivyRetriever

        records = []
        with reader(args.reader, settings) as (llm, described), \
                tempfile.TemporaryDirectory(prefix="arag-follow-up-rewriting-") as work:
            for name in names:
                suite = build_knowledge_base_suite(name, settings)
                turns = [t for t in suite.follow_ups if args.split == "all" or t.split == args.split]
                retriever = TantivyRetriever.build(Path(work) / name, suite.passages, title_boost=settings.title_boost)
                records += run_knowledge_base(suite, retriever, turns, llm)
                print(f"{name}: {len(turns)} turns", file=sys.stderr)
        meta = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "machine": f"{platform.machine()}, {platform.python_version()}", "reader": described,
                "split": args.split, "knowledge_bases": names}
    found = summaries(records)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        with records_path.open("w", encoding="utf-8") as out:
            for record in records:
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
    (args.out / "summary.json").write_text(json.dumps(
        {"per_kb": found, "meta": meta, "command": command}, indent=2) + "\n", encoding="utf-8")
    (args.out / "README.md").write_text(readme(found, command, meta), encoding="utf-8")
    print((args.out / "README.md").read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
