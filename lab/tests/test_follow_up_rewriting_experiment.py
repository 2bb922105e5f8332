"""The follow-up rewriting experiment: the reader sees only the turns the product sends it in
`rules+reader`, every turn the rules leave as sent in `reader_unmarked`, and the summary's ratio,
methods and two-question counts come from the records."""

from __future__ import annotations

from collections.abc import Sequence

from adaptive_rag.domain import Completion, Passage
from adaptive_rag.evaluation.support import FollowUpTurn, SupportSuite
from lab.experiments.follow_up_rewriting import run_knowledge_base, summaries


class ScriptedLLM:
    prompt_style = "completion"

    def __init__(self, reply: str) -> None:
        self.reply = reply
        self.prompts: list[str] = []

    def generate(self, prompt: str, max_tokens: int, stop: Sequence[str] = ()) -> Completion:
        self.prompts.append(prompt)
        return Completion(self.reply)


class KeywordRetriever:
    """Finds document `d-<word>` for every word of the query that names one."""

    def __init__(self, docs: Sequence[str]) -> None:
        self.docs = docs

    def search(self, query: str, k: int) -> list[Passage]:
        words = query.lower().replace("?", " ").split()
        return [Passage(f"d-{d}#0", d, "") for d in self.docs if d in words][:k]


TURNS = [
    # a pronoun: the rules rewrite it; the reader is not asked
    FollowUpTurn("t1", "What is the warranty on the frame?", "how long is it?", "How long is the frame warranty?",
                 ("d-frame",), split_key="x"),
    # no sign of depending on the conversation: as sent, except in reader_unmarked
    FollowUpTurn("t2", "Do you ship to canada?", "how much is express?", "How much is express to canada?",
                 ("d-canada",), split_key="x"),
]


def test_the_reader_sees_only_what_the_product_sends_it_and_the_widened_row_the_rest() -> None:
    llm = ScriptedLLM("How much is express shipping to canada?")
    suite = SupportSuite([], [], [], name="kb")
    records = run_knowledge_base(suite, KeywordRetriever(["frame", "canada"]), TURNS, llm)
    assert len(llm.prompts) == 1 and "how much is express?" in llm.prompts[0]
    first, second = records
    assert first["methods"] == {"rules": "rules", "rules+reader": "rules", "reader_unmarked": "rules"}
    assert second["methods"] == {"rules": "none", "rules+reader": "none", "reader_unmarked": "reader"}
    assert second["hit_5"]["as_typed"] == 0.0 and second["hit_5"]["reader_unmarked"] == 1.0
    found = summaries(records)["kb"]
    whole = found[next(iter(found))] if "all" not in found else found["all"]
    assert whole["hit_5"]["standalone"]["estimate"] == 1.0
    assert whole["vs_standalone"]["rules+reader"]["estimate"] == whole["hit_5"]["rules+reader"]["estimate"]
    assert whole["methods"]["reader_unmarked"] == {"reader": 1, "rules": 1}
    assert whole["reader_calls"] == 0  # rules+reader asked the reader for no turn


def test_a_rewrite_that_asks_several_things_is_counted() -> None:
    llm = ScriptedLLM("Do you ship to canada at all? How much is express?")
    records = run_knowledge_base(SupportSuite([], [], [], name="kb"), KeywordRetriever(["canada"]), TURNS[1:], llm)
    found = summaries(records)["kb"]
    assert next(iter(found.values()))["two_questions"] == {"rules": 0, "rules+reader": 0, "reader_unmarked": 1}
