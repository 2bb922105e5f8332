"""The key-revocation experiment's figures: per replica and round, and until every replica refused."""

from __future__ import annotations

from lab.experiments.key_revocation import Refusal, readme, summary


def test_the_figures_are_per_refusal_and_per_round_of_the_later_replica():
    refusals = [Refusal(1, "replica-1", 2.0, 0.1, 3), Refusal(1, "replica-2", 2.0, 0.9, 9),
                Refusal(2, "replica-1", 3.0, 0.5, 5), Refusal(2, "replica-2", 3.0, 0.3, 4)]
    figures = summary(refusals)
    assert (figures["rounds"], figures["replicas"]) == (2, 2)
    assert (figures["median_s"], figures["max_s"], figures["min_s"]) == (0.4, 0.9, 0.1)
    assert (figures["every_replica_median_s"], figures["every_replica_max_s"]) == (0.7, 0.9)
    assert figures["revoke_statement_median_ms"] == 2.5
    text = readme(figures, "python -m lab.experiments.key_revocation --rounds 2")
    assert "0.40 s median, 0.90 s" in text and "--rounds 2" in text
