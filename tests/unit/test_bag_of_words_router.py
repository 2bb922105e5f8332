"""The shipped router: a linear bag-of-words model fitted on labels, committed as router.json and
rebuilt without torch into a classifier model version (ONNX + tokenizer) that gives the same
logits as the fitted model, deterministically, once per router file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from adaptive_rag.contracts import Tier
from adaptive_rag.errors import ConfigurationError
from adaptive_rag.pinned import file_sha256
from adaptive_rag.training.bag_of_words import BagOfWordsRouter, fit, model_card, onnx_parity, publish, words
from adaptive_rag.training.learned_routers import LabelledQuery
from adaptive_rag.routing.model_repository import (
    describe_version, open_version, pin_served, served_version, version_at,
)
from adaptive_rag.storage.labels import read_label_file, write_label_file
from adaptive_rag.storage.models import TrainingLabel


def keyword_labels(n: int = 40) -> list[LabelledQuery]:
    """Tiers told apart by their words: greetings A, who-questions B, comparisons C."""
    found = []
    for i in range(n):
        found.append(LabelledQuery(f"hello there, thanks a lot {i}", Tier.A, "chat", f"a{i}"))
        found.append(LabelledQuery(f"Who wrote book number {i}?", Tier.B, "nq", f"b{i}"))
        found.append(LabelledQuery(f"Which film came out first, film {i} or film {i + 1}, and who directed both?",
                                   Tier.C, "hotpotqa", f"c{i}"))
    return found


@pytest.fixture(scope="module")
def router() -> BagOfWordsRouter:
    return fit(keyword_labels())


def test_it_learns_the_words_that_tell_the_tiers_apart_and_never_fits_the_validation_part(router):
    assert router.route_many(["hello there!", "Who wrote Dune?",
                              "Which film came out first, Alien or Heat, and who directed both?"]) == ["A", "B", "C"]
    assert router.card["validation"]["accuracy"] == 1.0
    assert router.card["labels"]["all"] == {"A": 40, "B": 40, "C": 40}
    fit_part, validation = router.card["labels"]["fit_part"], router.card["labels"]["validation"]
    assert sum(fit_part.values()) + sum(validation.values()) == 120 and sum(validation.values()) > 0
    assert "hello" in router.vocabulary and "[UNK]" not in router.vocabulary


def test_words_are_normalised_like_the_served_tokenizer():
    assert words(["Who WROTE Dúne?"]) == [["who", "wrote", "dune", "?"]]


def test_the_same_labels_give_the_same_bytes(router, tmp_path):
    again = fit(keyword_labels())
    assert router.save(tmp_path / "one.json") == again.save(tmp_path / "two.json")
    loaded = BagOfWordsRouter.load(tmp_path / "one.json")
    assert loaded.to_json() == router.to_json()


def test_a_file_of_another_kind_or_shape_is_refused(router, tmp_path):
    data = json.loads(router.to_json())
    with pytest.raises(ConfigurationError, match="not a bag-of-words router"):
        BagOfWordsRouter.from_json(json.dumps({**data, "kind": "lr"}))
    with pytest.raises(ConfigurationError, match="token_weights has shape"):
        BagOfWordsRouter.from_json(json.dumps({**data, "token_weights": data["token_weights"][:-1]}))


def test_one_tier_only_cannot_be_fitted():
    with pytest.raises(ConfigurationError, match="at least two tiers"):
        fit([LabelledQuery(f"q {i}", Tier.B) for i in range(20)])


def test_published_version_serves_the_same_logits_and_is_built_once(router, tmp_path):
    path = tmp_path / "router.json"
    router.save(path)
    first = publish(path, tmp_path / "repo", extra_info={"name": "bag-of-words (shipped)"})
    assert not first.cached and first.version == 1
    version = open_version(tmp_path / "repo")
    assert version.version == 1 and version.max_length == router.max_length
    assert onnx_parity(router, version.onnx_path, version.tokenizer_path,
                       ["hello there", "a question with words never seen: zyxxy qwop", ""]) < 1e-4
    again = publish(path, tmp_path / "repo")
    assert again.cached and again.version == 1
    info = json.loads((version.path / "classifier.json").read_text())
    assert info["source"]["sha256"] == file_sha256(path) and info["model_sha256"] == file_sha256(version.onnx_path)
    # built again elsewhere: byte-identical graph and tokenizer
    other = publish(path, tmp_path / "elsewhere")
    for name in ("model.onnx", "tokenizer.json"):
        assert file_sha256(other.path / name) == file_sha256(version.path / name)


def test_the_local_onnx_router_routes_like_the_fitted_model(router, tmp_path):
    from adaptive_rag.routers import Router
    from adaptive_rag.routers.local_classifier import LocalOnnxClassifier

    router.save(tmp_path / "router.json")
    version = version_at(publish(tmp_path / "router.json", tmp_path / "repo").path)
    local = LocalOnnxClassifier(version)
    assert isinstance(local, Router)
    for text, tier in [("hello there!", Tier.A), ("Who wrote Dune?", Tier.B)]:
        assert local.classify(text).tier is tier and local.route(text).tier is tier


def test_a_new_router_never_replaces_a_promoted_version(router, tmp_path):
    router.save(tmp_path / "router.json")
    publish(tmp_path / "router.json", tmp_path / "repo")
    model_dir = tmp_path / "repo" / "complexity"
    pin_served(model_dir)
    changed = fit(keyword_labels(30))
    changed.save(tmp_path / "router.json")
    assert publish(tmp_path / "router.json", tmp_path / "repo").version == 2
    assert served_version(model_dir) == 1


def test_describe_version_says_which_router_and_its_test_accuracy(router, tmp_path):
    router.save(tmp_path / "router.json")
    evaluation = {"test_labels": {"n": 90, "accuracy": 0.7, "dataset_rule_accuracy": 0.8, "reader": "qwen-1.5b"}}
    published = publish(tmp_path / "router.json", tmp_path / "repo",
                        extra_info={"name": "bag-of-words (shipped)", "evaluation": evaluation})
    line = describe_version(version_at(published.path))
    assert line.startswith("bag-of-words (shipped), complexity v1")
    assert "accuracy on 90 `test` labels 70.0%" in line and "rule: 80.0%" in line


def test_label_files_round_trip(tmp_path):
    rows = [TrainingLabel(origin="benchmark", dataset=d, question_id=q, question=f"question {q}?", label=t,
                          label_source="silver", split="train", correct_metric="em_or_acc",
                          outcomes={"A": {"f1": 0.0, "correct": False, "steps": 0}})
            for d, q, t in [("squad", "2", "B"), ("nq", "1", "A"), ("squad", "1", "C")]]
    assert write_label_file(rows, tmp_path / "labels.jsonl") == 3
    read = read_label_file(tmp_path / "labels.jsonl")
    assert [(r.dataset, r.question_id, r.label) for r in read] == [("nq", "1", "A"), ("squad", "1", "C"), ("squad", "2", "B")]
    assert read[0].outcomes == {"A": {"f1": 0.0, "correct": False, "steps": 0}}
    (tmp_path / "bad.jsonl").write_text('{"question": "no label"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: not a label row"):
        read_label_file(tmp_path / "bad.jsonl")


def test_padding_never_counts(router):
    assert np.all(router.token_weights[1] == 0.0)


def test_ship_publishes_once_and_refuses_a_broken_router_file(router, tmp_path):
    from tests.unit.test_cli_errors import run_arag

    router.save(tmp_path / "router.json")
    (tmp_path / "evaluation.json").write_text(json.dumps(
        {"test_labels": {"n": 10, "accuracy": 0.5, "dataset_rule_accuracy": 0.6, "reader": "qwen-1.5b",
                         "router_sha256": file_sha256(tmp_path / "router.json")}}))
    args = ["model", "ship", "--router", str(tmp_path / "router.json"), "--repository", str(tmp_path / "repo")]
    first, second = run_arag(*args), run_arag(*args)
    assert first.returncode == 0 and "published:" in first.stdout, first.stderr
    assert second.returncode == 0 and "already published:" in second.stdout
    assert "accuracy on 10 `test` labels 50.0%" in describe_version(open_version(tmp_path / "repo"))
    (tmp_path / "broken.json").write_text('{"kind": "lr"}')
    broken = run_arag("model", "ship", "--router", str(tmp_path / "broken.json"), "--repository", str(tmp_path / "repo"))
    assert broken.returncode == 2 and "not a bag-of-words router" in broken.stderr and "Traceback" not in broken.stderr


def test_a_cached_version_gets_the_figures_measured_since(router, tmp_path):
    router.save(tmp_path / "router.json")
    publish(tmp_path / "router.json", tmp_path / "repo")
    onnx_before = file_sha256(open_version(tmp_path / "repo").onnx_path)
    evaluation = {"test_labels": {"n": 5, "accuracy": 0.4, "dataset_rule_accuracy": 0.6}}
    assert publish(tmp_path / "router.json", tmp_path / "repo", extra_info={"evaluation": evaluation}).cached
    version = open_version(tmp_path / "repo")
    assert "accuracy on 5 `test` labels 40.0%" in describe_version(version)
    assert file_sha256(version.onnx_path) == onnx_before


def test_figures_measured_on_other_bytes_are_never_shown_as_this_routers(router, tmp_path):
    """A refitted router keeps the old evaluation.json beside it until measured: its card and its
    published version must not carry the old router's `test` figures."""
    from tests.unit.test_cli_errors import run_arag

    router.save(tmp_path / "router.json")
    (tmp_path / "evaluation.json").write_text(json.dumps({"test_labels": {
        "n": 10, "accuracy": 0.5, "interval_95": [0.4, 0.6], "dataset_rule_accuracy": 0.6,
        "dataset_rule_interval_95": [0.5, 0.7], "reader": "qwen-1.5b", "date": "2026-12-02", "command": "arag eval",
        "label": "cheapest correct", "router_sha256": "0" * 64}}))
    card = model_card(tmp_path / "router.json")
    assert "not measured for this router yet" in card and "50.0%" not in card
    shipped = run_arag("model", "ship", "--router", str(tmp_path / "router.json"), "--repository", str(tmp_path / "repo"))
    assert shipped.returncode == 0, shipped.stderr
    assert "`test` labels" not in describe_version(open_version(tmp_path / "repo"))


def test_support_labels_come_from_the_suites_train_split_and_never_from_quillbill() -> None:
    from adaptive_rag.settings import Settings
    from adaptive_rag.training.labelling import SUPPORT_LABEL_KBS, support_labels

    labels = support_labels(Settings(data_dir=Path(__file__).resolve().parents[3] / "shared" / "data"))
    assert labels and {label.dataset for label in labels} <= set(SUPPORT_LABEL_KBS)
    assert "quillbill" not in SUPPORT_LABEL_KBS
    assert all(label.split == "train" and label.origin == "support" for label in labels)
    assert {label.label for label in labels if label.dataset == "help-centre"} == {"B"}
    assert "C" in {label.label for label in labels if label.dataset == "covid-faq"}  # its joined questions
    again = support_labels(Settings(data_dir=Path(__file__).resolve().parents[3] / "shared" / "data"),
                           {(labels[0].dataset, labels[0].question_id)})
    assert len(again) == len(labels) - 1
