"""Answer style: does the `support` reader (a full answer citing its passages) come closer to the
FAQ's own answers than the `short` span reader, and at what cost in time?

The support suite's in-KB `paraphrase` and `faq` queries (`adaptive_rag.evaluation.support`), a
small subset of `--split` (`--limit` per kind, the suite's stable order); one retrieval per query
(single step, the settings' top_k), then each style's reader on the same passages, read as tier B
reads them (`ARAG_EVIDENCE_TOKENS`: their best sentences up to that budget; 0, whole passages). Scores against
the gold FAQ answer(s): ROUGE-L, token recall (share of the gold answer's tokens the reply holds,
SQuAD normalisation) and token F1; seconds per reply; for `support`, whether the reader cited a
passage on its own (before the top source is appended to a reply citing none). Intervals:
percentile bootstrap over queries, differences paired by query.

    python -m lab.experiments.answer_style --data-dir ../shared/data --out reports/conversations/style --limit 5
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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from adaptive_rag.contracts import AnswerStyle
from adaptive_rag.evaluation.metrics import f1_score, normalize_answer
from adaptive_rag.evaluation.support import FAQ, PARAPHRASE, build_suite, rouge_l
from adaptive_rag.settings import Settings
from adaptive_rag.strategies.single_step import answer_in_style, cited
from lab.harness.stats import mean_interval, paired_difference_interval

STYLES = (AnswerStyle.SHORT, AnswerStyle.SUPPORT)


def token_recall(prediction: str, golds: Sequence[str]) -> float:
    """Share of the gold answer's tokens found in the prediction (max over golds)."""
    best = 0.0
    said = Counter(normalize_answer(prediction).split())
    for gold in golds:
        wanted = Counter(normalize_answer(gold).split())
        if wanted:
            best = max(best, sum((said & wanted).values()) / sum(wanted.values()))
    return best


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=Path("reports/conversations/style"))
    parser.add_argument("--split", default="test")
    parser.add_argument("--limit", type=int, default=5, help="queries per kind (paraphrase, faq)")
    args = parser.parse_args(argv)
    settings = Settings(**({"data_dir": args.data_dir} if args.data_dir else {}))
    suite = build_suite(settings.data_dir, settings)
    queries = [q for q in suite.select(args.split, args.limit) if q.kind in (PARAPHRASE, FAQ)]
    from adaptive_rag.llm import build_llm
    from adaptive_rag.retrieval.tantivy_index import TantivyRetriever

    llm = build_llm(settings)
    args.out.mkdir(parents=True, exist_ok=True)
    records_path = args.out / "records.jsonl"
    # Records are written as they are made and a run resumes where the last one stopped.
    records: list[dict[str, Any]] = ([json.loads(line) for line in records_path.read_text().splitlines() if line]
                                     if records_path.exists() else [])
    done = {r["id"] for r in records}
    with tempfile.TemporaryDirectory(prefix="arag-style-") as work, records_path.open("a", encoding="utf-8") as sink:
        retriever = TantivyRetriever.build(Path(work) / "index", suite.passages, title_boost=settings.title_boost)
        for query in queries:
            if query.id in done:
                continue
            passages = retriever.search(query.query, settings.top_k)
            record: dict[str, Any] = {"id": query.id, "kind": query.kind, "query": query.query,
                                      "passages": [p.id for p in passages]}
            for style in STYLES:
                start = time.perf_counter()
                answer = answer_in_style(llm, query.query, passages, style, evidence_tokens=settings.evidence_tokens or None)
                seconds = time.perf_counter() - start
                record[style.value] = {
                    "answer": answer, "seconds": seconds,
                    "rouge_l": rouge_l(answer, query.gold_answers),
                    "recall": token_recall(answer, query.gold_answers),
                    "f1": f1_score(answer, query.gold_answers),
                }
            support = record[AnswerStyle.SUPPORT.value]["answer"]
            # The appended fallback is " [1]" at the very end: a reply citing on its own cites
            # something before it (or cites more than that one).
            own = support[:-4] if support.endswith(" [1]") else support
            record["support_cited_on_its_own"] = bool(cited(own, passages))
            record["support_cites"] = bool(cited(support, passages))
            records.append(record)
            sink.write(json.dumps(record, ensure_ascii=False) + "\n")
            sink.flush()
            print(json.dumps({k: record[k] for k in ("id", "support_cited_on_its_own")}), flush=True)
    summary: dict[str, Any] = {"queries": len(records), "split": args.split, "styles": {}, "differences": {}}
    for style in STYLES:
        summary["styles"][style.value] = {
            metric: (lambda i: i.as_dict() if i else None)(mean_interval([r[style.value][metric] for r in records]))
            for metric in ("rouge_l", "recall", "f1", "seconds")
        }
    for metric in ("rouge_l", "recall", "f1", "seconds"):
        diff = paired_difference_interval([r["short"][metric] for r in records], [r["support"][metric] for r in records])
        summary["differences"][f"support - short {metric}"] = diff.as_dict() if diff else None
    summary["support_cites"] = sum(r["support_cites"] for r in records) / max(len(records), 1)
    summary["support_cited_on_its_own"] = sum(r["support_cited_on_its_own"] for r in records) / max(len(records), 1)
    command = "python -m lab.experiments.answer_style " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    meta = {"reader": settings.llm_base_url or settings.reader, "top_k": settings.top_k,
            "evidence_tokens": settings.evidence_tokens,
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": f"{platform.machine()}, {platform.python_version()}"}
    (args.out / "summary.json").write_text(json.dumps({"summary": summary, "meta": meta, "command": command},
                                                      indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
