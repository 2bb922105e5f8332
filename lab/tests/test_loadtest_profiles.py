"""Load profiles and query picking (`lab/loadtest/shapes.py`, `lab/loadtest/queries.py`), and what the
`python -m lab.loadtest` parent imports.

The parent must never import locust: locust monkey-patches the process with gevent on import,
and the parent then streams the knowledge base over a blocking gRPC call whose request thread
never runs (the local stack hung at "importing ... through the KnowledgeBase API").
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lab.loadtest.queries import Query, QueryPicker, parse_mix
from lab.loadtest.shapes import PROFILES, ProfileOptions, make_profile, parse_duration

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90), ("20s", 20), ("5m", 300), ("1h30m", 5400), ("1h2m3s", 3723), (" 2M ", 120),
])
def test_parse_duration_reads_locust_run_times(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "5x", "-3", "1.5m"])
def test_parse_duration_refuses_what_locust_would_not_read(text: str) -> None:
    with pytest.raises(ValueError, match="run time"):
        parse_duration(text)


def test_profiles_plan_users_and_end() -> None:
    options = ProfileOptions(users=3, spawn_rate=1.5, step_seconds=10, max_users=6, spike_users=9)
    steady = make_profile("steady", options)
    assert steady.at(0) == (3, 1.5) and steady.at(59.9) == (3, 1.5) and steady.at(60) is None
    step = make_profile("step", options)
    assert step.steps() == [1, 2, 4, 6] and step.run_time_s == 40
    assert [step.at(t)[0] for t in (0, 10, 25, 39)] == [1, 2, 4, 6] and step.at(40) is None
    spike = make_profile("spike", ProfileOptions(users=2, spike_users=8, run_time_s=30))
    assert [spike.at(t)[0] for t in (0, 9.9, 10, 19.9, 20)] == [2, 2, 8, 8, 2]
    assert spike.expected_failures == ("RESOURCE_EXHAUSTED",)
    assert make_profile("soak", options).run_time_s == 1800
    assert set(PROFILES) == {"steady", "step", "spike", "soak"}
    with pytest.raises(ValueError, match="unknown profile"):
        make_profile("surge", options)


def test_the_loadtest_parent_never_imports_locust() -> None:
    """What `python -m lab.loadtest` does before it starts the stack, in a fresh interpreter."""
    code = (
        "import sys, argparse\n"
        "import lab.loadtest.__main__ as m\n"
        "args = argparse.Namespace(users=2, run_time='20s', step_seconds=5.0, max_users=4, "
        "spike_users=4, load_profile='step')\n"
        "assert m.expected_length_s(args) == 20.0, m.expected_length_s(args)\n"
        "args.run_time = None\n"
        "assert m.expected_length_s(args) == 15.0, m.expected_length_s(args)\n"
        "from lab.loadtest.shapes import PROFILES\n"
        "bad = sorted(n for n in ('locust', 'gevent') if n in sys.modules)\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _pools() -> dict[str, list[Query]]:
    return {"A": [Query(f"a{i}", "A", "chit-chat") for i in range(3)],
            "B": [Query(f"b{i}", "B", "squad") for i in range(2)],
            "C": [Query("c0", "C", "hotpotqa")]}


def test_query_picker_keeps_the_mix_exactly() -> None:
    picker = QueryPicker(_pools(), parse_mix("A=60,B=30,C=10"), seed=1)
    tiers = [picker.next().expected_tier for _ in range(100)]
    assert (tiers.count("A"), tiers.count("B"), tiers.count("C")) == (60, 30, 10)
    assert {tiers[i:i + 10].count("C") for i in range(0, 100, 10)} == {1}  # every ten hold one C


def test_query_picker_repeats_its_pool_unless_asked_for_distinct_texts() -> None:
    plain = QueryPicker(_pools(), parse_mix("A=100"), seed=3)
    texts = [plain.next().text for _ in range(9)]
    assert len(set(texts)) == 3  # three queries, walked three times
    distinct = QueryPicker(_pools(), parse_mix("A=100"), seed=3, distinct=True)
    tagged = [distinct.next() for _ in range(9)]
    assert len({q.text for q in tagged}) == 9
    assert [q.text.rsplit(" ", 1)[1] for q in tagged[::3]] == ["[3.0]", "[3.1]", "[3.2]"]
    assert [q.text.rsplit(" ", 1)[0] for q in tagged] == texts  # the same order, tagged
    other_run = QueryPicker(_pools(), parse_mix("A=100"), seed=4, distinct=True)
    assert not {other_run.next().text for _ in range(9)} & {q.text for q in tagged}
