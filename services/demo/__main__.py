"""`python -m services.demo` (`make demo`): the real service on one machine, end to end.

On a fresh machine, with no server running, it
1. starts the local Triton serving the newest classifier version of the model repository; with no
   version published (a fresh clone) nothing is served and the front door routes with the rules,
   each decision flagged as a fallback (the demo install has no torch to export a model);
2. starts one shared llama-server serving the embedded reader's GGUF (`--llm embedded`: a copy of
   the model in every worker process instead), applies the migrations to SQLite and starts the
   tier worker pools (tier-a, tier-b, tier-c and shadow) as real `celery worker` processes on the
   server-less filesystem broker, each calling the server (and loading each tenant's index on its
   first query);
3. starts the gRPC front door (`python -m services.frontdoor`) as a subprocess;
4. imports the demo help centre (the fictional Lumora, `demo/knowledge_base.jsonl`) into tenant
   'demo' through the KnowledgeBase gRPC API (a `kb:write` key), and creates an API key to ask;
5. sends the example questions of every tier (`demo/questions.json`) through a real gRPC channel
   and prints, per query, tier, strategy, who routed it (model version, rules fallback or the
   small-talk detector), answer,
   sources and latency;
6. stops everything, also on Ctrl-C, SIGTERM and errors, and checks no process it started is left.

Whatever is configured is used instead of being started: `REDIS_URL` (broker + results),
`DATABASE_URL` (records), `OPENSEARCH_URL` (retriever; tenants' indexes go behind the aliases
`<ARAG_KB_INDEX_PREFIX>-<tenant>`, prefix `arag-demo` by default), `TRITON_GRPC_URL`/`TRITON_URL` (classifier; its model repository is
`ARAG_MODEL_REPOSITORY`), `LLM_BASE_URL` (generator).

The in-process demo without any service (rules routing) remains `arag demo`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from adaptive_rag.contracts import SMALL_TALK_MODEL

# The stack itself (shared with `make loadtest`) lives in services.demo.local.
from services.demo.local import DEMO, Interrupted, install_stop_signals, local_stack

TIER_NAME = {1: "A", 2: "B", 3: "C"}
console = Console(width=None if sys.stdout.isatty() else 160)


def load_questions(path: Path, per_tier: int | None) -> list[dict[str, Any]]:
    """The demo's questions (the first `per_tier` of each expected tier); a follow-up turn
    (`follow_up_of`: the question it continues) only with the question it follows."""
    questions = json.loads(path.read_text(encoding="utf-8"))
    if per_tier is None:
        return questions
    kept: dict[str, int] = {}
    chosen = []
    for question in questions:
        tier = question.get("expected_tier", "?")
        if "follow_up_of" in question:
            if any(q["question"] == question["follow_up_of"] for q in chosen):
                chosen.append(question)
            continue
        if kept.get(tier, 0) < per_tier:
            kept[tier] = kept.get(tier, 0) + 1
            chosen.append(question)
    return chosen


def ask(stub: Any, auth: tuple, question: str, timeout_s: float,
        conversation_id: str | None = None) -> dict[str, Any]:
    """One Answer through gRPC (a turn of `conversation_id` when given); the reply (or the
    status) as a row."""
    import grpc

    from services.frontdoor.stubs import pb2

    started = time.perf_counter()
    request = pb2.AnswerRequest(query=question.encode())
    if conversation_id:  # an optional field: set only for a follow-up turn
        request.conversation_id = conversation_id
    try:
        reply = stub.Answer(request, metadata=auth, timeout=timeout_s)
    except grpc.RpcError as exc:
        return {"status": exc.code().name, "error": exc.details(),
                "latency_s": time.perf_counter() - started}
    info = reply.classifier
    return {
        "status": "OK", "request_id": reply.request_id, "tier": TIER_NAME.get(reply.tier, "?"),
        "conversation_id": reply.conversation_id, "rewritten_query": reply.rewritten_query,
        "strategy": reply.strategy, "steps": reply.steps, "answer": reply.answer,
        "answerable": reply.answerable, "unanswerable_reason": reply.unanswerable_reason,
        "sources": [{"id": s.id, "title": s.title, "score": s.score} for s in reply.sources],
        "routed_by": (f"rules fallback ({info.reason})" if info.fallback
                      else info.reason if info.model_name == SMALL_TALK_MODEL
                      else f"{info.model_name} v{info.model_version}"),
        "fallback": info.fallback, "model_version": info.model_version,
        "probabilities": dict(info.probabilities),
        "timings_ms": {"classify": reply.timings.classify_ms, "queue_wait": reply.timings.queue_wait_ms,
                       "strategy": reply.timings.strategy_ms, "total": reply.timings.total_ms},
        "latency_s": time.perf_counter() - started,
    }


def results_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="answers through gRPC (front door -> tier queue -> worker)", show_lines=True)
    for column, style in (("#", "dim"), ("question", ""), ("expected", "dim"), ("tier", "bold"),
                          ("strategy", ""), ("routed by", ""), ("answer", "green"),
                          ("sources", "cyan"), ("latency", "")):
        table.add_column(column, style=style or None, overflow="fold")
    for number, row in enumerate(rows, 1):
        if row["status"] != "OK":
            table.add_row(str(number), row["question"], row["expected"], "-", "-", "-",
                          f"[red]{row['status']}[/]: {row.get('error', '')}", "-",
                          f"{row['latency_s']:.1f} s")
            continue
        timings = row["timings_ms"]
        sources = "\n".join(f"{s['id']} {s['title']}" for s in row["sources"][:3]) or "-"
        answer = (row["answer"] or "(empty)") if row.get("answerable", True) else \
            f"(abstained: {row.get('unanswerable_reason') or 'no reason given'})"
        asked = row["question"]
        if row.get("follow_up_of"):
            asked += (f"\n[dim](follow-up, searched as: {row['rewritten_query']})[/]" if row.get("rewritten_query")
                      else "\n[dim](follow-up, searched as typed)[/]")
        table.add_row(
            str(number), asked, row["expected"], row["tier"],
            f"{row['strategy']} ({row['steps']} step{'s' if row['steps'] != 1 else ''})",
            row["routed_by"], answer if len(answer) <= 160 else answer[:157] + "...", sources,
            f"{row['latency_s']:.2f} s\n[dim]queue {timings['queue_wait']:.0f} ms\n"
            f"run {timings['strategy']:.0f} ms[/]",
        )
    return table


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    console.rule("[bold]Adaptive-RAG demo: the real service on this machine")
    with local_stack(args.workdir, knowledge_base=args.knowledge_base, console=console, llm=args.llm) as running:
        import grpc

        from services.frontdoor.stubs import pb2_grpc

        key = running.create_api_key("demo")
        console.print(f"API key for tenant 'demo': {key[:12]}... (stored hashed)")
        channel = grpc.insecure_channel(running.address)
        try:
            stub = pb2_grpc.AdaptiveRagStub(channel)
            auth = (("authorization", f"Bearer {key}"),)

            questions = load_questions(args.questions, args.per_tier)
            console.rule(f"{len(questions)} questions through gRPC")
            conversations: dict[str, str] = {}  # question -> the conversation its reply started or continued
            for question in questions:
                follows = question.get("follow_up_of")
                with console.status(f"[dim]{question['question']}"):
                    row = ask(stub, auth, question["question"], args.timeout,
                              conversations.get(follows) if follows else None)
                row.update(question=question["question"], expected=question.get("expected_tier", "?"),
                           reference=question.get("answer"), follow_up_of=follows)
                if row.get("conversation_id"):
                    conversations[question["question"]] = row["conversation_id"]
                rows.append(row)
                console.print(f"  {row.get('tier', '-')} {row['status']:<3} {row['latency_s']:6.2f} s  "
                              f"{question['question']}")
            console.print(results_table(rows))
            by_tier: dict[str, list[float]] = {}
            for row in rows:
                if row["status"] == "OK":
                    by_tier.setdefault(row["tier"], []).append(row["latency_s"])
            console.print("per tier: " + ", ".join(
                f"{tier}: {len(v)} answered, median {sorted(v)[len(v) // 2]:.2f} s"
                for tier, v in sorted(by_tier.items())))
            console.rule("stopping")
        finally:
            channel.close()
    leftovers = running.leftovers
    failed = [r for r in rows if r["status"] != "OK"]
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps({"rows": rows, "leftovers": leftovers}, indent=2))
    console.print(f"stopped the front door, the worker pools{' and Triton' if running.plan.start_triton else ''}; "
                  + ("no process left" if not leftovers else
                     f"[red]{len(leftovers)} leftover process(es) killed: {leftovers}[/]"))
    console.print(f"{len(rows) - len(failed)}/{len(rows)} answered; demo took "
                  f"{time.perf_counter() - started:.1f} s")
    return 1 if failed or leftovers else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=Path, default=DEMO / "questions.json")
    parser.add_argument("--knowledge-base", type=Path, default=DEMO / "knowledge_base.jsonl")
    parser.add_argument("--workdir", type=Path, default=Path("var/demo"),
                        help="index, SQLite database, broker folders and logs of the demo")
    parser.add_argument("--per-tier", type=int, default=None,
                        help="only the first N questions of each expected tier")
    parser.add_argument("--timeout", type=float, default=300.0, help="gRPC deadline per question (s)")
    parser.add_argument("--llm", choices=("server", "embedded"), default="server",
                        help="without LLM_BASE_URL: one shared llama-server (default) or the model in every worker")
    parser.add_argument("--json-out", type=Path, default=None, help="also write the rows as JSON")
    args = parser.parse_args(argv)
    install_stop_signals()
    try:
        return run(args)
    except (KeyboardInterrupt, Interrupted) as exc:
        console.print(f"[yellow]interrupted ({type(exc).__name__} {exc}); everything it started is stopped[/]")
        return 130


if __name__ == "__main__":
    sys.exit(main())
