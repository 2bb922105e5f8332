from __future__ import annotations

from lab.experiments.server_overhead import CONFIGS, readme, summarise, variable_part


def test_every_request_prefills_its_own_text_from_the_first_line():
    assert variable_part(1).splitlines()[1] != variable_part(2).splitlines()[1]


def test_per_token_times_are_ratios_to_the_model_at_the_same_depth():
    records = [{"config": name, "round": r, "wall_ms": 5100.0 + r, "prompt_n": 100, "prompt_ms": 2000.0 * (2 if name == "one-slot" else 1),
                "predicted_n": 20, "predicted_ms": 3000.0, "cached_n": 250} for name in CONFIGS for r in range(3)]
    summary = summarise(records, {"prefill_ms_per_token": 20.0, "generate_ms_per_token": 100.0})
    default = summary["configs"]["default"]
    assert default["prefill_ratio"] == 1.0 and default["generate_ratio"] == 1.5
    assert default["outside_timings_ms"] == 101.0
    assert summary["configs"]["one-slot"]["prefill_ratio"] == 2.0
    assert "| `no-host-cache` | 3 | 100 | 20.0 | 1.00x | 150.0 | 1.50x |" in readme(summary, "cmd", "meta")
