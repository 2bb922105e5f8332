"""Routing overhead: tokenize + Triton gRPC round trip + softmax + policy, per query.

Rows (each over `--queries` benchmark questions, after a warm-up):
- `local onnx (no triton)`: tokenize + ONNX Runtime in-process + policy: the floor;
- `triton single`: one query per request, one stream;
- `triton concurrent`: `--concurrency` threads through one client with batching on (queries that
  wait together go as one request; Triton's dynamic batcher merges across clients);
- `triton cached`: the same queries again with the client's LRU cache on (repeated queries).

Each row is measured for the candidate version and, with `--baseline-version`, for a baseline in
the same run (e.g. the fp32 export against its int8 quantization); with `--database-url` both are
also scored on the held-out `test` labels, which gives the accuracy cost of the faster graph.

    .venv/bin/python -m lab.experiments.routing_overhead --repository var/model_repository \
        --version 4 --baseline-version 3 --database-url sqlite:///var/arag.db \
        --out reports/routing_overhead

Starts its own Triton (`services/classifier/serve.py`) on free loopback ports unless `--url` is
given. Writes `routing_overhead.json` and `routing_overhead.md`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from adaptive_rag.contracts import CLASSIFIER_INPUTS, CLASSIFIER_MODEL, CLASSIFIER_OUTPUT
from adaptive_rag.routing.classifier_client import QueryTokenizer, TritonClassifier, softmax_rows
from adaptive_rag.routing.model_repository import open_version
from adaptive_rag.routing.policy import RoutingPolicy
from lab.harness.stats import percentiles
from services.classifier.local import TritonProcess

REPO_ROOT = Path(__file__).resolve().parents[2]
REFERENCE = {"p50": 9.3, "p99": 11.6}  # ms, single stream, untrained MiniLM via PyTriton, measured 2026-11-30


def load_queries(data_dir: Path, n: int) -> list[str]:
    try:
        from adaptive_rag.evaluation.datasets import load_questions

        texts = [q.question for q in load_questions(data_dir, split="test")]
    except Exception:  # noqa: BLE001 - no benchmark files: synthetic questions
        texts = []
    if not texts:
        texts = [f"Which came first, event {i} or event {i + 1}, and who was involved?" for i in range(n)]
    # Interleave datasets, deterministically.
    texts = sorted(texts, key=lambda t: hashlib.md5(t.encode()).hexdigest())
    return (texts * (n // len(texts) + 1))[:n]


def summary(latencies_s: list[float], wall_s: float | None = None) -> dict[str, float]:
    ms = [1000 * x for x in latencies_s]
    out = {"n": len(ms), **percentiles(ms), "mean": float(np.mean(ms)) if ms else 0.0}
    if wall_s:
        out["throughput_qps"] = len(ms) / wall_s
    return out


def bench_local(version, queries: list[str], threads: int) -> dict[str, float]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(str(version.onnx_path), options, providers=["CPUExecutionProvider"])
    tokenize = QueryTokenizer(version.tokenizer_path, version.max_length)
    policy = RoutingPolicy(version.thresholds())

    def one(q: str) -> None:
        ids, mask = tokenize([q])
        logits = session.run([CLASSIFIER_OUTPUT], dict(zip(CLASSIFIER_INPUTS, (ids, mask))))[0]
        policy.decide(softmax_rows(logits)[0].tolist())

    for q in queries[:50]:
        one(q)
    latencies = []
    wall = time.perf_counter()
    for q in queries:
        start = time.perf_counter()
        one(q)
        latencies.append(time.perf_counter() - start)
    return summary(latencies, time.perf_counter() - wall)


def bench_single(client: TritonClassifier, queries: list[str]) -> dict[str, float]:
    for q in queries[:50]:
        client.classify(q)
    latencies, fallbacks = [], 0
    wall = time.perf_counter()
    for q in queries:
        start = time.perf_counter()
        fallbacks += client.classify(q).fallback
        latencies.append(time.perf_counter() - start)
    return {**summary(latencies, time.perf_counter() - wall), "fallbacks": fallbacks}


def bench_concurrent(client: TritonClassifier, queries: list[str], concurrency: int) -> dict[str, float]:
    def timed(q: str) -> tuple[float, bool]:
        start = time.perf_counter()
        fallback = client.classify(q).fallback
        return time.perf_counter() - start, fallback

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(timed, queries[:100]))
        start = time.perf_counter()
        results = list(pool.map(timed, queries))
        wall = time.perf_counter() - start
    return {
        **summary([r[0] for r in results], wall), "concurrency": concurrency,
        "fallbacks": sum(r[1] for r in results),
    }


def markdown(result: dict) -> str:
    lines = [
        "# Routing overhead", "", f"Command: `{result['command']}`", "",
        *[f"- model {role}: {name}" for role, name in result["models"].items()],
        f"- machine: {result['machine']}", f"- load average at start: {result['load_average']}", "",
        "| row | n | p50 ms | p95 ms | p99 ms | mean ms | throughput q/s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in result["rows"].items():
        lines.append(
            f"| {name} | {row['n']} | {row['p50']:.2f} | {row['p95']:.2f} | {row['p99']:.2f} | "
            f"{row['mean']:.2f} | {row.get('throughput_qps', float('nan')):.0f} |"
        )
    ref = result["reference_single_stream_ms"]
    single = result["rows"].get("candidate: triton single")
    baseline = result["rows"].get("baseline: triton single")
    if single:
        lines += ["", f"Reference (untrained MiniLM, single stream, another day): p50 {ref['p50']} ms, p99 "
                  f"{ref['p99']} ms; candidate: p50 {single['p50']:.2f} ms ({single['p50'] / ref['p50']:.2f}x), "
                  f"p99 {single['p99']:.2f} ms ({single['p99'] / ref['p99']:.2f}x)."]
    if single and baseline:
        lines += ["", "Same run, candidate / baseline (single stream): "
                  f"p50 {single['p50'] / baseline['p50']:.2f}x, p95 {single['p95'] / baseline['p95']:.2f}x, "
                  f"p99 {single['p99'] / baseline['p99']:.2f}x."]
    if result.get("accuracy"):
        lines += ["", f"Accuracy cost on {result['accuracy_on']}:", "",
                  "| model | accuracy | macro-F1 | recall A | recall B | recall C |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for role, m in result["accuracy"].items():
            lines.append(f"| {role} | {100 * m['accuracy']:.1f} | {100 * m['macro_f1']:.1f} | "
                         + " | ".join(f"{100 * m['per_class'][t]['recall']:.1f}" for t in "ABC") + " |")
    return "\n".join(lines) + "\n"


def held_out_labels(database_url: str | None) -> tuple[list[str], list[str]]:
    """Texts and labels of the `test` split of `training_labels` (empty without a database)."""
    if not database_url:
        return [], []
    from adaptive_rag.storage import LabelStore, make_engine

    rows = LabelStore(make_engine(database_url)).labels(split="test")
    return [r.question for r in rows], [r.label for r in rows]


def bench_version(version, role: str, args, queries: list[str], cached: bool) -> dict[str, dict]:
    """Local ONNX floor, then Triton single stream, concurrent and (optionally) cached."""
    rows = {f"{role}: local onnx (no triton)": bench_local(version, queries, args.threads)}
    server = None
    if args.url is None:
        server = TritonProcess(args.repository, args.out / f"triton-{role}.log",
                               version=version.version, threads=args.threads)
    url = args.url or server.url
    try:
        with TritonClassifier.from_version(version, url=url, timeout_s=2.0, batching=False) as client:
            rows[f"{role}: triton single"] = bench_single(client, queries)
        with TritonClassifier.from_version(version, url=url, timeout_s=2.0, batching=True) as client:
            rows[f"{role}: triton concurrent"] = bench_concurrent(client, queries, args.concurrency)
        if cached:
            with TritonClassifier.from_version(version, url=url, timeout_s=2.0, batching=False,
                                               cache_size=4096) as client:
                for q in queries:
                    client.classify(q)
                rows[f"{role}: triton cached (repeat queries)"] = bench_single(client, queries)
    finally:
        if server is not None:
            server.stop()
    for name, row in rows.items():
        print(name, {k: round(v, 2) for k, v in row.items()}, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repository", type=Path, default=Path("var/model_repository"))
    parser.add_argument("--version", type=int, default=None, help="candidate (default: the latest)")
    parser.add_argument("--baseline-version", type=int, default=None,
                        help="measured in the same run, e.g. the fp32 export of the candidate's run")
    parser.add_argument("--database-url", default=None, help="held-out labels for the accuracy cost")
    parser.add_argument("--url", default=None, help="an already running Triton (host:port)")
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads (local and served)")
    parser.add_argument("--data-dir", type=Path, default=Path(os.environ.get("ARAG_DATA_DIR", "../shared/data")))
    parser.add_argument("--out", type=Path, default=Path("reports/routing_overhead"))
    args = parser.parse_args(argv)

    load_average = " ".join(f"{x:.2f}" for x in os.getloadavg())
    args.out.mkdir(parents=True, exist_ok=True)
    candidate = open_version(args.repository, CLASSIFIER_MODEL, args.version)
    roles = {"candidate": candidate}
    if args.baseline_version is not None:
        roles = {"baseline": open_version(args.repository, CLASSIFIER_MODEL, args.baseline_version), **roles}
    queries = load_queries(args.data_dir, args.queries)
    rows: dict[str, dict] = {}
    for role, version in roles.items():  # side by side in one run: the machine is shared and noisy
        rows.update(bench_version(version, role, args, queries, cached=role == "candidate"))
    texts, labels = held_out_labels(args.database_url)
    accuracy = {}
    if texts:
        from adaptive_rag.training.promotion import score_version

        accuracy = {f"{role} (v{v.version})": score_version(v, texts, labels) for role, v in roles.items()}
    result = {
        "command": "python -m lab.experiments.routing_overhead " + shlex.join(sys.argv[1:]),
        "models": {role: f"{v.name} v{v.version} ({v.onnx_path})" for role, v in roles.items()},
        "accuracy": accuracy,
        "accuracy_on": f"{len(texts)} held-out `test` labels",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "load_average": load_average,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "reference_single_stream_ms": REFERENCE,
        "rows": rows,
    }
    (args.out / "routing_overhead.json").write_text(json.dumps(result, indent=2))
    (args.out / "routing_overhead.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
