"""The feedback-driven retraining loop end to end, with real parts.

Queries answered through the gRPC front door (real Redis, PostgreSQL, Celery workers with the
embedded model, Triton serving version 1: the length router of `tests/e2e/conftest.py`), feedback
through `SubmitFeedback`, then the two jobs as a deployment runs them: `arag relabel` turns the
feedback into live labels, `arag retrain` trains a MiniLM challenger on the `fit` part of the
`train` labels and serves it as version 2 only because it beats the champion on the `validation`
part. Triton restarts on its port and loads what config.pbtxt now names (versions 1 and 2; given a
Triton URL, `arag retrain` would load version 2 on the running Triton instead, as
tests/integration/test_model_swap.py does); the front door, never restarted, routes the next query
with version 2 and records it.

The benchmark labels of this test are written for it: the tier follows the words (greetings -> A,
one-fact lookups -> B, comparisons -> C) and not the length, so the length router is a weak
champion and a few epochs of fine-tuning beat it. Needs the `train` extras (torch).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch  # noqa: F401  (a required dev dependency: `arag retrain` below trains with it)
from e2e_stack import Stack  # the stack, Triton and model repository fixtures: tests/e2e/conftest.py

from adaptive_rag.routing.model_repository import versions
from adaptive_rag.storage import LabelStore, TrainingLabel
from services.frontdoor.stubs import pb2

pytestmark = [pytest.mark.integration, pytest.mark.model]

ARAG = Path(sys.executable).with_name("arag")
PRODUCTS = ["Hub H2", "A19 Color bulb", "Flex Strip", "Motion Sensor", "Bridge Mini", "Smart Plug",
            "Dimmer Switch", "Outdoor Spot"]
GREETINGS = [
    "hi", "hello", "hey there", "thanks!", "good morning", "thank you", "bye for now",
    "hello, good morning to you and to the whole support team, I hope your day is going well",
    "thanks a lot for all of your help today, you have been really kind and very patient",
    "hey, how are you doing this fine morning, my friend? I just wanted to say hello again",
    "good evening and thank you once more for everything, have a lovely weekend together",
    "cheers", "hiya", "many thanks", "greetings from the customer success team, hope all is well",
]
LOOKUPS = ["How do I reset the {p}?", "What is the warranty of the {p}?", "Does the {p} work with Alexa?",
           "How bright is the {p}?"]
COMPARISONS = ["Compare the {p} and the {q}.", "{p} versus {q}?",
               "What is the difference between the {p} and the {q}?"]


def labelled_questions() -> list[tuple[str, str]]:
    found = [(g, "A") for g in GREETINGS]
    found += [(t.format(p=p), "B") for t in LOOKUPS for p in PRODUCTS]
    found += [(t.format(p=p, q=q), "C") for t in COMPARISONS
              for p, q in itertools.islice(itertools.permutations(PRODUCTS, 2), 0, 56, 5)]
    return found


def split(text: str) -> str:
    return "test" if hashlib.sha256(text.encode()).digest()[0] % 4 == 0 else "train"


def arag(*args: str, env: dict[str, str]) -> str:
    done = subprocess.run([str(ARAG), *args], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_feedback_relabel_retrain_publishes_version_2_used_by_the_next_query(
    stack: Stack, model_repository, tmp_path
) -> None:
    labels = LabelStore(stack.store.engine)
    for text, tier in labelled_questions():
        labels.add(TrainingLabel(
            origin="benchmark", dataset="support-fixture", question_id=hashlib.md5(text.encode()).hexdigest(),
            question=text, label=tier, label_source="silver", split=split(text), correct_metric="em",
            outcomes={},
        ))

    # Live traffic with feedback: a short question confirmed right, a lookup whose answer was wrong.
    greeting, _ = stack.answer("What is 2+2?")
    lookup, _ = stack.answer("How long is the Lumora Hub H2 warranty?")
    assert greeting.classifier.model_version == 1 and lookup.classifier.model_version == 1
    stack.stub.SubmitFeedback(pb2.FeedbackRequest(request_id=greeting.request_id, rating=1),
                              metadata=stack.auth, timeout=30)
    stack.stub.SubmitFeedback(pb2.FeedbackRequest(request_id=lookup.request_id, rating=-1,
                                                  comment="not what the manual says"),
                              metadata=stack.auth, timeout=30)

    env = {**os.environ, "DATABASE_URL": stack.settings.library.database_url,
           "ARAG_MODEL_REPOSITORY": str(model_repository), "ARAG_LLM_THREADS": "1"}
    out = arag("relabel", env=env)
    # Other e2e modules share the database and leave feedback of their own: count at least ours.
    new_labels = re.search(r"(\d+) new labels", out)
    assert new_labels and int(new_labels.group(1)) >= 2, out
    live = {row.request_id: row for row in labels.labels(split=None, origin="live")}
    assert live[greeting.request_id].label == "A"  # right on A: A
    expected = {"A": "B", "B": "C", "C": "C"}[pb2.Tier.Name(lookup.tier)[-1]]
    assert live[lookup.request_id].label == expected  # wrong: one tier up

    out = arag("retrain", "--epochs", "4", "--learning-rate", "1e-4", "--threads", "2",
               "--out", str(tmp_path / "run"), env=env)
    assert '"promoted": true' in out and '"version": 2' in out, out
    assert versions(model_repository / "complexity") == [1, 2]

    # Roll Triton onto version 2 on the same port; the front door finds it by polling.
    stack.lab.restart_triton()
    stack.wait_for_model_version(2)
    reply, _ = stack.answer("Compare the Hub H2 and the Bridge Mini.")
    assert reply.classifier.model_version == 2 and not reply.classifier.fallback
    assert reply.answer.strip()
    decision = stack.store.decision_for(reply.request_id)
    assert decision.model_version == 2 and not decision.fallback
