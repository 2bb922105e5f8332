"""Safe promotion and rollback of the classifier's served version, on cheap real ONNX models (the
length router of `lab/harness/models.py`: a good one routes these questions right, a bad one
says C to everything) and a real SQLite database with the migrations.

No Triton here (the swap against the real local Triton is tests/integration/test_model_swap.py),
except an address where none listens: a Triton that refuses must leave the served version as is.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adaptive_rag.contracts import CLASSIFIER_MODEL
from adaptive_rag.routing.model_repository import (
    ServingSwitchError, config_pbtxt, open_version, read_served, served_version, versions,
)
from adaptive_rag.storage import PromotionStore, make_engine, upgrade_database
from adaptive_rag.training.promotion import promote_candidate, rollback
from infra.local.servers import free_port
from lab.harness.models import publish_length_router

GOOD, BAD = -20.0, 50.0  # c_bias of the length router: right on LABELLED / always C
LABELLED = [
    ("hi", "A"), ("hello there", "A"), ("thanks a lot", "A"),
    ("How long is the warranty of the Hub H2 device?", "B"),
    ("Does the Flex Strip work with Alexa and Google Home?", "B"),
    ("How do I reset the motion sensor?", "B"),
    (("Compare the Hub H2 and the Bridge Mini in price, range, power draw, supported protocols and "
      "the warranty that each of them comes with."), "C"),
    (("What is the difference between the Flex Strip and the Outdoor Spot when it comes to "
      "brightness, colour range, weather sealing and the app?"), "C"),
]
TEXTS, LABELS = [t for t, _ in LABELLED], [label for _, label in LABELLED]


@pytest.fixture
def store(tmp_path) -> PromotionStore:
    url = f"sqlite:///{tmp_path / 'records.db'}"
    upgrade_database(url)
    return PromotionStore(make_engine(url))


def candidate(tmp_path: Path, c_bias: float, name: str) -> Path:
    """An exported version directory outside the repository (what `promote` exports a run to)."""
    return publish_length_router(tmp_path / "candidates" / name, 1, c_bias)


def repository_serving(tmp_path: Path, c_bias: float) -> Path:
    """A repository whose version 1 (no pointer yet: the latest, served) is a length router."""
    repo = tmp_path / "repo"
    publish_length_router(repo, 1, c_bias)
    (repo / CLASSIFIER_MODEL / "config.pbtxt").write_text(config_pbtxt())
    return repo


def test_a_better_challenger_is_published_served_and_recorded(tmp_path, store):
    repo = repository_serving(tmp_path, BAD)
    verdict = promote_candidate(candidate(tmp_path, GOOD, "good"), repo, TEXTS, LABELS, store=store,
                                challenger_run="runs/good")
    assert verdict.promoted and verdict.verdict == "promoted" and verdict.version == 2
    assert verdict.challenger["macro_f1"] == pytest.approx(1.0) and verdict.champion["macro_f1"] < 0.5
    model_dir = repo / CLASSIFIER_MODEL
    assert versions(model_dir) == [1, 2] and served_version(model_dir) == 2
    state = read_served(model_dir)
    assert state.history == (1, 2) and state.loaded == (1, 2) and state.previous == 1
    # Triton keeps the new and the previous version loaded (no gap while front doors move).
    assert "specific: { versions: [ 1, 2 ] }" in (model_dir / "config.pbtxt").read_text()
    info = json.loads((model_dir / "2" / "classifier.json").read_text())
    assert info["promotion"]["validation_counts"] == {"A": 3, "B": 3, "C": 2}
    # What users get follows the pointer: open_version's default, the in-process router.
    from adaptive_rag.routers.local_classifier import LocalOnnxClassifier

    assert open_version(repo).version == 2
    assert LocalOnnxClassifier(open_version(repo)).classify(TEXTS[0]).model_version == 2
    [row] = store.recent(CLASSIFIER_MODEL)
    assert (row.action, row.verdict, row.challenger_version, row.champion_version, row.served_version) == (
        "promote", "promoted", 2, 1, 2)
    assert row.metric == "macro_f1" and row.challenger_score == pytest.approx(1.0)
    assert row.champion_score == pytest.approx(verdict.champion["macro_f1"])
    assert row.validation_counts == {"A": 3, "B": 3, "C": 2} and row.challenger_run == "runs/good"
    assert row.details["challenger"]["accuracy"] == pytest.approx(1.0)


def test_a_worse_challenger_is_refused_and_nothing_changes(tmp_path, store):
    repo = repository_serving(tmp_path, GOOD)
    config_before = (repo / CLASSIFIER_MODEL / "config.pbtxt").read_text()
    verdict = promote_candidate(candidate(tmp_path, BAD, "bad"), repo, TEXTS, LABELS, store=store)
    assert not verdict.promoted and verdict.verdict == "refused" and verdict.version is None
    assert "champion version 1" in verdict.reason and "does not beat the champion" in verdict.reason
    model_dir = repo / CLASSIFIER_MODEL
    assert versions(model_dir) == [1] and served_version(model_dir) == 1
    assert read_served(model_dir) is None and (model_dir / "config.pbtxt").read_text() == config_before
    [row] = store.recent(CLASSIFIER_MODEL)
    assert (row.verdict, row.served_version, row.champion_version) == ("refused", 1, 1)
    assert row.challenger_score < row.champion_score == pytest.approx(1.0)
    # An equal challenger is refused too: it must be better by more than min_gain.
    same = promote_candidate(candidate(tmp_path, GOOD, "same"), repo, TEXTS, LABELS, store=store)
    assert same.verdict == "refused" and versions(model_dir) == [1]


def test_a_challenger_that_does_not_load_is_never_published(tmp_path, store):
    repo = repository_serving(tmp_path, BAD)
    broken = candidate(tmp_path, GOOD, "broken")
    (broken / "model.onnx").write_bytes(b"not an onnx graph")
    verdict = promote_candidate(broken, repo, TEXTS, LABELS, store=store)
    assert verdict.verdict == "failed" and not verdict.promoted and verdict.challenger is None
    assert "does not load or run" in verdict.reason
    assert versions(repo / CLASSIFIER_MODEL) == [1] and served_version(repo / CLASSIFIER_MODEL) == 1
    [row] = store.recent(CLASSIFIER_MODEL)
    assert row.verdict == "failed" and row.challenger_version is None and row.served_version == 1


def test_a_challenger_triton_cannot_load_stays_unserved(tmp_path, store):
    """Better on validation, but the configured Triton does not take it: the old version stays
    served, the config goes back to it, the new version stays on disk (recorded as failed)."""
    repo = repository_serving(tmp_path, BAD)
    nowhere = f"127.0.0.1:{free_port()}"
    verdict = promote_candidate(candidate(tmp_path, GOOD, "good"), repo, TEXTS, LABELS, store=store,
                                triton_urls=[nowhere])
    assert verdict.verdict == "failed" and "was not served" in verdict.reason
    model_dir = repo / CLASSIFIER_MODEL
    assert versions(model_dir) == [1, 2] and served_version(model_dir) == 1 and open_version(repo).version == 1
    assert "specific: { versions: [ 1 ] }" in (model_dir / "config.pbtxt").read_text()
    assert json.loads((model_dir / "2" / "classifier.json").read_text())["promotion"]["verdict"] == "failed"
    [row] = store.recent(CLASSIFIER_MODEL)
    assert (row.verdict, row.challenger_version, row.served_version) == ("failed", 2, 1)
    assert row.details["triton"] == [nowhere]


def test_rollback_serves_the_previous_version_and_is_recorded(tmp_path, store):
    repo = repository_serving(tmp_path, BAD)
    model_dir = repo / CLASSIFIER_MODEL
    with pytest.raises(ServingSwitchError, match="nothing to roll back to"):
        rollback(repo, store=store)
    assert promote_candidate(candidate(tmp_path, GOOD, "v2"), repo, TEXTS, LABELS, store=store).version == 2
    assert rollback(repo, store=store, reason="v2 misroutes tenant acme") == 1
    state = read_served(model_dir)
    assert served_version(model_dir) == 1 and open_version(repo).version == 1
    assert state.history == (1,) and state.loaded == (1, 2)  # v2 stays loaded until front doors moved
    assert versions(model_dir) == [1, 2]  # kept on disk
    row = store.recent(CLASSIFIER_MODEL)[0]
    assert (row.action, row.verdict, row.champion_version, row.served_version) == ("rollback", "rolled_back", 2, 1)
    assert row.reason == "v2 misroutes tenant acme"
    # Forward again by name; a version that is not there is refused and nothing changes.
    assert rollback(repo, to=2, store=store) == 2 and served_version(model_dir) == 2
    with pytest.raises(ServingSwitchError, match="not in"):
        rollback(repo, to=7, store=store)
    assert served_version(model_dir) == 2
    with pytest.raises(ServingSwitchError, match="already served"):
        rollback(repo, to=2, store=store)


def test_rollback_refused_by_triton_keeps_the_served_version(tmp_path, store):
    repo = repository_serving(tmp_path, BAD)
    promote_candidate(candidate(tmp_path, GOOD, "v2"), repo, TEXTS, LABELS, store=store)
    with pytest.raises(ServingSwitchError):
        rollback(repo, store=store, triton_urls=[f"127.0.0.1:{free_port()}"])
    assert served_version(repo / CLASSIFIER_MODEL) == 2
    assert store.recent(CLASSIFIER_MODEL)[0].verdict == "failed"


def test_an_export_alone_is_not_served_once_a_pointer_exists(tmp_path, store):
    """A version directory that did not pass promotion (a manual export) is on disk, not served;
    the config keeps the served versions' policy."""
    from adaptive_rag.routing.model_repository import write_config

    repo = repository_serving(tmp_path, BAD)
    promote_candidate(candidate(tmp_path, GOOD, "v2"), repo, TEXTS, LABELS, store=store)
    publish_length_router(repo, 3, GOOD)
    write_config(repo / CLASSIFIER_MODEL, config_pbtxt(max_batch_size=16))  # what export_run does
    text = (repo / CLASSIFIER_MODEL / "config.pbtxt").read_text()
    assert "specific: { versions: [ 1, 2 ] }" in text and "max_batch_size: 16" in text
    assert served_version(repo / CLASSIFIER_MODEL) == 2 and open_version(repo).version == 2


def test_the_cli_rolls_back_and_reports_status(tmp_path, store, monkeypatch):
    from typer.testing import CliRunner

    from adaptive_rag.cli import app

    for name in ("TRITON_GRPC_URL", "TRITON_URL", "ARAG_TRITON_CONTROL_URLS"):
        monkeypatch.delenv(name, raising=False)
    repo = repository_serving(tmp_path, BAD)
    promote_candidate(candidate(tmp_path, GOOD, "v2"), repo, TEXTS, LABELS, store=store)
    url = str(store.engine.url)
    runner = CliRunner()
    result = runner.invoke(app, ["model", "rollback", "--repository", str(repo), "--database-url", url])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"rolled_back": True, "from": 2, "served_version": 1}
    from adaptive_rag.routing.tenant_priors import TenantPriors

    TenantPriors().with_tenant("acme", (0.0, 0.0, -1.5), "fitted").save(repo / CLASSIFIER_MODEL / "1")
    result = runner.invoke(app, ["model", "status", "--repository", str(repo), "--database-url", url])
    assert result.exit_code == 0, result.output
    status = json.loads(result.stdout)
    assert status["served_version"] == 1 and status["versions"] == [1, 2]
    assert [r["action"] for r in status["recent"]] == ["rollback", "promote"]
    assert status["tenant_priors"] == {"acme": {"offsets": [0.0, 0.0, -1.5], "revision": 1, "note": "fitted"}}
    assert status["policy"]["time_price"] is None
    # A version priced on time shows its price and budget; a broken policy file is named, not fatal.
    from adaptive_rag.routing.policy import PolicyThresholds

    PolicyThresholds(c_threshold=None, a_threshold=None, time_price=3.25, tier_costs=(0.23, 0.46, 1.0),
                     metrics={"time_budget": 0.6}).save(repo / CLASSIFIER_MODEL / "1")
    result = runner.invoke(app, ["model", "status", "--repository", str(repo), "--database-url", url])
    priced = json.loads(result.stdout)["policy"]
    assert priced["time_price"] == 3.25 and priced["metrics"]["time_budget"] == 0.6
    (repo / CLASSIFIER_MODEL / "1" / "thresholds.json").write_text("{broken")
    result = runner.invoke(app, ["model", "status", "--repository", str(repo), "--database-url", url])
    assert result.exit_code == 0 and "thresholds.json" in json.loads(result.stdout)["policy"]["error"]


def test_macro_f1_for_promotion_leaves_out_a_class_with_a_handful_of_labels():
    from adaptive_rag.training.promotion import with_supported_macro_f1
    from adaptive_rag.training.classification import classification_metrics

    # 1 A, 30 B, 20 C: both routers get B and C right; only the challenger gets the lone A right
    truth = [0] + [1] * 30 + [2] * 20
    champion = with_supported_macro_f1(classification_metrics(truth, [1] + [1] * 30 + [2] * 20))
    challenger = with_supported_macro_f1(classification_metrics(truth, truth))
    assert champion["macro_f1_all"] < 0.7 < challenger["macro_f1_all"]  # one question, a third of the score
    assert champion["macro_f1_classes"] == ["B", "C"]
    assert challenger["macro_f1"] == pytest.approx(1.0)
    assert champion["macro_f1"] == pytest.approx((2 * 30 / 61 + 1.0) / 2)  # B's precision 30/31
    assert not challenger["macro_f1"] > champion["macro_f1"] + 0.05  # no longer a landslide


def test_with_only_small_classes_every_present_class_counts():
    from adaptive_rag.training.promotion import with_supported_macro_f1
    from adaptive_rag.training.classification import classification_metrics

    metrics = with_supported_macro_f1(classification_metrics([0, 1, 1, 2], [0, 1, 1, 1]))
    assert metrics["macro_f1_classes"] == ["A", "B", "C"]
    assert metrics["macro_f1"] == pytest.approx(metrics["macro_f1_all"])


# A support tenant's own validation labels: short messages its traffic needs C for. The good
# length router sends them to A (wrong there), the always-C one gets them right.
TENANT = [("ok", "C"), ("hey", "C"), ("yo there", "C"), ("bye now", "C"), ("cheers mate", "C")]


def with_tenant(rows: list[tuple[str, str]]) -> tuple[list[str], list[str], list[str | None]]:
    texts = TEXTS + [t for t, _ in rows]
    return texts, LABELS + [label for _, label in rows], [None] * len(TEXTS) + ["support"] * len(rows)


def test_a_challenger_better_overall_but_worse_on_a_tenants_own_labels_is_refused(tmp_path, store):
    repo = repository_serving(tmp_path, BAD)
    texts, labels, groups = with_tenant(TENANT)
    verdict = promote_candidate(candidate(tmp_path, GOOD, "good"), repo, texts, labels, store=store, groups=groups)
    assert verdict.challenger["macro_f1"] > verdict.champion["macro_f1"]  # better overall ...
    assert not verdict.promoted and verdict.verdict == "refused"  # ... but not for the tenant
    assert "routes a tenant's own traffic worse: support 0.0% < 100.0% on 5 labels" in verdict.reason
    assert verdict.tenants["support"] == {"labels": 5, "challenger": 0.0, "champion": 1.0, "checked": True,
                                          "wins": 0, "losses": 5, "p": 1.0, "worse": True, "better": False}
    assert served_version(repo / CLASSIFIER_MODEL) == 1
    [row] = store.recent(CLASSIFIER_MODEL)
    assert row.verdict == "refused" and row.details["tenants"]["support"]["worse"] is True


def test_a_tenant_with_too_few_validation_labels_is_reported_not_checked(tmp_path, store):
    repo = repository_serving(tmp_path, BAD)
    texts, labels, groups = with_tenant(TENANT[:4])
    verdict = promote_candidate(candidate(tmp_path, GOOD, "good"), repo, texts, labels, store=store, groups=groups)
    assert verdict.promoted and verdict.tenants["support"]["checked"] is False
    assert verdict.tenants["support"]["labels"] == 4


def test_a_tenant_gain_may_cost_at_most_the_allowed_overall_drop() -> None:
    from adaptive_rag.training.promotion import decide

    champion, challenger = {"macro_f1": 0.90}, {"macro_f1": 0.895}
    gain = {"acme": {"labels": 8, "challenger": 1.0, "champion": 0.5, "checked": True, "worse": False, "better": True}}
    ok, why = decide(challenger, champion, gain, "macro_f1", max_overall_drop=0.01)
    assert ok and "routes a tenant's own traffic better: acme 100.0% > 50.0% on 8 labels" in why
    ok, why = decide({"macro_f1": 0.85}, champion, gain, "macro_f1", max_overall_drop=0.01)
    assert not ok and "drops by more than 0.01" in why
    # No tenant gain: the overall score alone decides, strictly.
    assert decide(challenger, champion, {}, "macro_f1")[0] is False
    assert decide({"macro_f1": 0.91}, champion, {}, "macro_f1")[0] is True
    # A tenant routed worse refuses whatever the overall gain; an unchecked one neither helps nor refuses.
    worse = {"acme": {**gain["acme"], "challenger": 0.25, "worse": True, "better": False}}
    assert decide({"macro_f1": 0.99}, champion, worse, "macro_f1")[0] is False
    unchecked = {"acme": {**gain["acme"], "checked": False, "better": False}}
    assert decide(challenger, champion, unchecked, "macro_f1")[0] is False


def test_a_tenant_gain_of_a_label_or_two_is_no_evidence() -> None:
    from adaptive_rag.training.promotion import TENANT_GAIN_ALPHA, decide, sign_test, tenant_check

    assert sign_test(1, 0) == 0.5 and sign_test(4, 0) == 0.0625 and sign_test(0, 0) == 1.0
    assert sign_test(6, 1) == pytest.approx(8 / 128) and sign_test(4, 1) == pytest.approx(6 / 32)

    def scores(hits: list[bool]) -> dict:
        return {"macro_f1": 0.90, "tenants": {"acme": {"labels": len(hits), "accuracy": sum(hits) / len(hits), "hits": hits}}}

    # 10 of 14 against 9 of 14, one disagreement: more right, but p 0.5.
    champion = scores([True] * 9 + [False] * 5)
    one_more = scores([True] * 10 + [False] * 4)
    check = tenant_check(one_more, champion)["acme"]
    assert (check["wins"], check["losses"], check["p"], check["better"], check["worse"]) == (1, 0, 0.5, False, False)
    ok, why = decide({"macro_f1": 0.895}, {"macro_f1": 0.90}, {"acme": check}, "macro_f1")
    assert not ok and "won only 1 of 1 disagreements (p 0.500 > 0.1)" in why
    # Four disagreements, all won: p 0.0625 <= 0.1, a gain.
    four_more = scores([True] * 13 + [False] * 1)
    check = tenant_check(four_more, champion)["acme"]
    assert check["better"] and check["p"] <= TENANT_GAIN_ALPHA
    assert decide({"macro_f1": 0.895}, {"macro_f1": 0.90}, {"acme": check}, "macro_f1")[0] is True
