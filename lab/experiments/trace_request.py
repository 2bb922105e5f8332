"""One tier-C request through the real local stack, printed as its trace tree.

Starts the lab's stack (`lab.harness.stack`: front door, worker pools on the filesystem broker,
SQLite, the demo help centre; the rules route without a published classifier) with the instant LLM endpoint as its
LLM (`--instant-llm`, the default; `--embedded` keeps the configured embedded reader), traces to
files (`ARAG_TRACES=file`), asks one multi-part question through gRPC, reads the reply's
`trace-id` trailer and prints the tree `infra.local.trace_tree` draws from the files:

    python -m lab.experiments.trace_request --out reports/reliability/trace-c-request.txt
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
QUESTION = "Which plan supports more devices, Lumora Plus or Lumora Pro?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=REPO / "var" / "trace-request")
    parser.add_argument("--question", default=QUESTION)
    parser.add_argument("--embedded", action="store_true", help="the embedded reader, not the instant LLM")
    parser.add_argument("--llama-server", action="store_true",
                        help="the default reader on one shared llama-server (the stack's default), not the instant LLM")
    parser.add_argument("--warm-up", default=None,
                        help="a question asked first, untraced (the model's pages, the prompt's static part in the cache)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    import grpc

    from infra.local.trace_tree import find_trace, read_spans, render
    from lab.harness.stack import TIER_POOLS, Parts, lab_stack
    from services.frontdoor.stubs import pb2, pb2_grpc

    traces = (args.workdir / "traces").resolve()
    for old in traces.glob("*.jsonl"):
        old.unlink()
    parts = Parts(llm="embedded" if args.embedded else "llama-server" if args.llama_server else "instant")
    with lab_stack(args.workdir, parts, pools=TIER_POOLS, defaults={"llm_api": "completions"},
                   env={"ARAG_TRACES": "file", "ARAG_TRACES_DIR": str(traces)}) as running:
        key = running.api_key("demo")
        with grpc.insecure_channel(running.address) as channel:
            if args.warm_up:
                pb2_grpc.AdaptiveRagStub(channel).Answer(pb2.AnswerRequest(query_text=args.warm_up),
                                                         metadata=(("authorization", f"Bearer {key}"),), timeout=300)
            reply, call = pb2_grpc.AdaptiveRagStub(channel).Answer.with_call(
                pb2.AnswerRequest(query_text=args.question),
                metadata=(("authorization", f"Bearer {key}"),), timeout=300)
        trace_id = dict(call.trailing_metadata())["trace-id"]
        time.sleep(2.0)  # the exporters write every 0.5 s
    spans = find_trace(list(read_spans([traces])), trace_id)
    reader = "embedded reader" if args.embedded else "llama-server, default reader" if args.llama_server else "instant LLM endpoint"
    header = (f"# python -m lab.experiments.trace_request ({reader})\n"
              f"# question: {args.question}\n"
              f"# reply: tier {pb2.Tier.Name(reply.tier)}, strategy {reply.strategy}, steps {reply.steps}, "
              f"answer {reply.answer!r}, total {reply.timings.total_ms:.0f} ms (queue wait "
              f"{reply.timings.queue_wait_ms:.0f} ms, strategy {reply.timings.strategy_ms:.0f} ms)\n"
              f"# trace-id trailer: {trace_id}\n"
              f"# python -m infra.local.trace_tree {traces.relative_to(REPO) if traces.is_relative_to(REPO) else traces} {trace_id}\n")
    text = header + render(spans) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
