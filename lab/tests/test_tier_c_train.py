"""The tier-C choice on `train`: outcomes read from the label caches (plain or gzipped, variants
renamed), the chosen C minus each other one paired per question, and the choice itself."""

from __future__ import annotations

import gzip
import json
from dataclasses import asdict
from pathlib import Path

from adaptive_rag.evaluation.runner import Outcome
from lab.experiments.chain_reader import DATASETS
from adaptive_rag.evaluation.runner import load_outcomes
from lab.experiments.tier_c_train import choose, versus, with_variants


def outcome(dataset: str, qid: str, strategy: str, f1: float, seconds: float = 1.0) -> Outcome:
    return Outcome(qid, dataset, strategy, "a", 1, seconds, 0.0, f1, 0.0)


def write(path: Path, outcomes: list[Outcome], zipped: bool = False) -> Path:
    text = "".join(json.dumps(asdict(o)) + "\n" for o in outcomes) + '{"cut short'
    if zipped:
        with gzip.open(path, "wt", encoding="utf-8") as handle:
            handle.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_a_cache_reads_the_same_plain_or_gzipped_and_skips_a_cut_line(tmp_path: Path) -> None:
    rows = [outcome("2wiki", "q1", "evidence", 1.0), outcome("2wiki", "q1", "evidence", 0.5)]  # a rerun wins
    plain = load_outcomes(write(tmp_path / "o.jsonl", rows))
    zipped = load_outcomes(write(tmp_path / "o.jsonl.gz", rows, zipped=True))
    assert plain == zipped and list(plain) == [("2wiki", "q1", "evidence")]
    assert plain[("2wiki", "q1", "evidence")].f1 == 0.5


def test_a_variant_joins_under_its_own_name_and_only_its_c(tmp_path: Path) -> None:
    other = write(tmp_path / "t.jsonl", [outcome("musique", "q", "evidence", 0.3), outcome("musique", "q", "single_step", 9.0)])
    merged = with_variants({("musique", "q", "single_step"): outcome("musique", "q", "single_step", 0.1)},
                           {"evidence/t240": other})
    assert set(merged) == {("musique", "q", "single_step"), ("musique", "q", "evidence/t240")}
    assert merged[("musique", "q", "evidence/t240")].strategy == "evidence/t240"
    assert merged[("musique", "q", "single_step")].f1 == 0.1  # the variant's own B is not taken


def test_versus_pairs_per_question_and_averages_the_sets() -> None:
    outcomes = {}
    for dataset, (first, second) in zip(DATASETS, [(1.0, 0.0), (0.5, 0.5), (0.0, 0.5)]):
        for qid in ("a", "b"):
            for name, f1 in (("evidence", first), ("ircot", second)):
                outcomes[(dataset, qid, name)] = outcome(dataset, qid, name, f1)
    outcomes[("2wiki", "only-one", "evidence")] = outcome("2wiki", "only-one", "evidence", 0.0)  # unpaired: left out
    found = versus(outcomes, "evidence", "ircot")
    assert found["2wiki"] == {"n": 2, "difference": {"mean": 100.0, "low": 100.0, "high": 100.0}}
    assert found["sets"]["n"] == 6 and found["sets"]["difference"]["mean"] == round(100 * (1.0 + 0 - 0.5) / 3, 1)


def test_the_choice_is_the_best_mean_over_sets_ties_to_the_faster() -> None:
    def cells(f1: float, seconds: float) -> dict:
        row = {d: {} for d in DATASETS}
        row["sets"] = {"f1_mean_of_sets": {"mean": f1}, "seconds_mean": seconds}
        return row

    summary = {"single_step": cells(99.0, 1.0), "ircot": cells(30.0, 20.0), "evidence": cells(30.0, 10.0)}
    assert choose(summary) == "evidence"  # B is never a C; the tie goes to the faster
    summary["ircot"] = cells(31.0, 20.0)
    assert choose(summary) == "ircot"
    del summary["ircot"]["musique"]
    assert choose(summary) == "evidence"  # a C missing a set is not chosen
    assert choose({"single_step": cells(1.0, 1.0)}) is None
