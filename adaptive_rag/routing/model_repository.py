"""The Triton model repository of the complexity classifier (no torch needed).

`<repo>/<model>/config.pbtxt` and one numbered directory per version holding `model.onnx`, the
tokenizer files, `classifier.json` and `thresholds.json`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from adaptive_rag.contracts import CLASSIFIER_INPUTS, CLASSIFIER_MODEL, CLASSIFIER_OUTPUT, TIERS
from adaptive_rag.errors import ConfigurationError
from adaptive_rag.routing.policy import PolicyThresholds

MODEL_FILE = "model.onnx"
TOKENIZER_FILE = "tokenizer.json"


def config_pbtxt(
    name: str = CLASSIFIER_MODEL,
    max_batch_size: int = 32,
    queue_delay_us: int = 500,
    num_versions: int = 1,
    instances: int = 1,
) -> str:
    """Triton model configuration: onnxruntime backend, dynamic batching, latest-N versions."""
    preferred = [b for b in (4, 8, 16, 32, 64) if b <= max_batch_size] or [max_batch_size]
    return f"""name: "{name}"
backend: "onnxruntime"
max_batch_size: {max_batch_size}
input [
  {{
    name: "{CLASSIFIER_INPUTS[0]}"
    data_type: TYPE_INT64
    dims: [ -1 ]
  }},
  {{
    name: "{CLASSIFIER_INPUTS[1]}"
    data_type: TYPE_INT64
    dims: [ -1 ]
  }}
]
output [
  {{
    name: "{CLASSIFIER_OUTPUT}"
    data_type: TYPE_FP32
    dims: [ 3 ]
  }}
]
dynamic_batching {{
  preferred_batch_size: [ {", ".join(str(b) for b in preferred)} ]
  max_queue_delay_microseconds: {queue_delay_us}
}}
version_policy: {{ latest: {{ num_versions: {num_versions} }} }}
instance_group [
  {{
    count: {instances}
    kind: KIND_CPU
  }}
]
"""


def versions(model_dir: Path) -> list[int]:
    """Version numbers present under `model_dir` (numbered directories holding a model.onnx)."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        return []
    return sorted(
        int(p.name) for p in model_dir.iterdir()
        if p.is_dir() and p.name.isdigit() and (p / MODEL_FILE).is_file()
    )


def next_version(model_dir: Path) -> int:
    found = versions(model_dir)
    taken = [int(p.name) for p in Path(model_dir).iterdir() if p.name.isdigit()] if Path(model_dir).is_dir() else []
    return max(found + taken, default=0) + 1


@dataclass(frozen=True)
class ModelVersion:
    """One exported version: where its files are and what it needs at serving time."""

    name: str
    version: int
    path: Path
    max_length: int
    labels: tuple[str, ...]
    untrained: bool = False  # a bootstrap export (fresh head): serves, but routes at random

    @property
    def onnx_path(self) -> Path:
        return self.path / MODEL_FILE

    @property
    def tokenizer_path(self) -> Path:
        return self.path / TOKENIZER_FILE

    def thresholds(self) -> PolicyThresholds:
        return PolicyThresholds.load_or_default(self.path)


def open_version(repository: Path, name: str = CLASSIFIER_MODEL, version: int | None = None) -> ModelVersion:
    """The given version (default: the latest) of model `name` in `repository`."""
    model_dir = Path(repository) / name
    available = versions(model_dir)
    if not available:
        raise ConfigurationError(
            f"no exported model under {model_dir}; run `arag classifier train` and `export` first"
        )
    chosen = version if version is not None else available[-1]
    if chosen not in available:
        raise ConfigurationError(f"version {chosen} not in {model_dir} (have {available})")
    path = model_dir / str(chosen)
    info_path = path / "classifier.json"
    info = json.loads(info_path.read_text(encoding="utf-8")) if info_path.is_file() else {}
    if not (path / TOKENIZER_FILE).is_file():
        raise ConfigurationError(f"{path} lacks {TOKENIZER_FILE}")
    return ModelVersion(
        name=name, version=chosen, path=path, max_length=int(info.get("max_length", 128)),
        labels=tuple(info.get("labels", [t.value for t in TIERS])), untrained=bool(info.get("untrained")),
    )
