"""Exporting the sentence encoder of the learned routers (`adaptive_rag.routers.embeddings`) from a
base checkpoint to ONNX, once; needs the `train` extras (torch + transformers)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from adaptive_rag.errors import ConfigurationError
from adaptive_rag.pinned import file_sha256
from adaptive_rag.routers.embeddings import (
    DEFAULT_ENCODER, ENCODER_FILE, INPUTS, MODEL_FILE, OUTPUT, TOKENIZER_FILE, OnnxEmbedder, encoder_dir,
)

DEFAULT_MAX_LENGTH = 128  # questions are short; the classifier truncates at 128 too
PARITY_TOLERANCE = 1e-4
PARITY_TEXTS = (
    "hi",
    "Who wrote the novel Dune?",
    "Which film came out first, Blind Shaft or The Mask Of Fu Manchu, and who directed each?",
)


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


def ensure_encoder(
    routers_root: Path, base: str = DEFAULT_ENCODER, int8: bool = False,
    log: Callable[[str], None] = print,
) -> Path:
    """The exported encoder directory, exported first when it is not there yet (needs torch then)."""
    directory = encoder_dir(routers_root, Path(base).name if Path(base).is_dir() else base, int8)
    if (directory / ENCODER_FILE).is_file() and (directory / MODEL_FILE).is_file():
        return directory
    return export_encoder(directory, base, int8=int8, log=log)
