"""Each knowledge base's own abstention threshold, on tiny corpora in embedded tantivy with SQLite
records: derived when the knowledge base is written, without any labelled question; a question
from another domain abstains, one the documents answer does not; which threshold is in effect
(tenant override, deployment setting, automatic); and the relevance a retriever reports."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fakes import FakeLLM
from sqlalchemy import create_engine
from sqlalchemy.pool import StaticPool

from adaptive_rag.domain import Passage
from adaptive_rag.errors import InvalidRequestError, KnowledgeBaseMissingError
from adaptive_rag.knowledge.calibration import (
    FLOOR,
    Calibration,
    ThresholdSource,
    calibrate,
    quantile,
    reference_questions,
    threshold_in_effect,
)
from adaptive_rag.knowledge.documents import Document, Section
from adaptive_rag.knowledge.indexes import TantivyKnowledgeIndex
from adaptive_rag.knowledge.service import KnowledgeBaseService
from adaptive_rag.retrieval.relevance import bm25_idf, relevance
from adaptive_rag.retrieval.tantivy_index import TantivyRetriever
from adaptive_rag.storage import Base, KnowledgeRecords
from adaptive_rag.strategies import Abstention, SingleStep
from adaptive_rag.strategies.abstention import NO_PASSAGE

BIKE_SHOP = [
    ("battery", "E-bike battery care", "Charge the 625 Wh battery at room temperature. A full charge takes "
     "about 4 hours with the standard charger. Store the battery half charged over the winter."),
    ("warranty", "Frame and battery warranty", "Every Tidewater frame has a lifetime warranty against "
     "manufacturing defects. The battery and motor are covered for 2 years or 500 charge cycles."),
    ("returns", "Returning a bike", "Unridden bikes can be returned within 30 days of delivery. We send a "
     "prepaid shipping box; the refund reaches your card within 5 business days of arrival."),
    ("tyres", "Tyre pressure", "Road tyres run at 80 to 100 psi, gravel tyres at 35 to 50 psi. Check the "
     "pressure weekly with a floor pump and a gauge."),
    ("brakes", "Adjusting disc brakes", "If the disc brakes squeal, clean the rotors with isopropyl alcohol. "
     "Worn pads thinner than 1.5 mm must be replaced."),
    ("sizes", "Choosing a frame size", "Frame sizes run from XS to XL. Riders from 160 to 170 cm tall "
     "usually fit a size S; use the size calculator for your inseam."),
    ("delivery", "Delivery times", "Bikes in stock ship within 2 business days. Delivery takes 3 to 5 days "
     "in the mainland and a week to the islands. Assembly takes about 15 minutes."),
    ("app", "The Tidewater Ride app", "The Ride app shows the battery level, the assist mode and your "
     "routes. It pairs with the bike over Bluetooth and needs iOS 16 or Android 12."),
]
IN_DOMAIN = "How long does it take to charge the e-bike battery?"
OFF_DOMAIN = "How many days does it take to sail across the Atlantic?"  # shares only common words


def shop_documents() -> list[Document]:
    return [Document(doc_id, title, (Section("", text),), source="help.jsonl") for doc_id, title, text in BIKE_SHOP]


@pytest.fixture
def service(tmp_path: Path) -> KnowledgeBaseService:
    engine = create_engine("sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False})
    Base.metadata.create_all(engine)
    return KnowledgeBaseService(TantivyKnowledgeIndex(tmp_path / "kb"), KnowledgeRecords(engine),
                                backend="tantivy")


def answer(service: KnowledgeBaseService, tenant: str, question: str, threshold: float):
    llm = FakeLLM(["an answer"])
    retriever = service.index.retriever(tenant)
    return SingleStep(retriever, llm, top_k=3, abstention=Abstention(min_relevance=threshold)).run(question), llm


def test_an_import_derives_the_threshold_from_the_knowledge_base_alone(service: KnowledgeBaseService) -> None:
    service.upsert("tidewater", shop_documents())
    info = service.describe("tidewater")
    assert info.abstention.source is ThresholdSource.AUTOMATIC
    assert info.abstention.value == info.abstention.automatic >= FLOOR
    derived = Calibration.from_record(info.calibration)
    assert (derived.questions, derived.chunks) == (len(reference_questions()), info.chunks)
    assert derived.threshold == max(FLOOR, derived.reference_relevance)


def test_an_off_domain_question_abstains_and_an_in_domain_one_does_not(service: KnowledgeBaseService) -> None:
    service.upsert("tidewater", shop_documents())
    threshold = service.describe("tidewater").abstention.value
    off, off_llm = answer(service, "tidewater", OFF_DOMAIN, threshold)
    assert not off.answerable and off_llm.calls == []
    assert "does not cover the question" in off.abstain_reason and off.passages  # the closest ones
    covered, covered_llm = answer(service, "tidewater", IN_DOMAIN, threshold)
    assert covered.answerable and covered.answer == "an answer" and len(covered_llm.calls) == 1
    assert covered.passages[0].doc_id == "battery"


def test_a_question_sharing_no_word_with_the_knowledge_base_retrieves_nothing_and_abstains(
    service: KnowledgeBaseService,
) -> None:
    service.upsert("tidewater", shop_documents())
    result, llm = answer(service, "tidewater", "Quelle heure est-il à Tokyo ?", 0.0)  # no threshold at all
    assert (result.answerable, result.abstain_reason, result.passages, llm.calls) == (False, NO_PASSAGE, [], [])


def test_the_threshold_follows_the_knowledge_base_and_an_unchanged_import_keeps_it(
    service: KnowledgeBaseService,
) -> None:
    service.upsert("tidewater", shop_documents()[:3])
    small = service.describe("tidewater").calibration
    service.upsert("tidewater", shop_documents())
    grown = service.describe("tidewater").calibration
    assert (small["chunks"], grown["chunks"]) == (3, 8)
    service.upsert("tidewater", shop_documents())  # nothing changed: the stored one stays
    assert service.describe("tidewater").calibration == grown
    service.delete("tidewater", [doc_id for doc_id, _, _ in BIKE_SHOP])
    info = service.describe("tidewater")
    assert info.chunks == 0 and info.abstention.automatic is None and info.calibration is None


def test_the_operator_overrides_the_threshold_per_tenant_and_can_go_back(service: KnowledgeBaseService) -> None:
    service.upsert("tidewater", shop_documents())
    automatic = service.describe("tidewater").abstention.value
    overridden = service.set_threshold("tidewater", 5.0)
    assert (overridden.abstention.value, overridden.abstention.source) == (5.0, ThresholdSource.TENANT)
    assert overridden.abstention.automatic == automatic
    assert "tenant override; automatic would be" in overridden.abstention.describe()
    result, _ = answer(service, "tidewater", IN_DOMAIN, overridden.abstention.value)
    assert not result.answerable  # an absurdly high override wins over the derived threshold
    back = service.set_threshold("tidewater", None)
    assert (back.abstention.value, back.abstention.source) == (automatic, ThresholdSource.AUTOMATIC)
    with pytest.raises(InvalidRequestError):
        service.set_threshold("tidewater", -1.0)
    with pytest.raises(KnowledgeBaseMissingError):
        service.set_threshold("nobody", 0.5)


def test_the_deployment_setting_overrides_every_automatic_threshold_but_not_a_tenants(
    service: KnowledgeBaseService,
) -> None:
    service.upsert("tidewater", shop_documents())
    service.deployment_threshold = 0.0
    info = service.describe("tidewater")
    assert (info.abstention.value, info.abstention.source) == (0.0, ThresholdSource.DEPLOYMENT)
    service.set_threshold("tidewater", 0.7)
    assert service.describe("tidewater").abstention.source is ThresholdSource.TENANT


@pytest.mark.parametrize(("automatic", "override", "deployment", "value", "source"), [
    (0.6, None, None, 0.6, ThresholdSource.AUTOMATIC),
    (0.6, None, 0.3, 0.3, ThresholdSource.DEPLOYMENT),
    (0.6, 0.9, 0.3, 0.9, ThresholdSource.TENANT),
    (None, 0.0, None, 0.0, ThresholdSource.TENANT),
    (None, None, None, 0.0, ThresholdSource.NONE),
])
def test_which_threshold_is_in_effect(automatic, override, deployment, value, source) -> None:
    found = threshold_in_effect(automatic, override, deployment)
    assert (found.value, found.source, found.automatic, found.override) == (value, source, automatic, override)


def test_relevance_is_the_best_score_over_the_summed_idf_of_the_questions_terms(tmp_path: Path) -> None:
    passages = [Passage(f"p{i}#0", title, text, doc_id=f"p{i}") for i, (_, title, text) in enumerate(BIKE_SHOP)]
    retriever = TantivyRetriever.build(tmp_path / "index", passages, title_boost=1.0)
    docs = len(passages)
    # "tyre" is in one passage, "pressure" in one, "zeppelin" in none (the largest idf)
    expected = bm25_idf(1, docs) + bm25_idf(1, docs) + bm25_idf(0, docs)
    assert retriever.query_weight("tyre pressure zeppelin") == pytest.approx(expected)
    hits = retriever.search("tyre pressure zeppelin", 3)
    assert relevance(retriever, "tyre pressure zeppelin", hits) == pytest.approx(hits[0].score / expected)
    assert relevance(retriever, "tyre pressure zeppelin", []) == 0.0
    assert retriever.query_weight("the of and") == 0.0  # stop words only: nothing to weigh
    assert calibrate(retriever, chunks=0) is None


@pytest.mark.parametrize("q", [0.0, 0.25, 0.8, 0.95, 1.0])
def test_the_quantile_interpolates_like_numpy(q: float) -> None:
    values = [0.3, 0.1, 0.7, 0.2, 1.4, 0.9, 0.05]
    assert quantile(values, q) == pytest.approx(float(np.quantile(values, q)))
