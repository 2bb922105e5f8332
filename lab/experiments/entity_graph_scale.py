"""What does a knowledge base's entity graph cost at 100,000 passages: build time, memory, the
walk per question, and the update after a write?

The `ppr` and `chain` gatherers walk an entity graph (`adaptive_rag.evidence.graph`) that each
worker builds from its knowledge base's index on first use, and again after a write
(`evidence.graphs`). A tenant's knowledge base can be far larger than the benchmark corpus, so
this measures the graph at the benchmark corpus's size (23,706 passages: the baseline, real text)
and at 50,000 and 100,000 passages.

The larger corpora are the benchmark corpus repeated: copy r of a passage gets its own id and a
title with one more word ("Charles Mathew" -> "Charles Mathew kilo"), so every copy is a new
entity, while its text still mentions the original titles, as a bigger wiki mentions the same
famous names more often. No data is downloaded.

Each size runs in a fresh Python process, one after the other. Build time is wall time, once per
size; memory is traced (`tracemalloc`, which sees Python objects and numpy arrays) over a second
build: what the graph keeps (its own structures: it holds references to the passages, not copies)
and the peak while building, beside the process's resident memory with the passages loaded; the walk is Personalized PageRank seeded by the
entities of 40 benchmark `train` questions, the median of their times. Then two writes of 100
passages, each absorbed side by side by a fresh build over the written passages (the baseline)
and by `EntityGraph.updated` from the graph before it (median of 3): *edits*, 100 texts changed
(each now naming another title), and *new titles*, 50 texts changed and 50 new passages, each
titled a known title plus one word (so the words of 50 new titles must be looked for in every
text). Both start from the passages in memory; listing them from the index costs the same for
both. The machine's load average is recorded beside the run: on 2 shared cores the
times compare within one run, not between runs.

    python -m lab.experiments.entity_graph_scale --data-dir ../shared/data --out reports/entity_graph_scale

Writes `README.md` and `summary.json` (one record per size).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

SIZES = (23_706, 50_000, 100_000)
WALK_QUESTIONS = 40
WRITE_CHANGED, WRITE_NEW = 50, 50
EXTRA_WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliett kilo lima mike november "
               "oscar papa quebec romeo sierra tango").split()


def resident_mb() -> float:
    """This process's resident set size in MB (VmRSS)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def scaled_corpus(data_dir: Path, size: int) -> list:
    """The benchmark corpus repeated up to `size` passages, each copy a new entity (see the module)."""
    from adaptive_rag.domain import Passage
    from adaptive_rag.evaluation.corpus import load_corpus

    base = load_corpus(data_dir)
    passages: list[Passage] = []
    for copy in range(len(EXTRA_WORDS) + 1):
        for p in base:
            if len(passages) >= size:
                return passages
            if copy == 0:
                passages.append(p)
            else:
                extra = EXTRA_WORDS[copy - 1]
                passages.append(Passage(f"{p.id}-{extra}", f"{p.title} {extra}", p.text))
    return passages


def written(passages: Sequence[Any], new_titles: bool = True) -> list[Any]:
    """The passages after a write (see the module): changed texts spread over the corpus, new
    passages at the end (without `new_titles`: only changed texts, as many as the write's)."""
    from adaptive_rag.domain import Passage

    changed = WRITE_CHANGED if new_titles else WRITE_CHANGED + WRITE_NEW
    step = max(1, len(passages) // changed)
    after = list(passages)
    for n in range(changed):
        node = n * step
        named = passages[(node + len(passages) // 2) % len(passages)].title
        after[node] = Passage(after[node].id, after[node].title, f"{after[node].text} It was later linked to {named}.")
    for n in range(WRITE_NEW if new_titles else 0):
        source = passages[(n * 7919) % len(passages)]
        after.append(Passage(f"written-{n}", f"{source.title} revised", f"A revised page about {source.title}."))
    return after


def measure_one(data_dir: Path, size: int) -> dict[str, Any]:
    """One size, in this process: memory and time of the build, and the walks."""
    from adaptive_rag.evaluation.datasets import interleaved, limit_per_dataset, load_questions
    from adaptive_rag.evidence.graph import EntityGraph

    passages = scaled_corpus(data_dir, size)
    questions = interleaved(limit_per_dataset(load_questions(data_dir, ["2wiki", "musique", "hotpotqa"], split="train"),
                                              WALK_QUESTIONS))[:WALK_QUESTIONS]
    start = time.perf_counter()
    graph = EntityGraph(passages)
    build_s = time.perf_counter() - start
    del graph
    tracemalloc.start()  # a second build, traced: what the graph keeps and the peak while building
    graph = EntityGraph(passages)
    kept, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    walks = []
    for question in questions:
        seeds = {graph.entity_node(e): 1.0 for e in graph.question_entities(question.question)}
        begin = time.perf_counter()
        graph.personalized_pagerank(seeds or {0: 1.0})
        walks.append(1000 * (time.perf_counter() - begin))
    stats = graph.stats()
    absorbed = {}
    for kind, new_titles in (("edits", False), ("titles", True)):
        after = written(passages, new_titles)
        start = time.perf_counter()
        EntityGraph(after)
        absorbed[f"rebuild_{kind}_s"] = time.perf_counter() - start
        updates = []
        for _ in range(3):
            start = time.perf_counter()
            updated = graph.updated(after)
            updates.append(time.perf_counter() - start)
        absorbed[f"update_{kind}_s"] = statistics.median(updates)
        absorbed[f"rematched_{kind}"] = updated.rematched
    return {"passages": stats.passages, "entities": stats.entities, "edges": stats.mention_edges,
            "hubs": stats.hubs, "build_s": build_s, "graph_mb": kept / 2**20, "peak_mb": peak / 2**20, "process_mb": resident_mb(),
            "walk_ms_median": statistics.median(walks), "walks": len(walks),
            "write_passages": WRITE_CHANGED + WRITE_NEW, **absorbed}


def run(data_dir: Path, sizes: Sequence[int]) -> list[dict[str, Any]]:
    rows = []
    for size in sizes:
        done = subprocess.run([sys.executable, "-m", "lab.experiments.entity_graph_scale", "--one", str(size),
                               "--data-dir", str(data_dir)], capture_output=True, text=True, check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        row["load_average"] = os.getloadavg()[0]
        rows.append(row)
        print(f"{row['passages']:,} passages: build {row['build_s']:.1f} s, graph {row['graph_mb']:.0f} MB, "
              f"walk {row['walk_ms_median']:.0f} ms; after edits: rebuild {row['rebuild_edits_s']:.1f} s, update "
              f"{row['update_edits_s']:.2f} s; after new titles: rebuild {row['rebuild_titles_s']:.1f} s, update "
              f"{row['update_titles_s']:.2f} s (load {row['load_average']:.1f})", flush=True)
    return rows


def markdown(rows: Sequence[dict[str, Any]], command: str) -> str:
    base, top = rows[0], rows[-1]
    lines = [
        "# The entity graph at 100,000 passages",
        "",
        "**Question.** What does a knowledge base's entity graph cost at 100,000 passages: build time, "
        "memory, the walk per question, and the update after a write?",
        "",
        f"**Answer.** At {top['passages']:,} passages the graph builds in **{top['build_s']:.0f} s** "
        f"({top['build_s'] / base['build_s']:.1f}x the {base['passages']:,}-passage benchmark corpus, "
        f"{top['passages'] / base['passages']:.1f}x the passages), takes **{top['graph_mb']:.0f} MB** of "
        f"memory beyond its passages ({top['graph_mb'] / max(base['graph_mb'], 1e-9):.1f}x), and one walk "
        f"takes **{top['walk_ms_median']:.0f} ms** (median; {top['walk_ms_median'] / base['walk_ms_median']:.1f}x). "
        "Build and memory grow about linearly with the passages; the walk with the edges. "
        f"After a write of {top['write_passages']} passages the graph is updated, not rebuilt (the same graph): "
        f"**{top['update_edits_s']:.2f} s** against a fresh build's {top['rebuild_edits_s']:.1f} s when the write "
        f"edits texts (**{top['update_edits_s'] / top['rebuild_edits_s']:.2f}x**), "
        f"**{top['update_titles_s']:.1f} s** against {top['rebuild_titles_s']:.1f} s when it adds 50 titles "
        f"(**{top['update_titles_s'] / top['rebuild_titles_s']:.2f}x**: every text is searched for their words).",
        "",
        "| passages | entities | edges | hubs | build s | graph MB | peak MB while building | process MB | walk ms (median) "
        "| edits: rebuild s / update s | new titles: rebuild s / update s | matched again (edits / new titles) | load |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(f"| {r['passages']:,} | {r['entities']:,} | {r['edges']:,} | {r['hubs']:,} | {r['build_s']:.1f} "
                     f"| {r['graph_mb']:.0f} | {r['peak_mb']:.0f} | {r['process_mb']:.0f} | {r['walk_ms_median']:.1f} "
                     f"| {r['rebuild_edits_s']:.1f} / {r['update_edits_s']:.2f} "
                     f"({r['update_edits_s'] / r['rebuild_edits_s']:.2f}x) "
                     f"| {r['rebuild_titles_s']:.1f} / {r['update_titles_s']:.2f} "
                     f"({r['update_titles_s'] / r['rebuild_titles_s']:.2f}x) "
                     f"| {r['rematched_edits']:,} / {r['rematched_titles']:,} | {r['load_average']:.1f} |")
    lines += [
        "",
        "What it means for a worker: the build runs in the background on first use, and after each write "
        "to the knowledge base the graph is updated from the one before it (`ARAG_EVIDENCE_GRAPHS` graphs "
        "kept per process); requests meanwhile are answered without the graph and say so in their steps. "
        "Graph MB is per process that serves the knowledge base with a graph-walking gatherer; while it "
        "updates, the process holds the graph before the write beside the new one.",
        "",
        "**How measured.** " + " ".join(part.replace("\n", " ") for part in (__doc__ or "").split("\n\n")[2:4]),
        "",
        f"`{command}` on {platform.machine()}, Python {platform.python_version()}, "
        f"{datetime.now(timezone.utc).strftime('%Y-%m-%d')}.", "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--out", type=Path, default=Path("reports/entity_graph_scale"))
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES), help="passages per run, comma-separated")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # one size in this process
    parser.add_argument("--render", action="store_true", help="rewrite README.md from summary.json; run nothing")
    args = parser.parse_args(argv)
    if args.render:
        recorded = json.loads((args.out / "summary.json").read_text())
        (args.out / "README.md").write_text(markdown(recorded["sizes"], recorded["command"]), encoding="utf-8")
        return
    if args.one:
        print(json.dumps(measure_one(args.data_dir, args.one)))
        return
    command = "python -m lab.experiments.entity_graph_scale " + shlex.join(sys.argv[1:] if argv is None else argv)
    rows = run(args.data_dir, [int(s) for s in args.sizes.split(",")])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps({"command": command, "sizes": rows}, indent=2) + "\n")
    (args.out / "README.md").write_text(markdown(rows, command), encoding="utf-8")


if __name__ == "__main__":
    main()
