"""The wake-up latency benchmark's blocks and report, with calls that need no server."""

from __future__ import annotations

from lab.experiments.wakeup_latency import SETTINGS, TRITON, markdown, measure


def test_without_the_limit_only_the_machine_as_it_is_is_measured():
    calls = {"noop": lambda: None}
    samples, triton = measure(calls, [0.0, 1.0], blocks=2, block_size=3, limit=False)
    assert [len(samples["noop"][g][SETTINGS[0]]) for g in ("0.0", "1.0")] == [6, 6]
    assert samples["noop"]["0.0"][SETTINGS[1]] == [] and triton == {}
    report = {"command": "x", "started": "s", "finished": "f", "machine": "m", "gaps_ms": [0.0, 1.0],
              "blocks": 2, "block_size": 3, "samples": samples}
    text = markdown(report)
    assert "| noop | 0 |" in text and "| noop | 1 |" in text and "1.0x" in text


def test_tritons_own_split_covers_only_the_triton_calls():
    counter = {"n": 0}

    def infer():
        counter["n"] += 1

    def stats():
        n = counter["n"]
        return {"success": (n, n * 2_000_000), "queue": (n, n * 100_000), "compute_infer": (n, n * 1_000_000)}

    samples, triton = measure({TRITON: infer, "other": lambda: None}, [0.0], blocks=2, block_size=5,
                              limit=False, server_stats=stats)
    assert triton["0.0"][SETTINGS[0]] == {"success": 2.0, "queue": 0.1, "compute_infer": 1.0}
    assert triton["0.0"][SETTINGS[1]]["success"] is None  # not measured without the limit
    report = {"command": "x", "started": "s", "finished": "f", "machine": "m", "gaps_ms": [0.0],
              "blocks": 2, "block_size": 5, "samples": samples, "triton": triton}
    assert "| 0 | no limit | 2.000 | 0.100 | 1.000 |" in markdown(report)
