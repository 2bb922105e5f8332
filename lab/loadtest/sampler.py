"""While a load test runs: every few seconds, each Celery queue's depth and the front door's
Prometheus `/metrics`, as a time series (one JSON line per sample, plus a flat CSV).

Queue depth: with a Redis broker (`REDIS_URL`), LLEN of each queue of
`adaptive_rag.contracts.QUEUE_FOR_TIER` plus `SHADOW_QUEUE` (summed over kombu's priority lists,
`<queue>` and `<queue>\\x06\\x16<priority>`); with the server-less filesystem broker, the same
count Celery's producers use (`workers.client.CeleryTaskQueue(...).depth`, the queue's message
files under `ARAG_BROKER_DIR`). Messages workers already reserved are not counted.

Front door (`/metrics`): the Answer latency histogram `arag_frontdoor_request_seconds` per tier
(cumulative buckets; p50/p95/p99 of the answers that finished between two samples, interpolated
inside the buckets like PromQL's `histogram_quantile`), answers per tier and code
`arag_frontdoor_requests_total`, rules-fallback decisions `arag_classifier_fallback_total`,
rejections per tier `arag_frontdoor_rejected_total`, and the queue depth the front door last saw
(`arag_queue_depth`).
"""

from __future__ import annotations

import csv
import json
import logging
import math
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from adaptive_rag.contracts import QUEUE_FOR_TIER, SHADOW_QUEUE

QUEUES = (*QUEUE_FOR_TIER.values(), SHADOW_QUEUE)
TIERS = ("A", "B", "C")
QUANTILES = (0.5, 0.95, 0.99)
# kombu's Redis transport keeps one list per priority step: "<queue>" and "<queue>\x06\x16<n>".
KOMBU_PRIORITY_SEP = "\x06\x16"
KOMBU_PRIORITY_STEPS = (0, 3, 6, 9)
LOG = logging.getLogger("lab.loadtest.sampler")


# --- queue depth ----------------------------------------------------------------------------------

class RedisDepth:
    def __init__(self, url: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)

    def __call__(self) -> dict[str, int]:
        pipe = self.client.pipeline(transaction=False)
        for queue in QUEUES:
            for step in KOMBU_PRIORITY_STEPS:
                pipe.llen(queue if step == 0 else f"{queue}{KOMBU_PRIORITY_SEP}{step}")
        counts = pipe.execute()
        n = len(KOMBU_PRIORITY_STEPS)
        return {queue: int(sum(counts[i * n:(i + 1) * n])) for i, queue in enumerate(QUEUES)}

    def close(self) -> None:
        self.client.close()


class FilesystemDepth:
    def __init__(self, broker_dir: Path) -> None:
        from workers.celery_app import create_app
        from workers.client import CeleryTaskQueue
        from workers.settings import WorkerSettings

        # kombu's filesystem transport has no host; its "No hostname was supplied" warning is noise
        logging.getLogger("kombu.connection").setLevel(logging.ERROR)
        settings = WorkerSettings.model_validate({"broker_dir": Path(broker_dir), "redis_url": None})
        self.queue = CeleryTaskQueue(create_app(settings))

    def __call__(self) -> dict[str, int]:
        return {queue: self.queue.depth(queue) for queue in QUEUES}

    def close(self) -> None:
        self.queue.app.close()


def depth_reader(redis_url: str | None, broker_dir: Path | None) -> Any:
    """The queue-depth reader for this broker, or None (no broker to look at)."""
    if redis_url:
        return RedisDepth(redis_url)
    if broker_dir and Path(broker_dir).is_dir():
        return FilesystemDepth(Path(broker_dir))
    return None


# --- front door metrics ---------------------------------------------------------------------------

def parse_metrics(text: str) -> dict[str, Any]:
    """The front door's series this sampler keeps, from Prometheus text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, Any] = {
        "buckets": {}, "answers": {}, "rejected": {}, "fallback_total": 0.0, "queue_depth": {},
        "model_version": None,
    }
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, sample.value
            if name == "arag_frontdoor_request_seconds_bucket" and labels.get("method") == "Answer" \
                    and labels.get("code") == "OK":
                tier = labels.get("tier", "?")
                le = labels["le"]
                buckets = out["buckets"].setdefault(tier, {})
                buckets[le] = buckets.get(le, 0.0) + value
            elif name == "arag_frontdoor_requests_total" and labels.get("method") == "Answer":
                key = f"{labels.get('tier', '?')}/{labels.get('code', '?')}"
                out["answers"][key] = out["answers"].get(key, 0.0) + value
            elif name == "arag_frontdoor_rejected_total":
                out["rejected"][labels.get("tier", "?")] = value
            elif name == "arag_classifier_fallback_total":
                out["fallback_total"] = value
            elif name == "arag_queue_depth":
                out["queue_depth"][labels.get("queue", "?")] = value
            elif name == "arag_classifier_model_version":
                out["model_version"] = value
    return out


def _le(bound: str) -> float:
    return math.inf if bound in ("+Inf", "inf", "Inf") else float(bound)


def histogram_quantile(q: float, buckets: Mapping[str, float]) -> float | None:
    """Quantile `q` of cumulative `buckets` ({le: count}), linear inside a bucket (PromQL's way);
    None without observations. The +Inf bucket answers with the highest finite bound."""
    ordered = sorted(((_le(le), count) for le, count in buckets.items()), key=lambda x: x[0])
    if not ordered or ordered[-1][1] <= 0:
        return None
    total = ordered[-1][1]
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


def bucket_delta(now: Mapping[str, float], before: Mapping[str, float] | None) -> dict[str, float]:
    before = before or {}
    return {le: max(0.0, count - before.get(le, 0.0)) for le, count in now.items()}


# --- the sampler ----------------------------------------------------------------------------------

CSV_FIELDS = (
    ["time", "elapsed_s", "users", "locust_rps", "locust_fail_rps"]
    + [f"depth_{q}" for q in QUEUES]
    + ["fallback_total"] + [f"rejected_{t}" for t in TIERS] + [f"answered_{t}" for t in TIERS]
    + [f"fd_p{int(q * 100)}_{t}_s" for t in TIERS for q in QUANTILES]
    + ["errors"]
)


class Sampler:
    """Samples queue depth, front-door metrics and (optionally) the load generator's own numbers
    (`stats`: a callable returning users / rps / fail_rps) every `interval_s` seconds."""

    def __init__(
        self, out_jsonl: Path, *, metrics_url: str | None = None, redis_url: str | None = None,
        broker_dir: Path | None = None, interval_s: float = 5.0,
        stats: Callable[[], Mapping[str, float]] | None = None, out_csv: Path | None = None,
    ) -> None:
        self.out_jsonl = Path(out_jsonl)
        self.out_csv = Path(out_csv) if out_csv else self.out_jsonl.with_suffix(".csv")
        self.metrics_url = metrics_url
        self.redis_url, self.broker_dir = redis_url, broker_dir
        self.interval_s = interval_s
        self.stats = stats
        self.started = time.time()
        self._depth: Any = None
        self._depth_failed = False
        self._previous_buckets: dict[str, dict[str, float]] = {}
        self._stop = False
        self.samples = 0
        self.out_jsonl.parent.mkdir(parents=True, exist_ok=True)
        self._jsonl = self.out_jsonl.open("a", encoding="utf-8")
        new_csv = not self.out_csv.exists() or self.out_csv.stat().st_size == 0
        self._csv_file = self.out_csv.open("a", newline="", encoding="utf-8")
        self._csv = csv.DictWriter(self._csv_file, fieldnames=CSV_FIELDS)
        if new_csv:
            self._csv.writeheader()

    def _queue_depth(self, errors: list[str]) -> dict[str, int] | None:
        if self._depth is None and not self._depth_failed:
            try:
                self._depth = depth_reader(self.redis_url, self.broker_dir)
            except Exception as exc:  # noqa: BLE001 - sampling must never stop the load test
                self._depth_failed = True
                errors.append(f"queue depth reader: {exc}")
            if self._depth is None:
                self._depth_failed = True
        if self._depth is None:
            return None
        try:
            return self._depth()
        except Exception as exc:  # noqa: BLE001
            errors.append(f"queue depth: {exc}")
            return None

    def sample(self) -> dict[str, Any]:
        now = time.time()
        errors: list[str] = []
        row: dict[str, Any] = {"time": round(now, 3), "elapsed_s": round(now - self.started, 3)}
        if self.stats:
            try:
                row["locust"] = dict(self.stats())
            except Exception as exc:  # noqa: BLE001
                errors.append(f"locust stats: {exc}")
        row["queue_depth"] = self._queue_depth(errors)
        if self.metrics_url:
            try:
                with urllib.request.urlopen(self.metrics_url, timeout=5) as response:
                    metrics = parse_metrics(response.read().decode())
                window: dict[str, dict[str, float | None]] = {}
                for tier, buckets in metrics["buckets"].items():
                    delta = bucket_delta(buckets, self._previous_buckets.get(tier))
                    window[tier] = {f"p{int(q * 100)}": histogram_quantile(q, delta) for q in QUANTILES}
                    window[tier]["count"] = max(delta.values(), default=0.0)
                self._previous_buckets = metrics["buckets"]
                metrics["window"] = window
                row["frontdoor"] = metrics
            except Exception as exc:  # noqa: BLE001
                errors.append(f"metrics {self.metrics_url}: {exc}")
        row["errors"] = errors
        self._write(row)
        self.samples += 1
        return row

    def _write(self, row: dict[str, Any]) -> None:
        self._jsonl.write(json.dumps(row) + "\n")
        self._jsonl.flush()
        flat: dict[str, Any] = {"time": row["time"], "elapsed_s": row["elapsed_s"],
                                "errors": "; ".join(row["errors"])}
        locust_stats = row.get("locust") or {}
        flat.update(users=locust_stats.get("users"), locust_rps=locust_stats.get("rps"),
                    locust_fail_rps=locust_stats.get("fail_rps"))
        for queue, depth in (row.get("queue_depth") or {}).items():
            flat[f"depth_{queue}"] = depth
        fd = row.get("frontdoor")
        if fd:
            flat["fallback_total"] = fd["fallback_total"]
            for tier in TIERS:
                flat[f"rejected_{tier}"] = fd["rejected"].get(tier, 0.0)
                flat[f"answered_{tier}"] = fd["answers"].get(f"{tier}/OK", 0.0)
                for key, value in (fd["window"].get(tier) or {}).items():
                    if key.startswith("p"):
                        flat[f"fd_{key}_{tier}_s"] = value
        self._csv.writerow({k: v for k, v in flat.items() if k in CSV_FIELDS})
        self._csv_file.flush()

    def run(self) -> None:
        """Sample until `stop()` (a thread or a gevent greenlet: `time.sleep` yields under gevent)."""
        next_at = time.monotonic()
        while not self._stop:
            try:
                self.sample()
            except Exception:  # noqa: BLE001
                LOG.exception("sampling failed")
            next_at += self.interval_s
            while not self._stop and time.monotonic() < next_at:
                time.sleep(min(0.25, max(0.0, next_at - time.monotonic())))

    def stop(self) -> None:
        self._stop = True

    def close(self) -> None:
        self._stop = True
        if self._depth is not None:
            try:
                self._depth.close()
            except Exception:  # noqa: BLE001
                pass
        self._jsonl.close()
        self._csv_file.close()
