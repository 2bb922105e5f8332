"""The soak's slope and verdict logic on synthetic samples (no stack)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from lab.experiments.soak import judge, role_of, summarize
from lab.harness.stats import theil_sen

MB = 1_000_000


def samples(minutes: int, rss: callable, fds: callable = lambda m: 40, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{"minute": float(m), "rss": rss(m) + rng.uniform(-0.2, 0.2) * MB, "uss": rss(m) / 2,
             "pss": rss(m), "fds": fds(m)} for m in range(minutes + 1)]


def test_theil_sen_matches_scipy_and_ignores_an_outlier():
    stats = pytest.importorskip("scipy.stats")
    xs = [float(x) for x in range(30)]
    ys = [2.0 * x + (x % 3) for x in xs]
    ys[7] = 1000.0  # one wild sample (a burst) moves least squares, not the median of slopes
    fit = theil_sen(list(zip(xs, ys)))
    ref = stats.theilslopes(ys, xs, alpha=0.95)
    assert fit["slope"] == pytest.approx(ref.slope)
    assert (fit["low"], fit["high"]) == pytest.approx((ref.low_slope, ref.high_slope))
    assert fit["slope"] == pytest.approx(2.0, abs=0.1)
    assert theil_sen([(1.0, 1.0), (1.0, 2.0), (1.0, 3.0)]) is None  # one x: no slope


def test_flat_memory_and_descriptors_pass():
    verdict = judge(samples(60, lambda m: 100 * MB), warmup_minutes=15)
    assert verdict["verdict"] == "pass", verdict
    assert abs(verdict["rss"]["pct_per_h"]) < 1
    assert verdict["samples_after_warmup"] == 46


def test_memory_growing_10_percent_an_hour_fails_and_3_percent_passes():
    fast = judge(samples(60, lambda m: 100 * MB + m * (10 * MB / 60)), warmup_minutes=15)
    assert fast["verdict"] == "fail"
    assert 8 < fast["rss"]["pct_per_h"] < 10  # 10 MB/h over a median of ~106 MB
    assert fast["rss"]["pct_low"] <= fast["rss"]["pct_per_h"] <= fast["rss"]["pct_high"]
    slow = judge(samples(60, lambda m: 100 * MB + m * (3 * MB / 60)), warmup_minutes=15)
    assert slow["verdict"] == "pass"


def test_shared_memory_paged_in_is_not_a_leak_but_own_memory_growing_is():
    """A PostgreSQL backend touching more of the fixed shared buffers grows its RSS, not its own
    RSS (RssAnon + RssFile): judged on the own part when the records have it."""
    def backend(own: callable, shared: callable) -> list[dict]:
        rows = samples(60, lambda m: own(m) + shared(m))
        for row in rows:
            row["own"] = own(row["minute"])
        return rows

    touching = judge(backend(lambda m: 20 * MB, lambda m: (40 + m) * MB), warmup_minutes=15)
    assert touching["rss"]["pct_per_h"] > 5 and touching["judged_on"] == "own"
    assert touching["verdict"] == "pass", touching
    leaking = judge(backend(lambda m: (20 + m / 6) * MB, lambda m: 40 * MB), warmup_minutes=15)
    assert leaking["verdict"] == "fail" and "own RSS" in leaking["reasons"][0]


def test_growth_only_during_the_warm_up_is_not_held_against_a_process():
    warming = judge(samples(90, lambda m: (50 + min(m, 30) * 2) * MB), warmup_minutes=35)
    assert warming["verdict"] == "pass"
    judged_from_start = judge(samples(90, lambda m: (50 + min(m, 30) * 2) * MB), warmup_minutes=0)
    assert judged_from_start["rss"]["pct_per_h"] > 5


def test_descriptors_that_keep_growing_fail_and_noise_does_not():
    leaking = judge(samples(60, lambda m: 100 * MB, fds=lambda m: 40 + m // 10), warmup_minutes=15)
    assert leaking["verdict"] == "fail"
    assert any("descriptors" in r for r in leaking["reasons"])
    noisy = judge(samples(60, lambda m: 100 * MB, fds=lambda m: 40 + (3 if m % 7 == 0 else 0)), warmup_minutes=15)
    assert noisy["verdict"] == "pass"


def test_a_process_seen_too_little_after_the_warm_up_is_not_judged():
    late = [s for s in samples(60, lambda m: 100 * MB + m * MB) if s["minute"] >= 57]
    assert judge(late, warmup_minutes=15)["verdict"] == "not judged"


def test_roles_by_the_stack_its_parent_or_the_command_line():
    known = {10: "front door", 11: "worker pool A"}
    tree = {10: (1, "python -m services.frontdoor"), 11: (1, "celery worker"), 12: (11, "celery worker"),
            20: (1, "/usr/bin/redis-server 127.0.0.1:6379"), 30: (1, "/usr/lib/postgresql/15/bin/postgres -D x"),
            31: (30, "postgres: arag arag 127.0.0.1(5432) idle"), 32: (30, "postgres: checkpointer "),
            40: (1, "llama-server --model m.gguf")}
    assert role_of(12, tree, known) == "worker pool A child"
    assert role_of(20, tree, known) == "redis"
    assert role_of(30, tree, known) == "postgresql (postmaster)"
    assert role_of(31, tree, known) == "postgresql backend"
    assert role_of(32, tree, known) == "postgresql checkpointer"
    assert role_of(40, tree, known) == "llama-server"


def test_a_phase_fails_when_one_judged_process_fails():
    rows = []
    for pid, role, grow in ((1, "front door", 0.0), (2, "redis", 20 * MB / 60)):
        for s in samples(60, lambda m, g=grow: 100 * MB + m * g):
            rows.append({"type": "process", "phase": "instant", "time": s["minute"] * 60, "pid": pid, "role": role, **s})
    rows.append({"type": "load", "phase": "instant", "ended": 10, "codes": {"OK": 10}, "ok_per_s": 1.0,
                 "p50_ms": 5.0, "p95_ms": 9.0, "load_average": [1.0, 1.0, 1.0]})
    summary = summarize(rows, {"instant": {"warmup_minutes": 15, "minutes": 60}})
    phase = summary["phases"]["instant"]
    assert phase["verdict"] == "fail" and phase["judged"] == 2 and phase["failed"] == 1
    assert [p["role"] for p in phase["processes"] if p["verdict"] == "fail"] == ["redis"]
    assert phase["load"]["ok_share"] == 1.0


def test_the_report_recomputes_from_the_samples_alone(tmp_path):
    import json

    from lab.experiments.soak import finish

    with (tmp_path / "samples.jsonl").open("w") as out:
        for pid, role, grow in ((1, "front door", 0.0), (2, "redis", 20 * MB / 60)):
            for s in samples(60, lambda m, g=grow: 100 * MB + m * g):
                out.write(json.dumps({"type": "process", "phase": "instant", "time": s["minute"] * 60, "pid": pid,
                                      "role": role, **s}) + "\n")
        out.write(json.dumps({"type": "load", "phase": "instant", "ended": 10, "codes": {"OK": 10}, "ok_per_s": 1.0,
                              "p50_ms": 5.0, "p95_ms": 9.0, "load_average": [1.0, 1.0, 1.0]}) + "\n")
    summary = finish(tmp_path, {"command": "python -m lab.experiments.soak"},
                     {"instant": {"warmup_minutes": 15, "minutes": 60, "rate": 1.0}})
    assert summary["phases"]["instant"]["own_memory_growing"][0].startswith("redis [2] USS +")
    text = (tmp_path / "README.md").read_text()
    assert "Phase `instant` (60 min at 1.00 Answers/s, warm-up 15 min): **fail**: 2 processes judged, 1 over" in text
    assert (tmp_path / "soak.png").stat().st_size > 0
    assert json.loads((tmp_path / "summary.json").read_text())["phases"]["instant"]["failed"] == 1


def fd_folder(tmp_path, targets: list[str]):
    """A /proc/PID/fd look-alike: descriptor N links to targets[N]."""
    import os

    folder = tmp_path / "fd"
    folder.mkdir()
    for number, target in enumerate(targets):
        os.symlink(target, folder / str(number))
    return folder, sorted(os.listdir(folder))


def test_descriptors_are_counted_by_what_they_point_at(tmp_path):
    from lab.experiments.soak import fd_kinds

    folder, names = fd_folder(tmp_path, ["socket:[1]", "pipe:[2]", "anon_inode:[eventpoll]",
                                         "/var/lib/postgresql/base/1/2600", "socket:[3]"])
    assert fd_kinds(folder, names + ["9"]) == {"socket": 2, "pipe": 1, "anon": 1, "file": 1}
    rows = samples(60, lambda m: 100 * MB, fds=lambda m: 6 + m // 5)
    for row in rows:
        row["fd_kinds"] = {"socket": 2, "file": row["fds"] - 2}
    verdict = judge(rows, warmup_minutes=15)
    assert verdict["verdict"] == "fail" and "file 7 -> 16, socket 2 -> 2" in verdict["reasons"][0]


def test_a_databases_own_data_files_are_its_cache_unless_one_is_open_twice(tmp_path):
    from lab.experiments.soak import fd_kinds

    folder, names = fd_folder(tmp_path, ["socket:[1]", "/pgdata/base/1/2600", "/pgdata/base/1/2601",
                                         "/pgdata/base/1/2600", "/var/log/pg.log"])
    assert fd_kinds(folder, names, data_dir="/pgdata") == {
        "socket": 1, "data": 3, "data_repeated": 1, "file": 1}

    def backend(data: Any, repeated: Any = lambda m: 0) -> list[dict[str, Any]]:
        rows = samples(60, lambda m: 100 * MB, fds=lambda m: 10 + data(m))
        for row in rows:
            m = row["minute"]
            row["fd_kinds"] = {"socket": 10, "data": data(m), "data_repeated": repeated(m)}
            row["fds_judged"] = 10
        return rows

    caching = judge(backend(lambda m: 6 + (m % 5) * 3 + m // 6), warmup_minutes=15)
    assert caching["verdict"] == "pass" and caching["fds_judged_on"] == "fds_judged"
    assert caching["fds"]["slope_per_h"] > 1 and caching["data_fds_max"] >= 16
    leaking = judge(backend(lambda m: 6 + m // 6, repeated=lambda m: m // 20), warmup_minutes=15)
    assert leaking["verdict"] == "fail" and "a data file open more than once (" in leaking["reasons"][0]


def test_redis_account_after_the_warm_up():
    from lab.experiments.soak import redis_account

    rows = [{"type": "redis", "phase": "instant", "minute": m, "keys": 50_000 if m >= 15 else 3_000 * m,
             "used_memory": 40e6 if m >= 15 else 2.6e6 * m, "used_memory_rss": 50e6 + m * 1e4,
             "fragmentation": 1.2} for m in range(60)]
    account = redis_account(rows, "instant", 30)
    assert account["samples"] == 30 and account["keys"]["pct_per_h"] == 0
    assert account["used_memory_rss"]["first"] == 50e6 + 30e4 and 0 < account["used_memory_rss"]["pct_per_h"] < 2
    assert redis_account(rows, "reader", 30) is None


def write_run(folder, phases: dict[str, float], command: str, started: str) -> None:
    """A finished run's folder: `phases` maps a phase to its memory growth (MB per minute)."""
    import json

    from lab.experiments.soak import finish

    folder.mkdir()
    with (folder / "samples.jsonl").open("w") as out:
        for phase, grow in phases.items():
            for s in samples(60, lambda m, g=grow: 100 * MB + m * g * MB):
                out.write(json.dumps({"type": "process", "phase": phase, "time": s["minute"] * 60, "pid": 1,
                                      "role": "llama-server", **s}) + "\n")
            out.write(json.dumps({"type": "load", "phase": phase, "ended": 10, "codes": {"OK": 10}, "ok_per_s": 1.0,
                                  "p50_ms": 5.0, "p95_ms": 9.0, "load_average": [1.0, 1.0, 1.0]}) + "\n")
    finish(folder, {"command": command, "run_started": started, "run_ended": started.replace("T1", "T2"), "code": "abc"},
           {phase: {"warmup_minutes": 15, "minutes": 60, "rate": 1.0} for phase in phases})


def test_a_phase_run_again_replaces_that_phase_only(tmp_path):
    import json

    from lab.experiments.soak import merge

    write_run(tmp_path / "report", {"instant": 0.0, "reader": 0.4}, "soak", "2026-12-06T14:00:00")
    write_run(tmp_path / "rerun", {"reader": 0.0}, "soak --phases reader", "2026-12-06T17:00:00")
    assert json.loads((tmp_path / "report" / "summary.json").read_text())["phases"]["reader"]["verdict"] == "fail"
    summary = merge(tmp_path / "report", tmp_path / "rerun")
    assert {name: ph["verdict"] for name, ph in summary["phases"].items()} == {"instant": "pass", "reader": "pass"}
    assert summary["phases"]["instant"]["run"]["command"] == "soak"
    assert summary["phases"]["reader"]["run"]["command"] == "soak --phases reader"
    assert summary["command"] == "soak; soak --phases reader"
    rows = [json.loads(line) for line in (tmp_path / "report" / "samples.jsonl").read_text().splitlines()]
    assert sum(r["phase"] == "reader" for r in rows) == sum(r["phase"] == "instant" for r in rows) == 62
    assert "- run: `soak --phases reader`, 2026-12-06T17:00:00" in (tmp_path / "report" / "README.md").read_text()
