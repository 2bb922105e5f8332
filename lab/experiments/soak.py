"""Does any process of the stack leak memory or descriptors under hours of steady load? A soak:
an hour at half the ceiling with the instant LLM (after a half-hour warm-up), then 30 minutes with
the real reader at half its capacity (after its prompt cache has filled), every process sampled
every minute.

    .venv/bin/python -m lab.experiments.soak            # ~2 h 40 min, writes reports/soak/
    .venv/bin/python -m lab.experiments.soak --quick    # ~6 min smoke run, var/soak/quick/
    .venv/bin/python -m lab.experiments.soak --recompute reports/soak   # summary/README/plot from samples.jsonl
    .venv/bin/python -m lab.experiments.soak --recompute reports/soak --merge-from var/soak/rerun   # one phase run again

Each phase starts the lab's one stack (`lab.harness.stack.lab_stack`) afresh: Redis, PostgreSQL,
Triton serving the router the repository ships (`arag model ship`), embedded tantivy over the demo
help centre, the front door, worker pools A, B and C; the LLM is the instant endpoint
(`lab.harness.instant_llm`, a measurement device) in phase `instant` and one shared llama-server
with the default reader (`infra.local.llama_server`) in phase `reader`. The load is this
process's grpc.aio client (`lab.harness.load_client`), open loop, the default mix A 60 / B 30 /
C 10 % of the load test's query pools (`lab.loadtest.queries`), every text distinct (no cache
answers; a cache without a bound would show as growth).

Rates: `instant` at half of min(`--ceiling`, a closed-loop probe of `--probe-s` s at the start);
`--ceiling` defaults to the distinct-query ceiling on Redis, PostgreSQL and Triton with the
instant LLM in `reports/load/ceiling-servers` (117.0 Answers/s). `reader` at `--reader-rate`
(default 0.07/s: half of the mix's measured capacity, about 0.12-0.15/s: at 0.15/s the reader
answered 0.117/s and 16 % of the calls ran out of time; a decompose answer is several reader calls).

Every `--interval` s (60) each process of the stack (every descendant of this process: front
door, each pool's main and child processes, Redis, PostgreSQL's postmaster and backends, Triton,
the LLM) is read from /proc: RSS, PSS and USS (`smaps_rollup`), open descriptors, threads. Per
process, after the phase's warm-up, the slope per hour of each by Theil-Sen
(`lab.harness.stats.theil_sen`, 95 % interval); the verdict: memory (RSS) grows at most
`MEMORY_LIMIT_PCT_PER_H` % of its median per hour, descriptors at most `FD_LIMIT_PER_H` per hour
(PostgreSQL's descriptors on its own data files are its bounded file cache: shown, and failed only
when one file is open twice). The warm-up is fixed before the load starts: in `instant` twice the
results' expiry (Redis fills with a window of results, then sees it replaced once); Redis's own
account (keys, `used_memory`) is sampled beside its RSS.

Writes `samples.jsonl` (one line per process per sample, and one per minute of load: the figures
recompute from it), `summary.json`, `README.md` and `soak.png` to `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lab.harness.stats import percentile, theil_sen

REPO = Path(__file__).resolve().parents[2]
PROC = Path("/proc")
DEFAULT_CEILING = 117.0  # reports/load/ceiling-servers, distinct queries (run8, 2026-12-03)
CEILING_SOURCE = "reports/load/ceiling-servers (distinct queries, Redis + PostgreSQL + Triton, instant LLM)"
DEFAULT_READER_RATE = 0.07
MEMORY_LIMIT_PCT_PER_H = 5.0  # a process's own RSS may grow at most this share of its median per hour
FD_LIMIT_PER_H = 1.0  # descriptors: flat = a slope of at most one descriptor per hour
MIN_SAMPLES = 5  # after the warm-up, fewer samples than this: the process is not judged
MIX = "A=60,B=30,C=10"
END_GRACE_S = 45.0  # at a phase's end, calls still out get this long before they are dropped


@dataclass
class Phase:
    name: str  # instant | reader
    minutes: float
    warmup_minutes: float | None  # None: twice the stack's result expiry (`ARAG_RESULT_TTL`)
    timeout_s: float  # per Answer call
    rate: float | None = None  # Answers/s offered (instant: set after the probe)
    source: str = "all"  # the load test's query pools (`lab.loadtest.queries.build_pools`)


# --- reading the processes ------------------------------------------------------------------------


def fd_kinds(folder: Path, names: Sequence[str], data_dir: str | None = None) -> dict[str, int]:
    """Open descriptors by what they point at: `socket`, `pipe`, `anon` (eventfd, epoll, ...),
    `file` (a path), so a growing count says whether connections or files pile up. With `data_dir`
    (a database server's data directory) a file below it is `data` (PostgreSQL's relation files),
    and `data_repeated` counts the descriptors beyond one per such file: a file cache holds each
    file once, a leak opens the same one again."""
    kinds: Counter = Counter()
    data_targets: set[str] = set()
    prefix = data_dir.rstrip("/") + "/" if data_dir else None
    for name in names:
        try:
            target = os.readlink(folder / name)
        except OSError:
            continue  # closed meanwhile
        if prefix is not None and target.startswith(prefix):
            kinds["data"] += 1
            data_targets.add(target)
            continue
        kinds["socket" if target.startswith("socket:") else "pipe" if target.startswith("pipe:")
              else "anon" if target.startswith("anon_inode:") else "file"] += 1
    if prefix is not None:
        kinds["data"] += 0  # present, even when none is open
        kinds["data_repeated"] = kinds["data"] - len(data_targets)
    return dict(kinds)


def read_process(pid: int, proc: Path = PROC) -> dict[str, Any] | None:
    """RSS, its own part (`own`: RSS without shared memory, `RssAnon + RssFile`), PSS, USS (bytes),
    open descriptors and threads of `pid`; None if it is gone."""
    base = proc / str(pid)
    try:
        status = (base / "status").read_text()
        fd_names = os.listdir(base / "fd")
    except OSError:
        return None
    data_dir = None
    if status.startswith("Name:\tpostgres"):  # its working directory is the cluster's data directory
        try:
            data_dir = os.readlink(base / "cwd")
        except OSError:
            pass
    kinds = fd_kinds(base / "fd", fd_names, data_dir)
    out: dict[str, Any] = {"fds": len(fd_names), "fd_kinds": kinds,
                           "fds_judged": len(fd_names) - kinds.get("data", 0)}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key == "VmRSS":
            out["rss"] = int(value.split()[0]) * 1024
        elif key in ("RssAnon", "RssFile"):
            out["own"] = out.get("own", 0) + int(value.split()[0]) * 1024
        elif key == "Threads":
            out["threads"] = int(value.split()[0])
    try:
        rollup = (base / "smaps_rollup").read_text()
        private = 0
        for line in rollup.splitlines():
            key, _, value = line.partition(":")
            if key == "Pss":
                out["pss"] = int(value.split()[0]) * 1024
            elif key in ("Private_Clean", "Private_Dirty"):
                private += int(value.split()[0]) * 1024
        out["uss"] = private
    except OSError:
        pass
    return out if "rss" in out else None  # a zombie has no memory lines


def _stat(pid: int, proc: Path) -> tuple[int, str] | None:
    try:
        stat = (proc / str(pid) / "stat").read_text()
        cmd = (proc / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1]), cmd


def descendants(root: int, proc: Path = PROC) -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process under `root` (not `root` itself)."""
    table: dict[int, tuple[int, str]] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            found = _stat(int(entry.name), proc)
            if found is not None:
                table[int(entry.name)] = found
    children: dict[int, list[int]] = defaultdict(list)
    for pid, (parent, _) in table.items():
        children[parent].append(pid)
    out, todo = {}, list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        out[pid] = table[pid]
        todo.extend(children.get(pid, ()))
    return out


def role_of(pid: int, tree: Mapping[int, tuple[int, str]], known: Mapping[int, str]) -> str:
    """A process's role: the stack's own name for it (`LabStack.processes`), else by its parent
    (a worker pool's children) or its command line (the servers, PostgreSQL's processes by the
    title they set)."""
    if pid in known:
        return known[pid]
    parent, cmd = tree[pid]
    if parent in known and known[parent].startswith("worker pool"):
        return f"{known[parent]} child"
    for needle, role in (("tritonserver", "tritonserver"), ("redis-server", "redis"),
                         ("llama-server", "llama-server"), ("instant_llm", "instant LLM")):
        if needle in cmd:
            return role
    if cmd.startswith("postgres:"):  # a backend or an auxiliary process, by its title
        title = cmd.removeprefix("postgres:").strip()
        words = title.split()
        if len(words) >= 3 and ("(" in words[2] or words[2][:1].isdigit() or words[2] == "[local]"):
            return "postgresql backend"  # user database host(port) state
        return f"postgresql {' '.join(w for w in words if not w.startswith('('))[:30]}"
    if "postgres" in cmd:
        return "postgresql (postmaster)"
    if parent in known:
        return f"{known[parent]} child"
    if parent in tree:
        return f"{role_of(parent, tree, known)} child"
    return "other: " + cmd[:40]


def read_redis(url: str | None) -> dict[str, Any] | None:
    """Redis's own account of its memory: keys held, bytes its allocator gives the data
    (`used_memory`), the RSS it sees, fragmentation and keys expired so far; None without Redis."""
    if not url:
        return None
    import redis

    try:
        client = redis.Redis.from_url(url, socket_timeout=5)
        try:
            memory, stats, keys = client.info("memory"), client.info("stats"), client.dbsize()
        finally:
            client.close()
    except redis.RedisError:
        return None
    return {"keys": keys, "used_memory": memory.get("used_memory"), "used_memory_rss": memory.get("used_memory_rss"),
            "fragmentation": memory.get("mem_fragmentation_ratio"), "expired_keys": stats.get("expired_keys")}


def redis_account(rows: Sequence[Mapping[str, Any]], phase: str, warmup_minutes: float) -> dict[str, Any] | None:
    """After the warm-up: keys and `used_memory` first, last and their Theil-Sen slope per hour (is
    a growing RSS more data, or the allocator?)."""
    after = [r for r in rows if r.get("type") == "redis" and r.get("phase") == phase and r["minute"] >= warmup_minutes]
    if len(after) < MIN_SAMPLES:
        return None
    out: dict[str, Any] = {"samples": len(after)}
    for key in ("keys", "used_memory", "used_memory_rss"):
        fit = theil_sen([(r["minute"] / 60.0, r[key]) for r in after])
        level = percentile([r[key] for r in after], 50) or 0.0
        out[key] = {"first": after[0][key], "last": after[-1][key], "median": level,
                    "pct_per_h": 100 * fit["slope"] / level if fit and level else None}
    out["fragmentation_last"] = after[-1].get("fragmentation")
    return out


def sample(root: int, known: Mapping[int, str], phase: str, t0: float, proc: Path = PROC) -> list[dict[str, Any]]:
    """One sample of every process under `root`: a record per process."""
    now = time.time()
    tree = descendants(root, proc)
    rows = []
    for pid in sorted(tree):
        found = read_process(pid, proc)
        if found is None:
            continue
        rows.append({"type": "process", "phase": phase, "time": round(now, 3), "minute": round((now - t0) / 60.0, 3),
                     "pid": pid, "role": role_of(pid, tree, known), **found})
    return rows


# --- the verdict ----------------------------------------------------------------------------------


def series(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, int], list[Mapping[str, Any]]]:
    """(phase, role, pid) -> that process's samples in time order."""
    out: dict[tuple[str, str, int], list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        if row.get("type") == "process":
            out[(row["phase"], row["role"], row["pid"])].append(row)
    for rows_ in out.values():
        rows_.sort(key=lambda r: r["minute"])
    return dict(out)


def judge(samples: Sequence[Mapping[str, Any]], warmup_minutes: float,
          memory_limit_pct_per_h: float = MEMORY_LIMIT_PCT_PER_H, fd_limit_per_h: float = FD_LIMIT_PER_H,
          min_samples: int = MIN_SAMPLES) -> dict[str, Any]:
    """One process's verdict from its samples (`minute`, `rss`, `own`, `pss`, `uss`, `fds`):
    Theil-Sen slopes per hour of each after `warmup_minutes`; memory passes when the slope of its
    own RSS (without shared memory; RSS in records that lack it) is at most
    `memory_limit_pct_per_h` % of its median per hour, descriptors when their slope is at most
    `fd_limit_per_h` per hour. A database server's descriptors on its own data files (`fds_judged`
    leaves them out) are its file cache, bounded by the files it has: they pass while no file is
    open twice (`data_repeated`). Fewer than `min_samples` after the warm-up: not judged."""
    after = [s for s in samples if s["minute"] >= warmup_minutes]
    out: dict[str, Any] = {"samples": len(samples), "samples_after_warmup": len(after),
                           "first_minute": samples[0]["minute"] if samples else None,
                           "last_minute": samples[-1]["minute"] if samples else None}
    for key in ("rss", "own", "pss", "uss", "fds", "fds_judged"):
        values = [s[key] for s in after if s.get(key) is not None]
        if not values:
            continue
        fit = theil_sen([(s["minute"] / 60.0, s[key]) for s in after if s.get(key) is not None])
        level = percentile(values, 50) or 0.0
        entry: dict[str, Any] = {"median": level, "first": values[0], "last": values[-1], "max": max(values)}
        if fit is not None:
            entry.update(slope_per_h=fit["slope"], low_per_h=fit["low"], high_per_h=fit["high"])
            if not key.startswith("fds") and level > 0:
                entry.update(pct_per_h=100 * fit["slope"] / level, pct_low=100 * fit["low"] / level,
                             pct_high=100 * fit["high"] / level)
        out[key] = entry
    judged = "own" if "pct_per_h" in out.get("own", {}) else "rss"
    out["judged_on"] = judged
    if len(after) < min_samples or "pct_per_h" not in out.get(judged, {}):
        out["verdict"] = "not judged"
        out["reasons"] = [f"{len(after)} samples after the warm-up (< {min_samples})"]
        return out
    reasons = []
    if out[judged]["pct_per_h"] > memory_limit_pct_per_h:
        reasons.append(f"{'own RSS' if judged == 'own' else 'RSS'} {out[judged]['pct_per_h']:+.1f} %/h "
                       f"> {memory_limit_pct_per_h:g} %/h (RSS {out['rss']['pct_per_h']:+.1f}, "
                       f"USS {out.get('uss', {}).get('pct_per_h', float('nan')):+.1f} %/h)")
    fds = out.get("fds_judged") or out.get("fds", {})
    out["fds_judged_on"] = "fds_judged" if "fds_judged" in out else "fds"
    repeated = max((s.get("fd_kinds", {}).get("data_repeated", 0) for s in after), default=0)
    if any("data" in s.get("fd_kinds", {}) for s in after):
        out["data_fds_max"] = max(s["fd_kinds"].get("data", 0) for s in after)
    if repeated:
        reasons.append(f"a data file open more than once ({int(repeated)} extra descriptors): not a cache")
    if abs(fds.get("slope_per_h", 0.0)) > fd_limit_per_h:
        first, last = after[0].get("fd_kinds"), after[-1].get("fd_kinds")
        change = ""
        if first is not None and last is not None:  # what they point at, first -> last sample judged
            change = "; " + ", ".join(f"{kind} {first.get(kind, 0)} -> {last.get(kind, 0)}"
                                      for kind in sorted(set(first) | set(last)))
        reasons.append(f"descriptors {fds['slope_per_h']:+.1f}/h (beyond +-{fd_limit_per_h:g}/h{change})")
    out["verdict"] = "pass" if not reasons else "fail"
    out["reasons"] = reasons
    return out


def role_totals(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """(phase, role) -> per sample time the sum over that role's processes (a role with many
    short-lived processes, e.g. PostgreSQL backends, is judged as a whole too)."""
    sums: dict[tuple[str, str], dict[float, dict[str, Any]]] = defaultdict(dict)
    for row in rows:
        if row.get("type") != "process":
            continue
        at = sums[(row["phase"], row["role"])].setdefault(
            row["time"], {"minute": row["minute"], "rss": 0, "pss": 0, "uss": 0, "fds": 0, "processes": 0})
        for key in ("rss", "own", "pss", "uss", "fds", "fds_judged"):
            if key in row or key not in ("own", "fds_judged"):
                at[key] = at.get(key, 0) + (row.get(key) or 0)
        at["processes"] += 1
    return {k: sorted(v.values(), key=lambda r: r["minute"]) for k, v in sums.items()}


def summarize(rows: Sequence[Mapping[str, Any]], phases: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Per phase: every process's and every role's verdict, the load it ran under, the overall
    verdict (every judged process passes)."""
    out: dict[str, Any] = {"memory_limit_pct_per_h": MEMORY_LIMIT_PCT_PER_H, "fd_limit_per_h": FD_LIMIT_PER_H,
                           "min_samples": MIN_SAMPLES, "phases": {}}
    per_process = series(rows)
    totals = role_totals(rows)
    for name, info in phases.items():
        warm = float(info["warmup_minutes"])
        processes = []
        for (phase, role, pid), samples in sorted(per_process.items(), key=lambda kv: (kv[0][1], kv[0][2])):
            if phase == name:
                processes.append({"role": role, "pid": pid, **judge(samples, warm)})
        roles = []
        for (phase, role), samples in sorted(totals.items()):
            if phase == name:
                roles.append({"role": role, "processes_max": max(s["processes"] for s in samples),
                              **judge(samples, warm)})
        load = [r for r in rows if r.get("type") == "load" and r.get("phase") == name]
        codes: Counter = Counter()
        tiers: Counter = Counter()
        strategies: Counter = Counter()
        for r in load:
            codes.update(r.get("codes", {}))
            tiers.update(r.get("tiers", {}))
            strategies.update(r.get("strategies", {}))
        sent = sum(r.get("ended", 0) for r in load)
        judged = [p for p in processes if p["verdict"] != "not judged"]
        failed = [p for p in judged if p["verdict"] == "fail"]
        out["phases"][name] = {
            **dict(info), "processes": processes, "roles": roles,
            "judged": len(judged), "failed": len(failed), "not_judged": len(processes) - len(judged),
            "verdict": "pass" if judged and not failed else ("fail" if failed else "not judged"),
            "worst_rss_pct_per_h": max((p[p["judged_on"]]["pct_per_h"] for p in judged), default=None),
            "judged_on": judged[0]["judged_on"] if judged else None,
            # of the failed, those whose own memory (USS) grows past the limit too: not only shared
            # pages touched (PostgreSQL's shared buffers, copy-on-write pages of a forked child)
            "own_memory_growing": [f"{p['role']} [{p['pid']}] USS {p['uss']['pct_per_h']:+.1f} %/h" for p in failed
                                   if p.get("uss", {}).get("pct_per_h", 0.0) > MEMORY_LIMIT_PCT_PER_H],
            # a sensitivity, not the verdict: the same rule with twice the stated warm-up (does a
            # failure come from a fill that ends, e.g. a cache reaching its size, or go on?)
            "failed_with_double_warmup": [
                f"{role} [{pid}]" for (phase, role, pid), samples_ in sorted(per_process.items())
                if phase == name and judge(samples_, 2 * warm)["verdict"] == "fail"],
            "worst_fd_per_h": max((abs(p[p["fds_judged_on"]]["slope_per_h"]) for p in judged
                                   if "slope_per_h" in p.get(p["fds_judged_on"], {})), default=None),
            "redis": redis_account(rows, name, warm),
            "load": {"calls_ended": sent, "codes": dict(codes), "tiers": dict(tiers), "strategies": dict(strategies), "ok_share": (codes.get("OK", 0) / sent) if sent else None,
                     "answered_per_s_median": percentile([r["ok_per_s"] for r in load], 50),
                     "p50_ms_median": percentile([r["p50_ms"] for r in load], 50),
                     "p95_ms_median": percentile([r["p95_ms"] for r in load], 50),
                     "p95_ms_max": max((r["p95_ms"] for r in load if r.get("p95_ms") is not None), default=None),
                     "load_average_max": max((r["load_average"][0] for r in load), default=None),
                     "load_average_median": percentile([r["load_average"][0] for r in load], 50)},
        }
    return out


# --- running --------------------------------------------------------------------------------------


class MinuteBucket:
    """The calls that ended in one sampling interval: codes, tiers and OK latencies."""

    def __init__(self) -> None:
        self.codes: Counter = Counter()
        self.tiers: Counter = Counter()
        self.strategies: Counter = Counter()
        self.latencies: list[float] = []

    def add(self, record: Any) -> None:
        self.codes[record.code] += 1
        if record.ok:
            self.latencies.append(record.latency_ms)
            self.tiers[record.tier or "?"] += 1
            self.strategies[record.strategy or "?"] += 1

    def row(self, phase: str, t0: float, interval_s: float) -> dict[str, Any]:
        now = time.time()
        ended = sum(self.codes.values())
        return {"type": "load", "phase": phase, "time": round(now, 3), "minute": round((now - t0) / 60.0, 3),
                "ended": ended, "ok_per_s": round(self.codes.get("OK", 0) / interval_s, 3),
                "codes": dict(self.codes), "tiers": dict(self.tiers), "strategies": dict(self.strategies),
                "p50_ms": percentile(self.latencies, 50), "p95_ms": percentile(self.latencies, 95),
                "load_average": os.getloadavg()}


def publish_router(repository: Path, log: Path) -> None:
    """The router the repository ships, as a version Triton serves (`arag model ship`)."""
    if list(repository.glob("*/*/model.onnx")):
        return
    arag = Path(sys.executable).parent / "arag"
    with log.open("ab") as out:
        subprocess.run([str(arag), "model", "ship", "--repository", str(repository)], cwd=REPO, check=True,
                       stdout=out, stderr=subprocess.STDOUT, timeout=600, stdin=subprocess.DEVNULL)


async def drive(stack: Any, phase: Phase, args: argparse.Namespace, journal: Any, say: Any) -> dict[str, Any]:
    """The phase's load (after the probe, for `instant`) and its sampler, for `phase.minutes`."""
    from lab.harness.load_client import LoadClient, open_loop
    from lab.loadtest.queries import QueryPicker, build_pools, parse_mix

    picker = QueryPicker(build_pools(phase.source), parse_mix(MIX), seed=int(time.time()) % 100_000, distinct=True)
    known = stack.processes()
    info: dict[str, Any] = {"stack": dict(stack.using), "facts": stack.facts()}
    client = LoadClient(stack.address, stack.api_key("soak"), channels=4)
    await client.ready(timeout=120)
    try:
        for _ in range(5):  # connections, the model's pages, the index
            warm = await client.answer(picker.next().text, timeout=phase.timeout_s)
            client.records.clear()
        if not warm.ok:
            raise RuntimeError(f"the stack does not answer: {warm.code} {warm.detail}")
        if phase.rate is None:  # the instant phase: half of min(given ceiling, a closed-loop probe)
            stop_at = time.monotonic() + args.probe_s
            answered = 0

            async def one(lane: int) -> None:
                nonlocal answered
                while time.monotonic() < stop_at:
                    r = await client.answer(picker.next().text, timeout=30.0, lane=lane)
                    answered += r.ok

            started = time.monotonic()
            await asyncio.gather(*(one(i) for i in range(args.probe_clients)))
            probe = answered / (time.monotonic() - started)
            client.records.clear()
            phase.rate = 0.5 * min(args.ceiling, probe)
            info.update(probe_answers_per_s=round(probe, 2), given_ceiling=args.ceiling,
                        ceiling_source=CEILING_SOURCE if args.ceiling == DEFAULT_CEILING else "--ceiling")
            say(f"{phase.name}: probe {probe:.1f} answers/s, given ceiling {args.ceiling:g}: rate {phase.rate:.2f}/s")
            await asyncio.sleep(5)  # the probe's backlog drains
        info["rate"] = phase.rate
        t0 = time.time()
        info["started"] = datetime.fromtimestamp(t0, timezone.utc).isoformat(timespec="seconds")
        end = time.monotonic() + 60.0 * phase.minutes
        bucket = MinuteBucket()

        async def send(k: int) -> None:
            record = await client.answer(picker.next().text, timeout=phase.timeout_s, lane=k)
            bucket.add(record)

        async def load() -> None:
            chunk_s = args.interval
            n = max(1, round(phase.rate * chunk_s))
            origin, k, running = time.monotonic(), 0, set()
            while origin + k * chunk_s < end:
                due = origin + k * chunk_s
                await asyncio.sleep(max(0.0, due - 1.0 - time.monotonic()))
                task = asyncio.create_task(open_loop(send, n / chunk_s, count=n, start=due, max_lag_periods=20))
                running.add(task)
                task.add_done_callback(running.discard)
                k += 1
            if running:  # the calls still out: a short grace, then they are dropped (not counted)
                _, late = await asyncio.wait(running, timeout=min(phase.timeout_s, END_GRACE_S))
                for task in late:
                    task.cancel()
                info["load_chunks_cut_at_end"] = len(late)

        async def sampler() -> None:
            nonlocal bucket
            next_at = time.monotonic()
            while True:
                rows = await asyncio.to_thread(sample, os.getpid(), known, phase.name, t0)
                account = await asyncio.to_thread(read_redis, stack.settings.workers.redis_url)
                if account is not None:
                    rows.append({"type": "redis", "phase": phase.name, "time": round(time.time(), 3),
                                 "minute": round((time.time() - t0) / 60.0, 3), **account})
                done, bucket = bucket, MinuteBucket()
                client.records.clear()
                load_row = done.row(phase.name, t0, args.interval)
                for row in (*rows, load_row):
                    journal.write(json.dumps(row) + "\n")
                journal.flush()
                say(f"{phase.name} {load_row['minute']:6.1f} min: {len(rows)} rows, "
                    f"{load_row['ok_per_s']:.2f} OK/s, p95 {load_row['p95_ms'] or 0:.0f} ms, codes {load_row['codes']}, "
                    f"load {load_row['load_average'][0]:.1f}")
                next_at += args.interval
                if next_at > end + 1:
                    return
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))

        await asyncio.gather(load(), sampler())
        info["ended"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        return info
    finally:
        await client.close()


def run_phase(phase: Phase, args: argparse.Namespace, workdir: Path, journal: Any, console: Any) -> dict[str, Any]:
    from lab.harness.stack import Parts, lab_stack

    repository = workdir / "model_repository"
    repository.mkdir(parents=True, exist_ok=True)
    publish_router(repository, workdir / "model-ship.log")
    parts = Parts(broker="redis", records="postgres", classifier="triton", retriever="tantivy",
                  llm="instant" if phase.name == "instant" else "llama-server")
    settings = {"tenant_rate_per_s": 0, "tenant_slots": {"A": 0, "B": 0, "C": 0}}
    with lab_stack(workdir / phase.name, parts, pools=("A", "B", "C"), settings=settings, tenants=("soak",),
                   model_repository=repository, dotenv=False, env={"ARAG_TRACES": "off"}, console=console) as stack:
        if phase.warmup_minutes is None:  # Redis holds a full window of results, then sees it replaced once
            phase.warmup_minutes = 2 * stack.settings.workers.result_ttl_s / 60.0
        console.print(f"phase {phase.name}: warm-up {phase.warmup_minutes:g} min, stated before the load starts")
        info = asyncio.run(drive(stack, phase, args, journal, console.print))
    info["leftovers"] = stack.leftovers
    return info


# --- the report -----------------------------------------------------------------------------------


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e6:,.1f}"


def _pct(entry: Mapping[str, Any]) -> str:
    if "pct_per_h" not in entry:
        return "-"
    return f"{entry['pct_per_h']:+.2f} [{entry['pct_low']:+.2f}, {entry['pct_high']:+.2f}]"


def _fd(entry: Mapping[str, Any]) -> str:
    if "slope_per_h" not in entry:
        return "-"
    return f"{entry['slope_per_h']:+.1f} [{entry['low_per_h']:+.1f}, {entry['high_per_h']:+.1f}]"


def _redis(account: Mapping[str, Any] | None) -> str:
    if not account:
        return "-"

    def one(key: str, scale: float, unit: str) -> str:
        e = account[key]
        slope = "-" if e["pct_per_h"] is None else f"{e['pct_per_h']:+.1f} %/h"
        return f"{e['first'] / scale:,.1f} -> {e['last'] / scale:,.1f}{unit} ({slope})"

    return (f"keys {one('keys', 1, '')}; `used_memory` {one('used_memory', 1e6, ' MB')}; "
            f"`used_memory_rss` {one('used_memory_rss', 1e6, ' MB')}; fragmentation at the end "
            f"{account.get('fragmentation_last')}")


def _fds(judged: Mapping[str, Any]) -> str:
    """Median and slope of the descriptors judged (without a database's own data files)."""
    entry = judged.get(judged.get("fds_judged_on", "fds"), {})
    return f"{entry.get('median', '-')} | {_fd(entry)}"


def render(summary: Mapping[str, Any], out: Path) -> None:
    phases = summary["phases"]
    lines = ["# Soak: memory and descriptors of every process under hours of steady load", "",
             "**Question.** Under steady load at half the ceiling, does any process of the stack grow "
             "its memory or its open descriptors once warmed up?", ""]
    answer = []
    for name, ph in phases.items():
        load = ph["load"]
        answer.append(
            f"Phase `{name}` ({ph['minutes']:g} min at {ph.get('rate') or 0:.2f} Answers/s, warm-up {ph['warmup_minutes']:g} min): "
            f"**{ph['verdict']}**: {ph['judged']} processes judged, {ph['failed']} over the limits "
            f"(worst {'own RSS' if ph.get('judged_on') == 'own' else 'RSS'} slope {ph['worst_rss_pct_per_h'] if ph['worst_rss_pct_per_h'] is None else format(ph['worst_rss_pct_per_h'], '+.2f')} %/h, "
            f"worst descriptor slope {ph['worst_fd_per_h'] if ph['worst_fd_per_h'] is None else format(ph['worst_fd_per_h'], '.1f')}/h); "
            f"of these, own memory (USS) growing too: {', '.join(ph.get('own_memory_growing') or ['none'])}; "
            f"with twice the warm-up ({2 * ph['warmup_minutes']:g} min, a sensitivity) failing: "
            f"{', '.join(ph.get('failed_with_double_warmup') or ['none'])}; "
            f"{load['calls_ended']} calls, {100 * (load['ok_share'] or 0):.2f} % OK, median per-minute p95 "
            f"{load['p95_ms_median'] or 0:.0f} ms; load average (1 min) median {load['load_average_median'] or 0:.1f}, "
            f"max {load['load_average_max'] or 0:.1f}.")
    lines += ["**Answer (" + summary.get("run_started", "?")[:10] + ").** " + " ".join(answer), ""]
    lines += [f"Targets: after the warm-up, no process's own RSS (RSS without shared memory) grows more than {summary['memory_limit_pct_per_h']:g} % "
              f"of its median per hour; descriptors flat (Theil-Sen slope within +-{summary['fd_limit_per_h']:g} per hour). "
              "PostgreSQL's descriptors on its own data files (a relation's file stays open once read or written, "
              "up to `max_files_per_process`; the background writer closes them at each checkpoint) are a file cache "
              "bounded by the files the database has: they are shown (`data files open`), left out of the "
              "descriptor slope, and fail a process only if one file is open twice. "
              "The warm-up is stated before the run: in `instant` twice the results' expiry (`ARAG_RESULT_TTL`), "
              "the time for Redis to hold a full window of results and then see it replaced once. "
              f"A process with fewer than {summary['min_samples']} samples after the warm-up is not judged "
              "(it started late: a restarted child, a new PostgreSQL backend).", "",
              f"Command: `{summary.get('command', '?')}`  ",
              f"Run: {summary.get('run_started', '?')} -> {summary.get('run_ended', '?')}, commit {summary.get('code') or '?'}; "
              f"{summary.get('machine', '')}", ""]
    for name, ph in phases.items():
        lines += [f"## Phase `{name}`", "",
                  *([f"- run: `{ph['run'].get('command')}`, {ph['run'].get('run_started')} -> {ph['run'].get('run_ended')}, "
                     f"commit {ph['run'].get('code') or '?'}"] if ph.get("run") else []),
                  f"- LLM: {ph.get('stack', {}).get('llm', '?')}",
                  f"- stack: " + "; ".join(f"{k}: {v}" for k, v in ph.get("stack", {}).items() if k != "llm"),
                  f"- pools: concurrency {ph.get('facts', {}).get('concurrency')}, queue limits {ph.get('facts', {}).get('queue_limits')}",
                  f"- rate: {ph.get('rate') or 0:.2f} Answers/s open loop, mix {MIX} of the `{ph.get('queries')}` query pools, distinct texts"
                  + (f"; half of min(given ceiling {ph['given_ceiling']:g} from {ph.get('ceiling_source')}, "
                     f"closed-loop probe at the start {ph['probe_answers_per_s']:g})" if ph.get("probe_answers_per_s") else
                     " (`--reader-rate`)"),
                  f"- load: {json.dumps(ph['load'])}",
                  f"- Redis's own account after the warm-up: {_redis(ph.get('redis'))}", "",
                  "Per process (after the warm-up; slopes by Theil-Sen with their 95 % interval):", "",
                  "| process | pid | samples | RSS median MB | own RSS %/h [95 %] | RSS %/h [95 %] | PSS %/h | USS %/h | fds median | fds /h [95 %] | data files open (max) | verdict |",
                  "| --- | ---: | ---: | ---: | --- | --- | --- | --- | ---: | --- | ---: | --- |"]
        for p in ph["processes"]:
            lines.append(f"| {p['role']} | {p['pid']} | {p['samples_after_warmup']}/{p['samples']} | "
                         f"{_mb(p.get('rss', {}).get('median'))} | {_pct(p.get('own', {}))} | {_pct(p.get('rss', {}))} | {_pct(p.get('pss', {}))} | "
                         f"{_pct(p.get('uss', {}))} | {_fds(p)} | {p.get('data_fds_max', '-')} | "
                         f"{p['verdict']}{': ' + '; '.join(p['reasons']) if p['reasons'] else ''} |")
        lines += ["", "Per role (the sum over its processes at each sample):", "",
                  "| role | processes (max) | RSS median MB | own RSS %/h [95 %] | RSS %/h [95 %] | PSS %/h | fds median | fds /h [95 %] | verdict |",
                  "| --- | ---: | ---: | --- | --- | --- | ---: | --- | --- |"]
        for r in ph["roles"]:
            lines.append(f"| {r['role']} | {r['processes_max']} | {_mb(r.get('rss', {}).get('median'))} | "
                         f"{_pct(r.get('own', {}))} | {_pct(r.get('rss', {}))} | {_pct(r.get('pss', {}))} | {_fds(r)} | {r['verdict']}{': ' + '; '.join(r['reasons']) if r['reasons'] else ''} |")
        lines.append("")
    if summary.get("reading"):  # the analyst's reading of this run, kept in summary.json across recomputes
        lines += ["## Reading", "", summary["reading"], ""]
    lines += ["## Method", "",
              "Every sample reads /proc of each descendant of the driver: `VmRSS` and its own part "
              "`RssAnon + RssFile` (status: RSS without `RssShmem`, the shared-memory segments it has paged "
              "in), `Pss` and `Private_Clean + Private_Dirty` = USS (smaps_rollup), the entries of `fd/`, "
              "threads. The verdict is on the own RSS: a PostgreSQL backend's RSS grows as it touches pages of "
              "the shared buffers, a segment of fixed size (`shared_buffers`) that the postmaster allocated "
              "once, so RSS would call every busy backend a leak; USS is not used either, because a file page "
              "(the GGUF model, a library) turns from shared to private when another process mapping it "
              "exits. RSS, PSS and USS are shown beside it.",
              "", "Records: `samples.jsonl` (one line per process per sample, one `load` line per interval); "
              "`summary.json` and this README recompute from it (`--recompute`); `soak.png` plots own RSS and "
              "descriptors per role over time.", ""]
    (out / "README.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


def plot(rows: Sequence[Mapping[str, Any]], summary: Mapping[str, Any], out: Path) -> None:
    """Per phase, per role (the sum over its processes): RSS as a share of its value at the end of
    the warm-up, and descriptors minus theirs then; flat lines at 100 % and 0 are what passes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    totals = role_totals(rows)
    names = list(summary["phases"])
    fig, axes = plt.subplots(2, max(1, len(names)), figsize=(8 * max(1, len(names)), 10), squeeze=False)
    colours = plt.get_cmap("tab20").colors
    for col, name in enumerate(names):
        warm = summary["phases"][name]["warmup_minutes"]
        roles = [(role, samples) for (phase, role), samples in sorted(totals.items()) if phase == name]
        for i, (role, samples) in enumerate(roles):
            base = next((s for s in samples if s["minute"] >= warm), samples[-1])
            xs = [s["minute"] for s in samples]
            style = {"color": colours[i % len(colours)], "ls": ("-", "--", ":")[i // len(colours) % 3], "lw": 1.2}
            key = "own" if "own" in base else "rss"
            axes[0][col].plot(xs, [100.0 * s.get(key, 0) / base[key] if base[key] else None for s in samples],
                              label=f"{role} ({base[key] / 1e6:,.0f} MB)", **style)
            axes[1][col].plot(xs, [s["fds"] - base["fds"] for s in samples], label=f"{role} ({base['fds']})", **style)
        for row, label in ((0, "own RSS (without shared memory), % of the role's at the end of the warm-up"),
                           (1, "open descriptors minus the role's at the end of the warm-up")):
            ax = axes[row][col]
            ax.axvline(warm, color="grey", ls="--", lw=0.8)
            ax.set_xlabel(f"minutes into phase `{name}` (dashed: end of warm-up)")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6, ncol=2, loc="upper left")
        axes[0][col].set_title(f"phase `{name}`: sum over each role's processes (value at the warm-up's end)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "soak.png", dpi=110)
    plt.close(fig)


def git_commit() -> str | None:
    """The commit the stack ran (with "+changes" when the tree differs from it)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+changes" if dirty else "")) or None


def read_samples(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def finish(out: Path, meta: Mapping[str, Any], phases: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    rows = read_samples(out / "samples.jsonl")
    summary = {**meta, **summarize(rows, phases)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n", encoding="utf-8")
    render(summary, out)
    plot(rows, summary, out)
    return summary


RUN_KEYS = ("command", "run_started", "run_ended", "machine", "interval_s", "code", "reading")
DERIVED = ("processes", "roles", "judged", "failed", "not_judged", "verdict", "worst_rss_pct_per_h", "worst_fd_per_h",
           "load", "own_memory_growing", "failed_with_double_warmup")


def _phase_inputs(summary: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each phase's inputs as the run recorded them (its derived figures are recomputed)."""
    return {name: {k: v for k, v in ph.items() if k not in DERIVED} for name, ph in summary["phases"].items()}


def recompute(folder: Path) -> dict[str, Any]:
    old = json.loads((folder / "summary.json").read_text())
    return finish(folder, {k: old[k] for k in RUN_KEYS if k in old}, _phase_inputs(old))


def merge(target: Path, source: Path) -> dict[str, Any]:
    """Replace the phases of the report in `target` by those a later run wrote to `source` (one
    phase run again): its samples replace theirs, each phase keeps the run it came from (`run`:
    command, times, commit), and the report recomputes from the merged samples."""
    old = json.loads((target / "summary.json").read_text())
    new = json.loads((source / "summary.json").read_text())
    rerun = set(new["phases"])
    rows = [r for r in read_samples(target / "samples.jsonl") if r.get("phase") not in rerun]
    rows += read_samples(source / "samples.jsonl")
    with (target / "samples.jsonl").open("w", encoding="utf-8") as journal:
        journal.writelines(json.dumps(row) + "\n" for row in rows)
    phases: dict[str, dict[str, Any]] = {}
    for summary, names in ((old, [n for n in old["phases"] if n not in rerun]), (new, list(new["phases"]))):
        inputs = _phase_inputs(summary)
        for name in names:
            run = inputs[name].pop("run", None) or {k: summary.get(k) for k in ("command", "run_started", "run_ended", "code")}
            phases[name] = {**inputs[name], "run": run}
    order = list(old["phases"]) + [n for n in new["phases"] if n not in old["phases"]]
    meta = {k: old[k] for k in RUN_KEYS if k in old}
    meta.update(command="; ".join(dict.fromkeys(phases[n]["run"]["command"].strip() for n in order)),
                run_started=min(phases[n]["run"]["run_started"] for n in order),
                run_ended=max(phases[n]["run"]["run_ended"] for n in order))
    return finish(target, meta, {n: phases[n] for n in order})


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="~6 min: 3 + 2 min phases, a sample every 10 s")
    parser.add_argument("--phases", default="instant,reader")
    parser.add_argument("--instant-minutes", type=float, default=90.0, help="the warm-up, then an hour judged")
    parser.add_argument("--reader-minutes", type=float, default=55.0, help="the warm-up, then 30 minutes judged")
    parser.add_argument("--instant-warmup", type=float, default=None,
                        help="minutes not judged at the start (default: twice the results' expiry, ARAG_RESULT_TTL)")
    parser.add_argument("--reader-warmup", type=float, default=25.0,
                        help="minutes not judged: llama-server's host prompt cache (CACHE_RAM_MIB, 256 MiB) "
                             "filled in 21 minutes at 0.07 Answers/s (reports/soak, 2026-12-06)")
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between samples")
    parser.add_argument("--ceiling", type=float, default=DEFAULT_CEILING,
                        help=f"the instant LLM's ceiling, Answers/s (default {DEFAULT_CEILING:g}: {CEILING_SOURCE})")
    parser.add_argument("--probe-s", type=float, default=30.0, help="closed-loop probe at the start of `instant`")
    parser.add_argument("--probe-clients", type=int, default=16)
    parser.add_argument("--reader-rate", type=float, default=DEFAULT_READER_RATE)
    parser.add_argument("--out", type=Path, default=None, help="default reports/soak (quick: var/soak/quick)")
    parser.add_argument("--workdir", type=Path, default=None, help="default var/soak/<run>")
    parser.add_argument("--recompute", type=Path, default=None, help="rewrite summary, README and plot of a report folder")
    parser.add_argument("--merge-from", type=Path, default=None,
                        help="with --recompute: replace the report's phases by those of a later run's --out folder")
    args = parser.parse_args(argv)
    if args.recompute and args.merge_from:
        merge(args.recompute, args.merge_from)
        return 0
    if args.recompute:
        recompute(args.recompute)
        return 0
    if args.quick:
        args.instant_minutes, args.reader_minutes, args.instant_warmup, args.reader_warmup = 3.0, 2.0, 1.0, 0.5
        args.interval, args.probe_s = 10.0, 10.0
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    out = args.out or (REPO / "var" / "soak" / "quick" if args.quick else REPO / "reports" / "soak")
    workdir = args.workdir or REPO / "var" / "soak" / f"{'quick' if args.quick else 'full'}-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    workdir.mkdir(parents=True, exist_ok=True)
    console = Console()
    plan = {"instant": Phase("instant", args.instant_minutes, args.instant_warmup, 30.0),
            "reader": Phase("reader", args.reader_minutes, args.reader_warmup, 300.0, args.reader_rate, "demo")}
    chosen = [p.strip() for p in args.phases.split(",") if p.strip()]
    meta = {"command": "python -m lab.experiments.soak " + " ".join(argv if argv is not None else sys.argv[1:]),
            "run_started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": (f"{os.cpu_count()} CPU cores, {platform.platform()}, Python {platform.python_version()}; "
                        f"load average at start {', '.join(f'{x:.2f}' for x in os.getloadavg())}; "
                        "the machine is shared with other jobs"),
            "interval_s": args.interval, "code": git_commit()}
    phases: dict[str, dict[str, Any]] = {}
    with (out / "samples.jsonl").open("w", encoding="utf-8") as journal:
        for name in chosen:
            phase = plan[name]
            console.print(f"[bold]phase {name}[/]: {phase.minutes:g} min")
            try:
                info = run_phase(phase, args, workdir, journal, console)
            except Exception as exc:  # noqa: BLE001 - the other phase still runs; the report says why
                console.print_exception()
                info = {"error": f"{type(exc).__name__}: {exc}"}
            warm = phase.warmup_minutes if phase.warmup_minutes is not None else 0.0  # None: it failed to start
            phases[name] = {"minutes": phase.minutes, "warmup_minutes": warm, "rate": phase.rate,
                            "queries": phase.source, "timeout_s": phase.timeout_s, **info}
            meta["run_ended"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
            summary = finish(out, meta, phases)  # after every phase: an interrupted run still reports
    for name, ph in summary["phases"].items():
        console.print(f"{name}: {ph['verdict']} ({ph['judged']} judged, {ph['failed']} failed); load {ph['load']}")
    console.print(f"report: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
