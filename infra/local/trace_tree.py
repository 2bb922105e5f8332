"""Print one request's trace as a tree from the JSON-lines trace files (`ARAG_TRACES=file`).

    python -m infra.local.trace_tree var/traces 4bf92f3577b34da6a3ce929d0e0e4736
    python -m infra.local.trace_tree var/traces --last          # the newest Answer call
    python -m infra.local.trace_tree var/traces --list          # recent traces, newest last

The id is the `trace-id` trailer of the reply (or the `trace_id` of any log line of the request);
a unique prefix is enough. The files are those `workers.telemetry` writes: one per service
(`frontdoor.jsonl`, `worker-tier-c.jsonl`, ...), one span per line. Each line of the tree shows the
span's start offset from the trace's first span, its duration, its service where it changes, and
the attributes that say what happened (tier, step, tokens, status).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

# Attributes worth a place on a tree line (the rest: --all-attributes).
SHOWN = (
    "rpc.grpc.status_code", "arag.request_id", "arag.tier", "arag.kind", "arag.attempt", "strategy",
    "step", "steps", "llm_calls", "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens",
    "messaging.destination.name", "celery.state",
)
ANSWER_SPAN = "/adaptive_rag.v1.AdaptiveRag/Answer"


def read_spans(paths: Iterable[Path]) -> Iterator[dict[str, Any]]:
    """Every span of the given files, or of every `*.jsonl` in the given directories."""
    for path in paths:
        files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
        for file in files:
            with file.open(encoding="utf-8") as lines:
                for line in lines:
                    line = line.strip()
                    if line:
                        try:
                            yield json.loads(line)
                        except ValueError:  # a line cut short by a process killed mid-write
                            continue


def find_trace(spans: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    ids = {s["trace_id"] for s in spans if s["trace_id"].startswith(prefix.lower())}
    if len(ids) > 1:
        raise SystemExit(f"trace id prefix {prefix!r} matches {len(ids)} traces; give more digits")
    if not ids:
        raise SystemExit(f"no trace {prefix!r} in the files")
    trace_id = ids.pop()
    return [s for s in spans if s["trace_id"] == trace_id]


def latest_trace(spans: list[dict[str, Any]], root_name: str = ANSWER_SPAN) -> list[dict[str, Any]]:
    roots = [s for s in spans if s["name"] == root_name]
    if not roots:
        raise SystemExit(f"no {root_name} span in the files")
    newest = max(roots, key=lambda s: s["start_ns"])
    return [s for s in spans if s["trace_id"] == newest["trace_id"]]


def _ms(ns: int) -> str:
    return f"{ns / 1e6:9.1f} ms"


def _attributes(span: dict[str, Any], every: bool) -> str:
    attributes = span.get("attributes") or {}
    keys = sorted(attributes) if every else [k for k in SHOWN if k in attributes]
    shown = [f"{k.removeprefix('gen_ai.usage.')}={attributes[k]}" for k in keys]
    if span.get("status") == "ERROR":
        shown.append("status=ERROR")
    return "  " + " ".join(shown) if shown else ""


def render(spans: list[dict[str, Any]], every_attribute: bool = False) -> str:
    """The trace as an indented tree, children in start order; spans whose parent is not in the
    files (a process that did not export) hang from the top."""
    by_id = {s["span_id"]: s for s in spans}
    children: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    for span in spans:
        parent = span.get("parent_id")
        children[parent if parent in by_id else None].append(span)
    for group in children.values():
        group.sort(key=lambda s: s["start_ns"])
    origin = min(s["start_ns"] for s in spans)
    end = max(s["end_ns"] for s in spans)
    services = sorted({s.get("service", "") for s in spans})
    lines = [f"trace {spans[0]['trace_id']}: {len(spans)} spans, {(end - origin) / 1e6:.1f} ms, "
             f"services {', '.join(services)}",
             f"{'start':>12} {'duration':>12}  span"]

    def walk(span: dict[str, Any], prefix: str, last: bool, service: str | None) -> None:
        branch = "" if service is None else ("└─ " if last else "├─ ")
        where = f" [{span.get('service')}]" if span.get("service") != service else ""
        lines.append(f"{_ms(span['start_ns'] - origin):>12} {_ms(span['end_ns'] - span['start_ns']):>12}  "
                     f"{prefix}{branch}{span['name']}{where}{_attributes(span, every_attribute)}")
        kids = children.get(span["span_id"], [])
        deeper = prefix + ("" if service is None else ("   " if last else "│  "))
        for i, kid in enumerate(kids):
            walk(kid, deeper, i == len(kids) - 1, span.get("service"))

    for root in children[None]:
        walk(root, "", True, None)
    return "\n".join(lines)


def list_traces(spans: list[dict[str, Any]], limit: int = 20) -> str:
    roots = sorted((s for s in spans if s.get("parent_id") is None), key=lambda s: s["start_ns"])
    counts: dict[str, int] = defaultdict(int)
    for span in spans:
        counts[span["trace_id"]] += 1
    return "\n".join(
        f"{r['trace_id']}  {(r['end_ns'] - r['start_ns']) / 1e6:9.1f} ms  {counts[r['trace_id']]:3d} spans  "
        f"{r['name']}{_attributes(r, False)}" for r in roots[-limit:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="trace files or directories, then the trace id")
    parser.add_argument("--last", action="store_true", help="the newest Answer call's trace")
    parser.add_argument("--list", action="store_true", help="list recent traces")
    parser.add_argument("--all-attributes", action="store_true")
    args = parser.parse_args(argv)
    paths, trace_id = args.paths, None
    if not (args.last or args.list):
        if len(paths) < 2:
            parser.error("give the trace files or directory, then a trace id (or --last / --list)")
        trace_id, paths = str(paths[-1]), paths[:-1]
    spans = list(read_spans(paths))
    if not spans:
        raise SystemExit(f"no spans in {', '.join(map(str, paths))}")
    if args.list:
        print(list_traces(spans))
        return 0
    chosen = latest_trace(spans) if args.last else find_trace(spans, trace_id or "")
    print(render(chosen, args.all_attributes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
