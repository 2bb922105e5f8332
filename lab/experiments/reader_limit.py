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
   stack, its default slots) and with a copy of the model in every worker process
   (`--llm embedded`): latency per tier-B answer, and its ratio to `llama-bench -pg` for that
   answer's own prompt and generated tokens (read from the records): the model's time for the
   whole prompt, which is the target's reference; beside it the ratio to the model's time for
   the tokens the server actually prefilled (the rest came from its prompt cache, read from its
   `/metrics`), which is the service's own overhead. Then the demo's two-part questions (tier C,
   parts read in parallel on the server's slots), as a ratio to B's p50;
2. N clients in a closed loop over distinct help-centre questions (shared server): the tokens
   the server computed per second (prefilled + generated, from its `/metrics`; the prompt cache's
   tokens are not computed and not counted) against `llama-batched-bench` at the batch the server
   ran (its busy requests, sampled every 0.5 s) for the window's own prefilled and generated
   tokens per request; and, as before, the answers' whole prompts per second.

    python -m lab.experiments.reader_limit --setups server --out reports/reader_limit   # ~30 min

Writes `README.md`, `summary.json`, `answers.jsonl` (one record per answer: setup, clients,
question, tier, latency, tokens) and `bench.jsonl` (llama.cpp's own rows).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import subprocess
import sys
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
    # from the server's /metrics around the answer (one client only: nothing else runs then)
    prefilled_tokens: int | None = None
    cached_tokens: int | None = None
    phase: str = "one"  # one: the one-client questions; loop: a closed-loop window


SERVER_COUNTERS = {"prefilled": "llamacpp:prompt_tokens_total", "cached": "llamacpp:prompt_tokens_cached_total",
                   "generated": "llamacpp:tokens_predicted_total", "decodes": "llamacpp:n_decode_total"}


def server_counters(url: str) -> dict[str, float]:
    """llama-server's counters (`--metrics`), plus `processing`: requests being decoded now."""
    import httpx

    values: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=5.0).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    out = {key: values.get(name, 0.0) for key, name in SERVER_COUNTERS.items()}
    out["processing"] = values.get("llamacpp:requests_processing", 0.0)
    return out


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {key: after[key] - before[key] for key in SERVER_COUNTERS}


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


def bench_windows(model: Path, windows: list[dict]) -> list[dict]:
    """`llama-batched-bench` once per busy closed-loop window, at that window's own batch and its
    own prefilled and generated tokens per request: a generation-heavy window computes fewer
    tokens per second than a prefill-heavy one on the same hardware, so each window is compared
    with its own mix (rows tagged with the window's client count)."""
    rows = []
    for window in windows:
        if not window["answers"] or not window["batch_mean"]:
            continue
        prompt = max(1, round(window["prefilled"] / window["answers"]))
        gen = max(1, round(window["generated"] / window["answers"]))
        for row in bench_batched(model, prompt, gen, [max(1, round(window["batch_mean"]))]):
            rows.append({**row, "window": window["clients"]})
    return rows


def two_part_questions() -> set[str]:
    """The demo's two-part questions (tier C by parts), whatever tier the router gave them."""
    return {q["question"] for q in json.loads(DEMO_QUESTIONS.read_text()) if q.get("expected_tier") == "C"}


def questions(one_client: int) -> tuple[str, list[str], list[str]]:
    """A warm-up question, the one-client questions (the demo's tier-B ones, then covered
    help-centre questions up to `one_client`, then the demo's two-part tier-C ones), and the
    closed loop's: every prompt is asked once per stack, so none is answered from the server's
    prompt cache (a repeated prompt skips its prefill)."""
    demo = json.loads(DEMO_QUESTIONS.read_text())
    single = [q["question"] for q in demo if q.get("expected_tier") == "B" and "follow_up_of" not in q]
    two_part = sorted(two_part_questions())
    covered = [q["question"] for q in json.loads(COVERAGE_QUESTIONS.read_text()) if q.get("kind") == "covered"]
    warm_up, covered = covered[-1], covered[:-1]
    extra = max(0, one_client - len(single))
    return warm_up, single + covered[:extra] + two_part, covered[extra:]


LOAD_CLIENT = "load client and this driver"


def cpu_seconds(known: dict[int, str], root: int | None = None) -> dict[str, float]:
    """CPU seconds (user + system) used so far by each role of the processes under `root` (this
    process by default) and by `root` itself, which runs the load client: over a window, their
    differences say where the two cores went besides llama-server."""
    from lab.experiments.soak import descendants, role_of

    root = os.getpid() if root is None else root
    tree = descendants(root)
    tick = os.sysconf("SC_CLK_TCK")
    used: dict[str, float] = {}
    for pid in (*tree, root):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # it ended
        role = LOAD_CLIENT if pid == root else role_of(pid, tree, known)
        role = role.removesuffix(" child")  # a pool's children count as the pool
        used[role] = used.get(role, 0.0) + (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return used


def run_service(setup: str, workdir: Path, warm_up: str, single: list[str], pool: list[str],
                clients: list[int], window_s: float, slots: int, console: Any) -> tuple[list[Answer], list[dict]]:
    """The stack with `setup`'s reader: one client over `single`, then (shared server only) each
    N of `clients` in a closed loop over `pool` for `window_s` (each question once). Returns the
    answers and, per closed-loop window, the server's own counters."""
    from lab.harness.load_client import LoadClient
    from lab.harness.stack import Parts, lab_stack

    parts = Parts(llm="llama-server" if setup == "server" else "embedded")
    answers: list[Answer] = []
    windows: list[dict] = []
    with lab_stack(workdir / setup, parts, pools=("A", "B", "C"), tenants=("demo",), dotenv=False,
                   llama_parallel=slots, llama_threads=THREADS, console=console) as stack:
        key = stack.api_key("demo")
        metrics_url = stack.llm.url if setup == "server" else None

        async def ask(client: LoadClient, question: str, n: int, lane: int) -> Answer:
            before = server_counters(metrics_url) if metrics_url and n == 1 else None
            record = await client.answer(question, timeout=600.0, lane=lane)
            answer = Answer(setup, n, question, record.tier, record.code, record.end - record.start,
                            record.start, record.end)
            if before is not None:
                used = delta(server_counters(metrics_url), before)
                answer.prefilled_tokens, answer.cached_tokens = int(used["prefilled"]), int(used["cached"])
            if record.ok and record.request_id:
                stored = stack.store.get_result(record.request_id)
                if stored is not None:
                    answer.prompt_tokens, answer.completion_tokens = stored.prompt_tokens, stored.completion_tokens
            return answer

        async def sample_batch(samples: list[float], stop: asyncio.Event) -> None:
            while not stop.is_set():
                samples.append(server_counters(metrics_url)["processing"])
                try:
                    await asyncio.wait_for(stop.wait(), 0.5)
                except asyncio.TimeoutError:
                    pass

        async def go() -> None:
            async with LoadClient(stack.address, key, channels=max(clients)) as client:
                await client.ready()
                await ask(client, warm_up, 1, 0)  # warm-up: model pages, index, the prompt's static part
                for question in single:
                    answers.append(await ask(client, question, 1, 0))
                    a = answers[-1]
                    console.print(f"  {setup} 1 client {a.tier} {a.latency_s:5.2f} s "
                                  f"(prefilled {a.prefilled_tokens}, cached {a.cached_tokens}) {question}")
                if setup != "server":
                    return
                todo = list(reversed(pool))  # shared by the client counts: no question twice
                for n in clients:
                    stop_at = time.time() + window_s

                    async def one_client(lane: int) -> None:
                        while todo and time.time() < stop_at:
                            answers.append(await ask(client, todo.pop(), -n, lane))

                    samples: list[float] = []
                    stop = asyncio.Event()
                    sampler = asyncio.create_task(sample_batch(samples, stop))
                    cpu_before = cpu_seconds(stack.processes())
                    before, started = server_counters(metrics_url), time.time()
                    await asyncio.gather(*(one_client(lane) for lane in range(n)))
                    span = time.time() - started
                    used = delta(server_counters(metrics_url), before)
                    cpu_after = cpu_seconds(stack.processes())
                    cores = {role: round((cpu_after[role] - cpu_before.get(role, 0.0)) / span, 3)
                             for role in cpu_after}
                    stop.set()
                    await sampler
                    done = [a for a in answers if a.clients == -n]
                    for a in done:
                        a.clients, a.phase = n, "loop"
                    busy = [x for x in samples if x > 0]
                    windows.append({"clients": n, "span_s": span, "answers": len(done), **used,
                                    "batch_mean": sum(busy) / len(busy) if busy else 0.0,
                                    "busy_share": len(busy) / len(samples) if samples else 0.0,
                                    "cpu_cores": dict(sorted(cores.items(), key=lambda item: -item[1]))})
                    console.print(f"  server {n} clients: {len(done)} answers in {span:.0f} s, "
                                  f"{(used['prefilled'] + used['generated']) / span:.1f} computed tokens/s, "
                                  f"batch {windows[-1]['batch_mean']:.2f}")

        asyncio.run(go())
    return answers, windows


def summarize(answers: list[Answer], pg: dict[tuple[int, int], dict], batched: list[dict],
              windows: list[dict]) -> dict[str, Any]:
    one = {setup: [a for a in answers if a.setup == setup and a.phase == "one" and a.code == "OK" and a.tier == "B"]
           for setup in ("server", "embedded")}
    out: dict[str, Any] = {"one_client": {}, "throughput": []}
    for setup, rows in one.items():
        timed = [a for a in rows if (a.prompt_tokens, a.completion_tokens) in pg]
        ratios = [a.latency_s / pg[(a.prompt_tokens, a.completion_tokens)]["seconds"] for a in timed]
        computed = [a for a in rows if a.prefilled_tokens is not None
                    and (a.prefilled_tokens, a.completion_tokens) in pg]
        computed_ratios = [a.latency_s / pg[(a.prefilled_tokens, a.completion_tokens)]["seconds"] for a in computed]
        out["one_client"][setup] = {
            "answers": len(rows), "p50_s": median([a.latency_s for a in rows]),
            "prompt_tokens_p50": median([a.prompt_tokens for a in rows]),
            "completion_tokens_p50": median([a.completion_tokens for a in rows]),
            "prefilled_tokens_p50": median([a.prefilled_tokens for a in rows if a.prefilled_tokens is not None]),
            "cached_tokens_p50": median([a.cached_tokens for a in rows if a.cached_tokens is not None]),
            "model_p50_s": median([pg[(a.prompt_tokens, a.completion_tokens)]["seconds"] for a in timed]),
            "ratio_to_model_p50": median(ratios), "ratio_to_model_max": max(ratios) if ratios else None,
            "model_computed_p50_s": median([pg[(a.prefilled_tokens, a.completion_tokens)]["seconds"]
                                            for a in computed]),
            "ratio_to_model_computed_p50": median(computed_ratios)}
        two_part = [a for a in answers if a.setup == setup and a.phase == "one" and a.code == "OK"
                    and a.question in two_part_questions()]
        if two_part and rows:
            out["one_client"][setup].update({
                "two_part_answers": len(two_part), "two_part_p50_s": median([a.latency_s for a in two_part]),
                "two_part_over_b_p50": median([a.latency_s for a in two_part]) / median([a.latency_s for a in rows])})
    s, e = out["one_client"].get("server", {}), out["one_client"].get("embedded", {})
    if s.get("p50_s") and e.get("p50_s"):
        out["server_over_embedded_p50"] = s["p50_s"] / e["p50_s"]
    by_batch = {int(row["pl"]): row for row in batched if "window" not in row}
    own_mix = {int(row["window"]): row for row in batched if "window" in row}
    for window in windows:
        n, span = window["clients"], window["span_s"]
        rows = [a for a in answers if a.setup == "server" and a.phase == "loop" and a.clients == n and a.code == "OK"]
        computed = (window["prefilled"] + window["generated"]) / span if span else None
        batch = max(1, round(window["batch_mean"])) if window["batch_mean"] else None
        reference = by_batch.get(batch) if batch else None
        entry = {"clients": n, "answers": len(rows), "span_s": span, "batch_mean": window["batch_mean"],
                 "busy_share": window["busy_share"], "batch": batch,
                 "computed_tokens_per_s": computed,
                 "prefilled_per_request": window["prefilled"] / window["answers"] if window["answers"] else None,
                 "generated_per_request": window["generated"] / window["answers"] if window["answers"] else None,
                 "whole_prompt_tokens_per_s": (sum(a.prompt_tokens + a.completion_tokens for a in rows) / span
                                               if span else None),
                 "latency_p50_s": median([a.latency_s for a in rows]) if rows else None,
                 "cpu_cores": window.get("cpu_cores")}
        if reference and computed:
            entry["batched_bench_tokens_per_s"] = reference["speed"]
            entry["ratio_to_batched_bench"] = computed / reference["speed"]
        if n in own_mix and computed:
            entry["own_mix_tokens_per_s"] = own_mix[n]["speed"]
            entry["ratio_to_own_mix"] = computed / own_mix[n]["speed"]
        out["throughput"].append(entry)
    rates = [w["computed_tokens_per_s"] for w in out["throughput"] if w["computed_tokens_per_s"]]
    if rates:  # "never falls": no window below 0.9x the best before it (the machine is shared)
        peak = max(rates)
        out["throughput_never_falls"] = all(later >= 0.9 * max(rates[:i + 1]) for i, later in enumerate(rates))
        out["peak_computed_tokens_per_s"] = peak
        out["saturation"] = out["throughput"][-1]  # the most clients: every in-flight bound is full
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
        f"llama.cpp of llama-cpp-python {meta['llama_cpp_version']}, the stack's defaults "
        f"(one shared llama-server with {meta.get('slots', '?')} slots); the demo help centre: "
        f"{meta['one_client']} distinct questions one at a time (the demo's tier-B ones, then covered "
        f"ones, then its two-part tier-C ones), then {meta['clients']} clients in a closed loop over "
        f"distinct covered questions for {meta['window_s']:.0f} s each (no question asked twice on a "
        f"stack: the server's prompt cache never answers one). Measured {meta['when']}, load average "
        f"at start {meta.get('load_at_start', '?')}: compare the ratios, not the absolute times.",
        "",
        "## One client: tier-B latency against the model's own time",
        "",
        "| reader | B answers | p50 latency (s) | prompt / prefilled / generated tokens (p50) | "
        "llama-bench, whole prompt (s, p50) | ratio p50 | ratio max | llama-bench, prefilled tokens (s, p50) | ratio p50 |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for setup, row in one.items():
        lines.append(f"| {setup} | {row['answers']} | {fmt(row['p50_s'])} | {fmt(row['prompt_tokens_p50'], 0)} / "
                     f"{fmt(row.get('prefilled_tokens_p50'), 0)} / {fmt(row['completion_tokens_p50'], 0)} | "
                     f"{fmt(row['model_p50_s'])} | {fmt(row['ratio_to_model_p50'])}x | "
                     f"{fmt(row['ratio_to_model_max'])}x | {fmt(row.get('model_computed_p50_s'))} | "
                     f"{fmt(row.get('ratio_to_model_computed_p50'))}x |")
    for setup, row in one.items():
        if row.get("two_part_answers"):
            lines += ["", f"Two-part questions ({setup}, tier C, parts read in parallel): "
                          f"{row['two_part_answers']} answers, p50 {row['two_part_p50_s']:.2f} s, "
                          f"**{row['two_part_over_b_p50']:.2f}x** B's p50."]
    if "server_over_embedded_p50" in summary:
        lines += ["", f"Shared server over a model per worker, p50: {summary['server_over_embedded_p50']:.2f}x."]
    lines += ["", "## Concurrent clients: tokens computed per second against llama-batched-bench", "",
              "| clients | answers | server batch (mean busy) | computed tokens/s (service) | prefilled / generated per request | "
              "llama-batched-bench, same batch and tokens | ratio | whole prompts tokens/s | latency p50 (s) |",
              "| ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
    for row in summary["throughput"]:
        lines.append(f"| {row['clients']} | {row['answers']} | {fmt(row['batch_mean'])} | "
                     f"{fmt(row['computed_tokens_per_s'], 1)} | {fmt(row['prefilled_per_request'], 0)} / "
                     f"{fmt(row['generated_per_request'], 0)} | {fmt(row.get('batched_bench_tokens_per_s'), 1)} | "
                     f"{fmt(row.get('ratio_to_batched_bench'))}x | {fmt(row['whole_prompt_tokens_per_s'], 1)} | "
                     f"{fmt(row['latency_p50_s'])} |")
    if "throughput_never_falls" in summary:
        sat = summary["saturation"]
        lines += ["", f"Computed tokens/s never fall below 0.9x the best of fewer clients: "
                      f"**{'yes' if summary['throughput_never_falls'] else 'no'}**. At saturation "
                      f"({sat['clients']} clients) the server computes {fmt(sat['computed_tokens_per_s'], 1)} tokens/s, "
                      f"**{fmt(sat.get('ratio_to_batched_bench'))}x** llama-batched-bench at its batch."]
    own = [row for row in summary["throughput"] if row.get("ratio_to_own_mix") is not None]
    if own:
        lines += ["", "Each window against llama-batched-bench at its own batch and its own prefilled and generated "
                      "tokens per request (a generation-heavy window computes fewer tokens per second on the same "
                      "hardware):", "", "| clients | computed tokens/s | llama-batched-bench, own mix | ratio |",
                  "| ---: | ---: | ---: | ---: |"]
        lines += [f"| {row['clients']} | {fmt(row['computed_tokens_per_s'], 1)} | {fmt(row['own_mix_tokens_per_s'], 1)} | "
                  f"{fmt(row['ratio_to_own_mix'])}x |" for row in own]
    measured = [row for row in summary["throughput"] if row.get("cpu_cores")]
    if measured:
        lines += ["", "Where the two cores went in each window (CPU seconds per second of the window, user + system; "
                      "a pool counts with its children; the load client runs in this driver):", "",
                  "| clients | llama-server | everything else | of it, the top three |", "| ---: | ---: | ---: | --- |"]
        for row in measured:
            cores = row["cpu_cores"]
            rest = {role: value for role, value in cores.items() if role != "llama-server"}
            top = sorted(rest.items(), key=lambda item: -item[1])[:3]
            lines.append(f"| {row['clients']} | {fmt(cores.get('llama-server'))} | {fmt(sum(rest.values()))} | "
                         + ", ".join(f"{role} {value:.2f}" for role, value in top) + " |")
    lines += ["", "## Reading", "",
              "Every chat prompt starts with its static part (system text and the worked example), which the",
              "server keeps from the previous prompt on the slot: it prefills only the rest (the passages and",
              "the question). `llama-bench` prefills every token, so the whole-prompt ratio is below 1 when",
              "the cache serves; the prefilled-token ratio is the service's own overhead over the model's",
              "arithmetic (queueing, routing, retrieval, HTTP, tokenisation). Throughput counts the tokens the",
              "server computed (its `/metrics`), so the cache's tokens are not counted as work; the whole",
              "prompts' rate is shown beside it. With the stack's default pool concurrency the server decodes",
              "at most as many requests together as the pools send it: more clients wait in the queues.",
              "A setup with no answers was not run (`--setups`)."]
    lines += ["", "## Method", "",
              "Each answer's prompt and generated tokens come from the records (`query_results`), the tokens "
              "the server prefilled and took from its cache from its `/metrics` read before and after the "
              "answer (one client: nothing else runs). `llama-bench -pg P,G` measures the model alone for "
              f"exactly that pair (mean of {meta['repetitions']} repetitions). In each closed-loop window the "
              "server's counters give the tokens computed over the window's span, and `requests_processing`, "
              "sampled every 0.5 s while busy, the batch; `llama-batched-bench` decodes that many requests of "
              "the windows' median prefilled and generated tokens per request together.", "",
              "    " + (meta.get("command") or f"python -m lab.experiments.reader_limit --setups server --out {shown(out)}"),
              "", "Raw records: `answers.jsonl`, `windows.jsonl`, `bench.jsonl`; figures: `summary.json` "
              "(`--report-only` recomputes it and this page from them)."]
    (out / "README.md").write_text("\n".join(lines) + "\n")


def recompute(out: Path) -> int:
    """summary.json and README.md again from `answers.jsonl`, `windows.jsonl` and `bench.jsonl`."""
    answers = [Answer(**json.loads(line)) for line in (out / "answers.jsonl").read_text().splitlines() if line]
    windows = [json.loads(line) for line in (out / "windows.jsonl").read_text().splitlines() if line]
    bench = [json.loads(line) for line in (out / "bench.jsonl").read_text().splitlines() if line]
    pg = {(row["n_prompt"], row["n_gen"]): row for row in bench if row["tool"] == "llama-bench"}
    batched = [row for row in bench if row["tool"] == "llama-batched-bench"]
    meta = json.loads((out / "summary.json").read_text())["meta"]
    payload = {"meta": meta, "summary": summarize(answers, pg, batched, windows)}
    (out / "summary.json").write_text(json.dumps(payload, indent=2))
    render(out, payload)
    return 0


def rebench(out: Path) -> int:
    """The per-window references (`bench_windows`) for a run recorded before they existed, added
    to its `bench.jsonl` (replacing any earlier ones), then `recompute`."""
    from adaptive_rag.llm import embedded_model_path
    from adaptive_rag.settings import Settings

    windows = [json.loads(line) for line in (out / "windows.jsonl").read_text().splitlines() if line]
    bench = [json.loads(line) for line in (out / "bench.jsonl").read_text().splitlines() if line]
    bench = [row for row in bench if "window" not in row] + bench_windows(embedded_model_path(Settings(_env_file=None)), windows)
    (out / "bench.jsonl").write_text("".join(json.dumps(row) + "\n" for row in bench))
    return recompute(out)


def shown(path: Path) -> str:
    """`path` as a report names it: relative to the repository when inside it."""
    return str(path.relative_to(REPO) if path.is_relative_to(REPO) else path)


def repeated(folder: Path) -> dict[str, Any]:
    """The one-client figures of every run in `folder`'s subfolders (each a `--out` of its own,
    made one after the other on the same machine), their medians, and a README that shows them:
    one run's p50 rests on a dozen answers on a shared machine, so a target is read on the median
    of the runs' p50s."""
    runs = []
    for summary_path in sorted(folder.glob("*/summary.json")):
        payload = json.loads(summary_path.read_text())
        one = payload["summary"]["one_client"].get("server") or {}
        if not one.get("answers"):
            continue
        runs.append({"run": summary_path.parent.name, "when": payload["meta"]["when"],
                     "load_at_start": payload["meta"].get("load_at_start"),
                     "command": payload["meta"].get("command"), "b_answers": one["answers"], "b_p50_s": one["p50_s"],
                     "ratio_to_model_p50": one.get("ratio_to_model_p50"),
                     "ratio_to_model_computed_p50": one.get("ratio_to_model_computed_p50"),
                     "two_part_p50_s": one.get("two_part_p50_s"), "two_part_over_b_p50": one.get("two_part_over_b_p50")})
    keys = ("b_p50_s", "ratio_to_model_p50", "ratio_to_model_computed_p50", "two_part_p50_s", "two_part_over_b_p50")
    medians = {k: median([r[k] for r in runs if r[k] is not None]) if any(r[k] is not None for r in runs) else None
               for k in keys}
    out = {"runs": runs, "medians": medians}
    (folder / "repeated.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = ["# Reader limit, one client, repeated", "",
             "**Question.** Is a tier-B answer's p50 on the demo help centre within 4.5 s on 2 cores, and a two-part "
             "tier-C answer within 2.2x B's, when the run is repeated (one run's p50 rests on about a dozen answers "
             "on a shared machine)?", "",
             f"**Answer.** Over {len(runs)} runs, the median of the runs' B p50s is **{fmt(medians['b_p50_s'])} s** "
             f"(runs: {', '.join(fmt(r['b_p50_s']) for r in runs)}); two-part C over B: median "
             f"**{fmt(medians['two_part_over_b_p50'])}x**; B against the model's own time for the tokens the server "
             f"prefilled: median {fmt(medians['ratio_to_model_computed_p50'])}x.", "",
             "| run | written (UTC) | load at start | B answers | B p50 (s) | ratio to llama-bench, whole prompt | "
             "ratio to llama-bench, prefilled tokens | two-part C p50 (s) | C / B |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in runs:
        lines.append(f"| [{r['run']}]({r['run']}/README.md) | {r['when']} | {r['load_at_start']} | {r['b_answers']} | "
                     f"{fmt(r['b_p50_s'])} | {fmt(r['ratio_to_model_p50'])}x | {fmt(r['ratio_to_model_computed_p50'])}x | "
                     f"{fmt(r['two_part_p50_s'])} | {fmt(r['two_part_over_b_p50'])}x |")
    lines += ["", "Each run is a whole `reader_limit` run of its own (a fresh stack, the same questions), one after the "
              "other; its folder holds its records and report. Commands:", ""]
    lines += [f"    {r['command']}" for r in runs if r.get("command")]
    lines += ["", f"    python -m lab.experiments.reader_limit --repeated {shown(folder)}"
              "   # this page and repeated.json from the runs' summaries"]
    (folder / "README.md").write_text("\n".join(lines) + "\n")
    return out


def ladders(out: Path, runs: list[Path]) -> dict[str, Any]:
    """The closed-loop ladders of several whole runs side by side, and per client count the median
    over the runs of the computed tokens/s and of the ratio to llama-batched-bench at each window's
    own batch and token mix: one window is 45-90 s of a shared machine, and the own-mix reference
    itself moves about 10 % between runs, so the saturation target is read on the median."""
    rows = []
    for run in runs:
        payload = json.loads((run / "summary.json").read_text())
        for window in payload["summary"]["throughput"]:
            rows.append({"run": shown(run), "path": run,
                         "when": payload["meta"]["when"], "load_at_start": payload["meta"].get("load_at_start"),
                         "command": payload["meta"].get("command"), "clients": window["clients"],
                         "tokens_per_s": window.get("computed_tokens_per_s"),
                         "ratio_to_own_mix": window.get("ratio_to_own_mix"), "cpu_cores": window.get("cpu_cores")})
    counts = sorted({r["clients"] for r in rows})
    medians = {}
    for n in counts:
        mine = [r for r in rows if r["clients"] == n]
        rates = [r["tokens_per_s"] for r in mine if r["tokens_per_s"]]
        ratios = [r["ratio_to_own_mix"] for r in mine if r["ratio_to_own_mix"]]
        medians[n] = {"runs": len(mine), "tokens_per_s": median(rates) if rates else None,
                      "ratio_to_own_mix": median(ratios) if ratios else None}
    out.mkdir(parents=True, exist_ok=True)
    found = {"runs": [shown(run) for run in runs],
             "windows": [{k: v for k, v in r.items() if k != "path"} for r in rows],
             "medians": {str(n): m for n, m in medians.items()}}
    (out / "ladders.json").write_text(json.dumps(found, indent=2) + "\n")
    top = medians[counts[-1]] if counts else {}
    lines = ["# Reader limit, the closed-loop ladder over several runs", "",
             "**Question.** As clients grow, does the service keep at least 0.85x of what llama-batched-bench does at "
             "the server's batch, with each window's own prefilled and generated tokens per request?", "",
             f"**Answer.** At {counts[-1] if counts else '-'} clients the median over {top.get('runs', 0)} runs is "
             f"**{fmt(top.get('ratio_to_own_mix'))}x** at {fmt(top.get('tokens_per_s'), 1)} tokens/s.", "",
             "| clients | runs | median tokens/s | median ratio to own mix | each run's ratio |",
             "| ---: | ---: | ---: | ---: | --- |"]
    for n in counts:
        each = ", ".join(f"{fmt(r['ratio_to_own_mix'])}x" for r in rows if r["clients"] == n)
        lines.append(f"| {n} | {medians[n]['runs']} | {fmt(medians[n]['tokens_per_s'], 1)} | "
                     f"{fmt(medians[n]['ratio_to_own_mix'])}x | {each} |")
    lines += ["", "| run | written (UTC) | load at start | command |", "| --- | --- | --- | --- |"]
    for run in runs:
        first = next(r for r in rows if r["path"] == run)
        link = os.path.relpath(run / "README.md", out)
        lines.append(f"| [{first['run']}]({link}) | {first['when']} | {first['load_at_start']} | `{first['command']}` |")
    lines += ["", "Each run is a whole `reader_limit` run of its own (a fresh stack), one after the other; every "
              "figure is recomputed from the runs' `summary.json`:", "",
              f"    python -m lab.experiments.reader_limit --ladders {shlex.join(found['runs'])} --out {shown(out)}"]
    (out / "README.md").write_text("\n".join(lines) + "\n")
    return found


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "var" / "reader_limit")
    parser.add_argument("--one-client", type=int, default=10, help="distinct questions asked by one client")
    parser.add_argument("--clients", default="1,2,4,8,16", help="closed-loop client counts (shared server)")
    parser.add_argument("--slots", type=int, default=None, help="llama-server slots (default: the stack's)")
    parser.add_argument("--window", type=float, default=90.0, help="seconds per client count")
    parser.add_argument("--repetitions", type=int, default=2, help="llama-bench repetitions per pair")
    parser.add_argument("--setups", default="server,embedded")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--rebench", action="store_true",
                        help="no run: llama-batched-bench at each recorded window's own mix, then recompute --out")
    parser.add_argument("--repeated", type=Path, default=None,
                        help="no run: the one-client figures of every run under this folder, and their medians")
    parser.add_argument("--ladders", nargs="+", type=Path, default=None,
                        help="no run: the closed-loop ladders of these run folders side by side, medians per client "
                             "count, written to --out")
    parser.add_argument("--report-only", action="store_true",
                        help="no run: recompute summary.json and README.md from the records in --out")
    args = parser.parse_args(argv)
    if args.repeated:
        repeated(args.repeated.resolve())
        return 0
    if args.ladders:
        ladders(args.out.resolve(), [run.resolve() for run in args.ladders])
        return 0
    if args.rebench:
        return rebench(args.out.resolve())
    if args.report_only:
        return recompute(args.out.resolve())
    console = Console()
    clients = [int(x) for x in args.clients.split(",") if x]
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    from adaptive_rag.llm import embedded_model_path
    from adaptive_rag.settings import Settings
    from infra.local.llama_server import LLAMA_CPP_VERSION

    settings = Settings(_env_file=None)
    model = embedded_model_path(settings)
    from services.demo.local import LLM_SLOTS

    slots = args.slots or LLM_SLOTS
    load_at_start = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    warm_up, single, pool = questions(args.one_client)
    answers: list[Answer] = []
    windows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="arag-reader-limit-") as tmp:
        workdir = args.workdir or Path(tmp)
        for setup in args.setups.split(","):
            console.rule(f"service, reader {setup}")
            got, seen = run_service(setup, workdir, warm_up, single, pool, clients, args.window, slots, console)
            answers += got
            windows += seen
    console.rule("llama.cpp's own benchmarks")
    timed = [a for a in answers if a.phase == "one" and a.code == "OK" and a.tier == "B" and a.prompt_tokens]
    pairs = [(a.prompt_tokens, a.completion_tokens) for a in timed]
    pairs += [(a.prefilled_tokens, a.completion_tokens) for a in timed if a.prefilled_tokens]
    pg = bench_prompt_generation(model, pairs, args.repetitions)
    busy = [w for w in windows if w["answers"]]
    batches = sorted({max(1, round(w["batch_mean"])) for w in busy} | {1})
    batched = (bench_batched(model, max(1, int(median([w["prefilled"] / w["answers"] for w in busy]))),
                             max(1, int(median([w["generated"] / w["answers"] for w in busy]))), batches)
               if busy else [])
    batched += bench_windows(model, windows)
    summary = summarize(answers, pg, batched, windows)
    meta = {"command": "python -m lab.experiments.reader_limit " + shlex.join(sys.argv[1:] if argv is None else argv),
            "reader": settings.reader, "model": model.name, "cpus": os.cpu_count(), "threads": THREADS,
            "llama_cpp_version": LLAMA_CPP_VERSION, "one_client": len(single), "clients": clients,
            "slots": slots, "pool": len(pool), "window_s": args.window, "repetitions": args.repetitions,
            "load_at_start": load_at_start,
            "when": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "host": platform.node()}
    (out / "answers.jsonl").write_text("".join(json.dumps(asdict(a)) + "\n" for a in answers))
    (out / "windows.jsonl").write_text("".join(json.dumps(w) + "\n" for w in windows))
    (out / "bench.jsonl").write_text("".join(json.dumps(row) + "\n" for row in [*pg.values(), *batched]))
    payload = {"meta": meta, "summary": summary}
    (out / "summary.json").write_text(json.dumps(payload, indent=2))
    render(out, payload)
    console.print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
