"""The report of one load-test run, from the files locust and the locustfile wrote into its folder:

- `locust_stats.csv` (per name: `Answer tier=A`, ..., failures under `Answer`), `locust_failures.csv`;
- `locust_requests.jsonl` (one line per call: reply tier, expected tier, code, latency, timings);
- `locust_samples.jsonl` (queue depth and front-door metrics every few seconds);
- `run.json` (what ran: profile, users, mix, stack, command), written by `python -m lab.loadtest`.

Writes `report.md` with the tables and three PNG plots (matplotlib): requests/s over time (total
and per tier), p50/p95/p99 per tier over time, queue depth over time. Rebuild it with
`python -m lab.loadtest.report DIR`.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from bisect import bisect_right
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from lab.harness.stats import percentile

TIERS = ("A", "B", "C")
PREFIX = "locust"


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line:
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue  # a line cut by a kill
    return rows


def _read_csv(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _f(value: Any, digits: int = 0) -> str:
    if value is None or value == "" or value == "N/A":
        return "-"
    try:
        return f"{float(value):,.{digits}f}"
    except (TypeError, ValueError):
        return str(value)


def load_run(folder: Path) -> dict[str, Any]:
    return {
        "info": json.loads((folder / "run.json").read_text()) if (folder / "run.json").is_file() else {},
        "stats": _read_csv(folder / f"{PREFIX}_stats.csv"),
        "failures": _read_csv(folder / f"{PREFIX}_failures.csv"),
        "requests": _read_jsonl(folder / f"{PREFIX}_requests.jsonl"),
        "samples": _read_jsonl(folder / f"{PREFIX}_samples.jsonl"),
    }


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    """The numbers the report and its checks use."""
    requests = run["requests"]
    t0 = min((r["start"] for r in requests), default=None)
    t1 = max((r["time"] for r in requests), default=None)
    duration = (t1 - t0) if t0 is not None and t1 is not None else 0.0
    per_tier: dict[str, dict[str, Any]] = {}
    for tier in TIERS:
        ok = [r for r in requests if r.get("ok") and r.get("tier") == tier]
        ms = [r["ms"] for r in ok]
        per_tier[tier] = {
            "answered": len(ok),
            "rps": len(ok) / duration if duration > 0 else None,
            "p50_ms": percentile(ms, 50), "p95_ms": percentile(ms, 95), "p99_ms": percentile(ms, 99),
            "queue_wait_p50_ms": percentile([r.get("queue_wait_ms", 0.0) for r in ok], 50),
            "strategy_p50_ms": percentile([r.get("strategy_ms", 0.0) for r in ok], 50),
            "fallback": sum(1 for r in ok if r.get("fallback")),
        }
    failures = Counter(r.get("code", "?") for r in requests if not r.get("ok"))
    routing = Counter((r.get("expected_tier", "?"), r.get("tier", "?")) for r in requests if r.get("ok"))
    all_ms = [r["ms"] for r in requests if r.get("ok")]
    samples = run["samples"]
    depth_max: dict[str, int] = defaultdict(int)
    for sample in samples:
        for queue, depth in (sample.get("queue_depth") or {}).items():
            depth_max[queue] = max(depth_max[queue], depth)
    last_fd = next((s["frontdoor"] for s in reversed(samples) if s.get("frontdoor")), None)
    first_fd = next((s["frontdoor"] for s in samples if s.get("frontdoor")), None)
    frontdoor = None
    if last_fd:
        frontdoor = {
            "fallback_during_run": last_fd["fallback_total"] - (first_fd or {}).get("fallback_total", 0.0),
            "fallback_total": last_fd["fallback_total"],
            "rejected": {t: last_fd["rejected"].get(t, 0.0) - (first_fd or {}).get("rejected", {}).get(t, 0.0)
                         for t in TIERS},
            "model_version": last_fd.get("model_version"),
        }
    return {
        "by_users": by_users(requests, samples),
        "duration_s": duration, "requests": len(requests), "answered": len(all_ms),
        "rps": len(requests) / duration if duration > 0 else None,
        "answered_rps": len(all_ms) / duration if duration > 0 else None,
        "p50_ms": percentile(all_ms, 50), "p95_ms": percentile(all_ms, 95), "p99_ms": percentile(all_ms, 99),
        "per_tier": per_tier, "failures": dict(failures), "routing": {f"{e}->{t}": n for (e, t), n in routing.items()},
        "queue_depth_max": dict(depth_max), "frontdoor": frontdoor, "samples": len(samples),
    }


def by_users(requests: list[dict[str, Any]], samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Throughput and latency per number of running users (from the sampled user count): the
    step profile's knee, the spike's before/during/after. Calls count where they finished."""
    levels = [(s["time"], (s.get("locust") or {}).get("users")) for s in samples]
    levels = [(t, u) for t, u in levels if u is not None]
    if len(levels) < 2:
        return []
    seconds: dict[int, float] = defaultdict(float)
    for (t, users), (t_next, _) in zip(levels, levels[1:]):
        seconds[users] += t_next - t
    done: dict[int, list[dict[str, Any]]] = defaultdict(list)
    times = [t for t, _ in levels]
    for r in requests:
        i = max(0, bisect_right(times, r["time"]) - 1)
        done[levels[i][1]].append(r)
    rows = []
    for users in sorted(seconds):
        if users <= 0 or seconds[users] <= 0:
            continue
        calls = done.get(users, [])
        ok = [r["ms"] for r in calls if r.get("ok")]
        rows.append({"users": users, "seconds": seconds[users], "calls": len(calls), "answered": len(ok),
                     "answers_per_s": len(ok) / seconds[users], "failed": len(calls) - len(ok),
                     "p50_ms": percentile(ok, 50), "p95_ms": percentile(ok, 95)})
    return rows


# --- plots ----------------------------------------------------------------------------------------

def server_quantile(samples: list[dict[str, Any]], tier: str, q: float, trailing_s: float) -> list[tuple[float, float]]:
    """(time, seconds): the front door's own quantile of the Answers of `tier` that finished in the
    trailing window, from the difference of its cumulative histogram between two samples."""
    from lab.loadtest.sampler import bucket_delta, histogram_quantile

    with_metrics = [s for s in samples if s.get("frontdoor")]
    out = []
    for i, sample in enumerate(with_metrics):
        now = sample["frontdoor"]["buckets"].get(tier)
        if not now:
            continue
        start = next((s for s in with_metrics[:i] if s["time"] >= sample["time"] - trailing_s), None)
        if start is None or start is sample:
            continue
        value = histogram_quantile(q, bucket_delta(now, start["frontdoor"]["buckets"].get(tier)))
        if value is not None:
            out.append((sample["time"], value))
    return out


def _bin_width(duration: float) -> float:
    return max(5.0, round(duration / 40.0))


def plot(run: dict[str, Any], folder: Path) -> list[str]:
    """The three PNGs; returns their file names (none without matplotlib or data)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    requests = run["requests"]
    if not requests:
        return []
    written = []
    t0 = min(r["start"] for r in requests)
    duration = max(r["time"] for r in requests) - t0
    width = _bin_width(duration)
    bins = int(duration // width) + 1
    colors = {"A": "tab:green", "B": "tab:blue", "C": "tab:red", "failed": "tab:gray"}

    # requests/s over time (by completion time), total and per tier
    series: dict[str, list[float]] = {k: [0.0] * bins for k in ("all", *TIERS, "failed")}
    for r in requests:
        b = min(int((r["time"] - t0) // width), bins - 1)
        series["all"][b] += 1
        series[r["tier"] if r.get("ok") and r.get("tier") in TIERS else "failed"][b] += 1
    xs = [(i + 0.5) * width for i in range(bins)]
    # the last bin covers only the rest of the run: its rate over that part (dropped when tiny)
    covered = [min(width, duration - i * width) for i in range(bins)]
    keep = [i for i in range(bins) if covered[i] >= 0.4 * width]

    def rate(key: str) -> list[float]:
        return [series[key][i] / covered[i] for i in keep]

    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot([xs[i] for i in keep], rate("all"), color="black", label="all", linewidth=2)
    for key in (*TIERS, "failed"):
        if any(series[key]):
            ax.plot([xs[i] for i in keep], rate(key), color=colors[key],
                    label=f"tier {key}" if key in TIERS else "failed")
    users = [(s["elapsed_s"], (s.get("locust") or {}).get("users")) for s in run["samples"]
             if (s.get("locust") or {}).get("users") is not None]
    if users:
        sample_t0 = run["samples"][0]["time"] - run["samples"][0]["elapsed_s"]
        axu = ax.twinx()
        axu.step([sample_t0 + e - t0 for e, _ in users], [u for _, u in users], where="post",
                 color="tab:purple", linestyle=":", label="users")
        axu.set_ylabel("users", color="tab:purple")
        axu.set_ylim(bottom=0)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel(f"requests/s ({width:.0f} s bins)")
    ax.set_title("Throughput (by completion time)")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(folder / "requests_per_s.png", dpi=110)
    plt.close(fig)
    written.append("requests_per_s.png")

    # p50/p95/p99 per tier over time: client side over a trailing window, and the front door's own
    # p95 (its histogram between two samples)
    trailing = max(15.0, 3 * width)
    fig, axes = plt.subplots(1, 3, figsize=(13, 4), sharex=True)
    for ax, tier in zip(axes, TIERS):
        done = sorted((r["time"] - t0, r["ms"]) for r in requests if r.get("ok") and r.get("tier") == tier)
        for q, style in ((50, "-"), (95, "--"), (99, ":")):
            points = []
            for x in xs:
                window = [ms for t, ms in done if x + width / 2 - trailing <= t <= x + width / 2]
                if window:
                    points.append((x, percentile(window, q)))
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], style, color=colors[tier],
                        label=f"p{q} (client, last {trailing:.0f} s)")
        server = server_quantile(run["samples"], tier, 0.95, trailing)
        if server:
            ax.plot([t - t0 for t, _ in server], [v * 1000.0 for _, v in server], "x", color="black",
                    label=f"p95 front door (histogram, last {trailing:.0f} s)")
        if not done:
            ax.text(0.5, 0.5, f"no tier {tier} replies", transform=ax.transAxes, ha="center", color="gray")
        else:
            ax.set_yscale("log")
        ax.set_title(f"tier {tier}")
        ax.set_xlabel("seconds since start")
        ax.grid(True, which="both", alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    axes[0].set_ylabel("Answer latency ms")
    fig.suptitle("Answer latency per tier over time")
    fig.tight_layout()
    fig.savefig(folder / "latency_per_tier.png", dpi=110)
    plt.close(fig)
    written.append("latency_per_tier.png")

    # queue depth over time
    samples = [s for s in run["samples"] if s.get("queue_depth")]
    if samples:
        fig, ax = plt.subplots(figsize=(9, 4))
        queues = list(samples[0]["queue_depth"])
        for queue in queues:
            ax.step([s["time"] - t0 for s in samples], [s["queue_depth"].get(queue, 0) for s in samples],
                    where="post", label=queue)
        ax.set_xlabel("seconds since start")
        ax.set_ylabel("messages waiting")
        ax.set_title("Celery queue depth")
        ax.set_ylim(bottom=0)
        ax.legend()
        fig.tight_layout()
        fig.savefig(folder / "queue_depth.png", dpi=110)
        plt.close(fig)
        written.append("queue_depth.png")
    return written


# --- markdown -------------------------------------------------------------------------------------

def markdown(run: dict[str, Any], summary: dict[str, Any], plots: list[str]) -> str:
    info = run["info"]
    lines = [f"# Load test `{info.get('name', '?')}`", ""]
    if info:
        lines += [
            f"- profile **{info.get('profile')}**, {info.get('users_desc') or str(info.get('users')) + ' users'}, run time "
            f"{info.get('run_time') or 'the profile default'}, mix {info.get('mix')}, queries {info.get('query_source')}",
            f"- target: {info.get('target')}",
        ]
        for part, what in (info.get("stack") or {}).items():
            lines.append(f"  - {part}: {what}")
        lines += [f"- started {info.get('started')}, locust exit code {info.get('locust_exit_code')}",
                  f"- command: `{info.get('command')}`", ""]
    lines += [
        f"{summary['requests']} calls in {summary['duration_s']:.1f} s: {_f(summary['rps'], 2)} calls/s, "
        f"{_f(summary['answered_rps'], 2)} answers/s; all answers p50 {_f(summary['p50_ms'])} ms, "
        f"p95 {_f(summary['p95_ms'])} ms, p99 {_f(summary['p99_ms'])} ms.", "",
        "## Per tier (the tier each reply reports)", "",
        "Client-side latency from the per-call log (exact); queue wait and strategy time are the "
        "replies' own timings.", "",
        "| tier | answered | answers/s | p50 ms | p95 ms | p99 ms | queue wait p50 ms | strategy p50 ms | rules fallback |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for tier, t in summary["per_tier"].items():
        lines.append(f"| {tier} | {t['answered']} | {_f(t['rps'], 2)} | {_f(t['p50_ms'])} | {_f(t['p95_ms'])} | "
                     f"{_f(t['p99_ms'])} | {_f(t['queue_wait_p50_ms'])} | {_f(t['strategy_p50_ms'])} | "
                     f"{t['fallback']} |")
    lines += [
        "", "locust's own stats (`locust_stats.csv`; locust rounds times above 1 s to two significant digits):", "",
        "| name | requests | failures | req/s | p50 ms | p95 ms | p99 ms | max ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in run["stats"]:
        lines.append(
            f"| {row['Name']} | {row['Request Count']} | {row['Failure Count']} | {_f(row['Requests/s'], 2)} | "
            f"{_f(row['50%'])} | {_f(row['95%'])} | {_f(row['99%'])} | {_f(row['Max Response Time'])} |")
    if len(summary["by_users"]) > 1:
        lines += ["", "By number of running users (sampled; calls counted where they finished):", "",
                  "| users | seconds | answers | answers/s | failed | p50 ms | p95 ms |",
                  "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        lines += [f"| {row['users']} | {row['seconds']:.0f} | {row['answered']} | {row['answers_per_s']:.2f} | "
                  f"{row['failed']} | {_f(row['p50_ms'])} | {_f(row['p95_ms'])} |" for row in summary["by_users"]]
    lines += ["", "## Failures by gRPC status code", ""]
    if run["failures"]:
        lines += ["| name | error | occurrences |", "| --- | --- | ---: |"]
        lines += [f"| {f['Name']} | {f['Error']} | {f['Occurrences']} |" for f in run["failures"]]
        expected = info.get("expected_failures")
        lines += ["", f"Expected by the profile: {', '.join(expected) if expected else 'none'}."]
    else:
        lines.append("None.")
    lines += ["", "## Routing: expected tier of the query -> tier of the reply", "",
              "| expected \\ reply | A | B | C |", "| --- | ---: | ---: | ---: |"]
    for expected in TIERS:
        counts = [summary["routing"].get(f"{expected}->{t}", 0) for t in TIERS]
        lines.append(f"| {expected} | " + " | ".join(str(c) for c in counts) + " |")
    lines += ["", "## Queues and front door (sampled every few seconds)", ""]
    if summary["queue_depth_max"]:
        lines.append("Largest queue depth seen: " + ", ".join(
            f"{q} {d}" for q, d in summary["queue_depth_max"].items()) + ".")
    else:
        lines.append("Queue depth not sampled (no REDIS_URL / broker dir).")
    fd = summary["frontdoor"]
    if fd:
        rejected = ", ".join(f"{t} {int(v)}" for t, v in fd["rejected"].items())
        lines.append(f"Front door: {int(fd['fallback_during_run'])} rules-fallback decisions during the run "
                     f"(`arag_classifier_fallback_total`), rejected (queue full) {rejected} "
                     f"(`arag_frontdoor_rejected_total`), classifier model version {fd['model_version']}.")
    else:
        lines.append("Front-door metrics not sampled (no metrics URL).")
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    lines += ["", "## Files", "",
              "`locust_stats.csv`, `locust_stats_history.csv`, `locust_failures.csv`, `locust.html` (locust's own), "
              "`locust_requests.jsonl` (one line per call), `locust_samples.jsonl` / `.csv` (queue depth, front-door "
              "metrics), `locust.log`, `summary.json`, `run.json`."]
    return "\n".join(lines) + "\n"


def write_report(folder: Path) -> dict[str, Any]:
    run = load_run(folder)
    summary = summarize(run)
    plots = plot(run, folder)
    (folder / "report.md").write_text(markdown(run, summary, plots), encoding="utf-8")
    (folder / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="(Re)build report.md of a load-test run folder")
    parser.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    write_report(args.folder)
    print(args.folder / "report.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
