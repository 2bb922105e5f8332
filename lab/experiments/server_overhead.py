"""Where does llama-server spend more than the model itself on a tier-B-shaped request? The same
request through the server under its default flags and with one flag changed at a time, against
`llama-bench` for the same prefill and generation at the same cache depth.

The reader-limit run found the service's one-client B answer 1.2x the model's own time and the
server's computed tokens/s at 0.6-0.8x `llama-batched-bench`, with the server busy 99 % of the
time: the loss is inside llama-server, not around it. A request here is shaped like a B answer:
a static prefix (instructions, a worked example) the slot keeps in its cache, then about 120 new
prompt tokens (passages and a question, different every request so they are prefilled), then a
fixed number of generated tokens (`ignore_eos`). Per request the server's own `timings`
(prompt_n, prompt_ms, predicted_n, predicted_ms) and the HTTP wall time are kept.

Configurations (each a fresh server with the stack's defaults, `infra.local.llama_server`):
- `default`: as the stack runs it (4 slots, 256 MiB host prompt cache, log-probabilities asked
  for, as `adaptive_rag.llm.openai_compat` does);
- `no-logprobs`: the same server, requests without log-probabilities (the server then skips
  the full-vocabulary sort per generated token);
- `no-host-cache`: `--cache-ram 0`;
- `one-slot`: `--parallel 1`.
Requests alternate between the configurations' rounds, so a noisy neighbour hits all of them.
`llama-bench -p N -n 0 -d D` and `-p 0 -n G -d D` give the model's prefill and generation time
at the same depth D (the cached prefix), 2 threads, flash attention off (the server's parity flags).

    python -m lab.experiments.server_overhead --out reports/reader_limit/server_overhead
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lab.experiments.reader_limit import THREADS, tool
from lab.harness.stack import unwind_on_stop_signals

REPO = Path(__file__).resolve().parents[2]
GENERATED = 24
STATIC = ("You answer customer-support questions from the passages of a help centre. Use only the "
          "passages. Answer in one to three sentences and cite the passages you used as [1], [2].\n\n"
          "Example passages:\n[1] Returns: You can return any device within 30 days of delivery for a "
          "full refund. Start a return from Orders in the app; we email a prepaid label.\n"
          "[2] Refunds: Refunds reach the original payment method 5-10 business days after the "
          "return arrives at our warehouse.\nExample question: How do I return a device?\n"
          "Example answer: Start a return from Orders in the app within 30 days of delivery; we "
          "email you a prepaid label, and the refund reaches your payment method 5-10 business "
          "days after the device arrives [1][2].\n\n")
CONFIGS: dict[str, dict[str, Any]] = {
    "default": {"server": {}, "logprobs": True},
    "no-logprobs": {"server": {}, "logprobs": False},
    "no-host-cache": {"server": {"cache_ram_mib": 0}, "logprobs": True},
    "one-slot": {"server": {"parallel": 1}, "logprobs": True},
}


def variable_part(i: int) -> str:
    """About 120 prompt tokens that differ from every other request's within the first line."""
    return (f"Passages:\n[1] Hub H{i} setup: Plug the Lumora Hub H{i} into power and open the app; "
            f"pairing takes about {i + 2} minutes and the ring turns green when finished. "
            f"Keep the hub within {10 + i} metres of your router during setup.\n"
            f"[2] Hub H{i} warranty: The Hub H{i} carries a {i % 4 + 1}-year limited warranty that "
            f"covers manufacturing defects; damage from power surges is excluded. Claims need the "
            f"order number and a photo of the serial label.\n"
            f"[3] Hub H{i} limits: One hub controls up to {30 + i} devices and {i + 5} scenes.\n"
            f"Question: How long is the Hub H{i} warranty, and does it cover power surges?\nAnswer:")


def complete(url: str, prompt: str, logprobs: bool) -> dict[str, float]:
    body: dict[str, Any] = {"model": "arag-reader", "prompt": prompt, "max_tokens": GENERATED,
                            "temperature": 0.0, "ignore_eos": True}
    if logprobs:
        body["logprobs"] = 1
    request = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    started = time.perf_counter()
    reply = json.loads(urllib.request.urlopen(request, timeout=600).read())
    wall = time.perf_counter() - started
    t = reply["timings"]
    return {"wall_ms": 1000 * wall, "prompt_n": t["prompt_n"], "prompt_ms": t["prompt_ms"],
            "predicted_n": t["predicted_n"], "predicted_ms": t["predicted_ms"],
            "cached_n": t.get("cache_n", 0)}


def run_servers(rounds: int, workdir: Path) -> list[dict[str, Any]]:
    """Every configuration's server up at once (idle ones cost nothing), rounds interleaved."""
    from infra.local.llama_server import LlamaServerProcess

    servers: dict[str, Any] = {}
    records: list[dict[str, Any]] = []
    try:
        for name, config in CONFIGS.items():
            flags = config["server"]
            key = json.dumps(flags, sort_keys=True)
            shared = next((n for n, c in CONFIGS.items() if n in servers and json.dumps(c["server"], sort_keys=True) == key), None)
            servers[name] = servers[shared] if shared else LlamaServerProcess(
                log_path=workdir / f"llama-{name}.log", **flags).start()
        for name, server in servers.items():  # the static prefix in a slot's cache, the pages in memory
            complete(server.url.rstrip("/").removesuffix("/v1"), STATIC + variable_part(0), CONFIGS[name]["logprobs"])
        i = 1
        for r in range(rounds):
            order = list(CONFIGS) if r % 2 == 0 else list(reversed(CONFIGS))
            for name in order:
                url = servers[name].url.rstrip("/").removesuffix("/v1")
                row = complete(url, STATIC + variable_part(i), CONFIGS[name]["logprobs"])
                records.append({"config": name, "round": r, "load_average": os.getloadavg()[0], **row})
                print(f"round {r} {name:14s} prompt {row['prompt_n']:4.0f} in {row['prompt_ms']:7.0f} ms, "
                      f"{row['predicted_n']:3.0f} generated in {row['predicted_ms']:6.0f} ms, wall {row['wall_ms']:6.0f} ms",
                      flush=True)
                i += 1
    finally:
        for server in {id(s): s for s in servers.values()}.values():
            server.stop()
    return records


def bench(prefill: int, depth: int, repetitions: int) -> dict[str, float]:
    """llama-bench: ms per prefilled token (P new tokens at depth D) and per generated token at D."""
    from infra.local.llama_server import default_model_path

    out = {}
    for label, p, n in (("prefill", prefill, 0), ("generate", 0, GENERATED)):
        proc = subprocess.run([str(tool("llama-bench")), "-m", str(default_model_path()), "-t", str(THREADS),
                               "-fa", "off", "-p", str(p), "-n", str(n), "-d", str(depth), "-r", str(repetitions),
                               "-o", "jsonl"], capture_output=True, text=True, check=True)
        row = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")][-1]
        out[f"{label}_ms_per_token"] = row["avg_ns"] / 1e6 / max(p, n)
    return out


def summarise(records: list[dict[str, Any]], reference: dict[str, float]) -> dict[str, Any]:
    out: dict[str, Any] = {"reference": reference, "configs": {}}
    for name in CONFIGS:
        rows = [r for r in records if r["config"] == name]
        if not rows:
            continue
        prefill = statistics.median(r["prompt_ms"] / r["prompt_n"] for r in rows)
        generate = statistics.median(r["predicted_ms"] / r["predicted_n"] for r in rows)
        outside = statistics.median(r["wall_ms"] - r["prompt_ms"] - r["predicted_ms"] for r in rows)
        out["configs"][name] = {
            "requests": len(rows), "prompt_n": statistics.median(r["prompt_n"] for r in rows),
            "prefill_ms_per_token": prefill, "generate_ms_per_token": generate,
            "outside_timings_ms": outside, "wall_ms": statistics.median(r["wall_ms"] for r in rows),
            "prefill_ratio": prefill / reference["prefill_ms_per_token"],
            "generate_ratio": generate / reference["generate_ms_per_token"]}
    return out


def answer(summary: dict[str, Any]) -> str:
    """The configurations' ratios to the model, in one sentence."""
    c = summary["configs"]
    d = c.get("default")
    if not d:
        return "no request ran."
    others = "; ".join(f"`{name}` {v['prefill_ratio']:.2f}x / {v['generate_ratio']:.2f}x" for name, v in c.items()
                       if name != "default")
    return (f"As the stack runs it, llama-server prefills at {d['prefill_ratio']:.2f}x and generates at "
            f"{d['generate_ratio']:.2f}x the model's own time per token at the same depth, and HTTP adds "
            f"{d['outside_timings_ms']:.0f} ms to a request; with one flag changed: {others}.")


def readme(summary: dict[str, Any], command: str, meta: str) -> str:
    ref = summary["reference"]
    lines = ["# llama-server against the model on a tier-B-shaped request", "",
             "**Question.** Where does the server spend more than the model itself: prefill, generation, "
             "or around them; and does a flag change it?", "",
             "**Answer.** " + answer(summary), "",
             f"Reference, `llama-bench` at the cached prefix's depth: prefill {ref['prefill_ms_per_token']:.1f} ms per "
             f"token, generation {ref['generate_ms_per_token']:.1f} ms per token ({meta}).", "",
             "| configuration | requests | prompt tokens prefilled (p50) | prefill ms/token | x llama-bench | "
             "generation ms/token | x llama-bench | HTTP wall minus server timings (ms) | wall (ms, p50) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, c in summary["configs"].items():
        lines.append(f"| `{name}` | {c['requests']} | {c['prompt_n']:.0f} | {c['prefill_ms_per_token']:.1f} | "
                     f"{c['prefill_ratio']:.2f}x | {c['generate_ms_per_token']:.1f} | {c['generate_ratio']:.2f}x | "
                     f"{c['outside_timings_ms']:.0f} | {c['wall_ms']:.0f} |")
    lines += ["", "Medians over the requests; rounds interleave the configurations. Records: `records.jsonl`; "
              "figures: `summary.json`.", "", f"    {command}", ""]
    return "\n".join(lines)


def write_report(out: Path, summary: dict[str, Any]) -> str:
    """summary.json and README.md from a summary holding the run's facts (start, load, depth,
    prefilled tokens); returns the README."""
    meta = (f"depth {summary['depth']}, {summary['prefilled']} new tokens, {GENERATED} generated; "
            f"{summary['started'][:16]} UTC, load average at start {summary['load_average_at_start'][0]:.2f}")
    text = readme(summary, "python -m lab.experiments.server_overhead", meta)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    (out / "README.md").write_text(text, encoding="utf-8")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "reader_limit" / "server_overhead")
    parser.add_argument("--report-only", action="store_true", help="the summary and README from records.jsonl")
    args = parser.parse_args(argv)
    unwind_on_stop_signals()  # SIGTERM stops the llama-server started here too
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        old = json.loads((args.out / "summary.json").read_text(encoding="utf-8"))
        records = [json.loads(line) for line in (args.out / "records.jsonl").read_text(encoding="utf-8").splitlines() if line]
        write_report(args.out, {**old, **summarise(records, old["reference"])})
        return 0
    workdir = REPO / "var" / "server_overhead"
    workdir.mkdir(parents=True, exist_ok=True)
    started = datetime.now(timezone.utc)
    load = os.getloadavg()
    records = run_servers(args.rounds, workdir)
    prefilled = int(statistics.median(r["prompt_n"] for r in records))
    cached = int(statistics.median(r["cached_n"] for r in records))
    reference = bench(prefilled, cached, 3)
    with (args.out / "records.jsonl").open("w", encoding="utf-8") as out:
        for row in records:
            out.write(json.dumps(row) + "\n")
    summary = summarise(records, reference)
    summary.update(started=started.isoformat(timespec="seconds"), load_average_at_start=load,
                   depth=cached, prefilled=prefilled)
    print(write_report(args.out, summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
