"""Promotion refused, promotion accepted and rollback on the real Triton, through the gRPC front
door, while clients keep calling it: not one call fails, not one decision falls back to the rules,
and the version the replies report moves 1 -> 2 -> 1 with what is served. Then a tenant prior
written beside the served version shifts that tenant's decisions, and only that tenant's, without
a restart; and a version promoted with a price on time routes by it.

The operator's steps are the ones a deployment runs: `promote_candidate` (what `arag retrain`
and `arag model promote` end in) against the running Triton (EXPLICIT model control: the new
version is loaded before `served.json` moves), then `arag model rollback --triton-url`. The models
are the length routers of `lab/harness/models.py` (real ONNX graphs with known routing): the
served version 1 sends 14-16-token comparisons to B, the better challenger to C, the worse one
sends everything to C.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from e2e_stack import Stack

from adaptive_rag.contracts import CLASSIFIER_MODEL
from adaptive_rag.routing.model_repository import served_version
from adaptive_rag.routing.policy import PolicyThresholds
from adaptive_rag.routing.tenant_priors import TenantPriors
from adaptive_rag.storage import PromotionStore
from adaptive_rag.training.promotion import promote_candidate
from services.frontdoor.stubs import pb2
from lab.harness.models import publish_length_router

pytestmark = pytest.mark.integration

ARAG = Path(sys.executable).with_name("arag")
VALIDATION = [
    ("hi", "A"), ("hello there", "A"), ("thanks a lot", "A"),
    ("How do I reset the motion sensor?", "B"), ("What is the Hub H2 warranty?", "B"),
    # Comparisons the question-form rules do not send to C on their own (`routing.question_parts`
    # does "which is brighter, X or Y?" and "compare X and Y"): only the model decides these.
    ("Is the Flex Strip or the Outdoor Spot the brighter one?", "C"),
    ("Is the Smart Plug or the Dimmer Switch cheaper to run?", "C"),
    ("Does the Hub H2 or the Bridge Mini win on price and range?", "C"),
]
TEXTS, LABELS = [t for t, _ in VALIDATION], [label for _, label in VALIDATION]
# What the clients ask: the greetings are small talk, answered at admission without the classifier.
ASKED = [t for t, label in VALIDATION if label != "A"]
BETTER, WORSE = -12.0, 50.0  # c_bias: C from 13 tokens (right on VALIDATION) / C for everything


class Traffic:
    """Clients calling the front door until stopped: `Route` on the validation questions (not the
    greetings) without pause and `Answer` on a tier-A question one after another; every reply and error kept."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.stop = threading.Event()
        self.routes: list[tuple[int, bool, str]] = []  # (model version, fallback, tier)
        self.answers: list[int] = []  # model version of each answered question
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._route, daemon=True),
                        threading.Thread(target=self._answer, daemon=True)]

    def _call(self, send: Callable[[], object]) -> object | None:
        try:
            return send()
        except grpc.RpcError as exc:
            self.errors.append(f"{exc.code().name}: {exc.details()}")
            return None

    def _route(self) -> None:
        n = 0
        while not self.stop.is_set():
            text = ASKED[n % len(ASKED)]
            reply = self._call(lambda: self.stack.stub.Route(
                pb2.RouteRequest(query_text=text), metadata=self.stack.auth, timeout=30))
            if reply is not None:
                self.routes.append((reply.classifier.model_version, reply.classifier.fallback,
                                    pb2.Tier.Name(reply.tier)[-1]))
            n += 1

    def _answer(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            reply = self._call(lambda: self.stack.answer(f"What is {n}+{n}?", timeout=120)[0])
            if reply is not None:
                self.answers.append(reply.classifier.model_version)

    def __enter__(self) -> Traffic:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=180)

    def wait_for_version(self, version: int, within_s: float = 90.0) -> None:
        """Until 20 consecutive Route replies came from `version`."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            tail = self.routes[-20:]
            if len(tail) == 20 and all(v == version for v, _, _ in tail):
                return
            time.sleep(0.1)
        raise AssertionError(f"the front door did not move to version {version}: {self.routes[-5:]}")


def versions_in_order(seen: list[int]) -> list[int]:
    runs = seen[:1]
    for version in seen:
        if version != runs[-1]:
            runs.append(version)
    return runs


def test_refused_accepted_and_rolled_back_without_a_failed_call(own_frontdoor, tmp_path) -> None:
    stack: Stack = own_frontdoor()
    triton, repo = stack.extra["triton"], stack.extra["model_repository"]
    model_dir = repo / CLASSIFIER_MODEL
    promotions = PromotionStore(stack.store.engine)
    worse = publish_length_router(tmp_path / "worse", 1, WORSE)
    better = publish_length_router(tmp_path / "better", 1, BETTER)

    with Traffic(stack) as traffic:
        traffic.wait_for_version(1)
        refused = promote_candidate(worse, repo, TEXTS, LABELS, store=promotions, triton_urls=[triton.url])
        assert refused.verdict == "refused" and served_version(model_dir) == 1, refused.reason
        time.sleep(2.0)  # a poll of the front door (model_poll_s 1 s): it must stay on version 1
        assert all(v == 1 for v, _, _ in traffic.routes)

        accepted = promote_candidate(better, repo, TEXTS, LABELS, store=promotions, triton_urls=[triton.url])
        assert accepted.verdict == "promoted" and accepted.version == 2, accepted.reason
        traffic.wait_for_version(2)
        moved_at = len(traffic.routes)

        env = {**os.environ, "DATABASE_URL": stack.settings.library.database_url,
               "ARAG_MODEL_REPOSITORY": str(repo)}
        done = subprocess.run([str(ARAG), "model", "rollback", "--triton-url", triton.url,
                               "--reason", "e2e: back to version 1"],
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        assert '"served_version": 1' in done.stdout
        traffic.wait_for_version(1)
        time.sleep(1.0)

    assert traffic.errors == [], traffic.errors[:5]
    assert not [r for r in traffic.routes if r[1]], "a decision fell back to the rules"
    assert versions_in_order([v for v, _, _ in traffic.routes]) == [1, 2, 1]
    assert len(traffic.routes) > 100 and len(traffic.answers) >= 1
    # Version 2 routes the comparisons to C, as its validation score promised; version 1 never does.
    assert any(tier == "C" for _, _, tier in traffic.routes[moved_at - 20:moved_at])
    assert not any(tier == "C" for v, _, tier in traffic.routes if v == 1)
    rows = promotions.recent(CLASSIFIER_MODEL)[:3]
    assert [(r.action, r.verdict) for r in rows] == [
        ("rollback", "rolled_back"), ("promote", "promoted"), ("promote", "refused")]
    print(f"{len(traffic.routes)} Route and {len(traffic.answers)} Answer calls, 0 failed, versions "
          f"{versions_in_order([v for v, _, _ in traffic.routes])}, Route tiers {dict(Counter(t for *_, t in traffic.routes))}")

    # What a retrain's tenant step writes: acme's prior over version 1 pushes its comparisons to C.
    comparison = ASKED[-1]
    other = (("authorization", f"Bearer {stack.store.create_api_key('globex')}"),)

    def route(auth) -> pb2.RouteReply:
        return stack.stub.Route(pb2.RouteRequest(query_text=comparison), metadata=auth, timeout=30)

    assert pb2.Tier.Name(route(stack.auth).tier)[-1] == "B"
    TenantPriors().with_tenant("acme", (0.0, 0.0, 10.0)).save(model_dir / "1")
    deadline = time.monotonic() + 30
    while "tenant prior r1" not in (shifted := route(stack.auth)).classifier.reason and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "tenant prior r1: A +0.00, C +10.00" in shifted.classifier.reason, shifted.classifier.reason
    assert pb2.Tier.Name(shifted.tier)[-1] == "C" and shifted.classifier.model_version == 1
    untouched = route(other)
    assert pb2.Tier.Name(untouched.tier)[-1] == "B" and "tenant prior" not in untouched.classifier.reason

    # A version priced on time (what `arag routers fit-words --time-budget` publishes): version 2's
    # classifier, whose thresholds.json makes C cost more than the router is sure of a comparison.
    priced = publish_length_router(tmp_path / "priced", 1, BETTER)
    PolicyThresholds(c_threshold=None, a_threshold=None, time_price=20.0, tier_costs=(0.5, 0.5, 1.0)).save(priced)
    promoted = promote_candidate(priced, repo, TEXTS, LABELS, store=promotions, triton_urls=[triton.url])
    assert promoted.verdict == "promoted" and promoted.version == 3, promoted.reason
    deadline = time.monotonic() + 60
    while (paid := route(other)).classifier.model_version != 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert paid.classifier.model_version == 3 and "time priced at 20" in paid.classifier.reason, paid.classifier
    assert pb2.Tier.Name(paid.tier)[-1] == "B" and not paid.classifier.fallback
