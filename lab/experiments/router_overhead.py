"""Routing overhead of the learned routers, single stream, beside the fine-tuned classifier's.

Rows (each over `--queries` benchmark questions, one at a time, after a warm-up of 50; the rows
take turns query by query, so a load change on the machine touches all of them alike):
- `<router>: in-process`: embed (MiniLM-L6 through ONNX Runtime) + the router's arithmetic;
- `<router>: async adapter`: the same through `AsyncRouter` on an event loop, as the front door
  would call it (`await router.route(query)`: a hop to the router's thread pool and back);
- `encoder <name>: embed only`: the encoder alone, so the router's own share is visible;
- `classifier v<N>: local onnx`: the fine-tuned classifier in-process (tokenize + ONNX + policy),
  when the model repository holds a trained version;
- `classifier v<N>: triton single`: the same version through Triton over gRPC (with `--triton`),
  the served path the learned routers would replace.

The target from the issue is p99 <= 6 ms single stream for the served policy; each row says
whether it meets it. Measure on an idle machine for figures to keep (the load average at the start
and the end is recorded); a loaded machine inflates every row.

    .venv/bin/python -m lab.experiments.router_overhead --routers var/routers \
        --repository var/model_repository --triton --out reports/routing_overhead

With no trained routers (`--synthetic N`), each kind is fitted on N `train` questions with random
labels and outcomes: the latency depends on the memory size, not on the labels, but such rows say
nothing about routing quality. Writes `routers.json` and `routers.md`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from lab.experiments.routing_overhead import load_queries, summary

TARGET_P99_MS = 6.0


Call = tuple[Callable[[str], object], bool]  # (function, is it a coroutine function)


def interleaved(calls: dict[str, Call], queries: list[str], warmup: int = 50) -> dict[str, dict[str, float]]:
    """Every row on every query, the rows taking turns query by query (in an order rotated per
    query), so a load change on a shared machine touches every row alike."""

    async def run() -> dict[str, dict[str, float]]:
        names = list(calls)
        latencies: dict[str, list[float]] = {name: [] for name in names}
        for index, q in enumerate(queries[:warmup] + queries):
            turn = index % len(names)
            for name in names[turn:] + names[:turn]:
                function, is_async = calls[name]
                start = time.perf_counter()
                if is_async:
                    await function(q)
                else:
                    function(q)
                if index >= warmup:
                    latencies[name].append(time.perf_counter() - start)
        return {name: summary(values) for name, values in latencies.items()}

    return asyncio.run(run())


def synthetic_routers(root: Path, n: int, data_dir: Path, encoder: str, threads: int) -> list[Path]:
    """Each kind fitted on `n` train questions with random labels (latency only)."""
    from adaptive_rag.contracts import Tier
    from adaptive_rag.evaluation.datasets import load_questions
    from adaptive_rag.routers.embeddings import OnnxEmbedder
    from adaptive_rag.training.encoders import ensure_encoder
    from adaptive_rag.training.learned_routers import KINDS, LabelledQuery, TierOutcome

    rng = random.Random(0)
    texts = [q.question for q in load_questions(data_dir, split="train")]
    rng.shuffle(texts)
    examples = [
        LabelledQuery(text, Tier(rng.choice("ABC")), "synthetic", str(i), outcomes={
            t: TierOutcome(f1=rng.random(), correct=rng.random() < 0.3, steps=float(i)) for i, t in enumerate("ABC")})
        for i, text in enumerate(texts[:n])
    ]
    embedder = OnnxEmbedder(ensure_encoder(root, encoder), threads=threads)
    embeddings = embedder.embed_many([e.question for e in examples])
    paths = []
    for kind, cls in KINDS.items():
        router = cls(embedder)
        router.fit(examples, embeddings, note=f"SYNTHETIC: {n} train questions with random labels (latency only)")
        paths.append(router.save(root / kind))
    return paths


def markdown(result: dict) -> str:
    lines = [
        "# Routing overhead: learned routers beside the classifier", "", f"Command: `{result['command']}`", "",
        f"- machine: {result['machine']}",
        f"- load average at start / end: {result['load_average_start']} / {result['load_average_end']}",
        f"- ONNX Runtime intra-op threads: {result['threads']}",
        f"- target: p99 <= {TARGET_P99_MS:g} ms single stream for the served policy",
        *([f"- **{result['synthetic']}**"] if result.get("synthetic") else []),
        *[f"- {note}" for note in result.get("notes", [])], "",
        "| row | n | p50 ms | p95 ms | p99 ms | mean ms | p99 <= 6 ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | :---: |",
    ]
    for name, row in result["rows"].items():
        lines.append(f"| {name} | {row['n']} | {row['p50']:.2f} | {row['p95']:.2f} | {row['p99']:.2f} | "
                     f"{row['mean']:.2f} | {'yes' if row['p99'] <= TARGET_P99_MS else 'no'} |")
    lines += ["", "Routers: " + "; ".join(f"`{k}`: {v}" for k, v in result["routers"].items())]
    return "\n".join(lines) + "\n"


def classifier_calls(args, calls: dict[str, Call], notes: list[str]):
    """The fine-tuned classifier in-process and, with --triton, through Triton; returns what to
    close afterwards."""
    from adaptive_rag.contracts import CLASSIFIER_MODEL
    from adaptive_rag.routers.local_classifier import LocalOnnxClassifier
    from adaptive_rag.routing.model_repository import open_version, versions

    model_dir = args.repository / CLASSIFIER_MODEL
    trained = [v for v in sorted(versions(model_dir), reverse=True)
               if not open_version(args.repository, CLASSIFIER_MODEL, v).untrained] if model_dir.is_dir() else []
    if not trained:
        notes.append(f"no trained classifier version under {model_dir}: no classifier rows")
        return []
    version = open_version(args.repository, CLASSIFIER_MODEL, trained[0])
    calls[f"classifier v{version.version}: local onnx"] = (LocalOnnxClassifier(version, threads=args.threads).classify, False)
    if not args.triton:
        return []
    try:
        from adaptive_rag.routing.classifier_client import TritonClassifier
        from services.classifier.local import TritonProcess

        server = TritonProcess(args.repository, args.out / "triton-routers.log", version=version.version,
                               threads=args.threads)
    except Exception as exc:  # noqa: BLE001 - Triton is optional here
        notes.append(f"Triton not available: {exc}")
        return []
    client = TritonClassifier.from_version(version, url=server.url, timeout_s=2.0, batching=False)
    calls[f"classifier v{version.version}: triton single"] = (client.classify, False)
    return [client.close, server.stop]


def main(argv: list[str] | None = None) -> int:
    from adaptive_rag.routers.learned import AsyncRouter, load_router, router_dirs

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--routers", type=Path, nargs="*", default=[Path("var/routers")])
    parser.add_argument("--synthetic", type=int, default=None, help="fit each kind on N random-labelled questions")
    parser.add_argument("--encoder", default="minilm-l6", help="with --synthetic: the encoder base")
    parser.add_argument("--repository", type=Path, default=Path(os.environ.get("ARAG_MODEL_REPOSITORY", "var/model_repository")))
    parser.add_argument("--triton", action="store_true", help="also the classifier through a local Triton")
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    parser.add_argument("--data-dir", type=Path, default=Path(os.environ.get("ARAG_DATA_DIR", "../shared/data")))
    parser.add_argument("--out", type=Path, default=Path("reports/routing_overhead"))
    args = parser.parse_args(argv)

    load_start = " ".join(f"{x:.2f}" for x in os.getloadavg())
    args.out.mkdir(parents=True, exist_ok=True)
    queries = load_queries(args.data_dir, args.queries)
    notes: list[str] = []
    calls: dict[str, Call] = {}
    described: dict[str, str] = {}
    closers: list[Callable[[], object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = (synthetic_routers(Path(tmp), args.synthetic, args.data_dir, args.encoder, args.threads)
                 if args.synthetic else router_dirs(args.routers))
        if not paths:
            notes.append(f"no saved routers under {', '.join(map(str, args.routers))}")
        encoders_done: set[str] = set()
        for path in paths:
            router = load_router(path, threads=args.threads)
            name = f"{router.kind} ({path.name})" if path.name != router.kind else router.kind
            described[name] = (f"{router.model_name}, {json.dumps(router.params)}, fitted on "
                               f"{router.card['labels']['fitted_on']}")
            embedder = router.embedder
            if embedder.identity not in encoders_done:
                encoders_done.add(embedder.identity)
                calls[f"encoder {getattr(embedder, 'name', '?')}: embed only"] = (
                    lambda q, e=embedder: e.embed([q]), False)
            calls[f"{name}: in-process"] = (router.route, False)
            adapter = AsyncRouter(router)
            closers.append(adapter.close)
            calls[f"{name}: async adapter"] = (adapter.route, True)
        try:
            closers += classifier_calls(args, calls, notes)
            rows = interleaved(calls, queries) if calls else {}
        finally:
            for close in closers:
                close()
    result = {
        "command": "python -m lab.experiments.router_overhead " + shlex.join(sys.argv[1:] if argv is None else argv),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "load_average_start": load_start, "load_average_end": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "threads": args.threads, "date": time.strftime("%Y-%m-%d %H:%M"), "target_p99_ms": TARGET_P99_MS,
        "synthetic": (f"SYNTHETIC routers: each fitted on {args.synthetic} train questions with random labels; "
                      "latency only") if args.synthetic else None,
        "notes": notes, "routers": described, "rows": rows,
    }
    (args.out / "routers.json").write_text(json.dumps(result, indent=2))
    (args.out / "routers.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
