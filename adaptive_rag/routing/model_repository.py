"""The Triton model repository of the complexity classifier (no torch needed).

`<repo>/<model>/config.pbtxt`, one numbered directory per version holding `model.onnx`, the
tokenizer files, `classifier.json` and `thresholds.json`, and `served.json`: which version users
get (`served_version`; promotion and rollback move it with `switch_served`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adaptive_rag.contracts import CLASSIFIER_INPUTS, CLASSIFIER_MODEL, CLASSIFIER_OUTPUT, TIERS
from adaptive_rag.errors import AdaptiveRagError, ConfigurationError, short_error
from adaptive_rag.routing.policy import PolicyThresholds

if TYPE_CHECKING:
    from adaptive_rag.routing.classifier_client import TritonClassifier
    from adaptive_rag.settings import ClassifierSettings

MODEL_FILE = "model.onnx"
TOKENIZER_FILE = "tokenizer.json"


def config_pbtxt(
    name: str = CLASSIFIER_MODEL,
    max_batch_size: int = 32,
    queue_delay_us: int = 0,
    num_versions: int = 1,
    instances: int = 1,
    keep: Sequence[int] | None = None,
) -> str:
    """Triton model configuration: onnxruntime backend, dynamic batching; versions: the latest
    `num_versions`, or exactly `keep` (`specific`, what promotion and rollback write).

    No queue delay by default: the dynamic batcher still merges the requests that queue while the
    instance is busy (when batching pays), but with a delay every lone request waits all of it
    (500 us cost 0.6 ms of Triton queue per single-stream call here).
    """
    policy = (f"specific: {{ versions: [ {', '.join(str(v) for v in sorted(set(keep)))} ] }}" if keep
              else f"latest: {{ num_versions: {num_versions} }}")
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
version_policy: {{ {policy} }}
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
    """The given version (default: the *served* one, see `served_version`) of model `name`."""
    model_dir = Path(repository) / name
    available = versions(model_dir)
    if not available:
        raise ConfigurationError(
            f"no exported model under {model_dir}; run `arag classifier train` and `export` first"
        )
    chosen = version if version is not None else served_version(model_dir)
    if chosen not in available:
        raise ConfigurationError(f"version {chosen} not in {model_dir} (have {available})")
    return version_at(model_dir / str(chosen), name)


def open_classifier(settings: ClassifierSettings, version: int | None = None, **kwargs: Any) -> TritonClassifier:
    """A Triton client for `version` (default: the served one) of the configured model, with the
    configured timeout and batch size; `kwargs` go to `TritonClassifier`."""
    from adaptive_rag.routing.classifier_client import TritonClassifier

    model = open_version(settings.model_repository, settings.classifier_model, version)
    kwargs.setdefault("timeout_s", settings.classifier_timeout_s)
    kwargs.setdefault("max_batch", settings.classifier_max_batch)
    return TritonClassifier.from_version(model, url=settings.triton_grpc_url, **kwargs)


def version_at(path: Path, name: str = CLASSIFIER_MODEL) -> ModelVersion:
    """The exported version in directory `path` (named by its number, or 0 when it is not one:
    a candidate not published yet)."""
    path = Path(path)
    info_path = path / "classifier.json"
    info = json.loads(info_path.read_text(encoding="utf-8")) if info_path.is_file() else {}
    if not (path / TOKENIZER_FILE).is_file():
        raise ConfigurationError(f"{path} lacks {TOKENIZER_FILE}")
    return ModelVersion(
        name=name, version=int(path.name) if path.name.isdigit() else 0, path=path,
        max_length=int(info.get("max_length", 128)),
        labels=tuple(info.get("labels", [t.value for t in TIERS])), untrained=bool(info.get("untrained")),
    )


def describe_version(version: ModelVersion) -> str:
    """One line for people: which router this version is and how it scored on the `test` labels
    (as recorded when it was published), or that it is untrained."""
    info_path = version.path / "classifier.json"
    info = json.loads(info_path.read_text(encoding="utf-8")) if info_path.is_file() else {}
    name = info.get("name") or ("untrained MiniLM-L6 (bootstrap)" if version.untrained
                                else f"fine-tuned {Path(info['base']).name}" if info.get("base")
                                else "classifier")
    line = f"{name}, {version.name} v{version.version}"
    test = (info.get("evaluation") or {}).get("test_labels") or {}
    if test:
        line += (f"; accuracy on {test['n']} `test` labels {test['accuracy']:.1%} (the dataset-identity "
                 f"rule: {test['dataset_rule_accuracy']:.1%}), labels by {test.get('reader', '?')}")
    return line


# --- the served version ------------------------------------------------------------------------------
#
# Versions stay on disk; which one users get is a pointer, `served.json`, written atomically by
# promotion and rollback only (an export alone never changes it). Beside it, config.pbtxt's
# `version_policy: { specific: { versions: [...] } }` names what Triton keeps loaded: the served
# version and the one served before it, so a front door still pinned to the old version keeps
# its answers until it moves, and a rollback to it is instant. Without a pointer (a repository
# never promoted into) the latest version is served, as Triton's `latest` policy does.

SERVED_FILE = "served.json"
CONFIG_FILE = "config.pbtxt"
HISTORY_LIMIT = 50
HEALTH_QUERY = "Which is older, the Eiffel Tower or Big Ben?"


class ServingSwitchError(AdaptiveRagError):
    """A version could not be made the served one (absent, does not load, Triton refused it);
    the served version is unchanged."""


@dataclass(frozen=True)
class ServedState:
    """`served.json`: the served version, the versions served before it (oldest first, ending
    with `version`) and the versions config.pbtxt keeps loaded."""

    version: int
    history: tuple[int, ...]
    loaded: tuple[int, ...]
    updated_at: str = ""
    reason: str = ""

    @property
    def previous(self) -> int | None:
        """The version served before this one (what `arag model rollback` returns to)."""
        return self.history[-2] if len(self.history) >= 2 else None

    def to_json(self) -> str:
        return json.dumps({"version": self.version, "history": list(self.history),
                           "loaded": list(self.loaded), "updated_at": self.updated_at,
                           "reason": self.reason}, indent=2)


def read_served(model_dir: Path) -> ServedState | None:
    """The pointer in `model_dir`, or None when there is none (or it is unreadable)."""
    path = Path(model_dir) / SERVED_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return ServedState(
            version=int(data["version"]), history=tuple(int(v) for v in data.get("history", [])),
            loaded=tuple(int(v) for v in data.get("loaded", [])),
            updated_at=str(data.get("updated_at", "")), reason=str(data.get("reason", "")),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def served_version(model_dir: Path) -> int | None:
    """The version users get: the pointer's, else (pointer absent or naming a version that is
    gone) the newest version of its history still on disk, else the latest version."""
    available = versions(model_dir)
    state = read_served(model_dir)
    if state is not None:
        for candidate in (state.version, *reversed(state.history)):
            if candidate in available:
                return candidate
    return available[-1] if available else None


def pin_served(model_dir: Path) -> ServedState | None:
    """Write a pointer naming the version served now when there is none yet, so a version
    directory added next (a promotion's challenger) does not become "the latest" and get served
    before it passed. Returns the pointer (None: no version at all)."""
    model_dir = Path(model_dir)
    state = read_served(model_dir)
    if state is not None:
        return state
    current = served_version(model_dir)
    if current is None:
        return None
    state = ServedState(version=current, history=(current,), loaded=(current,),
                        updated_at=datetime.now(UTC).isoformat(timespec="seconds"),
                        reason="pinned: the latest version, served before any pointer existed")
    atomic_write(model_dir / SERVED_FILE, state.to_json())
    return state


def atomic_write(path: Path, text: str) -> None:
    """Write `text` to `path` so a reader (Triton, a front door) sees the old or the new file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    with tmp.open("w", encoding="utf-8") as sink:
        sink.write(text)
        sink.flush()
        os.fsync(sink.fileno())
    os.replace(tmp, path)


def _policy_span(text: str) -> tuple[int, int] | None:
    """Start and end of the `version_policy: { ... }` block in a config.pbtxt (braces matched)."""
    match = re.search(r"^\s*version_policy\s*:?\s*\{", text, re.MULTILINE)
    if match is None:
        return None
    depth, index = 0, match.end() - 1
    while index < len(text):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        index += 1
        if depth == 0:
            return match.start(), index
    return None


def set_version_policy(text: str, keep: Sequence[int]) -> str:
    """`text` (a config.pbtxt) with its version policy replaced by `specific: keep`; the rest of
    the operator's configuration (batching, instances) is left as it is."""
    policy = "version_policy: { specific: { versions: [ " + ", ".join(str(v) for v in sorted(set(keep))) + " ] } }"
    span = _policy_span(text)
    if span is None:
        return text.rstrip("\n") + "\n" + policy + "\n"
    start, end = span
    prefix = text[:start]
    if prefix and not prefix.endswith("\n"):
        prefix += "\n"
    return prefix + policy + text[end:]


def write_config(model_dir: Path, text: str | None = None, keep: Sequence[int] | None = None) -> Path:
    """Write `<model_dir>/config.pbtxt` atomically (default text: the existing file, else the
    standard config). Its version policy becomes `specific: keep`, or, without `keep`, the
    served pointer's loaded versions; with neither, `text` is written as it is."""
    model_dir = Path(model_dir)
    path = model_dir / CONFIG_FILE
    if text is None:
        text = path.read_text(encoding="utf-8") if path.is_file() else config_pbtxt(model_dir.name)
    if keep is None:
        state = read_served(model_dir)
        keep = state.loaded if state is not None and state.loaded else None
    model_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(path, set_version_policy(text, keep) if keep else text)
    return path


def _triton_load(url: str, model: ModelVersion, timeout_s: float) -> None:
    """Ask the Triton at `url` (EXPLICIT model control) to (re)load `model.name` from its
    config.pbtxt, then require `model.version` ready and one real inference through it.

    Triton keeps the versions it already serves while it loads; a failed load leaves them as
    they were, so this never takes the served version down."""
    import tritonclient.grpc as grpcclient

    from adaptive_rag.routing.classifier_client import TritonClassifier

    client = grpcclient.InferenceServerClient(url)
    try:
        client.load_model(model.name, client_timeout=timeout_s)
        if not client.is_model_ready(model.name, str(model.version), client_timeout=timeout_s):
            raise ServingSwitchError(f"Triton {url} loaded {model.name} but version {model.version} is not ready")
    finally:
        client.close()
    with TritonClassifier.from_version(model, url=url, model_version=str(model.version),
                                       timeout_s=min(timeout_s, 10.0), batching=False,
                                       retry_after_s=0.0) as probe:
        decision = probe.classify(HEALTH_QUERY)
    if decision.fallback:
        raise ServingSwitchError(f"Triton {url}: version {model.version} does not answer: {decision.reason}")


def _triton_reload(url: str, name: str, timeout_s: float) -> None:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    try:
        client.load_model(name, client_timeout=timeout_s)
    finally:
        client.close()


def triton_targets(urls: str | Sequence[str] | None) -> list[str]:
    """Every Triton the switch must load on: a comma-separated list or a sequence of
    `host:port`; `dns:///host:port` stands for every IPv4 address of `host` (a Kubernetes
    headless service: one per Triton pod)."""
    if not urls:
        return []
    items = [u.strip() for u in (urls.split(",") if isinstance(urls, str) else urls) if u and u.strip()]
    found: list[str] = []
    for item in items:
        if item.startswith("dns:///"):
            host, _, port = item[len("dns:///"):].rpartition(":")
            try:
                infos = socket.getaddrinfo(host, int(port), socket.AF_INET, socket.SOCK_STREAM)
            except (OSError, ValueError) as exc:
                raise ServingSwitchError(f"{item}: {exc}") from exc
            found.extend(f"{address}:{port}" for address in sorted({info[4][0] for info in infos}))
        else:
            found.append(item)
    return list(dict.fromkeys(found))


def switch_served(
    model_dir: Path,
    version: int,
    triton_urls: Sequence[str] = (),
    reason: str = "",
    timeout_s: float = 120.0,
) -> ServedState:
    """Make `version` the served one, without a gap.

    1. config.pbtxt keeps the served version and `version` loaded (`specific` policy);
    2. each Triton in `triton_urls` (`triton_targets`: `dns:///host:port` is every address of
       `host`, resolved now) loads it (`load_model`; the old version keeps serving meanwhile) and
       must report it ready and answer one query;
    3. only then `served.json` names it; front doors and in-process routers follow the pointer.

    On any failure the config is put back (and Tritons that already loaded reload it, which
    unloads the new version again) and `ServingSwitchError` is raised: the served version is
    unchanged. Versions older than the two kept stay on disk, unloaded.
    """
    model_dir, triton_urls = Path(model_dir), triton_targets(list(triton_urls))  # dns:/// -> each pod
    if version not in versions(model_dir):
        raise ServingSwitchError(f"version {version} not in {model_dir} (have {versions(model_dir)})")
    model = open_version(model_dir.parent, model_dir.name, version)
    state = read_served(model_dir)
    current = served_version(model_dir)
    history = list(state.history) if state is not None and state.history else ([current] if current else [])
    before_keep = list(state.loaded) if state is not None and state.loaded else ([current] if current else [])
    keep = sorted({v for v in (current, version) if v is not None})
    config_path = model_dir / CONFIG_FILE
    before = config_path.read_text(encoding="utf-8") if config_path.is_file() else config_pbtxt(model_dir.name)
    write_config(model_dir, before, keep)
    done: list[str] = []
    try:
        for url in triton_urls:
            _triton_load(url, model, timeout_s)
            done.append(url)
    except Exception as exc:
        write_config(model_dir, before, before_keep or None)
        for url in [*done, *triton_urls[len(done):len(done) + 1]]:
            # Back to the old loaded set (unloads the new version where it did load); best
            # effort: the old versions were never unloaded.
            with contextlib.suppress(Exception):
                _triton_reload(url, model.name, timeout_s)
        if isinstance(exc, ServingSwitchError):
            raise
        raise ServingSwitchError(f"Triton refused version {version}: {short_error(exc, 300)}") from exc
    if version in history:  # a rollback to a version served before: back to that point
        history = history[: len(history) - history[::-1].index(version)]
    else:
        history.append(version)
    served = ServedState(version=version, history=tuple(history[-HISTORY_LIMIT:]), loaded=tuple(keep),
                         updated_at=datetime.now(UTC).isoformat(timespec="seconds"), reason=reason)
    atomic_write(model_dir / SERVED_FILE, served.to_json())
    return served
