"""`arag capacity`: how many workers each tier needs for a query rate, a tier mix and a p95 target
(M/M/c, Erlang C; the formulas are in `adaptive_rag.capacity`)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from adaptive_rag.capacity import (
    CapacityError, CapacityPlan, parse_service_time_report, parse_tier_values, plan_capacity,
)
from adaptive_rag.cli.common import console


def _p95_targets(text: str) -> float | dict[str, float]:
    try:
        return float(text)
    except ValueError:
        return parse_tier_values(text, "--p95")


def _read_report(path: Path) -> dict[str, float]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CapacityError(f"service-time report not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CapacityError(f"cannot read service-time report {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise CapacityError(f"service-time report {path} is not JSON: {exc}") from None
    return parse_service_time_report(data)


def _table(plan: CapacityPlan, concurrency: int) -> Table:
    table = Table(title=f"{plan.rate:g} queries/s, max utilization {plan.max_utilization:g}: "
                        f"{plan.total_workers} workers (M/M/c per tier)")
    for name in ("tier", "arrival q/s", "service s", "workers", "replicas", "utilization",
                 "Wq mean s", "Wq p95 s", "p95 s (target)", "queue target", "listLength/replica",
                 "bound by"):
        table.add_column(name, justify="left" if name in ("tier", "bound by") else "right")
    for t in plan.tiers:
        table.add_row(
            t.tier, f"{t.arrival_rate:g}", f"{t.service_time_s:g}", str(t.workers),
            str(math.ceil(t.workers / concurrency)), f"{t.utilization:.3f}", f"{t.wq_mean_s:.3g}",
            f"{t.wq_p95_s:.3g}", f"{t.response_p95_s:.2f} ({t.p95_target_s:g})",
            str(t.queue_length_target), str(t.list_length_per_worker * concurrency), t.binding,
        )
    return table


def capacity(
    rate: Annotated[float, typer.Option("--rate", help="total arrival rate, queries/s")],
    mix: Annotated[str, typer.Option("--mix", help="share of each tier, e.g. A=0.6,B=0.3,C=0.1 (must sum to 1 within 1e-6)")],
    p95: Annotated[str, typer.Option("--p95", help="target p95 of the time in system (queue wait + service), seconds; one number or per tier A=..,B=..,C=..")],
    service_times: Annotated[Optional[str], typer.Option("--service-times", help="mean service time per task of one worker process, seconds: A=..,B=..,C=..")] = None,
    from_report: Annotated[Optional[Path], typer.Option("--from-report", help='load-run report JSON: {"service_time_s": {"A": ..}} or {"per_tier": {"A": {"service_time_s": ..}}}')] = None,
    max_utilization: Annotated[float, typer.Option("--max-utilization", help="upper bound of lambda*s/c per tier")] = 0.8,
    concurrency: Annotated[int, typer.Option("--concurrency", help="worker processes per replica (Celery --concurrency): sets replicas and KEDA listLength per replica")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="print the plan as JSON")] = False,
) -> None:
    """Workers per tier for a query rate, a tier mix and a p95 target (M/M/c queueing model).


    Model, per tier: queries arrive as a Poisson stream of rate R * share; c identical workers
    (processes), each serving one task at a time, with exponential service times of the given
    mean s; one FIFO queue per tier. Erlang C gives P(wait) and the wait distribution
    P(Wq > t) = C(c, a) exp(-(c/s - lambda) t) exactly (Gross & Harris, Fundamentals of Queueing
    Theory, M/M/c). The p95 of the time in system T = Wq + service uses the exact closed form of
    P(T > t) (a mix of an exponential and a hypoexponential), solved for P(T > t) = 0.05 by
    bisection. Each tier gets the smallest c with utilization lambda*s/c <= --max-utilization and
    p95(T) <= --p95. Since T >= service, a target at or below s * ln 20 (the service time's own
    p95) is unreachable; the error names the smallest achievable p95.


    Queue target: a new task with n tasks queued ahead waits about n / (c/s) (tasks ahead of you /
    service rate = your wait), so the queue may hold floor(c/s * (p95 - s)) tasks before the wait
    eats the p95 budget minus the mean service time. KEDA's Redis listLength is per replica
    (replicas = ceil(LLEN / listLength)): use floor(concurrency/s * (p95 - s)), shown as
    listLength/replica. Tasks a Celery worker has prefetched are no longer in the list.


    Limits: real service times are not exponential (LLM prompt processing dominates and is far
    less variable; multi-step C runs vary with their step count), arrivals are burstier than
    Poisson and the tiers share CPUs. Use the numbers for sizing, then check them with a load run.
    """
    if (service_times is None) == (from_report is None):
        raise typer.BadParameter("give exactly one of --service-times and --from-report")
    if concurrency < 1:
        raise CapacityError(f"--concurrency must be at least 1, got {concurrency}")
    times = (parse_tier_values(service_times, "--service-times") if service_times is not None
             else _read_report(from_report))  # type: ignore[arg-type]
    plan = plan_capacity(rate, parse_tier_values(mix, "--mix"), times, _p95_targets(p95), max_utilization)
    if as_json:
        out = plan.to_dict()
        out["concurrency"] = concurrency
        for tier in out["tiers"]:
            tier["replicas"] = math.ceil(tier["workers"] / concurrency)
            tier["list_length_per_replica"] = tier["list_length_per_worker"] * concurrency
        print(json.dumps(out, indent=2))
        return
    console.print(_table(plan, concurrency))
