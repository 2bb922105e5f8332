"""LLM serving on 2 cores: a model per worker process against one shared llama-server.

Setups, all serving the same Gemma 3 270M GGUF with greedy decoding:

- `embedded-t2`: N processes, each loading its own model through llama-cpp-python
  (`LlamaCppLLM`, `n_threads=2`): today's tier worker pools (a prefork Celery pool of N processes,
  `ARAG_LLM_THREADS` unset = all cores).
- `embedded-t1`: the same with `n_threads=1`.
- `server`: one `llama-server` (`-np 4 -t 2`, continuous batching; `infra/local/llama_server.py`)
  and N client threads, each calling it over HTTP through the project's adapter
  (`OpenAICompatibleLLM`, `api="completions"`), as workers do with `LLM_BASE_URL`.

Workloads: tier-A-like (the no-retrieval few-shot prompt of `adaptive_rag/prompts/no_retrieval.py`
over NQ-open questions, ~70 tokens) and tier-B-like (the single-step reader prompt of
`prompts/single_step.py` over five HotpotQA paragraphs, ~500-650 tokens), every request a
different prompt. (Without the benchmark data: demo questions and the demo knowledge base.)

Per cell (setup, N clients, workload): closed loop, the N clients start together after the
models are loaded and warmed up and send requests for a fixed window. Throughput = the window's
work per second: each request counts with the share of its duration inside the window (no
rounding when requests take several seconds); latency = per completed request. After the last
window (tier B), embedded requests still running `--tail-cap` s later are stopped and counted as
if they had ended then (an upper bound, in the embedded setups' favour); the server's all finish.
Cells are interleaved: for each N the setups run one after the other, in an order rotated per N
and round, so all see the same machine drift; the tables give the median over rounds.
The server's host-memory prompt cache is off (`--cache-ram 0`) so that repeated prompts across
rounds are not answered from cache (llama.cpp's slot prefix reuse stays on for both setups).

Before the timing, parity: five prompts answered by the embedded model and by the server (one
at a time, `api="completions"` and `api="chat"`); during the timing, every answer the server gave
under concurrency is compared with the embedded answer to the same prompt.

    .venv/bin/python -m lab.experiments.llm_serving --out reports/llm_serving   # ~12 minutes
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from adaptive_rag.domain import Passage
from adaptive_rag.prompts import format_passages, no_retrieval, single_step
from lab.harness.stack import unwind_on_stop_signals
from lab.harness.stats import median, percentile

REPO = Path(__file__).resolve().parents[2]
SETUPS = ("embedded-t2", "embedded-t1", "server")
WORKLOADS = ("A", "B")
CONCURRENCY = (1, 2, 4, 8)
SERVER_PARALLEL = 4
SERVER_THREADS = 2
N_PROMPTS = {"A": 400, "B": 300}
LOAD_TIMEOUT_S = 180.0


# --- prompts ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Prompt:
    text: str
    max_tokens: int
    stop: tuple[str, ...]


def _tier_a(question: str) -> Prompt:
    return Prompt(no_retrieval.PROMPT.text(question=question), no_retrieval.PROMPT.max_tokens,
                  no_retrieval.PROMPT.stop)


def _tier_b(question: str, passages: list[Passage]) -> Prompt:
    return Prompt(single_step.PROMPT.text(passages=format_passages(passages), question=question),
                  single_step.PROMPT.max_tokens, single_step.PROMPT.stop)


def load_prompts(data_dir: Path) -> tuple[dict[str, list[Prompt]], str]:
    """Tier-A and tier-B prompts (distinct); the second value names their source."""
    nq = data_dir / "nq-open_dev_natural-questions.jsonl"
    hotpot = data_dir / "hotpotqa_dev500_amor.jsonl"
    if nq.is_file() and hotpot.is_file():
        with nq.open(encoding="utf-8") as f:
            questions = [json.loads(line)["question"] for _, line in zip(range(N_PROMPTS["A"]), f)]
        b = []
        with hotpot.open(encoding="utf-8") as f:
            for _, line in zip(range(N_PROMPTS["B"]), f):
                row = json.loads(line)
                passages = [Passage(id=f"{row['_id']}-{i}", title=title, text="".join(sents))
                            for i, (title, sents) in enumerate(row["context"][:5])]
                b.append(_tier_b(row["question"], passages))
        return {"A": [_tier_a(q) for q in questions], "B": b}, (
            f"A: first {len(questions)} NQ-open dev questions; B: first {len(b)} HotpotQA dev "
            "questions, each with its first 5 context paragraphs")
    from adaptive_rag.evaluation.corpus import read_jsonl_corpus

    demo = REPO / "demo"
    rows = json.loads((demo / "questions.json").read_text(encoding="utf-8"))
    kb = list(read_jsonl_corpus(demo / "knowledge_base.jsonl"))
    a = [_tier_a(f"{r['question']}") for r in rows]
    b = [_tier_b(r["question"], [kb[(i + j) % len(kb)] for j in range(5)])
         for i, r in enumerate(rows * 4)]
    return {"A": a, "B": b}, "demo questions and knowledge base (benchmark data not found)"


# --- embedded clients: one process each, its own model --------------------------------------------

def _embedded_client(model_path: str, threads: int, prompts: dict[str, list[Prompt]],
                     first: dict[str, int], stride: int, schedule: list[tuple[str, float]],
                     barrier: Any, record_path: str) -> None:
    """Load the model, warm up, then per (workload, window) in `schedule`: wait for everyone,
    send requests until the window is over, log each request's start and end to `record_path` at
    once (the parent may kill this process mid-request after the last window)."""
    from adaptive_rag.llm.llama_cpp import LlamaCppLLM

    llm = LlamaCppLLM(Path(model_path), n_threads=threads)
    warm = prompts["A"][-1]
    llm.generate(warm.text, warm.max_tokens, warm.stop)
    barrier.wait()  # loaded
    with open(record_path, "a", encoding="utf-8") as out:
        for workload, window in schedule:
            barrier.wait()
            t0 = time.monotonic()
            index = first[workload]
            pool = prompts[workload]
            while time.monotonic() - t0 < window:
                p = pool[index % len(pool)]
                start = time.monotonic() - t0
                out.write(json.dumps({"workload": workload, "prompt": index % len(pool),
                                      "start": start}) + "\n")
                out.flush()
                completion = llm.generate(p.text, p.max_tokens, p.stop)
                end = time.monotonic() - t0
                out.write(json.dumps({
                    "workload": workload, "prompt": index % len(pool), "start": start, "end": end,
                    "prompt_tokens": completion.prompt_tokens,
                    "completion_tokens": completion.completion_tokens, "text": completion.text,
                }) + "\n")
                out.flush()
                index += stride
            barrier.wait()  # the last request of the window is done (it may overrun the window)


def _read_records(path: Path, cap: float) -> list[dict]:
    """One client's requests; one still running when it was stopped gets `end=None` and
    `cut=cap` (seconds after its window's start)."""
    records: list[dict] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if "end" in row:
            records[-1] = row
        else:
            records.append({**row, "end": None, "cut": cap})
    return records


def run_embedded(model: Path, threads: int, clients: int, prompts: dict[str, list[Prompt]],
                 cursor: dict[str, int], windows: dict[str, float],
                 tail_cap: float) -> dict[str, list[dict]]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(clients + 1)
    schedule = [(w, windows[w]) for w in WORKLOADS]
    with tempfile.TemporaryDirectory(prefix="arag-llm-bench-") as tmp:
        paths = [Path(tmp) / f"client-{i}.jsonl" for i in range(clients)]
        procs = [ctx.Process(
            target=_embedded_client,
            args=(str(model), threads, prompts, {w: cursor[w] + i for w in WORKLOADS}, clients,
                  schedule, barrier, str(paths[i])), daemon=True) for i in range(clients)]
        for proc in procs:
            proc.start()
        try:
            barrier.wait(timeout=LOAD_TIMEOUT_S)  # all loaded and warm
            for number, (workload, window) in enumerate(schedule):
                barrier.wait(timeout=60)  # go
                last = number == len(schedule) - 1
                try:
                    # after the last window, requests still running `tail_cap` s later are cut
                    barrier.wait(timeout=window + (tail_cap if last else 600))
                except threading.BrokenBarrierError:
                    if not last:
                        raise
        finally:
            for proc in procs:
                proc.kill()
            for proc in procs:
                proc.join(timeout=10)
        cap = windows[schedule[-1][0]] + tail_cap
        records = [r for path in paths if path.exists() for r in _read_records(path, cap)]
    return {w: [r for r in records if r["workload"] == w] for w in WORKLOADS}


# --- the shared server: N client threads through the project's adapter -------------------------

def run_server(base_url: str, clients: int, prompts: dict[str, list[Prompt]],
               cursor: dict[str, int], windows: dict[str, float]) -> dict[str, list[dict]]:
    from adaptive_rag.llm.openai_compat import OpenAICompatibleLLM

    llms = [OpenAICompatibleLLM(base_url, "gemma-3-270m", api="completions", logprobs=False)
            for _ in range(clients)]
    for llm in llms:  # connect once outside the window (the workers keep their clients)
        p = prompts["A"][-1]
        llm.generate(p.text, 1, p.stop)
    out: dict[str, list[dict]] = {w: [] for w in WORKLOADS}
    lock = threading.Lock()

    def client(i: int, workload: str, window: float, go: threading.Barrier) -> None:
        pool = prompts[workload]
        index = cursor[workload] + i
        go.wait()
        t0 = time.monotonic()
        while time.monotonic() - t0 < window:
            p = pool[index % len(pool)]
            start = time.monotonic() - t0
            completion = llms[i].generate(p.text, p.max_tokens, p.stop)
            end = time.monotonic() - t0
            with lock:
                out[workload].append({
                    "workload": workload, "prompt": index % len(pool), "start": start, "end": end,
                    "prompt_tokens": completion.prompt_tokens,
                    "completion_tokens": completion.completion_tokens, "text": completion.text})
            index += clients

    try:
        for workload in WORKLOADS:
            go = threading.Barrier(clients)
            threads = [threading.Thread(target=client, args=(i, workload, windows[workload], go))
                       for i in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        for llm in llms:
            llm.close()
    return out


# --- one cell's numbers ---------------------------------------------------------------------------

@dataclass
class Cell:
    setup: str
    clients: int
    workload: str
    round: int
    window_s: float
    answers: int  # requests started in the window that completed
    cut: int  # requests still running when the client was stopped (window + tail cap)
    answers_per_s: float
    latency_p50_s: float | None
    latency_p95_s: float | None
    prompt_tokens_p50: float | None
    texts: dict[int, str] = field(default_factory=dict, repr=False)


def _credit(start: float, end: float, window: float) -> float:
    """The share of one request's time that lies inside [0, window]."""
    if end <= start:
        return 1.0 if start <= window else 0.0
    return max(0.0, min(end, window) - max(start, 0.0)) / (end - start)


def summarize(setup: str, clients: int, workload: str, rnd: int, window: float,
              records: list[dict]) -> Cell:
    """Throughput = sum over requests of the share of each request's duration inside the window,
    per second of window: in a closed loop this counts the window's work without the rounding of
    "answers finished in the window" (a 7 s request in a 15 s window counts 1/7 per second it
    overlaps). A request cut after the tail cap counts as if it had ended there (an upper bound:
    favours the setup that was that slow)."""
    done = [r for r in records if r["end"] is not None]
    cut = [r for r in records if r["end"] is None]
    credit = sum(_credit(r["start"], r["end"], window) for r in done)
    credit += sum(_credit(r["start"], r["cut"], window) for r in cut)
    latencies = [r["end"] - r["start"] for r in done]
    return Cell(
        setup=setup, clients=clients, workload=workload, round=rnd, window_s=window,
        answers=len(done), cut=len(cut), answers_per_s=credit / window,
        latency_p50_s=median(latencies), latency_p95_s=percentile(latencies, 95),
        prompt_tokens_p50=median(r["prompt_tokens"] for r in done),
        texts={r["prompt"]: r["text"] for r in done},
    )


# --- parity -------------------------------------------------------------------------------------------

def _embedded_answers(model: str, prompts: list[Prompt]) -> list[str]:
    from adaptive_rag.llm.llama_cpp import LlamaCppLLM

    llm = LlamaCppLLM(Path(model), n_threads=2)
    return [llm.generate(p.text, p.max_tokens, p.stop).text for p in prompts]


def parity(model: Path, base_url: str, prompts: dict[str, list[Prompt]]) -> dict[str, Any]:
    from adaptive_rag.llm import build_llm
    from adaptive_rag.settings import Settings

    chosen = prompts["A"][:3] + prompts["B"][:2]
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        embedded = pool.submit(_embedded_answers, str(model), chosen).result()
    rows = []
    by_api = {}
    for api in ("completions", "chat"):
        llm = build_llm(Settings(llm_base_url=base_url, llm_api=api, llm_model="anything"))
        by_api[api] = [llm.generate(p.text, p.max_tokens, p.stop) for p in chosen]
        llm.close()
    for i, p in enumerate(chosen):
        rows.append({
            "workload": "A" if i < 3 else "B", "prompt_tail": p.text[-80:],
            "embedded": embedded[i], "server_completions": by_api["completions"][i].text,
            "server_chat": by_api["chat"][i].text,
            "server_completions_logprobs": by_api["completions"][i].token_logprobs is not None,
        })
    return {
        "rows": rows,
        "completions_equal": sum(r["embedded"] == r["server_completions"] for r in rows),
        "chat_equal": sum(r["embedded"] == r["server_chat"] for r in rows),
        "n": len(rows),
    }


# --- report -------------------------------------------------------------------------------------------

def aggregate(cells: list[Cell]) -> dict[str, dict[str, dict[int, dict[str, Any]]]]:
    table: dict[str, dict[str, dict[int, dict[str, Any]]]] = {}
    for workload in WORKLOADS:
        for setup in SETUPS:
            for n in sorted({c.clients for c in cells}):
                mine = [c for c in cells if (c.workload, c.setup, c.clients) == (workload, setup, n)]
                if not mine:
                    continue
                table.setdefault(workload, {}).setdefault(setup, {})[n] = {
                    "answers_per_s": median([c.answers_per_s for c in mine]),
                    "answers_per_s_rounds": [round(c.answers_per_s, 3) for c in mine],
                    "answers": sum(c.answers for c in mine),
                    "cut": sum(c.cut for c in mine),
                    "latency_p50_s": median([c.latency_p50_s for c in mine]),
                    "latency_p95_s": median([c.latency_p95_s for c in mine]),
                    "prompt_tokens_p50": median([c.prompt_tokens_p50 for c in mine]),
                }
    return table


def agreement(cells: list[Cell]) -> dict[str, Any]:
    """Server answers under concurrency against embedded-t2 answers to the same prompts."""
    result = {}
    for workload in WORKLOADS:
        embedded: dict[int, str] = {}
        server: dict[int, str] = {}
        for c in cells:
            if c.workload != workload:
                continue
            target = embedded if c.setup == "embedded-t2" else server if c.setup == "server" else None
            if target is not None:
                target.update(c.texts)
        common = sorted(set(embedded) & set(server))
        result[workload] = {"compared": len(common),
                            "identical": sum(embedded[i] == server[i] for i in common)}
    return result


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def write_report(out: Path, meta: dict[str, Any], cells: list[Cell], par: dict[str, Any]) -> None:
    table = aggregate(cells)
    agree = agreement(cells)
    out.mkdir(parents=True, exist_ok=True)
    payload = {"meta": meta, "table": table, "parity": par, "agreement_under_load": agree,
               "cells": [{k: v for k, v in asdict(c).items() if k != "texts"} for c in cells]}
    (out / "report.json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    render_markdown(out, payload)


def _reading(table: dict[str, dict[str, dict[int, dict[str, Any]]]], ns: list[int]) -> list[str]:
    """A few sentences computed from the table (so a rerun keeps them true)."""
    lo, hi = ns[0], ns[-1]

    def thr(w: str, s: str, n: int) -> float:
        return table[w][s][n]["answers_per_s"]

    if not all(s in table.get(w, {}) for w in WORKLOADS for s in ("embedded-t2", "server")):
        return []
    return [
        "## Reading", "",
        f"- With one client the two setups are close (tier A "
        f"{thr('A', 'server', lo) / thr('A', 'embedded-t2', lo):.2f}x, tier B "
        f"{thr('B', 'server', lo) / thr('B', 'embedded-t2', lo):.2f}x): the HTTP hop is small "
        "next to the model.",
        f"- A model per process collapses as clients are added: {hi} processes with 2 threads "
        f"each on 2 cores give {thr('A', 'embedded-t2', hi) / thr('A', 'embedded-t2', lo):.2f}x "
        f"the one-client tier-A throughput (1 thread each: "
        f"{thr('A', 'embedded-t1', hi) / thr('A', 'embedded-t1', lo):.2f}x). The shared server "
        f"keeps its throughput and gains from batching: "
        f"{thr('A', 'server', hi) / thr('A', 'server', lo):.2f}x (tier A), "
        f"{thr('B', 'server', hi) / thr('B', 'server', lo):.2f}x (tier B) at {hi} clients, i.e. "
        f"{thr('A', 'server', hi) / thr('A', 'embedded-t2', hi):.1f}x and "
        f"{thr('B', 'server', hi) / thr('B', 'embedded-t2', hi):.1f}x the per-process setup.",
        "- Tier B is bound by prompt evaluation (~500 tokens per answer on 2 cores), which "
        "batching barely speeds up: the server's latency grows with the queue "
        f"({hi} clients, {SERVER_PARALLEL} slots) while its throughput holds; the embedded "
        f"setups' tier-B numbers at {hi} clients are upper bounds (requests cut, see above).",
        "",
    ]


def render_markdown(out: Path, payload: dict[str, Any]) -> None:
    meta, par, agree = payload["meta"], payload["parity"], payload["agreement_under_load"]
    table = {w: {s: {int(n): v for n, v in by_n.items()} for s, by_n in by_setup.items()}
             for w, by_setup in payload["table"].items()}
    ns = sorted({int(n) for by_setup in table.values() for by_n in by_setup.values()
                 for n in by_n})
    lines = [
        "# LLM serving: a model per worker process against one shared llama-server",
        "",
        f"Generated by `python -m lab.experiments.llm_serving` on {meta['date']} "
        f"({meta['machine']}; load average before the run: {meta['load_before']}). "
        f"{meta['rounds']} interleaved rounds, medians over rounds"
        + (" (of 2: their mean)" if meta["rounds"] == 2 else "") + "; windows: tier A "
        f"{meta['windows']['A']:.0f} s, tier B {meta['windows']['B']:.0f} s per cell; "
        "throughput counts each request with the share of its duration inside the window "
        f"(module docstring). Run time {meta['elapsed_s'] / 60:.1f} min.",
        "",
        "- **embedded-t2 / embedded-t1**: N processes, each with its own `Llama` "
        "(llama-cpp-python, 2 resp. 1 threads): the current tier worker pools.",
        f"- **server**: one `llama-server` (`-np {SERVER_PARALLEL} -t {SERVER_THREADS} "
        f"-c {meta['server_ctx']}`, continuous batching, prompt RAM cache off), N client threads "
        "through `OpenAICompatibleLLM(api=\"completions\")`.",
        f"- Prompts: {meta['prompt_source']}; every request a different prompt; greedy, "
        "project's max_tokens/stop.",
        "",
    ]
    for workload in WORKLOADS:
        title = {"A": "Tier-A-like (no-retrieval few-shot prompt)",
                 "B": "Tier-B-like (five-passage reader prompt)"}[workload]
        rows = table.get(workload, {})
        ptoks = median([rows[s][n]["prompt_tokens_p50"] for s in rows for n in rows[s]])
        lines += [f"## {title}, ~{_fmt(ptoks, 0)} prompt tokens", "",
                  "Answers/s (median over rounds); in brackets: median latency p50 / p95 in s.", "",
                  "| setup | " + " | ".join(f"{n} client{'s' if n > 1 else ''}" for n in ns)
                  + f" | {ns[-1]} vs 1 |",
                  "|---|" + "---:|" * (len(ns) + 1)]
        for setup in SETUPS:
            if setup not in rows:
                continue
            r = rows[setup]
            cells_txt = [f"{_fmt(r[n]['answers_per_s'])} ({_fmt(r[n]['latency_p50_s'])} / "
                         f"{_fmt(r[n]['latency_p95_s'])})" if n in r else "-" for n in ns]
            scale = (r[ns[-1]]["answers_per_s"] / r[ns[0]]["answers_per_s"]
                     if ns[-1] in r and ns[0] in r and r[ns[0]]["answers_per_s"] else None)
            lines.append(f"| {setup} | " + " | ".join(cells_txt) + f" | {_fmt(scale)}x |")
        for base in ("embedded-t2", "embedded-t1"):
            if base in rows and "server" in rows:
                ratios = [(rows["server"][n]["answers_per_s"] / rows[base][n]["answers_per_s"])
                          if rows[base][n]["answers_per_s"] else None for n in ns]
                lines.append(f"| server / {base} | " + " | ".join(
                    "inf" if v is None else f"{v:.2f}x" for v in ratios) + " | |")
        cut = {s: sum(rows[s][n]["cut"] for n in rows[s]) for s in rows}
        lines += ["", "Answers per setup (all rounds): " + ", ".join(
            f"{s} {sum(rows[s][n]['answers'] for n in rows[s])}" for s in rows)
            + f"; requests cut {meta['tail_cap_s']:.0f} s after the window (counted as if they "
            "had ended then): " + ", ".join(f"{s} {cut[s]}" for s in rows) + ".", ""]
    lines += [
        "## Same answers?", "",
        f"Parity, one request at a time, {par['n']} prompts (3 tier A, 2 tier B): the server "
        f"through `LLM_API=completions` gave the embedded model's answer for "
        f"{par['completions_equal']}/{par['n']}, through `LLM_API=chat` (the GGUF's chat template "
        f"wraps the few-shot prompt) for {par['chat_equal']}/{par['n']}. `LLM_MODEL` was "
        "`anything`: llama-server serves its one model whatever the name.", "",
        "| tier | embedded | server, completions | server, chat |", "|---|---|---|---|",
    ]
    for r in par["rows"]:
        lines.append(f"| {r['workload']} | {r['embedded']!r} | {r['server_completions']!r} | "
                     f"{r['server_chat']!r} |".replace("\n", "\\n"))
    lines += ["", "Under load (continuous batching, several slots): the server's answers equal "
              "embedded-t2's for the same prompt in " + ", ".join(
                  f"tier {w} {agree[w]['identical']}/{agree[w]['compared']}" for w in WORKLOADS)
              + " prompts answered by both.", ""]
    lines += _reading(table, ns)
    (out / "report.md").write_text("\n".join(lines), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "llm_serving")
    parser.add_argument("--data-dir", type=Path,
                        default=Path(os.environ.get("ARAG_DATA_DIR", REPO.parent / "shared" / "data")))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", default=",".join(map(str, CONCURRENCY)))
    parser.add_argument("--setups", default=",".join(SETUPS))
    parser.add_argument("--window-a", type=float, default=4.0)
    parser.add_argument("--window-b", type=float, default=12.0)
    parser.add_argument("--tail-cap", type=float, default=12.0,
                        help="after the last window, stop embedded requests this much later")
    parser.add_argument("--render-only", action="store_true",
                        help="rewrite report.md from an existing report.json, measure nothing")
    args = parser.parse_args(argv)
    unwind_on_stop_signals()  # SIGTERM stops the llama-server started here too
    if args.render_only:
        render_markdown(args.out, json.loads((args.out / "report.json").read_text("utf-8")))
        print((args.out / "report.md").read_text(encoding="utf-8"))
        return 0

    from infra.local.llama_server import LlamaServerProcess, default_model_path

    started = time.monotonic()
    model = default_model_path()
    prompts, source = load_prompts(args.data_dir)
    windows = {"A": args.window_a, "B": args.window_b}
    clients = [int(x) for x in args.clients.split(",")]
    setups = [s for s in SETUPS if s in args.setups.split(",")]
    load_before = os.getloadavg()
    cells: list[Cell] = []
    cursor = {w: 0 for w in WORKLOADS}
    log = REPO / "var" / "llm_serving" / "llama-server.log"  # scratch, git-ignored
    log.parent.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    server = LlamaServerProcess(model, parallel=SERVER_PARALLEL, threads=SERVER_THREADS,
                                log_path=log, cache_ram_mib=0)
    with server:
        print(f"llama-server up at {server.base_url}; parity check", flush=True)
        par = parity(model, server.base_url, prompts)
        print(f"parity: completions {par['completions_equal']}/{par['n']}, "
              f"chat {par['chat_equal']}/{par['n']}", flush=True)
        for rnd in range(args.rounds):
            for k, n in enumerate(clients):
                shift = (rnd + k) % len(setups)
                for setup in setups[shift:] + setups[:shift]:
                    if setup == "server":
                        records = run_server(server.base_url, n, prompts, cursor, windows)
                    else:
                        threads = 2 if setup == "embedded-t2" else 1
                        records = run_embedded(model, threads, n, prompts, cursor, windows,
                                               args.tail_cap)
                    for w in WORKLOADS:
                        cell = summarize(setup, n, w, rnd, windows[w], records[w])
                        cells.append(cell)
                        print(f"round {rnd} {setup:12s} N={n} {w}: {cell.answers_per_s:6.2f}/s "
                              f"p50 {_fmt(cell.latency_p50_s)} s ({cell.answers} answers, "
                              f"{cell.cut} cut) load {os.getloadavg()[0]:.1f}",
                              flush=True)
                # next N: new prompts for every setup (the same ones across setups of this N)
                for w in WORKLOADS:
                    cursor[w] += 97
    meta = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
                   f"Python {platform.python_version()}",
        "load_before": [round(x, 2) for x in load_before],
        "rounds": args.rounds, "windows": windows, "tail_cap_s": args.tail_cap, "clients": clients, "setups": setups,
        "server_ctx": server.ctx_size, "server_parallel": SERVER_PARALLEL,
        "server_threads": SERVER_THREADS, "prompt_source": source, "model": str(model),
        "elapsed_s": time.monotonic() - started,
    }
    write_report(args.out, meta, cells, par)
    print((args.out / "report.md").read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
