"""The reader-limit experiment's arithmetic on synthetic answers and server counters (no stack)."""

from __future__ import annotations

import json

import pytest

from lab.experiments.reader_limit import Answer, delta, render, summarize, two_part_questions


def answer(tier: str, latency: float, clients: int = 1, prompt: int = 380, prefilled: int | None = 125,
           generated: int = 20) -> Answer:
    return Answer("server", clients, f"q{latency}", tier, "OK", latency, 0.0, latency, prompt, generated,
                  prefilled, None if prefilled is None else prompt - prefilled, "one" if clients == 1 else "loop")


def test_one_client_ratios_use_the_whole_prompt_and_the_prefilled_tokens():
    first, second = sorted(two_part_questions())[:2]
    answers = [answer("B", 4.0), answer("B", 6.0), answer("C", 9.0), answer("C", 11.0),
               answer("C", 30.0)]  # a one-part question the router sent to C: not a two-part one
    answers[2].question, answers[3].question = first, second
    pg = {(380, 20): {"seconds": 8.0}, (125, 20): {"seconds": 3.0}}
    out = summarize(answers, pg, [], [])["one_client"]["server"]
    assert out["answers"] == 2 and out["p50_s"] == pytest.approx(5.0)
    assert out["ratio_to_model_p50"] == pytest.approx(5.0 / 8.0)
    assert out["ratio_to_model_computed_p50"] == pytest.approx(5.0 / 3.0)
    assert out["two_part_over_b_p50"] == pytest.approx(10.0 / 5.0)


def test_throughput_counts_computed_tokens_against_the_bench_at_the_servers_batch():
    windows = [{"clients": 1, "span_s": 100.0, "answers": 10, "prefilled": 1250.0, "cached": 2550.0,
                "generated": 200.0, "decodes": 0.0, "batch_mean": 1.0, "busy_share": 0.9},
               {"clients": 4, "span_s": 100.0, "answers": 20, "prefilled": 2500.0, "cached": 5100.0,
                "generated": 400.0, "decodes": 0.0, "batch_mean": 1.8, "busy_share": 1.0},
               {"clients": 16, "span_s": 100.0, "answers": 12, "prefilled": 1500.0, "cached": 3060.0,
                "generated": 240.0, "decodes": 0.0, "batch_mean": 2.1, "busy_share": 1.0}]
    batched = [{"pl": 1, "speed": 20.0}, {"pl": 2, "speed": 30.0}]
    out = summarize([], {}, batched, windows)
    rows = {row["clients"]: row for row in out["throughput"]}
    assert rows[1]["computed_tokens_per_s"] == pytest.approx(14.5)
    assert rows[4]["batch"] == 2 and rows[4]["ratio_to_batched_bench"] == pytest.approx(29.0 / 30.0)
    # 17.4 tokens/s at 16 clients is below 0.9x the 29.0 of 4 clients: the throughput fell
    assert out["throughput_never_falls"] is False
    assert out["saturation"]["clients"] == 16


def test_counter_deltas_and_the_report_render(tmp_path):
    before = {"prefilled": 10.0, "cached": 0.0, "generated": 5.0, "decodes": 3.0, "processing": 1.0}
    after = {"prefilled": 135.0, "cached": 255.0, "generated": 25.0, "decodes": 30.0, "processing": 0.0}
    assert delta(after, before) == {"prefilled": 125.0, "cached": 255.0, "generated": 20.0, "decodes": 27.0}
    summary = summarize([answer("B", 4.0)], {(380, 20): {"seconds": 8.0}, (125, 20): {"seconds": 3.0}}, [], [])
    meta = {"reader": "qwen-1.5b", "model": "m.gguf", "cpus": 2, "llama_cpp_version": "0.3.36", "one_client": 1,
            "clients": [1], "slots": 4, "window_s": 60.0, "repetitions": 2, "when": "now", "load_at_start": "0.1"}
    render(tmp_path, {"meta": meta, "summary": summary})
    text = (tmp_path / "README.md").read_text()
    assert "| server | 1 | 4.00 | 380 / 125 / 20 | 8.00 | 0.50x" in text
    json.dumps(summary)  # the summary is written as JSON


def test_repeated_runs_are_read_on_the_median_of_their_p50s(tmp_path):
    from lab.experiments.reader_limit import repeated

    for name, p50 in (("run-1", 4.6), ("run-2", 4.2), ("run-3", 4.4), ("empty", None)):
        (tmp_path / name).mkdir()
        one = {"answers": 12, "p50_s": p50, "ratio_to_model_p50": 0.5, "ratio_to_model_computed_p50": 1.1,
               "two_part_p50_s": 9.0, "two_part_over_b_p50": 2.0} if p50 else {"answers": 0}
        (tmp_path / name / "summary.json").write_text(json.dumps(
            {"meta": {"when": "now", "command": f"python -m lab.experiments.reader_limit --out {name}"},
             "summary": {"one_client": {"server": one}}}))
    out = repeated(tmp_path)
    assert [r["run"] for r in out["runs"]] == ["run-1", "run-2", "run-3"]
    assert out["medians"]["b_p50_s"] == pytest.approx(4.4)
    assert "median of the runs' B p50s is **4.40 s**" in (tmp_path / "README.md").read_text()


def test_ladders_of_several_runs_are_read_on_the_median_per_client_count(tmp_path):
    from lab.experiments.reader_limit import ladders

    for name, ratios in (("a", (1.0, 0.75)), ("b", (0.9, 0.9)), ("c", (0.8, 0.81))):
        (tmp_path / name).mkdir()
        windows = [{"clients": n, "computed_tokens_per_s": 30.0, "ratio_to_own_mix": r, "cpu_cores": {}}
                   for n, r in zip((1, 16), ratios)]
        (tmp_path / name / "summary.json").write_text(json.dumps(
            {"meta": {"when": "now", "command": f"python -m lab.experiments.reader_limit --out {name}"},
             "summary": {"throughput": windows}}))
    found = ladders(tmp_path / "ladders", [tmp_path / n for n in ("a", "b", "c")])
    assert found["medians"]["16"]["ratio_to_own_mix"] == pytest.approx(0.81)
    assert found["medians"]["1"] == {"runs": 3, "tokens_per_s": 30.0, "ratio_to_own_mix": pytest.approx(0.9)}
    text = (tmp_path / "ladders" / "README.md").read_text()
    assert "At 16 clients the median over 3 runs is **0.81x**" in text and "](../a/README.md)" in text


def test_cpu_seconds_are_counted_per_role_with_this_process_as_the_load_client():
    import subprocess
    import sys
    import time

    from lab.experiments.reader_limit import LOAD_CLIENT, cpu_seconds

    spin = "import time\nend = time.time() + 0.6\nwhile time.time() < end: pass\ntime.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(1.5)
        used = cpu_seconds({child.pid: "worker pool B"})
    finally:
        child.kill()
        child.wait()
    assert LOAD_CLIENT in used and used["worker pool B"] >= 0.4


def test_each_window_is_compared_with_the_bench_at_its_own_mix_too():
    windows = [{"clients": 4, "span_s": 100.0, "answers": 20, "prefilled": 2400.0, "cached": 0.0,
                "generated": 440.0, "decodes": 0.0, "batch_mean": 1.9, "busy_share": 1.0},
               {"clients": 16, "span_s": 100.0, "answers": 20, "prefilled": 2300.0, "cached": 0.0,
                "generated": 660.0, "decodes": 0.0, "batch_mean": 1.9, "busy_share": 1.0}]
    batched = [{"pl": 2, "speed": 40.0}, {"pl": 2, "speed": 36.0, "window": 4}, {"pl": 2, "speed": 32.0, "window": 16}]
    rows = {row["clients"]: row for row in summarize([], {}, batched, windows)["throughput"]}
    assert rows[16]["ratio_to_batched_bench"] == pytest.approx(29.6 / 40.0)  # the shared reference
    assert rows[16]["ratio_to_own_mix"] == pytest.approx(29.6 / 32.0)
    assert rows[4]["ratio_to_own_mix"] == pytest.approx(28.4 / 36.0)
