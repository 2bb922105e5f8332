"""The port fakes themselves: they satisfy the protocols and record what strategies send."""

from __future__ import annotations

import pytest
from fakes import FakeLLM, FakeRetriever, make_passages

from adaptive_rag.ports import LLM, Retriever


def test_fakes_satisfy_the_ports(fake_llm, fake_retriever) -> None:
    assert isinstance(fake_llm, LLM)
    assert isinstance(fake_retriever, Retriever)


def test_fake_llm_replays_a_list_and_records_calls() -> None:
    llm = FakeLLM(["one", "two"])
    assert llm.generate("p1", 5, ("\n",)).text == "one"
    assert llm.generate("p2", 7).text == "two"
    assert [(c.prompt, c.max_tokens, c.stop) for c in llm.calls] == [
        ("p1", 5, ("\n",)), ("p2", 7, ()),
    ]
    with pytest.raises(AssertionError, match="no scripted reply"):
        llm.generate("p3", 1)


def test_fake_llm_callable_script() -> None:
    llm = FakeLLM(lambda prompt: prompt.upper())
    assert llm.generate("abc", 3).text == "ABC"
    assert llm.prompts == ["abc"]


def test_fake_retriever_bounds_by_k_and_records(fake_retriever, passages) -> None:
    assert fake_retriever.search("q", 3) == passages[:3]
    assert fake_retriever.search("r", 0) == []
    assert fake_retriever.queries == [("q", 3), ("r", 0)]
    scripted = FakeRetriever(lambda query, k: make_passages(k, prefix=query))
    assert [p.id for p in scripted.search("x", 2)] == ["x0", "x1"]
