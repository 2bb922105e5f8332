"""`python -m lab.loadtest` (`make loadtest`): one headless locust run against the service, with its
report.

Without `--host` it starts the lab's stack first (`lab.harness.stack.lab_stack`) with the parts
`make demo` starts (embedded defaults, or the servers that REDIS_URL, DATABASE_URL,
OPENSEARCH_URL, TRITON_GRPC_URL/TRITON_URL, LLM_BASE_URL point at), creates an API key, runs
locust (`lab/loadtest/locustfile.py`) with the chosen profile, and stops everything; with `--host`
(and `ARAG_API_KEY`) it only loads that front door. `--instant-llm` starts the instant
OpenAI-compatible endpoint of `lab/harness/instant_llm.py` as the LLM (a measurement device: the
service without the model's cost), `--embedded-llm` a model copy in every worker process instead
of the one shared llama-server `make demo` starts.

Output, one folder per run: `var/loadtest/<run>/` (scratch, git-ignored) or, with `--publish`,
`reports/load/<run>/`: locust's CSV (`locust_stats.csv`, `_stats_history.csv`, `_failures.csv`)
and HTML (`locust.html`), the per-call log and the queue/metrics samples, and `report.md` with
PNG plots (`lab/loadtest/report.py`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import signal
import subprocess
import sys
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from infra.local.servers import stop_process

REPO = Path(__file__).resolve().parents[2]
LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"
PROFILES = ("steady", "step", "spike", "soak")
DEFAULT_USERS = 4
DEFAULT_RUN_TIME = "60s"
DEFAULT_USER_PERIOD_S = 4.0


def resolve_users(args: argparse.Namespace) -> None:
    """`--users`/`--spawn-rate` defaults; with `--rate`, enough users to offer it (each user one
    call per `--user-period` s, so a call may take that long without the rate dropping)."""
    if args.rate < 0:
        raise SystemExit(f"--rate must be >= 0, got {args.rate}")
    if args.users is None:
        args.users = max(1, math.ceil(args.rate * args.user_period)) if args.rate > 0 else DEFAULT_USERS
    if args.spawn_rate is None:
        args.spawn_rate = (max(2.0, args.users / max(1.0, min(args.user_period, 10.0)))
                           if args.rate > 0 else 2.0)


def _parse_seconds(text: str | None) -> float | None:
    if not text:
        return None
    from lab.loadtest.shapes import parse_duration

    return float(parse_duration(text))


def expected_length_s(args: argparse.Namespace) -> float:
    """How long the profile runs (for the subprocess timeout)."""
    from lab.loadtest.shapes import ProfileOptions, make_profile

    options = ProfileOptions(users=args.users, run_time_s=_parse_seconds(args.run_time),
                             step_seconds=args.step_seconds, max_users=args.max_users,
                             spike_users=args.spike_users)
    return make_profile(args.load_profile, options).run_time_s


def locust_command(args: argparse.Namespace, out: Path, host: str, metrics_url: str | None,
                   redis_url: str | None, broker_dir: Path | None) -> list[str]:
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE.relative_to(REPO)), "--headless",
           "--host", host, "--load-profile", args.load_profile, "--users", str(args.users),
           "--spawn-rate", str(args.spawn_rate), "--mix", args.mix, "--query-source", args.query_source,
           "--csv", str(out / "locust"), "--csv-full-history", "--html", str(out / "locust.html"),
           "--sample-interval", str(args.sample_interval), "--answer-timeout", str(args.answer_timeout),
           "--step-seconds", str(args.step_seconds), "--max-users", str(args.max_users),
           "--spike-users", str(args.spike_users), "--only-summary"]
    if args.run_time:
        cmd += ["--run-time", args.run_time]
    if metrics_url:
        cmd += ["--metrics-url", metrics_url]
    if redis_url:
        cmd += ["--redis-url", redis_url]
    elif broker_dir:
        cmd += ["--broker-dir", str(broker_dir)]
    if args.expect_failures is not None:
        cmd += ["--expect-failures", args.expect_failures]
    if getattr(args, "rate", 0):
        cmd += ["--rate", f"{args.rate:g}"]
    return cmd + list(args.locust_args)


def run_locust(cmd: list[str], env: dict[str, str], log_path: Path, timeout_s: float) -> int:
    """Run locust to its end (bounded); Ctrl-C / SIGTERM stop it too."""
    with log_path.open("w") as log:
        log.write(f"$ {shlex.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            log.write(f"\n[loadtest] locust still running after {timeout_s:.0f} s: stopped\n")
            return_code = 124
        except BaseException:
            return_code = 130
            raise
        finally:
            stop_process(proc, signal.SIGINT, 30.0)  # locust writes its CSV/HTML on the way out
        return return_code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab.loadtest", description=__doc__.split("\n\n")[0],
        epilog="Anything after `--` goes to locust as is (e.g. -- --wait 0.5 --per-dataset 50).")
    parser.add_argument("--load-profile", "--profile", dest="load_profile", choices=PROFILES,
                        default=os.environ.get("ARAG_LOAD_PROFILE", "steady"))
    parser.add_argument("--users", "-u", type=int, default=None,
                        help=f"users (steady/soak, spike's base) (default {DEFAULT_USERS}; with --rate: "
                             f"enough for it, ceil(RATE x --user-period))")
    parser.add_argument("--spawn-rate", "-r", type=float, default=None,
                        help="users started per s (default 2; with --rate: all users within one --user-period)")
    parser.add_argument("--rate", type=float, default=float(os.environ.get("ARAG_LOAD_RATE", "0") or 0),
                        help="open loop: offer RATE Answers/s in all, each user paced by locust's "
                             "constant_throughput(RATE/users) (default 0: closed loop)")
    parser.add_argument("--user-period", type=float, default=DEFAULT_USER_PERIOD_S,
                        help="with --rate: seconds between one user's calls, i.e. users = "
                             "ceil(RATE x this); keep it above the worst latency expected "
                             f"(default {DEFAULT_USER_PERIOD_S:g})")
    parser.add_argument("--run-time", "-t", default=None,
                        help=f"e.g. 60s, 5m (default: steady {DEFAULT_RUN_TIME}, others their own length)")
    parser.add_argument("--mix", default=os.environ.get("ARAG_LOAD_MIX", "A=60,B=30,C=10"))
    parser.add_argument("--query-source", choices=("demo", "benchmark", "all"),
                        default=os.environ.get("ARAG_LOAD_QUERIES", "all"))
    parser.add_argument("--step-seconds", type=float, default=30.0)
    parser.add_argument("--max-users", type=int, default=16)
    parser.add_argument("--spike-users", type=int, default=16)
    parser.add_argument("--expect-failures", default=None, help="gRPC codes that do not fail the run")
    parser.add_argument("--answer-timeout", type=float, default=120.0)
    parser.add_argument("--sample-interval", type=float, default=2.0)
    parser.add_argument("--name", default=None, help="run name (default <profile>-<UTC time>)")
    parser.add_argument("--publish", action="store_true",
                        help="write under reports/load/<run> (to commit) instead of var/loadtest/<run>")
    parser.add_argument("--out", type=Path, default=None, help="the run's folder (overrides the two above)")
    parser.add_argument("--workdir", type=Path, default=Path("var/loadtest/stack"),
                        help="the local stack's index, database, broker and logs")
    parser.add_argument("--knowledge-base", type=Path, default=REPO / "demo" / "knowledge_base.jsonl")
    parser.add_argument("--instant-llm", action="store_true",
                        help="an instant OpenAI-compatible LLM endpoint instead of the model (measures the service)")
    parser.add_argument("--embedded-llm", action="store_true",
                        help="a copy of the model in every worker process instead of the one shared "
                             "llama-server (parallel slots, continuous batching) every worker calls")
    parser.add_argument("--host", default=None,
                        help="an already running front door (HOST:PORT): start nothing, key from ARAG_API_KEY")
    parser.add_argument("--metrics-url", default=os.environ.get("ARAG_LOAD_METRICS_URL"),
                        help="with --host: its /metrics")
    parser.add_argument("locust_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.locust_args and args.locust_args[0] == "--":
        args.locust_args = args.locust_args[1:]
    if args.run_time is None and args.load_profile == "steady":
        args.run_time = DEFAULT_RUN_TIME
    resolve_users(args)

    from rich.console import Console

    from lab.harness.stack import TIER_POOLS, Parts, lab_stack
    from services.demo.local import Interrupted, install_stop_signals

    console = Console(width=None if sys.stdout.isatty() else 160)
    started_at = datetime.now(timezone.utc)
    name = args.name or f"{args.load_profile}-{started_at:%Y%m%d-%H%M%S}"
    out = (args.out or (Path("reports/load") if args.publish else Path("var/loadtest")) / name).resolve()
    out.mkdir(parents=True, exist_ok=True)
    length_s = expected_length_s(args)
    info: dict[str, Any] = {
        "name": name, "profile": args.load_profile, "users": args.users, "run_time": args.run_time,
        "mix": args.mix, "query_source": args.query_source, "rate": args.rate or None, "started": started_at.isoformat(timespec="seconds"),
        "command": shlex.join(["python", "-m", "lab.loadtest", *(argv if argv is not None else sys.argv[1:])]),
        "expected_length_s": length_s,
        "users_desc": {"step": f"1..{args.max_users} users, doubling every {args.step_seconds:g} s",
                       "spike": f"{args.users} users, {args.spike_users} in the middle third"}.get(
                           args.load_profile, f"{args.users} users")
        + (f", open loop at {args.rate:g} Answers/s" if args.rate else ""),
    }
    from lab.loadtest.shapes import PROFILES as SHAPES

    info["expected_failures"] = (
        [c.strip().upper() for c in args.expect_failures.split(",") if c.strip()]
        if args.expect_failures is not None else list(SHAPES[args.load_profile].expected_failures))
    install_stop_signals()
    code = 1
    leftovers: list = []
    try:
        with ExitStack() as stack:
            env = dict(os.environ)
            if args.host:
                host, metrics_url, redis_url, broker_dir = args.host, args.metrics_url, env.get("REDIS_URL"), None
                if not env.get("ARAG_API_KEY"):
                    parser.error("--host needs ARAG_API_KEY (an API key of that front door)")
                info["target"] = f"front door {host} (running already)"
            else:
                console.rule(f"[bold]load test {name}: starting the local stack")
                parts = Parts(llm="instant" if args.instant_llm else "embedded" if args.embedded_llm else None)
                running = stack.enter_context(lab_stack(
                    args.workdir, parts, knowledge_base=args.knowledge_base, tenants=("loadtest",),
                    console=console, pools=(*TIER_POOLS, *(("shadow",) if _shadow_share() > 0 else ())),
                    # The run measures the service, not one tenant's rate limit (unless configured):
                    # the load-test tenant gets no token bucket; its tier shares still apply.
                    defaults={"tenant_limits": {"loadtest": {"rate_per_s": 0}}},
                ))
                info["stack"] = running.using
                host, metrics_url = running.address, running.metrics_url
                redis_url = running.settings.workers.redis_url
                broker_dir = None if redis_url else running.settings.workers.broker_dir
                env = {**os.environ, "ARAG_API_KEY": running.api_key("loadtest")}
                info["target"] = f"local stack, front door {host}"
            cmd = locust_command(args, out, host, metrics_url, redis_url, broker_dir)
            info["locust_command"] = shlex.join(cmd)
            console.rule(f"locust: profile {args.load_profile}, {info['users_desc']}, {length_s:.0f} s ({out / 'locust.log'})")
            code = run_locust(cmd, env, out / "locust.log", timeout_s=length_s + 180)
            info["locust_exit_code"] = code
            console.print(f"locust exited with {code}")
            if not args.host:
                console.rule("stopping the local stack")
        if not args.host:
            leftovers = running.leftovers
            info["leftovers"] = leftovers
            console.print("stopped everything it started; " + (
                "no process left" if not leftovers else f"[red]{len(leftovers)} leftover process(es) killed[/]"))
    except (KeyboardInterrupt, Interrupted) as exc:
        console.print(f"[yellow]interrupted ({type(exc).__name__} {exc}); everything it started is stopped[/]")
        info["interrupted"] = True
        code = 130
    finally:
        info["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        (out / "run.json").write_text(json.dumps(info, indent=2, default=str))
    from lab.loadtest.report import write_report

    summary = write_report(out)
    _print_summary(console, summary, out)
    return code if code else (1 if leftovers else 0)


def _shadow_share() -> float:
    try:
        return float(os.environ.get("ARAG_SHADOW_SHARE", "0") or 0)
    except ValueError:
        return 0.0


def _print_summary(console: Any, summary: dict[str, Any], out: Path) -> None:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:,.0f} ms"

    console.print(f"{summary['requests']} calls in {summary['duration_s']:.1f} s, "
                  f"{(summary['answered_rps'] or 0):.2f} answers/s; failures {summary['failures'] or 'none'}")
    for tier, t in summary["per_tier"].items():
        console.print(f"  tier {tier}: {t['answered']:>4} answered, {(t['rps'] or 0):.2f}/s, "
                      f"p50 {ms(t['p50_ms'])}, p95 {ms(t['p95_ms'])}, p99 {ms(t['p99_ms'])}")
    console.print(f"report: {out / 'report.md'}")


if __name__ == "__main__":
    sys.exit(main())
