"""Embedded tantivy vs OpenSearch on the shared benchmark corpus, in one run.

    python -m lab.experiments.retrieval_backends --data-dir ../shared/data --out reports/retrieval_backends

Builds both backends from `load_corpus(data_dir)` and measures, per backend:

- indexing throughput (passages/s, wall clock of the whole build including the final commit or
  refresh);
- query latency p50/p95/p99 with one client, and with `--threads` (8) clients sharing one
  retriever, over the texts of `--latency-questions` (500) questions, k = `--k` (10); plus
  throughput (queries/s) of the concurrent run;
- recall@2/5/10 of the gold supporting paragraphs (by title) on HotpotQA, 2Wiki and MuSiQue.

It prints a table with the OpenSearch / tantivy ratio and writes `results.json` and `results.md`
to `--out`. OpenSearch is the cluster at `--opensearch-url` (or `OPENSEARCH_URL`); without one a
local node (`infra.local.opensearch.OpenSearchNode`) is started on a free loopback port and stopped
at the end. `--limit-corpus N` and `--limit-questions N` make a quick smoke run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adaptive_rag.domain import Passage
from adaptive_rag.evaluation.corpus import load_corpus
from adaptive_rag.evaluation.datasets import Question, load_questions
from adaptive_rag.evaluation.retrieval_eval import recall_at_k
from adaptive_rag.ports import Retriever
from adaptive_rag.settings import Settings
from infra.local.opensearch import OpenSearchNode
from lab.harness.stats import percentiles

RECALL_DATASETS = ("hotpotqa", "2wiki", "musique")
KS = (2, 5, 10)
BACKENDS = ("tantivy", "opensearch")


@dataclass
class BackendResult:
    name: str
    build_s: float = 0.0
    docs: int = 0
    docs_per_s: float = 0.0
    latency_1: dict[str, float] = field(default_factory=dict)  # ms
    latency_n: dict[str, float] = field(default_factory=dict)  # ms
    qps_1: float = 0.0
    qps_n: float = 0.0
    recall: dict[str, dict[int, float]] = field(default_factory=dict)
    recall_s: float = 0.0
    notes: dict[str, Any] = field(default_factory=dict)


# ---- measuring ---------------------------------------------------------------------------------


def _summary(latencies_s: Sequence[float]) -> dict[str, float]:
    ms = [x * 1000 for x in latencies_s]
    return {**percentiles(ms), "mean": sum(ms) / len(ms) if ms else 0.0}


def _timed_search(retriever: Retriever, query: str, k: int) -> float:
    start = time.perf_counter()
    retriever.search(query, k)
    return time.perf_counter() - start


def measure_latency(
    retriever: Retriever, queries: Sequence[str], k: int, threads: int, warmup: int = 200
) -> tuple[dict[str, float], float, dict[str, float], float]:
    """(single-client summary, single-client qps, concurrent summary, concurrent qps)."""
    for i in range(min(warmup, 10 * len(queries))):  # warm caches, the JVM's JIT, connection pools
        retriever.search(queries[i % len(queries)], k)

    start = time.perf_counter()
    single = [_timed_search(retriever, q, k) for q in queries]
    qps_1 = len(queries) / (time.perf_counter() - start)

    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(lambda q: retriever.search(q, k), queries[: threads * 2]))  # warm the pool
        start = time.perf_counter()
        concurrent = list(pool.map(lambda q: _timed_search(retriever, q, k), queries))
        qps_n = len(queries) / (time.perf_counter() - start)
    return _summary(single), qps_1, _summary(concurrent), qps_n


def run_backend(
    name: str,
    build: Callable[[Sequence[Passage]], Retriever],
    passages: Sequence[Passage],
    latency_queries: Sequence[str],
    recall_questions: Sequence[Question],
    k: int,
    threads: int,
    warmup: int = 200,
) -> tuple[BackendResult, Retriever]:
    result = BackendResult(name)
    print(f"[{name}] indexing {len(passages)} passages ...", flush=True)
    start = time.perf_counter()
    retriever = build(passages)
    result.build_s = time.perf_counter() - start
    result.docs = int(retriever.count())  # type: ignore[attr-defined]
    result.docs_per_s = len(passages) / result.build_s if result.build_s else 0.0
    print(f"[{name}] {result.docs} docs in {result.build_s:.1f} s ({result.docs_per_s:.0f} docs/s)", flush=True)

    print(f"[{name}] latency over {len(latency_queries)} queries, 1 and {threads} clients ...", flush=True)
    result.latency_1, result.qps_1, result.latency_n, result.qps_n = measure_latency(
        retriever, latency_queries, k, threads, warmup
    )

    print(f"[{name}] recall@{','.join(map(str, KS))} over {len(recall_questions)} questions ...", flush=True)
    start = time.perf_counter()
    result.recall = recall_at_k(retriever, recall_questions, KS)
    result.recall_s = time.perf_counter() - start
    return result, retriever


# ---- report --------------------------------------------------------------------------------------


def _ratio(os_value: float, tv_value: float) -> str:
    return f"{os_value / tv_value:.3g}" if tv_value else "n/a"


def table(results: dict[str, BackendResult], threads: int = 8) -> str:
    names = [n for n in BACKENDS if n in results]
    rows: list[tuple[str, list[float], str]] = []  # (metric, values, format)

    def add(metric: str, get: Callable[[BackendResult], float], fmt: str) -> None:
        rows.append((metric, [get(results[n]) for n in names], fmt))

    add("indexing (docs/s)", lambda r: r.docs_per_s, "{:.0f}")
    add("index build (s)", lambda r: r.build_s, "{:.1f}")
    for label, attr in (("1 client", "latency_1"), (f"{threads} clients", "latency_n")):
        for q in ("p50", "p95"):
            add(f"latency {q} {label} (ms)", lambda r, a=attr, q=q: getattr(r, a).get(q, 0.0), "{:.2f}")
    add("throughput 1 client (q/s)", lambda r: r.qps_1, "{:.0f}")
    add(f"throughput {threads} clients (q/s)", lambda r: r.qps_n, "{:.0f}")
    datasets = sorted({d for r in results.values() for d in r.recall})
    for dataset in datasets:
        for k in KS:
            add(f"recall@{k} {dataset}", lambda r, d=dataset, k=k: r.recall.get(d, {}).get(k, 0.0), "{:.3f}")

    header = ["metric", *names] + (["opensearch / tantivy"] if len(names) == 2 else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for metric, values, fmt in rows:
        cells = [metric, *(fmt.format(v) for v in values)]
        if len(names) == 2:
            cells.append(_ratio(values[1], values[0]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---- main ------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=Path(os.environ.get("ARAG_DATA_DIR", "../shared/data")))
    parser.add_argument("--out", type=Path, default=Path("reports/retrieval_backends"))
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated subset of tantivy,opensearch")
    parser.add_argument("--opensearch-url", default=os.environ.get("OPENSEARCH_URL"),
                        help="existing cluster (default: start a local node)")
    parser.add_argument("--index", default="arag-bench-retrieval", help="OpenSearch index to (re)create")
    parser.add_argument("--keep-index", action="store_true", help="leave the OpenSearch index in place")
    parser.add_argument("--work-dir", type=Path, default=None, help="for the tantivy index and a local node")
    parser.add_argument("--title-boost", type=float, default=Settings().title_boost)
    parser.add_argument("--k", type=int, default=10, help="k of the latency queries")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--latency-questions", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=200, help="untimed searches before timing")
    parser.add_argument("--limit-corpus", type=int, default=None, help="smoke runs: first N passages")
    parser.add_argument("--limit-questions", type=int, default=None, help="smoke runs: N questions per dataset")
    parser.add_argument("--seed", type=int, default=13)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(backends) - set(BACKENDS)
    if unknown:
        print(f"unknown backend(s): {sorted(unknown)}", file=sys.stderr)
        return 2

    print(f"loading corpus and questions from {args.data_dir} ...", flush=True)
    passages = load_corpus(args.data_dir)
    if args.limit_corpus:
        passages = passages[: args.limit_corpus]
    questions = load_questions(args.data_dir, RECALL_DATASETS, split="test")  # report on test only
    if args.limit_questions:
        per: dict[str, int] = {}
        kept = []
        for q in questions:
            per[q.dataset] = per.get(q.dataset, 0) + 1
            if per[q.dataset] <= args.limit_questions:
                kept.append(q)
        questions = kept
    rng = random.Random(args.seed)
    latency_queries = [q.question for q in rng.sample(questions, min(args.latency_questions, len(questions)))]
    print(f"{len(passages)} passages, {len(questions)} recall questions, "
          f"{len(latency_queries)} latency queries", flush=True)

    results: dict[str, BackendResult] = {}
    with tempfile.TemporaryDirectory(prefix="arag-bench-", dir=args.work_dir) as tmp:
        work = Path(tmp)
        if "tantivy" in backends:
            from adaptive_rag.retrieval.tantivy_index import TantivyRetriever

            result, _ = run_backend(
                "tantivy",
                lambda ps: TantivyRetriever.build(work / "tantivy", ps, title_boost=args.title_boost),
                passages, latency_queries, questions, args.k, args.threads, args.warmup,
            )
            results["tantivy"] = result

        if "opensearch" in backends:
            from adaptive_rag.retrieval.opensearch import OpenSearchRetriever

            node = None if args.opensearch_url else OpenSearchNode(work / "opensearch")
            node_start_s = 0.0
            try:
                url = args.opensearch_url
                if node is not None:
                    print(f"starting a local OpenSearch node on {node.url} ...", flush=True)
                    started = time.perf_counter()
                    node.start()
                    node_start_s = time.perf_counter() - started
                    url = node.url
                result, retriever = run_backend(
                    "opensearch",
                    lambda ps: OpenSearchRetriever.create(
                        url, args.index, ps, title_boost=args.title_boost,
                        maxsize=max(16, args.threads * 2),
                    ),
                    passages, latency_queries, questions, args.k, args.threads, args.warmup,
                )
                result.notes["url"] = "local node (infra/opensearch)" if node else "external cluster"
                if node is not None:
                    result.notes["node_start_s"] = round(node_start_s, 1)
                    result.notes["node_rss_mb"] = node.rss_mb()
                if not args.keep_index:
                    retriever.delete_index()  # type: ignore[attr-defined]
                results["opensearch"] = result
            finally:
                if node is not None:
                    node.close()

    md_table = table(results, args.threads)
    print()
    print(md_table)

    meta = {
        "corpus_passages": len(passages),
        "recall_questions": {d: sum(q.dataset == d for q in questions) for d in RECALL_DATASETS},
        "latency_queries": len(latency_queries),
        "k": args.k,
        "threads": args.threads,
        "title_boost": args.title_boost,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "limited": bool(args.limit_corpus or args.limit_questions),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    payload = {
        "meta": meta,
        "backends": {
            name: {
                **{k: v for k, v in vars(r).items() if k != "recall"},
                "recall": {d: {str(k): v for k, v in by_k.items()} for d, by_k in r.recall.items()},
            }
            for name, r in results.items()
        },
    }
    (args.out / "results.json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    notes = "\n".join(
        f"- {name}: {', '.join(f'{k}={v}' for k, v in r.notes.items())}" for name, r in results.items() if r.notes
    )
    (args.out / "results.md").write_text(
        "# Retrieval backends: embedded tantivy vs OpenSearch\n\n"
        f"Corpus: {meta['corpus_passages']} passages; recall questions: {meta['recall_questions']}; "
        f"latency: {meta['latency_queries']} question texts, k={args.k}, 1 and {args.threads} client threads "
        f"sharing one retriever; {meta['machine']['cpus']} CPUs"
        + (" (limited smoke run)" if meta["limited"] else "") + ".\n\n"
        + md_table + "\n\n"
        + "Latency is per `search` call as the application sees it (for OpenSearch: HTTP on loopback "
        "included). Recall: share of a question's gold supporting titles in the top k, question text "
        "as the query.\n"
        + (f"\n{notes}\n" if notes else ""),
        encoding="utf-8",
    )
    print(f"\nwrote {args.out / 'results.json'} and {args.out / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
