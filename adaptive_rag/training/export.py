"""ONNX export into a Triton model repository (needs the `train` extras for torch).

Layout (loadable as-is by a standalone Triton with the onnxruntime backend):

    <repo>/complexity/config.pbtxt
    <repo>/complexity/<version>/model.onnx          inputs input_ids, attention_mask INT64 [-1, -1]
                                                     output logits FP32 [-1, 3]
    <repo>/complexity/<version>/tokenizer.json      + tokenizer_config.json (serving tokenizes
                                                     with the `tokenizers` library)
    <repo>/complexity/<version>/classifier.json     labels, max length, base, kind, run
    <repo>/complexity/<version>/thresholds.json     routing policy thresholds (`arag calibrate`)
    <repo>/complexity/<version>/MODEL_CARD.md, metrics.json, validation.jsonl

Every export adds the next version number. Which version is served is `served.json` (promotion
and rollback move it); a repository never promoted into serves the latest.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from adaptive_rag.contracts import CLASSIFIER_INPUTS, CLASSIFIER_MODEL, CLASSIFIER_OUTPUT, TIERS
from adaptive_rag.routing.model_repository import (
    MODEL_FILE, config_pbtxt, next_version, write_config,
)
from adaptive_rag.routing.policy import PolicyThresholds

SAMPLE_TEXTS = (
    "hi",
    "Who wrote the novel Dune?",
    "Which film came out first, Blind Shaft or The Mask Of Fu Manchu, and who directed each?",
    "What is the difference between the capital of France and the largest city of Germany?",
)
COPIED = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "classifier.json",
          "MODEL_CARD.md", "metrics.json", "validation.jsonl")


@dataclass
class ExportResult:
    version: int
    version_dir: Path
    onnx_path: Path
    max_abs_diff: float
    quantization: dict | None = None


def export_onnx(network, tokenizer, path: Path, opset: int = 17) -> None:
    """Trace `network` to ONNX with dynamic batch and sequence axes, one self-contained file."""
    import torch

    network.eval()
    enc = tokenizer(list(SAMPLE_TEXTS[:2]), padding=True, return_tensors="pt")
    args = (enc["input_ids"].to(torch.int64), enc["attention_mask"].to(torch.int64))
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(
            network, args, str(path),
            input_names=list(CLASSIFIER_INPUTS), output_names=[CLASSIFIER_OUTPUT],
            dynamic_axes={
                **{name: {0: "batch", 1: "sequence"} for name in CLASSIFIER_INPUTS},
                CLASSIFIER_OUTPUT: {0: "batch"},
            },
            opset_version=opset, do_constant_folding=True, dynamo=False,
        )


def onnx_parity(network, tokenizer, onnx_path: Path, texts=SAMPLE_TEXTS, max_length: int = 128) -> float:
    """Largest |logit difference| between PyTorch and ONNX Runtime on `texts` (one padded batch)."""
    import numpy as np
    import onnxruntime as ort
    import torch

    enc = tokenizer(list(texts), padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        expected = network(enc["input_ids"], enc["attention_mask"]).float().numpy()
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    got = session.run([CLASSIFIER_OUTPUT], {
        name: enc[name].numpy().astype(np.int64) for name in CLASSIFIER_INPUTS
    })[0]
    if got.shape != expected.shape:
        raise AssertionError(f"ONNX logits shape {got.shape} != PyTorch {expected.shape}")
    return float(np.max(np.abs(got - expected)))


def export_run(
    run_dir: Path,
    repository: Path,
    model_name: str = CLASSIFIER_MODEL,
    version: int | None = None,
    max_batch_size: int = 32,
    tolerance: float = 1e-4,
    int8: bool = False,
) -> ExportResult:
    """Export a trained run as the next version of `<repository>/<model_name>`.

    Raises when ONNX Runtime's logits differ from PyTorch's by more than `tolerance` (checked
    on the FP32 graph). With `int8`, the served `model.onnx` is the dynamically quantized graph
    (`model.fp32.onnx` is kept beside it) and its cost against FP32 is measured and recorded in
    `classifier.json` under `quantization`.
    """
    from adaptive_rag.training.model import load_checkpoint

    network, tokenizer, meta = load_checkpoint(run_dir)
    model_dir = Path(repository) / model_name
    version = version or next_version(model_dir)
    version_dir = model_dir / str(version)
    if version_dir.exists():
        raise FileExistsError(f"model version already exists: {version_dir}")
    staging = model_dir / f".staging-{version}"
    shutil.rmtree(staging, ignore_errors=True)
    onnx_path = staging / MODEL_FILE
    export_onnx(network, tokenizer, onnx_path)
    diff = onnx_parity(network, tokenizer, onnx_path, max_length=meta.get("max_length", 128))
    if diff > tolerance:
        shutil.rmtree(staging, ignore_errors=True)
        raise AssertionError(f"ONNX parity failed: max |diff| {diff:.2e} > {tolerance:g}")
    for name in COPIED:
        if (Path(run_dir) / name).is_file():
            shutil.copy2(Path(run_dir) / name, staging / name)
    info = json.loads((staging / "classifier.json").read_text(encoding="utf-8"))
    info.update({
        "version": version, "run_dir": str(Path(run_dir).resolve()),
        "exported": time.strftime("%Y-%m-%dT%H:%M:%S"), "onnx_parity_max_abs_diff": diff,
    })
    if int8:
        info["quantization"] = quantize_int8(staging, run_dir, meta.get("max_length", 128))
    (staging / "classifier.json").write_text(json.dumps(info, indent=2), encoding="utf-8")
    if not (staging / "thresholds.json").exists():
        PolicyThresholds().save(staging / "thresholds.json")
    staging.rename(version_dir)
    # keeps the served pointer's version policy (an export alone is never served once one was promoted)
    write_config(model_dir, config_pbtxt(model_name, max_batch_size=max_batch_size))
    return ExportResult(version=version, version_dir=version_dir, onnx_path=version_dir / MODEL_FILE,
                        max_abs_diff=diff, quantization=info.get("quantization"))


def quantize_int8(version_dir: Path, run_dir: Path, max_length: int = 128) -> dict:
    """Dynamic INT8 quantization of `version_dir/model.onnx` (weights int8, activations quantized
    on the fly); the FP32 graph is kept as `model.fp32.onnx`. Returns the measured cost: logit
    differences and argmax agreement against FP32, and validation accuracy of both when the run
    has a validation slice with texts."""
    import numpy as np
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from adaptive_rag.routing.classifier_client import QueryTokenizer

    fp32, int8 = version_dir / "model.fp32.onnx", version_dir / "model.int8.onnx"
    (version_dir / MODEL_FILE).rename(fp32)
    quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8)
    rows = []
    val_path = Path(run_dir) / "validation.jsonl"
    if val_path.is_file():
        rows = [json.loads(line) for line in val_path.read_text(encoding="utf-8").splitlines() if line]
        rows = [r for r in rows if r.get("text")]
    texts = [r["text"] for r in rows] or list(SAMPLE_TEXTS)
    tokenize = QueryTokenizer(version_dir / "tokenizer.json", max_length, pad_to_multiple=1)
    sessions = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (fp32, int8)]
    outputs = [[], []]
    for text in texts:
        ids, mask = tokenize([text])
        for out, session in zip(outputs, sessions):
            out.append(session.run([CLASSIFIER_OUTPUT], dict(zip(CLASSIFIER_INPUTS, (ids, mask))))[0][0])
    a, b = np.array(outputs[0]), np.array(outputs[1])
    report = {
        "kind": "int8 dynamic (onnxruntime quantize_dynamic, QInt8 weights)",
        "n": len(texts), "on": "validation slice" if rows else "sample texts",
        "max_abs_logit_diff": float(np.abs(a - b).max()),
        "mean_abs_logit_diff": float(np.abs(a - b).mean()),
        "argmax_agreement": float((a.argmax(1) == b.argmax(1)).mean()),
        "bytes_fp32": fp32.stat().st_size, "bytes_int8": int8.stat().st_size,
    }
    if rows:
        truth = np.array([[t.value for t in TIERS].index(r["label"]) for r in rows])
        report["val_accuracy_fp32"] = float((a.argmax(1) == truth).mean())
        report["val_accuracy_int8"] = float((b.argmax(1) == truth).mean())
    int8.rename(version_dir / MODEL_FILE)
    return report
