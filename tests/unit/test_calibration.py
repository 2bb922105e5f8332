"""Calibrating the policy's thresholds: the highest F1 within a step budget."""

from __future__ import annotations

import pytest

from adaptive_rag.training.calibration import CalibrationExample, calibrate_thresholds, evaluate_thresholds


def _example(probs, f1, steps=(0, 1, 3)):
    return CalibrationExample(
        probabilities=probs, f1=dict(zip("ABC", f1)), steps=dict(zip("ABC", steps))
    )


def test_calibration_escalates_when_c_pays_off_and_respects_the_step_budget():
    # B is the argmax everywhere, but C answers the first two questions and B does not.
    examples = [
        _example((0.1, 0.6, 0.3), (0, 0, 1)),
        _example((0.1, 0.55, 0.35), (0, 0, 1)),
        _example((0.1, 0.8, 0.1), (0, 1, 1)),
        _example((0.1, 0.85, 0.05), (0, 1, 1)),
    ]
    free = calibrate_thresholds(examples, c_grid=[None, 0.2, 0.5], a_grid=[None])
    assert free.c_threshold == 0.2
    assert free.metrics["f1"] == pytest.approx(1.0)
    # At most 1.5 steps per question: only one of the four may go to C -> no escalation fits.
    tight = calibrate_thresholds(examples, step_budget=1.5, c_grid=[None, 0.2, 0.5], a_grid=[None])
    assert evaluate_thresholds(tight, examples)["steps"] <= 1.5
    assert tight.c_threshold in (None, 0.5)
    assert "budget" in tight.note
