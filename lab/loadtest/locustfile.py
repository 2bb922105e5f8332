"""Locust load test of the Adaptive-RAG gRPC front door.

    locust -f lab/loadtest/locustfile.py --host 127.0.0.1:50051 --headless --profile steady \
        --users 4 --run-time 60s --csv var/loadtest/run/locust --html var/loadtest/run/locust.html

One user = one gRPC channel sending `Answer` calls back to back (closed loop; `--wait` adds think
time; `--rate R` makes it open loop at R Answers/s in all, each user paced by locust's
`constant_throughput(R/users)`): the query from the pools of `lab/loadtest/queries.py` in the tier mix (`--mix`, default
A=60,B=30,C=10), `query` as UTF-8 bytes, a fresh uuid4 `client_request_id`, the API key of
`ARAG_API_KEY` as `authorization: Bearer ...`. Stats rows are per tier the reply reports
(`Answer tier=A`); failures are grouped by gRPC status code. The load shape is a profile
(`--profile steady|step|spike|soak`, `lab/loadtest/shapes.py`). With `--csv PREFIX` it also writes
`PREFIX_requests.jsonl` (one line per call: tier, expected tier, code, latency, the reply's
timings) and `PREFIX_samples.jsonl`/`.csv` (queue depth and front-door metrics every
`--sample-interval` s; `--metrics-url`, `REDIS_URL` or `--broker-dir` say where to look).
Exit code: 0 unless a failure the profile does not expect happened (`--expect-failures`).
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `locust -f lab/loadtest/locustfile.py` from anywhere
    sys.path.insert(0, str(REPO))

from locust import LoadTestShape, constant_throughput, events, task  # noqa: E402  (locust monkey-patches on import)
from locust.exception import LocustError  # noqa: E402
from locust.runners import MasterRunner, WorkerRunner  # noqa: E402

import grpc  # noqa: E402
import grpc.experimental.gevent as grpc_gevent  # noqa: E402

grpc_gevent.init_gevent()  # before any channel is created

from lab.loadtest import queries, shapes  # noqa: E402
from lab.loadtest.grpc_user import GrpcUser  # noqa: E402
from lab.loadtest.sampler import Sampler  # noqa: E402
from services.frontdoor.stubs import pb2, pb2_grpc  # noqa: E402

LOG = logging.getLogger("loadtest")
STATE: dict[str, Any] = {"picker": None, "sampler": None, "sampler_greenlet": None, "requests_log": None,
                         "expected_failures": (), "profile": None}
_LOG_LOCK = threading.Lock()


@events.init_command_line_parser.add_listener
def _options(parser) -> None:
    # parser.add_argument (not a group): only it knows locust's web-UI flags such as is_secret
    group = parser
    group.add_argument("--load-profile", choices=list(shapes.PROFILES), default="steady",
                       env_var="ARAG_LOAD_PROFILE", help="load shape [ARAG_LOAD_PROFILE] (default steady)")
    group.add_argument("--mix", default=queries.DEFAULT_MIX, env_var="ARAG_LOAD_MIX",
                       help=f"share of queries per expected tier [ARAG_LOAD_MIX] (default {queries.DEFAULT_MIX})")
    group.add_argument("--query-source", choices=list(queries.SOURCES), default="all",
                       env_var="ARAG_LOAD_QUERIES",
                       help="demo help-centre questions, benchmark test split, or both [ARAG_LOAD_QUERIES]")
    group.add_argument("--data-dir", default=None, env_var="ARAG_DATA_DIR",
                       help="benchmark files [ARAG_DATA_DIR] (default ../shared/data)")
    group.add_argument("--per-dataset", type=int, default=200, env_var="ARAG_LOAD_PER_DATASET",
                       help="benchmark questions kept per dataset (test split) [ARAG_LOAD_PER_DATASET]")
    group.add_argument("--api-key", default="", env_var="ARAG_API_KEY", is_secret=True,
                       help="front-door API key [ARAG_API_KEY]")
    group.add_argument("--answer-timeout", type=float, default=120.0, env_var="ARAG_LOAD_TIMEOUT",
                       help="gRPC deadline of one Answer in s [ARAG_LOAD_TIMEOUT] (default 120)")
    group.add_argument("--wait", type=float, default=0.0, env_var="ARAG_LOAD_WAIT",
                       help="think time between a user's calls in s [ARAG_LOAD_WAIT] (default 0)")
    group.add_argument("--rate", type=float, default=0.0, env_var="ARAG_LOAD_RATE",
                       help="open-loop offered rate in Answers/s over all users [ARAG_LOAD_RATE]: each "
                            "user paced by locust's constant_throughput(RATE/users); 0 = closed loop "
                            "(default). Needs users >= RATE x latency (s) to be sustained; overrides --wait")
    group.add_argument("--step-seconds", type=float, default=30.0, env_var="ARAG_LOAD_STEP_SECONDS",
                       help="step profile: seconds per step [ARAG_LOAD_STEP_SECONDS] (default 30)")
    group.add_argument("--max-users", type=int, default=16, env_var="ARAG_LOAD_MAX_USERS",
                       help="step profile: last step 1,2,4,..,N users [ARAG_LOAD_MAX_USERS] (default 16)")
    group.add_argument("--spike-users", type=int, default=16, env_var="ARAG_LOAD_SPIKE_USERS",
                       help="spike profile: users in the spike [ARAG_LOAD_SPIKE_USERS] (default 16)")
    group.add_argument("--expect-failures", default=None, env_var="ARAG_LOAD_EXPECT_FAILURES",
                       help="gRPC codes that do not fail the run, comma-separated [ARAG_LOAD_EXPECT_FAILURES] "
                            "(default: the profile's: spike RESOURCE_EXHAUSTED, others none)")
    group.add_argument("--metrics-url", default=None, env_var="ARAG_LOAD_METRICS_URL",
                       help="front door /metrics to sample [ARAG_LOAD_METRICS_URL]")
    group.add_argument("--redis-url", default=None, env_var="REDIS_URL",
                       help="Redis broker whose queue depth is sampled [REDIS_URL]")
    group.add_argument("--broker-dir", default=None, env_var="ARAG_BROKER_DIR",
                       help="filesystem broker whose queue depth is sampled (no REDIS_URL) [ARAG_BROKER_DIR]")
    group.add_argument("--sample-interval", type=float, default=5.0, env_var="ARAG_LOAD_SAMPLE_INTERVAL",
                       help="seconds between samples [ARAG_LOAD_SAMPLE_INTERVAL] (default 5)")
    group.add_argument("--samples-out", default=None, help="samples JSONL (default PREFIX_samples.jsonl with --csv)")
    group.add_argument("--requests-log", default=None,
                       help="per-call JSONL (default PREFIX_requests.jsonl with --csv)")
    group.add_argument("--seed", type=int, default=0, env_var="ARAG_LOAD_SEED", help="query order seed")
    group.add_argument("--distinct", action="store_true", default=False, env_var="ARAG_LOAD_DISTINCT",
                       help="tag every query text [seed.pass] so none repeats (no routing-cache hits)")


def profile_options(options: Any, users_given: int | None) -> shapes.ProfileOptions:
    base = shapes.ProfileOptions()
    return shapes.ProfileOptions(
        users=users_given or base.users,
        spawn_rate=float(options.spawn_rate or base.spawn_rate),
        run_time_s=float(options.run_time) if options.run_time else None,
        step_seconds=options.step_seconds, max_users=options.max_users, spike_users=options.spike_users,
    )


class ProfileShape(LoadTestShape):
    """The profile chosen with `--profile` (locust runs the first shape class of a locustfile, so
    this one delegates to `lab.loadtest.shapes`); reads --users, --spawn-rate and --run-time."""

    use_common_options = True

    def __init__(self) -> None:
        super().__init__()
        self.profile: shapes.Profile | None = None

    def tick(self):
        if self.profile is None:  # not configured by the init event (e.g. a library run)
            options = self.runner.environment.parsed_options
            self.profile = shapes.make_profile(options.load_profile, profile_options(options, options.num_users))
        return self.profile.at(self.get_run_time())


def _output_path(explicit: str | None, csv_prefix: str | None, suffix: str) -> Path | None:
    if explicit:
        return Path(explicit)
    return Path(f"{csv_prefix}_{suffix}") if csv_prefix else None


@events.init.add_listener
def _setup(environment, **_kwargs) -> None:
    """Profile, query pools and per-call log from the options; a bad option ends locust (exit 2)."""
    options = environment.parsed_options
    if options is None:
        return
    try:
        _configure(environment, options)
    except Exception as exc:  # noqa: BLE001 - event hooks swallow exceptions; SystemExit is not
        LOG.error("load test not started: %s", exc)
        raise SystemExit(2) from exc


def _configure(environment, options) -> None:
    if (getattr(options, "rate", 0.0) or 0.0) < 0:
        raise ValueError(f"--rate must be >= 0 (0: closed loop), got {options.rate}")
    profile = shapes.make_profile(options.load_profile, profile_options(options, options.num_users))
    STATE["profile"] = profile
    if isinstance(environment.shape_class, ProfileShape):
        environment.shape_class.profile = profile
    expected = options.expect_failures
    STATE["expected_failures"] = (tuple(c.strip().upper() for c in expected.split(",") if c.strip())
                                  if expected is not None else profile.expected_failures)
    if not isinstance(environment.runner, MasterRunner):  # the processes that run users
        pools = queries.build_pools(options.query_source, Path(options.data_dir) if options.data_dir else None,
                                    options.per_dataset)
        STATE["picker"] = queries.QueryPicker(pools, queries.parse_mix(options.mix), seed=options.seed,
                                              distinct=options.distinct)
        sizes = ", ".join(f"{t}: {len(p)}" for t, p in pools.items())
        LOG.info("profile %s, mix %s, query pools %s, %s", profile.name, options.mix, sizes,
                 f"open loop at {options.rate:g} Answers/s over {options.num_users} users"
                 if getattr(options, "rate", 0.0) else "closed loop")
        log_path = _output_path(options.requests_log, options.csv_prefix, "requests.jsonl")
        if log_path:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            STATE["requests_log"] = log_path.open("a", encoding="utf-8")


@events.request.add_listener
def _log_request(request_type, name, response_time, response_length, exception=None, context=None,
                 start_time=None, **_kwargs) -> None:
    out = STATE["requests_log"]
    if out is None or request_type != "grpc":
        return
    row = {"time": round(time.time(), 3), "start": round(start_time or time.time() - response_time / 1000, 3),
           "name": name, "ms": round(response_time, 2), "bytes": response_length, "ok": exception is None,
           **(context or {})}
    with _LOG_LOCK:
        out.write(json.dumps(row) + "\n")


@events.test_start.add_listener
def _start_sampler(environment, **_kwargs) -> None:
    options = environment.parsed_options
    if options is None or isinstance(environment.runner, WorkerRunner) or STATE["sampler"] is not None:
        return
    out = _output_path(options.samples_out, options.csv_prefix, "samples.jsonl")
    if out is None:
        return
    runner = environment.runner

    def stats() -> dict[str, float]:
        total = runner.stats.total
        return {"users": runner.user_count, "rps": round(total.current_rps, 3),
                "fail_rps": round(total.current_fail_per_sec, 3)}

    sampler = Sampler(out, metrics_url=options.metrics_url, redis_url=options.redis_url,
                      broker_dir=Path(options.broker_dir) if options.broker_dir else None,
                      interval_s=options.sample_interval, stats=stats)
    import gevent

    STATE["sampler"] = sampler
    STATE["sampler_greenlet"] = gevent.spawn(sampler.run)


@events.test_stop.add_listener
def _stop_sampler(environment, **_kwargs) -> None:
    sampler = STATE["sampler"]
    if sampler is None:
        return
    sampler.stop()
    greenlet = STATE["sampler_greenlet"]
    if greenlet is not None:
        greenlet.join(timeout=10)
    try:
        sampler.sample()  # the state right at the end
    except Exception:  # noqa: BLE001
        LOG.exception("last sample failed")
    sampler.close()
    STATE["sampler"] = None


def unexpected_failures(environment) -> list[tuple[str, str, int]]:
    """(name, error, occurrences) of every failure whose gRPC code the profile does not expect."""
    expected = set(STATE["expected_failures"])
    found = []
    for error in environment.runner.stats.errors.values():
        text = str(error.error)
        code = text.split(":", 1)[0].strip()
        if code not in expected:
            found.append((error.name, text, error.occurrences))
    return found


@events.quitting.add_listener
def _exit_code(environment, **_kwargs) -> None:
    _stop_sampler(environment)
    out = STATE["requests_log"]
    if out is not None:
        out.close()
        STATE["requests_log"] = None
    if isinstance(environment.runner, WorkerRunner):
        return
    unexpected = unexpected_failures(environment)
    if unexpected:
        for name, text, count in unexpected:
            LOG.error("unexpected failure: %s %s (%d times)", name, text, count)
        environment.process_exit_code = 1
    elif environment.runner.stats.errors and not environment.runner.exceptions:
        LOG.info("only expected failures (%s)", ", ".join(STATE["expected_failures"]))
        environment.process_exit_code = 0


class AdaptiveRagUser(GrpcUser):
    """Sends Answer calls back to back; the query from the shared picker (tier mix)."""

    stub_class = pb2_grpc.AdaptiveRagStub

    def wait_time(self) -> float:
        options = self.environment.parsed_options
        if options is None:
            return 0.0
        rate = getattr(options, "rate", 0.0) or 0.0
        if rate > 0:  # open loop at a fixed rate: locust's own pacing, RATE/users per user
            pacer = getattr(self, "_pacer", None)
            if pacer is None:
                pacer = self._pacer = constant_throughput(rate / max(1, options.num_users or 1))
            return pacer(self)
        return options.wait

    def on_start(self) -> None:
        options = self.environment.parsed_options
        key = (options.api_key if options is not None else "") or os.environ.get("ARAG_API_KEY", "")
        if not key:
            raise LocustError("no API key: set ARAG_API_KEY (or --api-key); `arag keys create --tenant T` makes one")
        self.auth = (("authorization", f"Bearer {key}"),)
        self.timeout = options.answer_timeout if options is not None else 120.0
        if STATE["picker"] is None:
            STATE["picker"] = queries.QueryPicker(queries.build_pools("demo"), queries.parse_mix(queries.DEFAULT_MIX))
        rate = (getattr(options, "rate", 0.0) or 0.0) if options is not None else 0.0
        if rate > 0:
            # locust starts users in batches (once a second); without a random phase each batch
            # would call at the same instant every period (bursts, not a steady rate)
            import gevent

            gevent.sleep(random.uniform(0.0, max(1, options.num_users or 1) / rate))
            self._cp_last_run = time.perf_counter()  # constant_throughput's clock starts now

    @task
    def answer(self) -> None:
        query = STATE["picker"].next()
        self.call_context = {"expected_tier": query.expected_tier, "source": query.source}
        request = pb2.AnswerRequest(query=query.text.encode("utf-8"), client_request_id=str(uuid.uuid4()))
        try:
            self.stub.Answer(request, metadata=self.auth, timeout=self.timeout)
        except grpc.RpcError:
            pass  # recorded by the interceptor as a failure of its status code
