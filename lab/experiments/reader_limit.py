"""How close does the service come to what the reader itself can do on this CPU?

The reference is llama.cpp's own benchmarks, built from the same vendored sources as the server
(`infra/llama/build.sh VERSION llama-bench|llama-batched-bench`), run on the same GGUF:

- `llama-bench -pg P,G`: the model's own time to prefill a P-token prompt and generate G tokens,
  one request, no HTTP, no service: the floor for one tier-B answer of that size;
- `llama-batched-bench -npp P -ntg G -npl N`: tokens per second with N such requests decoded
  together: the ceiling for N concurrent clients.

Against it, in the same run, the whole service (`lab.harness.stack`: front door, tier pools,
Triton or the rules, the demo help centre) answers the demo's tier-B questions through gRPC:

1. one client, one question at a time, with the reader in one shared llama-server (the default
   stack) and with a copy of the model in every worker process (`--llm embedded`): latency per
   answer, and its ratio to `llama-bench -pg` for that answer's own prompt and generated tokens
   (read from the records);
2. N clients in a closed loop over distinct help-centre questions (shared server): the tokens
   the reader processed per second (prompt + generated, from the records, answers completed in
   the window), and its ratio to `llama-batched-bench` at the same batch size.

    python -m lab.experiments.reader_limit --out reports/reader_limit        # ~35 minutes on 2 cores

Writes `README.md`, `summary.json`, `answers.jsonl` (one record per answer: setup, clients,
question, tier, latency, tokens) and `bench.jsonl` (llama.cpp's own rows).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lab.harness.stats import median

REPO = Path(__file__).resolve().parents[2]
DEMO_QUESTIONS = REPO / "demo" / "questions.json"
COVERAGE_QUESTIONS = REPO / "demo" / "coverage_questions.json"
THREADS = 2
# The benchmarks run the model as the server does (`infra.local.llama_server.PARITY_ARGS`: flash
# attention off), so the ratio compares the same arithmetic.


@dataclass
class Answer:
    """One answer as the client saw it, with the reader's token counts from the records."""

    setup: str  # server | embedded
    clients: int
    question: str
    tier: str | None
    code: str
    latency_s: float
    start: float
    end: float
    prompt_tokens: int = 0
    completion_tokens: int = 0


def tool(name: str) -> Path:
    """llama.cpp's `name` (llama-bench, llama-batched-bench), built once and cached."""
    from infra.local.llama_server import BUILD_SCRIPT, LLAMA_CPP_VERSION

    explicit = os.environ.get(name.upper().replace("-", "_") + "_BIN")
    if explicit:
        return Path(explicit)
    proc = subprocess.run(["bash", str(BUILD_SCRIPT), LLAMA_CPP_VERSION, name], stdout=subprocess.PIPE,
                          text=True, check=True, stdin=subprocess.DEVNULL)
    return Path(proc.stdout.strip().splitlines()[-1])


def bench_prompt_generation(model: Path, pairs: list[tuple[int, int]], repetitions: int) -> dict[tuple[int, int], dict]:
    """`llama-bench -pg P,G` per pair: mean seconds for the prompt and the generation together."""
    out: dict[tuple[int, int], dict] = {}
    binary = tool("llama-bench")
    for p, g in sorted(set(pairs)):
        proc = subprocess.run(
            [str(binary), "-m", str(model), "-t", str(THREADS), "-fa", "off", "-p", "0", "-n", "0", "-pg", f"{p},{g}",
             "-r", str(repetitions), "-o", "jsonl"], capture_output=True, text=True, check=True)
        rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        row = rows[-1]
        out[(p, g)] = {"tool": "llama-bench", "n_prompt": p, "n_gen": g, "seconds": row["avg_ns"] / 1e9,
                       "stddev_s": row.get("stddev_ns", 0) / 1e9, "tokens_per_s": row["avg_ts"],
                       "repetitions": repetitions, "build": row.get("build_commit")}
    return out


def bench_batched(model: Path, prompt: int, gen: int, batches: list[int]) -> list[dict]:
    """`llama-batched-bench`: total tokens/s with N requests of `prompt` + `gen` tokens together."""
    binary = tool("llama-batched-bench")
    ctx = max(batches) * (prompt + gen) + 256
    proc = subprocess.run(
        [str(binary), "-m", str(model), "-t", str(THREADS), "-fa", "off", "-c", str(ctx), "-b", "2048", "-ub", "512",
         "-npp", str(prompt), "-ntg", str(gen), "-npl", ",".join(map(str, batches)),
         "--output-format", "jsonl"], capture_output=True, text=True, check=True)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return [{"tool": "llama-batched-bench", **row} for row in rows]


def questions(one_client: int) -> tuple[str, list[str], list[str]]:
    """A warm-up question, the one-client questions (the demo's tier-B ones, then covered
    help-centre questions up to `one_client`), and the closed loop's: every prompt is asked once
    per stack, so none is answered from the server's prompt cache (a repeated prompt skips its
    prefill)."""
    demo = json.loads(DEMO_QUESTIONS.read_text())
    single = [q["question"] for q in demo if q.get("expected_tier") == "B" and "follow_up_of" not in q]
    covered = [q["question"] for q in json.loads(COVERAGE_QUESTIONS.read_text()) if q.get("kind") == "covered"]
    warm_up, covered = covered[-1], covered[:-1]
    extra = max(0, one_client - len(single))
    return warm_up, single + covered[:extra], covered[extra:]


def run_service(setup: str, workdir: Path, warm_up: str, single: list[str], pool: list[str],
                clients: list[int], window_s: float, console: Any) -> list[Answer]:
    """The stack with `setup`'s reader: one client over `single`, then (shared server only) each
    N of `clients` in a closed loop over `pool` for `window_s` (each question once)."""
    from lab.harness.load_client import LoadClient
    from lab.harness.stack import Parts, lab_stack

    parts = Parts(llm="llama-server" if setup == "server" else "embedded")
    answers: list[Answer] = []
    with lab_stack(workdir / setup, parts, pools=("A", "B", "C"), tenants=("demo",), dotenv=False,
                   llama_parallel=max(clients + [4]), llama_threads=THREADS, console=console) as stack:
        key = stack.api_key("demo")

        async def ask(client: LoadClient, question: str, n: int, lane: int) -> Answer:
            record = await client.answer(question, timeout=600.0, lane=lane)
            answer = Answer(setup, n, question, record.tier, record.code, record.end - record.start,
                            record.start, record.end)
            if record.ok and record.request_id:
                stored = stack.store.get_result(record.request_id)
                if stored is not None:
                    answer.prompt_tokens, answer.completion_tokens = stored.prompt_tokens, stored.completion_tokens
            return answer

        async def go() -> None:
            async with LoadClient(stack.address, key, channels=max(clients)) as client:
                await client.ready()
                await ask(client, warm_up, 1, 0)  # warm-up: model pages, index, the prompt's static part
                for question in single:
                    answers.append(await ask(client, question, 1, 0))
                    console.print(f"  {setup} 1 client {answers[-1].tier} {answers[-1].latency_s:5.2f} s {question}")
                if setup != "server":
                    return
                todo = list(reversed(pool))  # shared by the client counts: no question twice
                for n in clients:
                    stop_at = time.time() + window_s

                    async def one_client(lane: int) -> None:
                        while todo and time.time() < stop_at:
                            answers.append(await ask(client, todo.pop(), n, lane))

                    started = time.time()
                    await asyncio.gather(*(one_client(lane) for lane in range(n)))
                    done = [a for a in answers if a.clients == n]
                    console.print(f"  server {n} clients: {len(done)} answers in {time.time() - started:.0f} s")

        asyncio.run(go())
    return answers


def summarize(answers: list[Answer], pg: dict[tuple[int, int], dict], batched: list[dict],
              window_s: float) -> dict[str, Any]:
    one = {setup: [a for a in answers if a.setup == setup and a.clients == 1 and a.code == "OK" and a.tier == "B"]
           for setup in ("server", "embedded")}
    out: dict[str, Any] = {"one_client": {}, "throughput": []}
    for setup, rows in one.items():
        ratios = [a.latency_s / pg[(a.prompt_tokens, a.completion_tokens)]["seconds"] for a in rows
                  if (a.prompt_tokens, a.completion_tokens) in pg]
        out["one_client"][setup] = {
            "answers": len(rows), "p50_s": median([a.latency_s for a in rows]),
            "prompt_tokens_p50": median([a.prompt_tokens for a in rows]),
            "completion_tokens_p50": median([a.completion_tokens for a in rows]),
            "model_p50_s": median([pg[(a.prompt_tokens, a.completion_tokens)]["seconds"] for a in rows
                                   if (a.prompt_tokens, a.completion_tokens) in pg]),
            "ratio_to_model_p50": median(ratios), "ratio_to_model_max": max(ratios) if ratios else None}
    s, e = out["one_client"].get("server", {}), out["one_client"].get("embedded", {})
    if s.get("p50_s") and e.get("p50_s"):
        out["server_over_embedded_p50"] = s["p50_s"] / e["p50_s"]
    by_batch = {int(row["pl"]): row for row in batched}
    for n in sorted({a.clients for a in answers if a.setup == "server" and a.clients > 1} | {1}):
        rows = [a for a in answers if a.setup == "server" and a.clients == n and a.code == "OK"]
        if n == 1 or not rows:
            continue
        start = min(a.start for a in rows)
        span = max(a.end for a in rows) - start
        tokens = sum(a.prompt_tokens + a.completion_tokens for a in rows)
        reference = by_batch.get(n)
        entry = {"clients": n, "answers": len(rows), "span_s": span, "tokens_per_s": tokens / span if span else None,
                 "latency_p50_s": median([a.latency_s for a in rows])}
        if reference:
            entry["batched_bench_tokens_per_s"] = reference["speed"]
            entry["ratio_to_batched_bench"] = entry["tokens_per_s"] / reference["speed"] if entry["tokens_per_s"] else None
        out["throughput"].append(entry)
    return out


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render(out: Path, payload: dict[str, Any]) -> None:
    summary, meta = payload["summary"], payload["meta"]
    one = summary["one_client"]
    lines = [
        "# Reader limit: the service against llama.cpp's own benchmarks",
        "",
        "**Question.** How close does a tier-B answer come to the time the reader itself needs for "
        "the same prompt on this CPU, and how much of the reader's batched throughput does the "
        "service keep under concurrent clients?",
        "",
        f"**Setup.** {meta['reader']} ({meta['model']}), {THREADS} threads, {meta['cpus']} cores, "
        f"llama.cpp of llama-cpp-python {meta['llama_cpp_version']}; the demo help centre: "
        f"{meta['one_client']} distinct questions one at a time (the demo's tier-B ones, then covered "
        f"ones; B answers counted), then {meta['clients']} clients in a closed loop over distinct covered "
        f"questions for {meta['window_s']:.0f} s each (no question asked twice on a stack: the "
        f"server's prompt cache never answers one). Measured "
        f"{meta['when']} on a shared machine: compare the ratios, not the absolute times.",
        "",
        "## One client: tier-B latency against the model's own time",
        "",
        "| reader | B answers | p50 latency (s) | prompt / generated tokens (p50) | llama-bench -pg same tokens (s, p50) | ratio p50 | ratio max |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for setup, row in one.items():
        lines.append(f"| {setup} | {row['answers']} | {fmt(row['p50_s'])} | {fmt(row['prompt_tokens_p50'], 0)} / "
                     f"{fmt(row['completion_tokens_p50'], 0)} | {fmt(row['model_p50_s'])} | "
                     f"{fmt(row['ratio_to_model_p50'])}x | {fmt(row['ratio_to_model_max'])}x |")
    if "server_over_embedded_p50" in summary:
        lines += ["", f"Shared server over a model per worker, p50: {summary['server_over_embedded_p50']:.2f}x."]
    lines += ["", "## Concurrent clients: tokens/s against llama-batched-bench", "",
              "| clients | answers | tokens/s (service) | tokens/s (llama-batched-bench, same batch) | ratio | latency p50 (s) |",
              "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in summary["throughput"]:
        lines.append(f"| {row['clients']} | {row['answers']} | {fmt(row['tokens_per_s'], 1)} | "
                     f"{fmt(row.get('batched_bench_tokens_per_s'), 1)} | {fmt(row.get('ratio_to_batched_bench'))}x | "
                     f"{fmt(row['latency_p50_s'])} |")
    lines += ["", "## Reading", "",
              "A ratio below 1 is the server's prompt cache, not a faster model: every chat prompt starts",
              "with its static part (system text and the worked example, about 255 tokens), which the server",
              "keeps from the previous prompt on the slot, while `llama-bench` and `llama-batched-bench`",
              "prefill every token. The service's token counts are the prompts' whole lengths, so its",
              "tokens/s count the cached prefix too. A setup with no answers was not run (`--setups`)."]
    lines += ["", "## Method", "",
              "Each answer's prompt and generated tokens come from the records (`query_results`); "
              "`llama-bench -pg P,G` measures the model alone for exactly that pair (mean of "
              f"{meta['repetitions']} repetitions), so the ratio is the service's whole cost per answer over "
              "the model's: queueing, routing, retrieval, HTTP, tokenisation. Throughput counts the "
              "tokens of the answers completed in each window over the span from the first send to the "
              "last reply; `llama-batched-bench` decodes N requests of the median prompt and "
              "generation length together.", "",
              f"    python -m lab.experiments.reader_limit --out {out.relative_to(REPO) if out.is_relative_to(REPO) else out}",
              "", "Raw records: `answers.jsonl`, `bench.jsonl`; figures: `summary.json`."]
    (out / "README.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "var" / "reader_limit")
    parser.add_argument("--one-client", type=int, default=10, help="distinct questions asked by one client")
    parser.add_argument("--clients", default="2,4", help="closed-loop client counts (shared server)")
    parser.add_argument("--window", type=float, default=90.0, help="seconds per client count")
    parser.add_argument("--repetitions", type=int, default=2, help="llama-bench repetitions per pair")
    parser.add_argument("--setups", default="server,embedded")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    console = Console()
    clients = [int(x) for x in args.clients.split(",") if x]
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    from adaptive_rag.llm import embedded_model_path
    from adaptive_rag.settings import Settings
    from infra.local.llama_server import LLAMA_CPP_VERSION

    settings = Settings(_env_file=None)
    model = embedded_model_path(settings)
    warm_up, single, pool = questions(args.one_client)
    answers: list[Answer] = []
    with tempfile.TemporaryDirectory(prefix="arag-reader-limit-") as tmp:
        workdir = args.workdir or Path(tmp)
        for setup in args.setups.split(","):
            console.rule(f"service, reader {setup}")
            answers += run_service(setup, workdir, warm_up, single, pool, clients, args.window, console)
    console.rule("llama.cpp's own benchmarks")
    pairs = [(a.prompt_tokens, a.completion_tokens) for a in answers
             if a.clients == 1 and a.code == "OK" and a.tier == "B" and a.prompt_tokens]
    pg = bench_prompt_generation(model, pairs, args.repetitions)
    loop = [a for a in answers if a.clients > 1 and a.code == "OK" and a.prompt_tokens]
    batched = (bench_batched(model, int(median([a.prompt_tokens for a in loop])),
                             int(median([a.completion_tokens for a in loop])), [1, *clients]) if loop else [])
    summary = summarize(answers, pg, batched, args.window)
    meta = {"reader": settings.reader, "model": model.name, "cpus": os.cpu_count(), "threads": THREADS,
            "llama_cpp_version": LLAMA_CPP_VERSION, "one_client": len(single), "clients": clients,
            "pool": len(pool), "window_s": args.window, "repetitions": args.repetitions,
            "when": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "host": platform.node()}
    (out / "answers.jsonl").write_text("".join(json.dumps(asdict(a)) + "\n" for a in answers))
    (out / "bench.jsonl").write_text("".join(json.dumps(row) + "\n" for row in [*pg.values(), *batched]))
    payload = {"meta": meta, "summary": summary}
    (out / "summary.json").write_text(json.dumps(payload, indent=2))
    render(out, payload)
    console.print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
