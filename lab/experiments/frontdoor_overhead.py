"""Front-door overhead per Answer, before (commit 7b14f11, the old serving code) and after (this
working tree), side by side in one run on one stack.

Both front doors, each with its own worker pools, run at the same time on the same shared backing
services, each tree's processes with `cwd=<tree>` and `PYTHONPATH=<tree>` first on the same
interpreter (checked: `adaptive_rag`, `services`, `workers` resolve into the tree):

- before: `git worktree add --detach /tmp/arag-before 7b14f11` (reused when present);
- after: the repository this file lives in.

Shared, started here on loopback by the lab's stack (`lab.harness.stack`, its servers only: the
trees' pools and front doors are started here, each with its tree's code): Redis (one database
number per tree), PostgreSQL (one database per tree, `arag_before` / `arag_after`, each migrated
by its own tree's code), one Triton serving the
router (`--router shipped`, the default: the bag-of-words router the repository ships, published
with `arag model ship` as users get it; `--router minilm`: an untrained MiniLM-L6 exported once,
its routing effectively random, a fixture with a transformer's inference cost), a tantivy index of `demo/knowledge_base.jsonl`, and an *instant* OpenAI-compatible LLM endpoint (a
measurement device: a threaded HTTP server answering every completion at once with a fixed short
text), so the workers' strategies take almost no time.

Load: gRPC `Answer` calls (generated stubs of this tree; the .proto is wire-compatible with the
old one), each with a fresh `client_request_id` and a distinct query (demo questions plus a
counter), closed loop with 1 and with 4 concurrent clients. Blocks of requests alternate between
the trees (before, after, after, before, ...: both see the same machine noise, linear drift
cancels), after an
uncounted warm-up. Per Answer:

    overhead = timings.total_ms - timings.queue_wait_ms - timings.strategy_ms

i.e. what the front door itself spends: authentication, validation, records writes, routing
(tokenize + Triton), enqueue, result delivery back to the waiting call, reply building.

Around each block the CPU time of that tree's processes is read from /proc (front door; worker
pools with their children): CPU per Answer, what bounds a machine's throughput, compared with
an interval over blocks. `--after-env NAME=VALUE` measures a setting against its default.

    .venv/bin/python -m lab.experiments.frontdoor_overhead --out reports/frontdoor_overhead
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import secrets
import shlex
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from adaptive_rag.contracts import CLASSIFIER_MODEL
from lab.harness.instant_llm import LLM_ANSWER, cpu_model
from lab.harness.load_client import CallRecord, LoadClient, closed_loop
from lab.harness.stats import CpuMeter, block_bootstrap_ratio, percentile, process_table, ratio_of_medians_interval
from infra.local.servers import free_port

REPO = Path(__file__).resolve().parents[2]
BEFORE_COMMIT = "7b14f11"
BEFORE_TREE = Path("/tmp/arag-before")
PYTHON = Path(sys.executable)
TREES = ("before", "after")
POOLS = "A,B,C"
START_TIMEOUT_S = 180.0
CALL_TIMEOUT_S = 30.0


# --- processes this benchmark starts --------------------------------------------------------------

def _children() -> dict[int, list[int]]:
    """ppid -> pids, from /proc."""
    out: dict[int, list[int]] = {}
    for pid, ppid in process_table().items():
        out.setdefault(ppid, []).append(pid)
    return out


def descendants(pid: int) -> list[int]:
    tree, found, todo = _children(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@dataclass
class Started:
    name: str
    process: subprocess.Popen
    log: Path


class Processes:
    """Every long-running process started here, each in its own session (process group); stopped
    in reverse order with SIGTERM to the group, then SIGKILL to the group and to every descendant
    seen (celery starts its pools in sessions of their own)."""

    def __init__(self) -> None:
        self.started: list[Started] = []

    def start(self, name: str, cmd: list[str], *, cwd: Path, env: dict[str, str], log: Path) -> Started:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            out.write(f"--- {shlex.join(cmd)} (cwd {cwd})\n".encode())
            out.flush()
            proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        started = Started(name, proc, log)
        self.started.append(started)
        return started

    def wait_for(self, started: Started, mark: str, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if mark in started.log.read_text(errors="replace"):
                return
            if started.process.poll() is not None:
                raise RuntimeError(f"{started.name} exited with {started.process.returncode}:\n"
                                   f"{started.log.read_text(errors='replace')[-4000:]}")
            time.sleep(0.2)
        raise RuntimeError(f"{started.name} not ready after {timeout_s:.0f} s ({started.log})")

    def stop_all(self) -> list[int]:
        """Stop everything; returns the pids still alive afterwards (should be none)."""
        left: list[int] = []
        for started in reversed(self.started):
            proc = started.process
            family = descendants(proc.pid)
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                try:
                    proc.wait(timeout=45)
                except subprocess.TimeoutExpired:
                    pass
            family += [p for p in descendants(proc.pid) if p not in family]
            for pid in [proc.pid, *family]:
                try:
                    if pid == proc.pid:
                        os.killpg(pid, signal.SIGKILL)
                    if _alive(pid):
                        os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            time.sleep(0.2)
            left += [pid for pid in [proc.pid, *family] if _alive(pid)]
        self.started.clear()
        return left


# --- setup ----------------------------------------------------------------------------------------

def ensure_before_tree(tree: Path, commit: str) -> str:
    """The before worktree at `commit` (added when missing); returns its full commit hash."""
    if not (tree / ".git").exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], cwd=REPO,
                       check=True, stdout=subprocess.DEVNULL)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, check=True, capture_output=True,
                          text=True).stdout.strip()
    want = subprocess.run(["git", "rev-parse", commit], cwd=REPO, check=True, capture_output=True,
                          text=True).stdout.strip()
    if head != want:
        raise RuntimeError(f"{tree} is at {head}, not {commit} ({want}); remove it "
                           f"(git worktree remove {tree}) and run again")
    return head


def tree_env(tree: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ARAG_", "LLM_", "TRITON_"))
           and k not in ("REDIS_URL", "DATABASE_URL", "OPENSEARCH_URL", "PYTHONPATH")}
    env["PYTHONPATH"] = str(tree)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run_in_tree(tree: Path, env: dict[str, str], code: str) -> str:
    out = subprocess.run([str(PYTHON), "-c", code], cwd=tree, env=env, capture_output=True,
                         text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"in {tree}: python -c {code!r} failed:\n{out.stderr[-3000:]}")
    return out.stdout.strip()


def check_imports(tree: Path, env: dict[str, str]) -> dict[str, str]:
    """Where `adaptive_rag`, `services.frontdoor` and `workers` come from in that tree's processes."""
    found = json.loads(run_in_tree(tree, env, (
        "import json, adaptive_rag, services.frontdoor, workers.pools, infra.local.servers;"
        "print(json.dumps({m.__name__: m.__file__ for m in (adaptive_rag, services.frontdoor,"
        " workers.pools, infra.local.servers)}))")))
    wrong = {m: f for m, f in found.items() if not Path(f).resolve().is_relative_to(tree.resolve())}
    if wrong:
        raise RuntimeError(f"in {tree} these modules resolve elsewhere: {wrong}")
    return found


ROUTERS = {
    # what a fresh clone serves (`make router`): the committed bag-of-words router, as ONNX
    "shipped": ("the bag-of-words router the repository ships (`arag model ship`, "
                "models/router/router.json)", ["model", "ship"]),
    # a transformer's inference cost with random routing (a fixture, never trained)
    "minilm": ("an untrained MiniLM-L6 (`arag model bootstrap`; random routing, a fixture)",
               ["model", "bootstrap"]),
}


def model_repository(root: Path, router: str, log: Path, tree: Path = REPO) -> Path:
    """A model repository (one per router kind under `root`) whose served version is `router`
    (`ROUTERS`), published once with `tree`'s `arag` (its model configuration, too)."""
    repository = root / router
    if not list((repository / CLASSIFIER_MODEL).glob("*/model.onnx")):
        with log.open("ab") as out:
            subprocess.run([str(PYTHON.parent / "arag"), *ROUTERS[router][1], "--repository",
                            str(repository)], cwd=tree, check=True, stdout=out,
                           stderr=subprocess.STDOUT, env=tree_env(tree, {}), timeout=900)
    return repository


def build_index(index_dir: Path, log: Path) -> Path:
    if not index_dir.exists():
        with log.open("ab") as out:
            subprocess.run([str(PYTHON.parent / "arag"), "index", str(REPO / "demo" / "knowledge_base.jsonl"),
                            "--index-dir", str(index_dir)], cwd=REPO, check=True, stdout=out,
                           stderr=subprocess.STDOUT, env=tree_env(REPO, {}), timeout=300)
    return index_dir


def import_knowledge(tree: Path, env: dict[str, str], tenant: str, log: Path) -> None:
    """The demo help centre into `tenant`'s knowledge base, for trees that have one per tenant
    (older trees read the shared index of `build_index`)."""
    if not (tree / "adaptive_rag" / "cli" / "kb.py").exists():
        return
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        subprocess.run([str(PYTHON), "-c", "from adaptive_rag.cli import main; main()", "kb", "import",
                        "--tenant", tenant, str(REPO / "demo" / "knowledge_base.jsonl")],
                       cwd=tree, check=True, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=300)


def plain_pg(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def create_database(admin_url: str, name: str) -> str:
    import psycopg

    with psycopg.connect(plain_pg(admin_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return admin_url.rsplit("/", 1)[0] + f"/{name}"


def insert_api_key(url: str, tenant: str) -> str:
    import psycopg

    key = "arag_" + secrets.token_urlsafe(24)
    with psycopg.connect(plain_pg(url), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO api_keys (tenant, key_prefix, key_hash, created_at) VALUES (%s, %s, %s, %s)",
            (tenant, key[:8], hashlib.sha256(key.encode()).hexdigest(), datetime.now(timezone.utc)),
        )
    return key


# --- one tree's stack ------------------------------------------------------------------------------

@dataclass
class TreeStack:
    name: str
    tree: Path
    commit: str
    env: dict[str, str]
    listen: str
    key: str
    modules: dict[str, str]
    worker_pids: dict[str, Any]


def settings_env(tree_name: str, shared: dict[str, str], redis_url: str, database_url: str,
                 metrics_port: int, broker_dir: Path) -> dict[str, str]:
    env = {**shared, "REDIS_URL": redis_url, "DATABASE_URL": database_url,
           "ARAG_METRICS_PORT": str(metrics_port), "ARAG_BROKER_DIR": str(broker_dir)}
    # Both spellings, so any commit can be either tree: per-tier variables (7b14f11 and older)
    # and JSON mappings (the redesigned settings); each tree reads only its own.
    for tier in ("A", "B", "C"):
        env[f"ARAG_CONCURRENCY_{tier}"] = "1"
        env[f"ARAG_MAX_QUEUE_DEPTH_{tier}"] = "100000"
    env["ARAG_CONCURRENCY_SHADOW"] = "1"
    env["ARAG_CONCURRENCY"] = json.dumps({"A": 1, "B": 1, "C": 1, "shadow": 1})
    env["ARAG_MAX_QUEUE_DEPTH"] = json.dumps({"A": 100000, "B": 100000, "C": 100000})
    # All calls come from one tenant: its token bucket (50/s by default) would refuse calls at
    # a few clients and the overhead would be measured on the survivors. 0 lifts it (a tree that
    # predates the setting ignores it); its tier slot shares stay on.
    env["ARAG_TENANT_RATE"] = "0"
    return env


def stage_means(env: dict[str, str]) -> dict[str, float]:
    """Mean milliseconds per stage of Answer from a front door's `arag_frontdoor_stage_seconds`
    histogram (front doors that do not export it give {})."""
    import urllib.request

    from services.frontdoor.metrics import stage_totals

    url = f"http://127.0.0.1:{env['ARAG_METRICS_PORT']}/metrics"
    try:
        text = urllib.request.urlopen(url, timeout=10).read().decode()
    except OSError:
        return {}
    return {stage: round(1000 * total / calls, 3)
            for stage, (total, calls) in stage_totals(text).items() if calls}


def process_facts(pid: int) -> dict[str, Any]:
    """cwd and PYTHONPATH of a running process (to show each tree ran its own code)."""
    try:
        environ = dict(item.split("=", 1) for item in
                       Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
                       if "=" in item)
        return {"pid": pid, "cwd": os.readlink(f"/proc/{pid}/cwd"),
                "PYTHONPATH": environ.get("PYTHONPATH")}
    except OSError as exc:
        return {"pid": pid, "error": str(exc)}


def start_tree(procs: Processes, name: str, tree: Path, commit: str, env: dict[str, str],
               logs: Path) -> TreeStack:
    modules = check_imports(tree, env)
    run_in_tree(tree, env, "import os; from adaptive_rag.storage import upgrade_database; "
                           "upgrade_database(os.environ['DATABASE_URL'])")
    key = insert_api_key(env["DATABASE_URL"], f"bench-{name}")
    import_knowledge(tree, env, f"bench-{name}", logs / name / "kb.log")
    pools = procs.start(f"{name} worker pools", [str(PYTHON), "-m", "workers.pools", "--pools", POOLS],
                        cwd=tree, env=env, log=logs / name / "pools.log")
    port = free_port()
    frontdoor = procs.start(f"{name} front door",
                            [str(PYTHON), "-m", "services.frontdoor", "--listen", f"127.0.0.1:{port}"],
                            cwd=tree, env=env, log=logs / name / "frontdoor.log")
    procs.wait_for(pools, "workers ready")
    procs.wait_for(frontdoor, "READY front door on port")
    workers = [process_facts(pid) for pid in descendants(pools.process.pid)]
    return TreeStack(name, tree, commit, env, f"127.0.0.1:{port}", key, modules, {
        "pools": process_facts(pools.process.pid), "frontdoor": process_facts(frontdoor.process.pid),
        "workers": workers,
    })


def cpu_meter(stack: TreeStack) -> CpuMeter:
    """A tree's own processes by role: its front door; its worker pools with their children."""
    return CpuMeter({stack.worker_pids["frontdoor"]["pid"]: "front door",
                     stack.worker_pids["pools"]["pid"]: "worker pools"})


# --- load --------------------------------------------------------------------------------------------

@dataclass
class Sample:
    tree: str
    concurrency: int
    block: int
    status: str = "OK"
    client_ms: float | None = None
    total_ms: float | None = None
    queue_wait_ms: float | None = None
    strategy_ms: float | None = None
    classify_ms: float | None = None
    tier: str | None = None
    fallback: bool | None = None
    model_version: int | None = None

    @property
    def overhead_ms(self) -> float | None:
        if self.total_ms is None:
            return None
        return self.total_ms - self.queue_wait_ms - self.strategy_ms

    @classmethod
    def of(cls, call: CallRecord, tree: str, concurrency: int, block: int) -> Sample:
        """The sample of one Answer call of the shared load client."""
        return cls(tree, concurrency, block, call.code, call.latency_ms, call.total_ms, call.queue_wait_ms,
                   call.strategy_ms, call.classify_ms, call.tier, call.fallback, call.model_version)


class Queries:
    """Distinct queries: the demo questions in turn, each with a counter appended."""

    def __init__(self) -> None:
        self.base = [q["question"] for q in json.loads((REPO / "demo" / "questions.json").read_text())]
        self.n = 0

    def take(self, count: int) -> list[str]:
        out = []
        for _ in range(count):
            text = self.base[self.n % len(self.base)]
            out.append(f"{text} (#{self.n})")
            self.n += 1
        return out


async def run_block(client: LoadClient, stack: TreeStack, queries: list[str], concurrency: int,
                    block: int) -> list[Sample]:
    """Closed loop: `concurrency` clients (a connection each), each sends its next query when its
    reply is in."""
    async def one(query: str, lane: int) -> Sample:
        call = await client.answer(query, timeout=CALL_TIMEOUT_S, lane=lane)
        return Sample.of(call, stack.name, concurrency, block)

    return await closed_loop(one, queries, concurrency)


async def route_latencies(client: LoadClient, queries: list[str]) -> dict[str, Any]:
    """Single-stream `Route` calls (the decision-only RPC): client-side ms per call; {} when the
    tree's front door has no Route."""
    ms, errors = [], 0
    for q in queries:
        call = await client.route(q, timeout=CALL_TIMEOUT_S)
        if call.code == "UNIMPLEMENTED":
            return {}
        if not call.ok:
            errors += 1
            continue
        ms.append(call.latency_ms)
    return {"calls": len(queries), "errors": errors, "p50_ms": percentile(ms, 50), "p95_ms": percentile(ms, 95),
            "p99_ms": percentile(ms, 99)}


async def measure(stacks: dict[str, TreeStack], concurrencies: list[int], args: argparse.Namespace,
                  queries: Queries) -> tuple[list[Sample], list[dict[str, Any]], dict[str, Any]]:
    """Per concurrency: an uncounted warm-up, then the trees' blocks in counterbalanced order with
    each block's CPU; then the single-stream Route calls. (samples, blocks, route)"""
    samples: list[Sample] = []
    blocks: list[dict[str, Any]] = []
    for i, c in enumerate(concurrencies):
        clients = {name: LoadClient(stacks[name].listen, stacks[name].key, channels=c) for name in TREES}
        try:
            for client in clients.values():
                await client.ready(timeout=30)
            warm = queries.take(args.warmup)
            for name in TREES:
                bad = [s.status for s in await run_block(clients[name], stacks[name], warm, c, -1)
                       if s.status != "OK"]
                if bad:
                    raise RuntimeError(f"{name}: warm-up calls failed: {bad}")
            order = block_order(args.blocks, TREES[i % 2])
            texts: list[str] = []
            for b, name in enumerate(order):
                if b % 2 == 0:  # both trees of a pair get the same queries
                    texts = queries.take(args.block_size)
                la = os.getloadavg()
                meter = cpu_meter(stacks[name])
                cpu0 = meter.snapshot()
                t0 = time.monotonic()
                got = await run_block(clients[name], stacks[name], texts, c, b)
                seconds = time.monotonic() - t0
                cpu_s = CpuMeter.used(cpu0, meter.snapshot())
                samples += got
                ok = [s.overhead_ms for s in got if s.status == "OK"]
                blocks.append({"concurrency": c, "block": b, "tree": name,
                               "seconds": seconds, "load_average_start": la,
                               "answered": len(ok), "overhead_p50_ms": percentile(ok, 50),
                               "cpu_s": cpu_s})
                print(f"clients {c} block {b:2d} {name:6s}: {len(ok)}/{len(got)} ok, "
                      f"overhead p50 {_f(percentile(ok, 50))} ms, {blocks[-1]['seconds']:.1f} s, "
                      f"load {la[0]:.2f}", flush=True)
        finally:
            for client in clients.values():
                await client.close()
    route: dict[str, Any] = {}
    for name in TREES:  # the decision-only RPC, single stream, distinct queries
        async with LoadClient(stacks[name].listen, stacks[name].key) as client:
            route[name] = await route_latencies(client, queries.take(args.route_calls))
    return samples, blocks, route


def block_order(blocks: int, first: str) -> list[str]:
    """first, second, second, first, ...: each tree `blocks` times, counterbalanced in pairs."""
    second = "after" if first == "before" else "before"
    order = []
    for i in range(blocks):
        order += [first, second] if i % 2 == 0 else [second, first]
    return order


# --- statistics -------------------------------------------------------------------------------------

def by_block(samples: list[Sample]) -> list[list[float]]:
    """The answered calls' overhead, one list per block."""
    blocks: dict[int, list[float]] = {}
    for s in samples:
        if s.status == "OK":
            blocks.setdefault(s.block, []).append(s.overhead_ms)
    return [blocks[b] for b in sorted(blocks)]


def summarize(samples: list[Sample], concurrencies: list[int], n_boot: int, seed: int) -> dict[str, Any]:
    rows, ratios = [], []
    for c in concurrencies:
        per: dict[str, list[Sample]] = {t: [s for s in samples if s.concurrency == c and s.tree == t]
                                        for t in TREES}
        for tree in TREES:
            mine = per[tree]
            ok = [s for s in mine if s.status == "OK"]
            over = [s.overhead_ms for s in ok]
            errors: dict[str, int] = {}
            for s in mine:
                if s.status != "OK":
                    errors[s.status] = errors.get(s.status, 0) + 1
            rows.append({
                "tree": tree, "concurrency": c, "sent": len(mine), "answered": len(ok),
                "errors": errors,
                "overhead_p50_ms": percentile(over, 50), "overhead_p95_ms": percentile(over, 95),
                "overhead_p99_ms": percentile(over, 99),
                "classify_p50_ms": percentile([s.classify_ms for s in ok], 50),
                "overhead_p50_by_tier_ms": {t: percentile([s.overhead_ms for s in ok if s.tier == t], 50)
                                            for t in ("A", "B", "C")},
                "total_p50_ms": percentile([s.total_ms for s in ok], 50),
                "client_p50_ms": percentile([s.client_ms for s in mine], 50),
                "client_p95_ms": percentile([s.client_ms for s in mine], 95),
                "queue_wait_p50_ms": percentile([s.queue_wait_ms for s in ok], 50),
                "strategy_p50_ms": percentile([s.strategy_ms for s in ok], 50),
                "tiers": {t: sum(1 for s in ok if s.tier == t) for t in ("A", "B", "C")},
                "fallback_routed": sum(1 for s in ok if s.fallback),
                "model_versions": sorted({s.model_version for s in ok if s.model_version is not None}),
            })
        ob = [s.overhead_ms for s in per["before"] if s.status == "OK"]
        oa = [s.overhead_ms for s in per["after"] if s.status == "OK"]
        if ob and oa:
            ci = ratio_of_medians_interval(by_block(per["after"]), by_block(per["before"]), n_boot, seed + c)
            ratios.append({
                "concurrency": c,
                "p50": percentile(oa, 50) / percentile(ob, 50), "p50_ci95": list(ci) if ci else None,
                "p95": percentile(oa, 95) / percentile(ob, 95), "p99": percentile(oa, 99) / percentile(ob, 99),
                "client_p50": (percentile([s.client_ms for s in per["after"]], 50)
                               / percentile([s.client_ms for s in per["before"]], 50)),
            })
    return {"rows": rows, "ratios": ratios}


def cpu_summary(blocks: list[dict[str, Any]], concurrencies: list[int], n_boot: int,
                seed: int) -> dict[str, Any]:
    """CPU milliseconds per answered call, by role, per tree and concurrency (all its blocks'
    CPU over all their answers), and after/before of the total with a bootstrap over blocks.

    CPU per Answer is what decides a machine's ceiling; measured in the same interleaved blocks
    as the latency, it compares two trees far more tightly than two ceiling runs can."""
    rows, ratios = [], []
    for c in concurrencies:
        per = {t: [b for b in blocks if b["concurrency"] == c and b["tree"] == t and b.get("cpu_s")
                   and b["answered"]] for t in TREES}
        if not all(per.values()):
            continue
        for tree in TREES:
            answered = sum(b["answered"] for b in per[tree])
            roles = sorted({role for b in per[tree] for role in b["cpu_s"]})
            by_role = {role: 1000 * sum(b["cpu_s"].get(role, 0.0) for b in per[tree]) / answered
                       for role in roles}
            rows.append({"tree": tree, "concurrency": c, "answered": answered, "blocks": len(per[tree]),
                         "cpu_ms_per_answer": by_role, "total_ms": sum(by_role.values())})
        # (CPU seconds, answers) per block; the statistic is CPU per answer over the picked blocks
        cost = {t: [(sum(b["cpu_s"].values()), b["answered"]) for b in per[t]] for t in TREES}

        def per_answer(blocks: list[tuple[float, int]]) -> float:
            return sum(cpu for cpu, _ in blocks) / sum(answered for _, answered in blocks)

        ci = block_bootstrap_ratio(cost["after"], cost["before"], per_answer, n_boot, seed + 100 + c)
        point = per_answer(cost["after"]) / per_answer(cost["before"])
        ratios.append({"concurrency": c, "total": point, "total_ci95": list(ci) if ci else None})
    return {"rows": rows, "ratios": ratios}


# --- report ------------------------------------------------------------------------------------------

def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def table_lines(summary: dict[str, Any]) -> list[str]:
    lines = [
        "| clients | tree | answered | errors | overhead p50 | p95 | p99 | classify p50 | "
        "client p50 | client p95 | tiers A/B/C | overhead p50 by tier A/B/C | fallback |",
        "| ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: |",
    ]
    for r in summary["rows"]:
        errors = ", ".join(f"{k} {v}" for k, v in r["errors"].items()) or "0"
        lines.append(
            f"| {r['concurrency']} | {r['tree']} | {r['answered']}/{r['sent']} | {errors} | "
            f"{_f(r['overhead_p50_ms'])} | {_f(r['overhead_p95_ms'])} | {_f(r['overhead_p99_ms'])} | "
            f"{_f(r['classify_p50_ms'])} | {_f(r['client_p50_ms'])} | {_f(r['client_p95_ms'])} | "
            f"{'/'.join(str(r['tiers'][t]) for t in 'ABC')} | "
            f"{' / '.join(_f(r['overhead_p50_by_tier_ms'][t]) for t in 'ABC')} | {r['fallback_routed']} |")
    return lines


def _interval(ci: list[float] | None) -> str:
    return f"{ci[0]:.2f}x - {ci[1]:.2f}x" if ci else "- (fewer than two blocks)"


def ratio_lines(summary: dict[str, Any]) -> list[str]:
    lines = ["| clients | after/before p50 | 95 % interval (bootstrap) | p95 | p99 | client p50 |",
             "| ---: | ---: | --- | ---: | ---: | ---: |"]
    for r in summary["ratios"]:
        lines.append(f"| {r['concurrency']} | {r['p50']:.2f}x | {_interval(r['p50_ci95'])} | "
                     f"{r['p95']:.2f}x | {r['p99']:.2f}x | {r['client_p50']:.2f}x |")
    return lines


def cpu_lines(cpu: dict[str, Any] | None) -> list[str]:
    if not cpu or not cpu["rows"]:
        return []
    roles = sorted({role for r in cpu["rows"] for role in r["cpu_ms_per_answer"]})
    ratio = {r["concurrency"]: r for r in cpu["ratios"]}
    lines = ["| clients | tree | answered | " + " | ".join(roles) + " | total | after/before total (95 % interval) |",
             "| ---: | --- | ---: |" + " ---: |" * len(roles) + " ---: | --- |"]
    for r in cpu["rows"]:
        q = ratio.get(r["concurrency"]) if r["tree"] == "after" else None
        lines.append(
            f"| {r['concurrency']} | {r['tree']} | {r['answered']} | "
            + " | ".join(_f(r["cpu_ms_per_answer"].get(role), 2) for role in roles)
            + f" | {_f(r['total_ms'], 2)} | "
            + (f"{q['total']:.2f}x ({_interval(q['total_ci95'])})" if q else "")
            + " |")
    return lines


def markdown(report: dict[str, Any]) -> str:
    cfg, m = report["config"], report["machine"]
    la0, la1 = report["load_average_start"], report["load_average_end"]
    peak = max(la0[0], la1[0], *(b["load_average_start"][0] for b in report["blocks"]))
    loaded = peak > 6
    trees = report["trees"]
    # Runs from before the benchmark lifted the tenant's token bucket do not say so.
    bucket_off = ((trees["after"].get("env") or {}).get("ARAG_TENANT_RATE") == "0")
    lines = [
        f"# Front-door overhead per Answer: before ({trees['before']['commit'][:7]}) vs after (the working tree)",
        "",
        f"Command: `{report['command']}`  ",
        f"Run: {report['started']} -> {report['finished']}, {m['cpus']} CPU cores ({m['cpu']}, "
        f"{m['platform']}, Python {m['python']}); load average (1/5/15 min) at start "
        f"{', '.join(f'{x:.2f}' for x in la0)}, at end {', '.join(f'{x:.2f}' for x in la1)}, "
        f"highest 1-min value at a block start {peak:.2f}; the machine is shared with other jobs"
        + (" and was **heavily loaded** (1-min load above 6 at some point): absolute numbers are "
           "inflated, the interleaved ratio is the figure to read." if loaded else "."),
        "",
        f"- before: `{trees['before']['commit']}` (worktree `{trees['before']['tree']}`); after: the "
        f"working tree `{trees['after']['tree']}` at `{trees['after']['commit']}`"
        + (" with uncommitted changes" if trees["after"].get("dirty") else "") + ".",
        "- Each tree's processes ran with cwd = the tree and `PYTHONPATH=<tree>` on the same "
        "interpreter; `adaptive_rag`, `services.frontdoor`, `workers.pools` were checked to import "
        "from the tree (report.json: `trees.*.modules`, and cwd/PYTHONPATH of the running "
        "front door, pools and celery workers).",
        "- Same stack for both, started by the script on loopback: one Redis (database "
        f"{cfg['redis_db']['before']} before, {cfg['redis_db']['after']} after), one PostgreSQL "
        "(databases `arag_before` / `arag_after`, each migrated by its own tree), "
        + ("one Triton per tree, each serving its own tree's publication of "
           if cfg.get("triton_per_tree") else "one Triton serving ")
        + f"{ROUTERS[cfg.get('router', 'minilm')][0]}, the tantivy "
        "index of `demo/knowledge_base.jsonl`, and an **instant OpenAI-compatible LLM endpoint** (a "
        "measurement device, run by the script as a process of its own: a fixed one-word answer, no compute), "
        f"`LLM_API=chat`. Worker pools per tree: `{POOLS}`, 1 process each; queue limits 100000; "
        + ("the tenant's token bucket off (`ARAG_TENANT_RATE=0`); " if bucket_off else "")
        + f"model poll {cfg['model_poll_s']:.0f} s; other settings at their defaults"
        + (f" except, in the after tree only, {', '.join(f'`{k}={v}`' for k, v in cfg['after_env'].items())}"
           if cfg.get("after_env") else "") + ".",
        f"- Load: gRPC `Answer` (stubs of the after tree), a new `client_request_id` and a distinct "
        f"query each (demo questions + counter; the same query sequence for both trees), closed "
        f"loop at {', '.join(str(c) for c in cfg['concurrency'])} concurrent client(s); per "
        f"concurrency {cfg['warmup']} uncounted warm-up calls per tree, then {cfg['blocks']} blocks "
        f"of {cfg['block_size']} requests per tree, interleaved between the trees (before, after, after, before, before, after, ...; the first tree alternates per concurrency level).",
        "",
        "Overhead = `timings.total_ms - timings.queue_wait_ms - timings.strategy_ms`, all from the "
        "reply (ms). It is what the front door itself spends on one Answer: reading the metadata and "
        "authenticating the API key (a PostgreSQL lookup), validating the query, the idempotency "
        "check and the records writes (request row, routing decision), classification "
        "(tokenize -> Triton round trip -> policy), the queue-depth check and the enqueue on the "
        "tier's Celery queue in Redis, the delivery of the worker's result back to the waiting call "
        "(Redis pub/sub + reading the stored result), and building the reply. Queue wait (enqueue "
        "to task start) and the strategy's own run are excluded; so is the gRPC transport outside "
        "the handler (in `client` latency only).",
        "",
        "## Overhead per Answer (ms)",
        "",
        *table_lines(report["summary"]),
        "",
        "`classify`: `timings.classify_ms` (part of the overhead). `client`: latency the gRPC client "
        "saw (everything, including the instant strategy and queue wait). `fallback`: answers "
        "routed by the rules fallback (Triton not answering in time).",
        "",
        "## Ratio after / before",
        "",
        *ratio_lines(report["summary"]),
        "",
        f"Interval: percentile bootstrap, {cfg['bootstrap']} resamples of each tree's blocks "
        "(independently; a block's requests share its moment's machine noise), ratio of the "
        "medians of the resampled blocks' requests.",
        "",
    ]
    if report.get("cpu") and report["cpu"]["rows"]:
        lines += ["## CPU per Answer (ms)", "",
                  "Each tree's own processes, read from /proc before and after each of its blocks: "
                  "the front door, and the worker pools (Celery main processes and their prefork "
                  "children). Not counted: the shared Redis, PostgreSQL, Triton, the instant LLM and "
                  "the client. The ceiling of a machine is its cores over the CPU per Answer.", "",
                  *cpu_lines(report["cpu"]), "",
                  f"Interval: percentile bootstrap, {cfg['bootstrap']} resamples of each tree's blocks.", ""]
    stage_rows = report.get("stages_ms") or {}
    names = sorted({stage for per in stage_rows.values() for stage in per})
    if names:
        lines += ["## Where the time goes (mean ms per Answer and stage, from each front door's "
                  "`arag_frontdoor_stage_seconds`; all calls of the run)", "",
                  "| tree | " + " | ".join(names) + " |", "| --- |" + " ---: |" * len(names)]
        for tree, per in stage_rows.items():
            if per:
                lines.append(f"| {tree} | " + " | ".join(_f(per.get(n), 2) for n in names) + " |")
        lines.append("")
    route_rows = {t: r for t, r in (report.get("route") or {}).items() if r}
    if route_rows:
        lines += ["## Route (decision only), single stream, client-side ms", "",
                  "| tree | calls | errors | p50 | p95 | p99 |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
        lines += [f"| {t} | {r['calls']} | {r['errors']} | {_f(r['p50_ms'], 2)} | {_f(r['p95_ms'], 2)} | "
                  f"{_f(r['p99_ms'], 2)} |" for t, r in route_rows.items()]
        lines.append("")
    if report.get("notes"):
        lines += ["## Notes", "", *[f"- {n}" for n in report["notes"]], ""]
    lines += ["Per-block timings and load, settings and every sample: `report.json`.", ""]
    return "\n".join(lines)


def print_table(summary: dict[str, Any], cpu: dict[str, Any] | None = None) -> None:
    for line in [*table_lines(summary), "", *ratio_lines(summary), "", *cpu_lines(cpu)]:
        print(line)


# --- main ----------------------------------------------------------------------------------------------

def _interrupt(signum: int, _frame: Any) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt(signal.Signals(signum).name)


def git(args: list[str], cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=12, help="blocks per tree and concurrency")
    parser.add_argument("--block-size", type=int, default=50, help="requests per block")
    parser.add_argument("--concurrency", default="1,4", help="concurrent clients, comma-separated")
    parser.add_argument("--warmup", type=int, default=20, help="uncounted calls per tree and concurrency")
    parser.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--route-calls", type=int, default=300, help="single-stream Route calls per tree")
    parser.add_argument("--router", choices=sorted(ROUTERS), default="shipped",
                        help="the classifier Triton serves (shipped: what users get)")
    parser.add_argument("--triton-per-tree", action="store_true",
                        help="each tree publishes its own model repository (its model "
                             "configuration) and gets its own Triton; default: one shared")
    parser.add_argument("--after-env", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting for the after tree's processes only (repeatable), e.g. "
                             "ARAG_SWITCH_INTERVAL_MS=0.5 to measure a setting against its default")
    parser.add_argument("--before-commit", default=BEFORE_COMMIT)
    parser.add_argument("--before-tree", type=Path, default=BEFORE_TREE)
    parser.add_argument("--workdir", type=Path, default=REPO / "var" / "bench-frontdoor")
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "frontdoor_overhead")
    parser.add_argument("--render", type=Path, default=None,
                        help="only write report.md again from this report.json")
    args = parser.parse_args(argv)
    if args.render:  # the summary is computed again from the samples
        report = json.loads(args.render.read_text())
        cfg = report["config"]
        samples = [Sample(**{k: v for k, v in s.items() if k != "overhead_ms"})
                   for s in report["samples"]]
        report["summary"] = summarize(samples, cfg["concurrency"], cfg["bootstrap"], cfg["seed"])
        report["cpu"] = cpu_summary(report["blocks"], cfg["concurrency"], cfg["bootstrap"], cfg["seed"])
        args.render.write_text(json.dumps(report, indent=1, default=str))
        (args.render.parent / "report.md").write_text(markdown(report))
        print_table(report["summary"], report["cpu"])
        return 0
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    concurrencies = [int(c) for c in args.concurrency.split(",") if c.strip()]
    bad = [item for item in args.after_env if "=" not in item]
    if bad:
        parser.error(f"--after-env takes NAME=VALUE, not {bad[0]!r}")
    after_env = dict(item.split("=", 1) for item in args.after_env)
    args.workdir = args.workdir.resolve()  # the trees run with their own cwd

    started_at = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    load_start = os.getloadavg()
    before_commit = ensure_before_tree(args.before_tree, args.before_commit)
    trees = {"before": args.before_tree, "after": REPO}
    commits = {"before": before_commit, "after": git(["rev-parse", "HEAD"], REPO)}
    logs = args.workdir / "logs"
    if logs.exists():
        import shutil

        shutil.rmtree(logs)
    logs.mkdir(parents=True)
    print(f"before: {before_commit[:12]} in {args.before_tree}; after: {REPO} (working tree)", flush=True)
    # One repository and Triton for both trees; with --triton-per-tree each tree publishes its own
    # (its own model configuration) and gets its own Triton.
    repositories = {
        name: model_repository(
            args.workdir / ("model_repositories" if not args.triton_per_tree
                            else f"model_repositories-{name}"),
            args.router, logs / "setup.log", trees[name] if args.triton_per_tree else REPO)
        for name in TREES
    }
    index_dir = build_index(args.workdir / "index", logs / "setup.log")

    from lab.harness.stack import Parts, lab_stack

    procs = Processes()
    samples: list[Sample] = []
    blocks: list[dict[str, Any]] = []
    route: dict[str, Any] = {}
    stacks: dict[str, TreeStack] = {}
    left: list[int] = []
    redis_db = {"before": 1, "after": 2}
    model_poll_s = 3600.0
    notes: list[str] = []
    try:
        with ExitStack() as stack:
            # the servers only: Redis, PostgreSQL, Triton (the before tree's repository) and the
            # instant LLM endpoint; no pools, front door or tenant of its own
            servers = stack.enter_context(lab_stack(
                args.workdir / "servers", Parts(broker="redis", records="postgres", classifier="triton", llm="instant"),
                pools=(), frontdoor=False, tenants=(), model_repository=repositories["before"]))
            redis_url, postgres_url = servers.redis.url, servers.settings.library.database_url
            print(f"redis {redis_url}, postgres {postgres_url}", flush=True)
            triton_of = {"before": servers.triton,
                         "after": (servers.start_triton("triton-after", repositories["after"])
                                   if args.triton_per_tree else servers.triton)}
            for name in TREES:
                print(f"{name}: triton {triton_of[name].url} ({repositories[name]})", flush=True)
            llm_url = servers.llm.url
            stack.callback(lambda: left.extend(procs.stop_all()))  # before the servers stop
            shared = {
                "ARAG_INDEX_DIR": str(index_dir), "ARAG_KB_DIR": str(args.workdir / "kb"),
                "ARAG_RETRIEVER": "tantivy",
                "LLM_BASE_URL": llm_url, "LLM_API": "chat", "ARAG_MODEL_POLL": str(model_poll_s),
            }
            for name in TREES:
                database_url = create_database(postgres_url, f"arag_{name}")
                per_tree = {**shared, "TRITON_GRPC_URL": triton_of[name].url,
                            "ARAG_MODEL_REPOSITORY": str(repositories[name]),
                            **(after_env if name == "after" else {})}
                env = tree_env(trees[name], settings_env(
                    name, per_tree, f"{redis_url.rsplit('/', 1)[0]}/{redis_db[name]}", database_url,
                    free_port(), args.workdir / f"broker-{name}"))
                stacks[name] = start_tree(procs, name, trees[name], commits[name], env, logs)
                print(f"{name}: front door on {stacks[name].listen}, modules from "
                      f"{Path(stacks[name].modules['adaptive_rag']).parents[1]}", flush=True)

            samples, blocks, route = asyncio.run(measure(stacks, concurrencies, args, Queries()))
            stages = {name: stage_means(stacks[name].env) for name in TREES}
            for name in TREES:  # still alive at the end? (a crashed pool would show here)
                pids = stacks[name].worker_pids
                if not all(_alive(p["pid"]) for p in [pids["pools"], pids["frontdoor"]]):
                    notes.append(f"{name}: front door or pools process had exited before the end")
    finally:
        left += procs.stop_all()  # whatever the stack's own unwinding did not reach
    if left:
        print(f"WARNING: processes still alive after stopping: {left}", file=sys.stderr)
        notes.append(f"processes still alive after stopping: {left}")

    summary = summarize(samples, concurrencies, args.bootstrap, args.seed)
    cpu = cpu_summary(blocks, concurrencies, args.bootstrap, args.seed)
    load_end = os.getloadavg()
    report = {
        "command": shlex.join([".venv/bin/python", "-m", "lab.experiments.frontdoor_overhead",
                               *(sys.argv[1:] if argv is None else argv)]),
        "started": started_at, "finished": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {"cpus": os.cpu_count(), "cpu": cpu_model(), "platform": platform.platform(),
                    "python": platform.python_version(), "interpreter": str(PYTHON)},
        "load_average_start": load_start, "load_average_end": load_end,
        "config": {"blocks": args.blocks, "block_size": args.block_size,
                   "concurrency": concurrencies, "warmup": args.warmup, "router": args.router,
                   "triton_per_tree": args.triton_per_tree,
                   "bootstrap": args.bootstrap, "seed": args.seed, "redis_db": redis_db,
                   "model_poll_s": model_poll_s, "pools": POOLS, "llm_answer": LLM_ANSWER,
                   "call_timeout_s": CALL_TIMEOUT_S, "after_env": after_env},
        "trees": {name: {"tree": str(trees[name]), "commit": commits[name],
                         "dirty": name == "after" and bool(git(["status", "--porcelain"], REPO)),
                         "changed_paths": (git(["status", "--porcelain"], REPO).splitlines()
                                           if name == "after" else []),
                         "modules": stacks[name].modules if name in stacks else None,
                         "processes": stacks[name].worker_pids if name in stacks else None,
                         "env": {k: v for k, v in stacks[name].env.items()
                                 if k.startswith(("ARAG_", "LLM_", "TRITON_", "REDIS_", "DATABASE_"))
                                 or k == "PYTHONPATH"} if name in stacks else None}
                  for name in TREES},
        "summary": summary, "cpu": cpu, "blocks": blocks, "notes": notes, "stages_ms": stages, "route": route,
        "samples": [{**asdict(s), "overhead_ms": s.overhead_ms} for s in samples],
    }
    print()
    print_table(summary, cpu)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    (args.out / "report.md").write_text(markdown(report))
    print(f"\nwrote {args.out / 'report.md'} and {args.out / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
