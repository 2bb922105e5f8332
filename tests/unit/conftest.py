"""Shared fixtures of the unit suite: the port fakes and an environment free of settings."""

from __future__ import annotations

import pytest
from fakes import FakeLLM, FakeRetriever, make_passages

from adaptive_rag.settings import Settings
from tests.conftest import TEST_READER


def _settings_env_names() -> set[str]:
    """Every environment name `Settings` reads (its validation aliases)."""
    names: set[str] = set()
    for name, field in Settings.model_fields.items():
        names.add(name)
        alias = field.validation_alias
        for choice in getattr(alias, "choices", ()) or ():
            if isinstance(choice, str):
                names.add(choice)
    return names


SETTINGS_ENV = frozenset(_settings_env_names())


@pytest.fixture(autouse=True)
def _clean_settings_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit tests never depend on the caller's ARAG_* / LLM_* / OPENSEARCH_* variables; the
    reader is the suite's own (`tests/conftest.py`), so tier C and the prompts are the same on
    every machine whatever the default reader is."""
    for name in SETTINGS_ENV:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.setenv("ARAG_READER", TEST_READER)


@pytest.fixture
def settings() -> Settings:
    """Default settings, ignoring any `.env` file."""
    return Settings(_env_file=None)


@pytest.fixture
def fake_llm() -> FakeLLM:
    return FakeLLM()


@pytest.fixture
def passages():
    return make_passages(10)


@pytest.fixture
def fake_retriever(passages) -> FakeRetriever:
    return FakeRetriever(passages)
