"""`tenant_slug`: a safe, unique, deterministic name for any tenant string."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import subprocess
import sys

import pytest

from adaptive_rag.knowledge.indexes import tenant_slug

SLUG = re.compile(r"^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?$")

HOSTILE = [
    "../x",
    "../../etc/passwd",
    "/absolute",
    "A B",
    ".",
    "..",
    "-leading-dash",
    "_underscore",
    "+plus",
    "CON",
    "nul\x00byte",
    "tab\tnewline\n",
    "Zürich Café",
    "東京",
    "🎉",
    "\u202e\u200b\ufeff",
    "\ud800 lone surrogate",
    "a" * 64,
    "A" * 1000,
    "x" * 39 + "-" + "y" * 30,
    "*?\"<>|,#:\\",
]


@pytest.mark.parametrize("tenant", HOSTILE, ids=lambda t: repr(t[:16]))
def test_slug_is_safe_as_directory_and_index_name(tenant: str) -> None:
    slug = tenant_slug(tenant)
    assert SLUG.match(slug), slug
    assert len(slug) <= 57
    assert slug not in {".", ".."}
    assert "/" not in slug and "\\" not in slug
    # inside `<prefix>-<slug>-g<N>` it keeps OpenSearch's 255-byte limit with a long prefix
    assert len(f"{'p' * 150}-{slug}-g999999".encode()) <= 255


def test_slug_is_the_same_in_another_process() -> None:
    # Another process (other PYTHONHASHSEED) must find the same directory and index.
    tenants = [t for t in HOSTILE if "\ud800" not in t]
    script = (
        "import json, sys; from adaptive_rag.knowledge.indexes import tenant_slug; "
        "print(json.dumps([tenant_slug(t) for t in json.load(sys.stdin)]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], input=json.dumps(tenants), capture_output=True, text=True,
        check=True, env={**os.environ, "PYTHONHASHSEED": "12345"},
    ).stdout
    assert json.loads(out) == [tenant_slug(t) for t in tenants]


def test_known_value_is_stable() -> None:
    # Stored directories and indexes are found by this name: it must not change between versions.
    assert tenant_slug("Acme") == "acme-" + hashlib.sha256(b"Acme").hexdigest()[:16]


def test_readable_part() -> None:
    assert tenant_slug("Acme Corp").startswith("acme-corp-")
    assert tenant_slug("Zürich Café").startswith("zurich-cafe-")
    assert tenant_slug("../x").startswith("x-")
    assert re.fullmatch(r"[0-9a-f]{16}", tenant_slug("東京"))  # nothing readable: the hash alone


def test_case_and_punctuation_variants_differ() -> None:
    variants = ["Acme", "acme", "ACME", "acme!", " acme", "acme ", "a-c-m-e", "Åcme", "acme\u200b"]
    assert len({tenant_slug(v) for v in variants}) == len(variants)


def test_long_tenants_sharing_a_prefix_differ() -> None:
    base = "t" * 64
    assert tenant_slug(base + "1") != tenant_slug(base + "2")
    assert len(tenant_slug(base + "1")) <= 57


def test_many_random_tenants_are_unique() -> None:
    rng = random.Random(7)
    alphabet = "aAbB -_./é東🎉0"
    tenants = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))) for _ in range(20_000)}
    assert len({tenant_slug(t) for t in tenants}) == len(tenants)


@pytest.mark.parametrize("bad", ["", None, 42])
def test_empty_or_non_string_is_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        tenant_slug(bad)  # type: ignore[arg-type]
