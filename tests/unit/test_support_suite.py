"""The support suite: its construction from the COVID FAQ files, its metrics on hand-made cases,
and the runner (fake LLM and retriever) writing report.json, report.md and support.png."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import pytest
from fakes import FakeLLM, FakeRetriever

from adaptive_rag.contracts import RoutingDecision, Tier
from adaptive_rag.domain import Passage
from adaptive_rag.errors import ConfigurationError
from adaptive_rag.evaluation.datasets import split_of
from adaptive_rag.evaluation.support import (
    FAQ_FILE,
    GOLD_TIER,
    KINDS,
    SIMILARITY_FILE,
    SMALL_TALK_STRATEGY,
    SupportOutcome,
    SupportQuery,
    bootstrap_interval,
    build_report,
    build_suite,
    doc_id_of,
    evaluate_support,
    join_questions,
    load_small_talk,
    retrieval_hits,
    rouge_l,
    route,
    run_support,
    score_row,
    summarise_row,
    threshold_sweep,
    write_support_report,
)
from adaptive_rag.knowledge.documents import derived_document_id, normalise_title
from adaptive_rag.settings import Settings, multi_step_strategy

COVID_KINDS = tuple(k for k in KINDS if k not in ("question", "uncovered"))  # the help centre's own
from adaptive_rag.strategies import Abstention, SingleStep

REPO = Path(__file__).resolve().parents[2]
DATA_DIR = REPO / ".." / "shared" / "data"


@pytest.fixture(scope="module")
def suite():
    if not (DATA_DIR / FAQ_FILE).is_file():
        pytest.skip(f"support data not found in {DATA_DIR}")
    return build_suite(DATA_DIR, Settings(_env_file=None, data_dir=DATA_DIR))


# --- construction ------------------------------------------------------------------------------


def test_counts_per_kind(suite) -> None:
    counts = Counter(q.kind for q in suite.queries)
    assert len(suite.entries) == 213
    assert counts["paraphrase"] == 240  # distinct question_2 of the 244 positive pairs
    assert counts["faq"] == 208  # distinct FAQ questions (five are asked twice)
    assert counts["small_talk"] == len(load_small_talk()) >= 40
    assert counts["joined"] == 60
    assert counts["out_of_kb"] == 80
    assert set(counts) == set(COVID_KINDS)


def test_ids_are_unique_and_splits_follow_the_shared_hash_rule(suite) -> None:
    ids = [q.id for q in suite.queries]
    assert len(ids) == len(set(ids))
    assert all(q.split == split_of("support", q.id) for q in suite.queries)
    train = sum(q.split == "train" for q in suite.queries) / len(suite.queries)
    assert 0.5 < train < 0.7
    for kind in COVID_KINDS:
        kinds = [q for q in suite.queries if q.kind == kind]
        assert {q.split for q in kinds} == {"train", "test"}


def test_suite_is_stable_across_builds(suite) -> None:
    again = build_suite(DATA_DIR, Settings(_env_file=None, data_dir=DATA_DIR))
    assert [(q.id, q.query, q.split, q.gold_groups) for q in again.queries] == [
        (q.id, q.query, q.split, q.gold_groups) for q in suite.queries
    ]


def test_gold_tiers_and_abstain_expectations(suite) -> None:
    for query in suite.queries:
        assert query.gold_tier == GOLD_TIER[query.kind]
        assert query.expect_abstain == (query.kind == "out_of_kb")
        assert bool(query.gold_groups) == query.in_kb
        if query.in_kb:
            assert query.gold_answers and all(query.gold_answers)


def test_gold_mapping_covers_every_positive_pair(suite) -> None:
    with (DATA_DIR / SIMILARITY_FILE).open(encoding="utf-8", newline="") as handle:
        positives = [row for row in csv.DictReader(handle) if row["similar"] == "1"]
    assert len(positives) == 244
    by_text = {normalise_title(q.query): q for q in suite.queries if q.kind == "paraphrase"}
    entries = {e.doc_id: e for e in suite.entries}
    for pair in positives:
        query = by_text[normalise_title(pair["question_2"])]
        gold_questions = {normalise_title(entries[d].question) for d in query.gold_groups[0]}
        assert normalise_title(pair["question_1"]) in gold_questions


def test_gold_ids_are_the_importers_ids(suite) -> None:
    indexed = {p.doc_id for p in suite.passages}
    assert all(p.doc_id and p.id.startswith(p.doc_id + "#") for p in suite.passages)
    for entry in suite.entries:
        assert entry.doc_id in indexed
        assert entry.doc_id.startswith(derived_document_id(entry.question, prefix="faq"))
    repeated = [q for q in suite.queries if q.kind == "faq" and len(q.gold_groups[0]) > 1]
    assert len(repeated) == 5  # a question asked twice: either entry answers it


def test_joined_questions(suite) -> None:
    joined = [q for q in suite.queries if q.kind == "joined"]
    for query in joined:
        assert len(query.gold_groups) == 2 and not set(query.gold_groups[0]) & set(query.gold_groups[1])
        assert query.query.count("? And ") == 1 and query.query.endswith("?")
    assert len({frozenset(q.gold_groups) for q in joined}) == len(joined)


def test_out_of_kb_questions_are_drawn_from_three_sets_off_topic(suite) -> None:
    out = [q for q in suite.queries if q.kind == "out_of_kb"]
    assert Counter(q.id.split("-")[1] for q in out) == {"nq": 27, "trivia": 27, "squad": 26}
    for query in out:
        assert not any(w in query.query.lower() for w in ("covid", "virus", "disease", "vaccin"))


def test_select_limits_per_kind_in_a_stable_order(suite) -> None:
    picked = suite.select("test", limit=3)
    assert Counter(q.kind for q in picked) == {kind: 3 for kind in COVID_KINDS}
    assert all(q.split == "test" for q in picked)
    assert picked == suite.select("test", limit=3)
    assert [q.kind for q in picked[:5]] != [picked[0].kind] * 5  # kinds interleaved


def test_join_questions() -> None:
    assert join_questions("What is X?", "How does it spread?") == "What is X? And how does it spread?"
    assert join_questions("What is X", "COVID-19 risks?") == "What is X? And COVID-19 risks?"


# --- metrics -----------------------------------------------------------------------------------


def test_retrieval_hits() -> None:
    single = (("a", "a2"),)
    assert retrieval_hits(["a", "b"], single) == (1.0, 1.0)
    assert retrieval_hits(["b", "c", "d", "e", "a2"], single) == (0.0, 1.0)
    assert retrieval_hits(["b", "c", "d", "e", "f", "a"], single) == (0.0, 0.0)  # sixth is out
    joined = (("a",), ("z",))
    assert retrieval_hits(["z", "x", "a"], joined) == (1.0, 1.0)
    assert retrieval_hits(["a", "x", "y"], joined) == (1.0, 0.0)  # both entries needed in top 5
    assert retrieval_hits([], joined) == (0.0, 0.0)
    assert retrieval_hits(["a"], ()) == (0.0, 0.0)


def test_doc_id_of() -> None:
    assert doc_id_of("faq-1#3") == "faq-1"
    assert doc_id_of("faq-1#3", "faq-9") == "faq-9"
    assert doc_id_of("plain") == "plain"


def test_rouge_l() -> None:
    assert rouge_l("wash your hands often", ["wash your hands often"]) == pytest.approx(1.0)
    assert rouge_l("", ["anything"]) == 0.0
    assert rouge_l("anything", []) == 0.0
    partial = rouge_l("wash hands", ["you should wash your hands"])
    assert 0.0 < partial < 1.0
    assert rouge_l("wash hands", ["unrelated text", "you should wash your hands"]) == partial


def test_bootstrap_interval() -> None:
    assert bootstrap_interval([]) is None
    assert bootstrap_interval([0.5] * 10) == (0.5, 0.5)
    values = [0.0] * 30 + [1.0] * 70
    low, high = bootstrap_interval(values)
    assert low < 0.7 < high and 0.55 < low and high < 0.85
    assert bootstrap_interval(values) == (low, high)  # seeded


def test_threshold_sweep_picks_the_best_separation() -> None:
    queries = [
        SupportQuery("i1", "faq", "in one", Tier.B, (("a",),), ("x",)),
        SupportQuery("i2", "paraphrase", "in two", Tier.B, (("a",),), ("x",)),
        SupportQuery("o1", "out_of_kb", "out one", Tier.B, expect_abstain=True),
        SupportQuery("t1", "small_talk", "hi", Tier.A),
    ]
    scores = {"in one": 12.0, "in two": 9.0, "out one": 4.0, "hi": 100.0}
    retriever = FakeRetriever(lambda q, k: [Passage("a#0", "t", "x", score=scores[q], doc_id="a")])
    sweep = threshold_sweep(queries, retriever, thresholds=[0.0, 5.0, 10.0])
    assert [p["false_abstain"] for p in sweep["points"]] == [0.0, 0.0, 0.5]
    assert [p["out_of_kb_abstain"] for p in sweep["points"]] == [0.0, 1.0, 1.0]
    assert sweep["best"]["threshold"] == 5.0 and (sweep["n_in"], sweep["n_out"]) == (2, 1)


# --- routing, scoring and the runner ------------------------------------------------------------


def hand_made_queries() -> list[SupportQuery]:
    return [
        SupportQuery("faq-1", "faq", "How does the virus spread?", Tier.B, (("d1",),), ("It spreads by droplets.",)),
        SupportQuery("para-1", "paraphrase", "In which ways is the virus spread?", Tier.B, (("d1",),), ("It spreads by droplets.",)),
        SupportQuery("joined-1", "joined", "What is X? And what is Y?", Tier.C, (("d1",), ("d2",)), ("It spreads by droplets.\n\nY is y.",)),
        SupportQuery("talk-1", "small_talk", "thanks!", Tier.A),
        SupportQuery("ookb-1", "out_of_kb", "Who painted the Mona Lisa?", Tier.B, gold_answers=("Leonardo",), expect_abstain=True),
    ]


def kb_retriever() -> FakeRetriever:
    """The virus questions find d1 (and d2) with a high score; the painting finds a weak match."""

    def search(query: str, k: int) -> list[Passage]:
        if "Mona" in query:
            return [Passage("d9#0", "Art", "paint", score=1.0, doc_id="d9")]
        return [Passage("d1#0", "Spread", "It spreads by droplets.", score=9.0, doc_id="d1"),
                Passage("d2#0", "Y", "Y is y.", score=8.0, doc_id="d2")]

    return FakeRetriever(search)


def scripted_llm() -> FakeLLM:
    def reply(prompt: str) -> str:
        if "Split the question" in prompt:
            return "What is X?\nWhat is Y?"
        return "spreads by droplets"

    return FakeLLM(reply)


def test_route_fixed_rows_small_talk_and_router_results(settings: Settings) -> None:
    assert route("always_b", "thanks!", settings).strategy == "single_step"
    assert route("always_a", "q", settings).tier == Tier.A
    talk = route("router", "thanks!", settings)
    assert (talk.strategy, talk.tier) == (SMALL_TALK_STRATEGY, Tier.A)
    assert route("router", "Hi, how does the virus spread?", settings).strategy == "single_step"
    as_tier = route("router", "how long does the virus live on surfaces", settings, router=lambda q: Tier.C)
    assert (as_tier.strategy, as_tier.tier) == (multi_step_strategy(settings), Tier.C)
    decision = route("router", "how long does the virus live on surfaces", settings,
                     router=lambda q: RoutingDecision(tier=Tier.A))
    assert (decision.strategy, decision.tier) == ("no_retrieval", Tier.A)
    with pytest.raises(ConfigurationError):
        route("sometimes", "q", settings)


@pytest.fixture
def settings() -> Settings:
    """Tier C as the hand-made runs below count it: decompose (its split, then one read)."""
    return Settings(_env_file=None, multi_step="decompose")


def run_hand_made(settings: Settings, tmp_path: Path, llm: FakeLLM):
    from adaptive_rag.strategies import build_strategy

    retriever = kb_retriever()
    strategies = {
        "single_step": SingleStep(retriever, llm, abstention=Abstention(min_score=5.0)),
        # decompose itself (the runner's arithmetic below counts its two calls), not its parts
        "decompose": build_strategy("decompose", retriever, llm, settings.model_copy(update={"answer_parts": False})),
    }
    queries = hand_made_queries()
    outcomes = run_support(queries, ["router", "always_b"], strategies, tmp_path / "results.jsonl", settings)
    return queries, outcomes


def test_runner_scores_and_resumes(settings: Settings, tmp_path: Path) -> None:
    llm = scripted_llm()
    queries, outcomes = run_hand_made(settings, tmp_path, llm)
    # router: faq B, para B, joined C (decompose), talk canned, ookb B; always_b: B on all five.
    assert Counter(s for _, s in outcomes) == {"single_step": 5, "decompose": 1, SMALL_TALK_STRATEGY: 1}
    calls = len(llm.calls)
    again, second = run_hand_made(settings, tmp_path, FakeLLM([]))  # nothing left to run
    assert second.keys() == outcomes.keys()
    assert calls == 4 + 2  # four single-step reads (Mona Lisa abstains first) + decompose's two

    router = summarise_row(score_row("router", queries, outcomes, settings))
    overall = router["overall"]
    assert overall["tier_accuracy"]["mean"] == 1.0
    assert overall["out_of_kb_abstain"]["mean"] == 1.0  # below the threshold
    assert overall["false_abstain"]["mean"] == 0.0
    assert overall["small_talk_abstain"]["mean"] == 0.0
    assert overall["hit_1"]["mean"] == 1.0 and overall["hit_5"]["mean"] == 1.0
    # "spreads by droplets" against "It spreads by droplets." (P 1, R 3/4) twice, and against
    # the joined gold "It spreads by droplets. Y is y." (P 1, R 3/7) once.
    assert overall["f1"]["mean"] == pytest.approx((6 / 7 + 6 / 7 + 0.6) / 3)
    assert set(overall["seconds_by_tier"]) == {"A", "B", "C"}
    assert router["kinds"]["small_talk"]["f1"]["mean"] is None

    always_b = summarise_row(score_row("always_b", queries, outcomes, settings))
    assert always_b["overall"]["tier_accuracy"]["mean"] == pytest.approx(3 / 5)
    assert always_b["kinds"]["small_talk"]["abstain"]["mean"] == 0.0  # "thanks!" scored 9.0 here
    assert set(always_b["overall"]["seconds_by_tier"]) == {"B"}


def test_report_files(settings: Settings, tmp_path: Path) -> None:
    queries, outcomes = run_hand_made(settings, tmp_path, scripted_llm())
    report = build_report(["router", "always_b"], queries, outcomes, settings,
                          {"command": "arag eval --suite support"}, retriever=kb_retriever())
    paths = write_support_report(report, tmp_path / "out")
    assert [p.name for p in paths] == ["report.json", "report.md", "support.png"]
    assert all(p.stat().st_size > 0 for p in paths)
    data = json.loads(paths[0].read_text())
    assert set(data["rows"]) == {"router", "always_b"}
    assert data["differences"]["router - always_b, tier accuracy"]["mean"] == pytest.approx(0.4)
    text = paths[1].read_text()
    assert "`arag eval --suite support`" in text and "## out_of_kb" in text and "| router |" in text


def test_evaluate_support_end_to_end_with_fakes(tmp_path: Path) -> None:
    if not (DATA_DIR / FAQ_FILE).is_file():
        pytest.skip(f"support data not found in {DATA_DIR}")
    settings = Settings(_env_file=None, data_dir=DATA_DIR)
    retriever = FakeRetriever(lambda q, k: [Passage("faq-x#0", "T", "text", score=3.0, doc_id="faq-x")][:k])
    llm = scripted_llm()
    run = evaluate_support(settings, tmp_path / "support", limit=2, llm=llm, retriever=retriever,
                           meta={"command": "arag eval --suite support --limit 2"})
    assert [p.name for p in run.paths] == ["report.json", "report.md", "support.png"]
    assert all(p.exists() for p in run.paths)
    report = run.report
    assert report["meta"]["queries_per_kind"] == {kind: 2 for kind in COVID_KINDS}
    assert report["rows"]["router"]["overall"]["n"] == 10
    assert (tmp_path / "support" / "results.jsonl").exists()
    # resuming with other settings into the same directory is refused
    with pytest.raises(ConfigurationError, match="abstain_min_score"):
        evaluate_support(settings.model_copy(update={"abstain_min_score": 2.0}), tmp_path / "support",
                         limit=2, llm=llm, retriever=retriever)
    # report only: nothing runs, the same figures come back
    again = evaluate_support(settings, tmp_path / "support", limit=2, llm=FakeLLM([]),
                             retriever=retriever, run=False)
    assert again.report["rows"]["router"]["overall"]["n"] == 10


def test_outcome_round_trips_through_json() -> None:
    outcome = SupportOutcome("q", "single_step", "a", False, "why", 1, 0.5, ["d#0"], ["d"], [1.0], [])
    assert SupportOutcome(**json.loads(json.dumps(outcome.__dict__))) == outcome


# --- the CLI -----------------------------------------------------------------------------------


def test_cli_runs_the_support_suite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not (DATA_DIR / FAQ_FILE).is_file():
        pytest.skip(f"support data not found in {DATA_DIR}")
    from typer.testing import CliRunner

    import adaptive_rag.llm
    from adaptive_rag.cli import app

    monkeypatch.setattr(adaptive_rag.llm, "build_llm", lambda settings: scripted_llm())
    out = tmp_path / "support"
    args = ["eval", "--suite", "support", "--limit", "1", "--out", str(out), "--data-dir", str(DATA_DIR)]
    monkeypatch.setattr("sys.argv", ["arag", *args])  # the report records the command
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["meta"]["rows"] == ["router", "always_b"]
    assert report["meta"]["queries_per_kind"] == {kind: 1 for kind in COVID_KINDS}
    assert report["meta"]["abstain_min_relevance"].split(" (")[1].startswith("automatic: max(floor")
    assert report["meta"]["abstain_min_score"] == "0 (settings)"
    assert (out / "support.png").exists() and not (out / "kb_index").exists()  # index in a temp dir
    assert f"Command: `arag eval --suite support --limit 1 --out {out}" in (out / "report.md").read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["eval", "--suite", "nope"], "unknown suite 'nope'"),
        (["eval", "--split", "train", "--report-only"], "--split is for --suite support"),
        (["eval", "--suite", "support", "--strategies", "ircot", "--report-only"], "support rows are tiers a, b, c"),
        (["eval", "--abstain-min-score", "high", "--report-only"], "takes a number or auto"),
    ],
)
def test_cli_rejects_bad_suite_options(args: list[str], message: str) -> None:
    from typer.testing import CliRunner

    from adaptive_rag.cli import app

    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_the_help_centre_suite_has_gold_answers_follow_ups_and_both_kinds_of_uncovered_questions():
    from adaptive_rag.evaluation.help_centre import build_help_centre
    from adaptive_rag.evaluation.support import OUT_OF_KB, QUESTION, UNCOVERED

    suite = build_help_centre(Settings(_env_file=None))
    kinds = {q.kind for q in suite.queries}
    assert kinds == {QUESTION, UNCOVERED, OUT_OF_KB}
    known = {e.doc_id for e in suite.entries}
    for query in suite.queries:
        assert query.in_kb == (query.kind == QUESTION)
        assert query.expect_abstain == (query.kind != QUESTION)
        if query.in_kb:
            assert query.gold_answers and set(query.gold_groups[0]) <= known
    # the abstention experiment's split rule, so a question is `test` in both
    from adaptive_rag.evaluation.datasets import split_of
    assert all(q.split == split_of("demo-coverage", q.id) for q in suite.queries)
    assert {q.split for q in suite.queries} == {"train", "test"}
    assert suite.follow_ups and all(t.gold and set(t.gold) <= known for t in suite.follow_ups)
    assert all(t.follow_up != t.standalone for t in suite.follow_ups)


def test_follow_up_hits_scores_each_row_against_the_standalone_question(tmp_path):
    from adaptive_rag.evaluation.help_centre import build_help_centre
    from adaptive_rag.evaluation.support import follow_up_hits
    from adaptive_rag.retrieval.tantivy_index import TantivyRetriever

    suite = build_help_centre(Settings(_env_file=None))
    index = TantivyRetriever.build(tmp_path / "index", suite.passages)
    found = follow_up_hits(suite.follow_ups[:6], index)
    assert found["turns"] == 6 and len(found["records"]) == 6
    assert set(found["vs_standalone"]) == {"as_typed", "rewritten"}
    for record in found["records"]:
        assert set(record["hit_5"]) == {"standalone", "as_typed", "rewritten"}
        assert record["queries"]["as_typed"] == next(t.follow_up for t in suite.follow_ups if t.id == record["id"])


def test_the_quillbill_help_centre_is_markdown_imported_and_chunked_like_a_tenants(tmp_path):
    from adaptive_rag.evaluation.quillbill import PAGES_DIR, build_quillbill, page_id
    from adaptive_rag.evaluation.support import JOINED, OUT_OF_KB, QUESTION, UNCOVERED
    from adaptive_rag.knowledge.chunking import chunk_documents
    from adaptive_rag.knowledge.importers import import_path

    settings = Settings(_env_file=None)
    suite = build_quillbill(settings)
    documents = import_path(PAGES_DIR)  # what `arag kb import DIR` reads
    assert [e.doc_id for e in suite.entries] == [d.id for d in documents] and len(documents) >= 40
    assert suite.passages == chunk_documents(documents, settings.chunk_words, settings.chunk_overlap_words)
    per_section = Counter((p.doc_id, p.section) for p in suite.passages)
    assert any(n > 1 for n in per_section.values())  # some sections are long enough to be split
    assert any(" | " in p.text for p in suite.passages)  # table rows survive as text
    assert page_id("payments/payouts.md") in {d.id for d in documents}
    kinds = Counter(q.kind for q in suite.queries)
    assert set(kinds) == {QUESTION, JOINED, UNCOVERED, OUT_OF_KB} and kinds[QUESTION] >= 80
    assert kinds[UNCOVERED] >= 30 and kinds[OUT_OF_KB] >= 15 and len(suite.follow_ups) >= 30
    ids = [q.id for q in suite.queries] + [t.id for t in suite.follow_ups]
    assert len(ids) == len(set(ids))
    known = {d.id for d in documents}
    for query in suite.queries:
        assert query.split == split_of("support", query.id)
        assert query.expect_abstain == (not query.in_kb)
        if query.in_kb:
            assert query.gold_answers and all(g and set(g) <= known for g in query.gold_groups)
            assert len(query.gold_groups) == (2 if query.kind == JOINED else 1)
    assert {q.split for q in suite.queries if q.kind == UNCOVERED} == {"train", "test"}
    assert all(t.gold and set(t.gold) <= known and t.follow_up != t.standalone for t in suite.follow_ups)
    assert suite.held_out


def test_a_held_out_knowledge_base_reports_every_question_and_a_no_threshold_gate(tmp_path):
    from adaptive_rag.evaluation.quillbill import build_quillbill
    from adaptive_rag.evaluation.support import knowledge_base_checks
    from adaptive_rag.retrieval.tantivy_index import TantivyRetriever

    suite = build_quillbill(Settings(_env_file=None))
    index = TantivyRetriever.build(tmp_path / "index", suite.passages)
    checks = knowledge_base_checks(suite, index, Abstention(min_relevance=0.45), "test")
    everything = checks["all_questions"]
    assert everything["n"] == len(suite.queries)
    assert everything["abstention"]["caught"]["n"] > checks["abstention"]["caught"]["n"]
    # without a threshold only a question that retrieves nothing abstains
    assert checks["abstention_no_threshold"]["false_abstain"]["estimate"] == 0.0


def test_question_records_let_the_gate_figures_be_recomputed(tmp_path):
    from adaptive_rag.evaluation.bootstrap import bootstrap_mean
    from adaptive_rag.evaluation.quillbill import build_quillbill
    from adaptive_rag.evaluation.support import knowledge_base_checks
    from adaptive_rag.retrieval.tantivy_index import TantivyRetriever

    suite = build_quillbill(Settings(_env_file=None))
    index = TantivyRetriever.build(tmp_path / "index", suite.passages)
    checks = knowledge_base_checks(suite, index, Abstention(min_relevance=0.45), "test")
    test = [r for r in checks["records"] if r["split"] == "test"]
    caught = bootstrap_mean({"all": [float(r["abstained"]["automatic"]) for r in test if not r["in_kb"]]})
    assert caught.estimate == checks["abstention"]["caught"]["estimate"]
    hits = [r["hit_5"] for r in test if r["in_kb"]]
    assert sum(hits) / len(hits) == checks["retrieval"]["in_kb"]["hit_5"]["mean"]
