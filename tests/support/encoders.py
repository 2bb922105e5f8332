"""Sentence encoders for tests of the learned routers, no model download and no torch:

- `HashingEmbedder`: bag of words hashed into 64 dimensions, unit length (pure numpy);
- `tiny_encoder`: a real exported-encoder directory (ONNX graph: token embedding table -> mean over
  the real tokens -> L2 normalisation, with the MiniLM tokenizer), which `OnnxEmbedder` and the
  `arag routers` / `arag eval` commands open like the exported MiniLM.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from adaptive_rag.pinned import file_sha256
from adaptive_rag.routers.embeddings import (
    ENCODER_FILE,
    INPUTS,
    MODEL_FILE,
    OUTPUT,
    TOKENIZER_FILE,
)
from adaptive_rag.training.splits import normalise_question


class HashingEmbedder:
    """Words hashed into `dim` buckets, counted, L2-normalised: questions sharing words are close."""

    def __init__(self, dim: int = 64) -> None:
        self._dim = dim

    @property
    def identity(self) -> str:
        return f"test-hashing-{self._dim}"

    @property
    def dim(self) -> int:
        return self._dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in normalise_question(text).split():
                out[row, int(hashlib.md5(word.encode()).hexdigest(), 16) % self._dim] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)


def tiny_encoder(directory: Path, dim: int = 16, seed: int = 0) -> Path:
    """An exported-encoder directory with a random token table (MiniLM's vocabulary)."""
    import onnx
    from onnx import TensorProto, helper

    from lab.harness.models import minilm_tokenizer_path

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    vocab = 30522
    table = np.random.default_rng(seed).standard_normal((vocab, dim)).astype(np.float32)
    ids, mask = INPUTS
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", ids], ["tokens"], axis=0),  # [b, s, d]
            helper.make_node("Cast", [mask], ["mask_f"], to=TensorProto.FLOAT),  # [b, s]
            helper.make_node("Unsqueeze", ["mask_f", "last"], ["mask_3"]),  # [b, s, 1]
            helper.make_node("Mul", ["tokens", "mask_3"], ["masked"]),
            helper.make_node("ReduceSum", ["masked", "seq_axis"], ["summed"], keepdims=0),  # [b, d]
            helper.make_node("ReduceSum", ["mask_3", "seq_axis"], ["count"], keepdims=0),  # [b, 1]
            helper.make_node("Div", ["summed", "count"], ["mean"]),
            helper.make_node("LpNormalization", ["mean"], [OUTPUT], axis=1, p=2),
        ],
        "tiny_encoder",
        [helper.make_tensor_value_info(ids, TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info(mask, TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch", dim])],
        initializer=[
            helper.make_tensor("table", TensorProto.FLOAT, [vocab, dim], table.tobytes(), raw=True),
            helper.make_tensor("last", TensorProto.INT64, [1], [2]),
            helper.make_tensor("seq_axis", TensorProto.INT64, [1], [1]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(directory / MODEL_FILE))
    shutil.copy(minilm_tokenizer_path(), directory / TOKENIZER_FILE)
    (directory / ENCODER_FILE).write_text(json.dumps({
        "name": directory.name, "base": {"name": "tiny test table"}, "dim": dim, "max_length": 64,
        "pooling": "mean over real tokens, L2-normalised", "sha256": file_sha256(directory / MODEL_FILE),
    }))
    return directory
