"""The default reader itself (the rest of the suite runs the smallest one): pinned, verified,
answering through its chat template in every strategy form it is given."""

from __future__ import annotations

import pytest

from adaptive_rag.domain import Passage
from adaptive_rag.llm import build_llm
from adaptive_rag.readers import DEFAULT_READER, READERS, is_verified, model_path
from adaptive_rag.settings import Settings, prompt_style
from adaptive_rag.strategies.no_retrieval import NoRetrieval
from adaptive_rag.strategies.single_step import read_answer

pytestmark = pytest.mark.model

PASSAGES = [
    Passage("1", "Arthur's Magazine", "Arthur's Magazine (1844-1846) was an American literary "
            "periodical published in Philadelphia in the 19th century.", 1.0),
    Passage("2", "First for Women", "First for Women is a woman's magazine published by Bauer "
            "Media Group in the USA. The magazine was started in 1989.", 1.0),
]


@pytest.fixture(scope="module")
def settings() -> Settings:
    return Settings(reader=DEFAULT_READER, llm_threads=2, llm_context=2048)


@pytest.fixture(scope="module")
def llm(settings: Settings):
    return build_llm(settings)


def test_the_default_reader_is_assembled_and_verified(settings: Settings, llm) -> None:
    reader = READERS[DEFAULT_READER]
    assert is_verified(reader, model_path(reader, settings.cache_dir))
    assert llm.prompt_style == prompt_style(settings) == reader.prompt_style


def test_it_reads_the_passages(llm) -> None:
    answer = read_answer(llm, "Where was Arthur's Magazine published?", PASSAGES)
    assert "philadelphia" in answer.lower() and len(answer.split()) <= 6


def test_it_answers_without_passages(llm) -> None:
    result = NoRetrieval(llm).run("What is the capital of France?")
    assert "paris" in result.answer.lower()
