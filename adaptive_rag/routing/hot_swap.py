"""The serving router: the classifier client of the served model version, swapped to a newly
served version without a restart, and `FixedRouter` for routers that have nothing to swap.

Classifier: `TritonClassifier` is built for one model version (its tokenizer, max length and
thresholds come from that version's directory), and it pins requests to that version so
tokenizer, thresholds and weights always match. Every `poll_s` seconds `refresh` looks at the
model repository; when the served version (`served.json`, written by promotion and rollback)
changed and Triton reports it ready, a client for it replaces the current one (the old one is
closed a little later so calls in flight finish). When Triton is down nothing is swapped and the
rules fallback decides, flagged. Every decision carries the version that made it.

Tenant priors (`adaptive_rag.routing.tenant_priors`): the served version's per-tenant shifts are
applied to each caller tenant's decision; `refresh` reloads them when their file changes (a
retraining run fits them), so a tenant's routing adapts without a new model version.

Which router a process serves (`ARAG_ROUTER`) is the front door's choice
(`services.frontdoor.routing.open_router`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import structlog

from adaptive_rag.contracts import RoutingDecision
from adaptive_rag.routing.model_repository import open_classifier, served_version
from adaptive_rag.routing.policy import fallback_decision
from adaptive_rag.routing.rules import rules_router
from adaptive_rag.routing.tenant_priors import TenantPriors, priors_stamp
from adaptive_rag.settings import ClassifierSettings

LOG = structlog.get_logger("frontdoor.classifier")
# Calls in flight on a replaced client get this long to finish before it is closed.
CLOSE_GRACE_S = 10.0
# A fallback decision triggers an early look for a newer version, at most this often.
KICK_INTERVAL_S = 1.0


def build_triton_classifier(settings: ClassifierSettings, version: int, cache_size: int = 0):
    """A batching Triton client pinned to `version` of the configured model; with `cache_size`,
    repeated queries are answered from its LRU (one cache per version: a new version starts empty)."""
    return open_classifier(settings, version=version, model_version=str(version), cache_size=cache_size)


class ClassifierRouter:
    """Holds the current classifier client and replaces it when a newer version is served."""

    def __init__(
        self, settings: ClassifierSettings, poll_s: float,
        build: Callable[[ClassifierSettings, int], object] = build_triton_classifier,
        on_version: Callable[[str, int], None] | None = None,
    ) -> None:
        self.settings = settings
        self.poll_s = poll_s
        self._build = build
        self._on_version = on_version
        self._client = None
        self.version: int | None = None
        self._lock = threading.Lock()
        self._kick: asyncio.Future | None = None
        self._kicked_at = float("-inf")
        self.priors = TenantPriors()
        self._priors_stamp: int | None = None

    @property
    def model_name(self) -> str:
        return self.settings.classifier_model

    def published_versions(self) -> list[int]:
        """The served version (promotion and rollback move it), as a one-element list."""
        served = served_version(self.settings.model_repository / self.settings.classifier_model)
        return [] if served is None else [served]

    def _version_dir(self, version: int | None) -> Path | None:
        if version is None:
            return None
        return Path(self.settings.model_repository) / self.settings.classifier_model / str(version)

    def _reload_priors(self) -> None:
        """The held version's tenant priors, read again when their file changed (a broken file
        keeps the priors in use)."""
        directory = self._version_dir(self.version)
        stamp = priors_stamp(directory)
        if stamp == self._priors_stamp:
            return
        try:
            self.priors = TenantPriors.load_or_empty(directory)
        except Exception as exc:  # noqa: BLE001 - a broken file must not stop routing
            LOG.warning("tenant_priors_unreadable", version=self.version, error=str(exc))
            return
        self._priors_stamp = stamp
        LOG.info("tenant_priors_in_use", version=self.version, tenants=sorted(self.priors.tenants))

    def refresh(self) -> bool:
        """Switch to the served version if Triton serves it (or if none is held yet), and reload
        the held version's tenant priors when they changed.

        Blocking (file system + one Triton readiness call); returns True when it switched.
        """
        with self._lock:
            available = self.published_versions()
            if not available or available[-1] == self.version:
                self._reload_priors()
                return False
            newest = available[-1]
            try:
                candidate = self._build(self.settings, newest)
            except Exception as exc:  # noqa: BLE001 - a broken export must not stop serving
                LOG.warning("classifier_version_unusable", version=newest, error=str(exc))
                return False
            if self._client is not None and not candidate.is_ready():
                # Published but not (yet) loaded by Triton: keep routing with the current one.
                candidate.close()
                return False
            old, self._client, previous = self._client, candidate, self.version
            self.version = newest
            # The old version's priors corrected the old version's probabilities: never carry them over.
            self.priors, self._priors_stamp = TenantPriors(), None
            self._reload_priors()
        LOG.info("classifier_version_in_use", model=self.model_name, version=newest, previous=previous)
        if self._on_version is not None:
            self._on_version(self.model_name, newest)
        if old is not None:
            timer = threading.Timer(CLOSE_GRACE_S, old.close)
            timer.daemon = True
            timer.start()
        return True

    async def poll_forever(self) -> None:
        """`refresh` every `poll_s` seconds until cancelled."""
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await asyncio.to_thread(self.refresh)
            except Exception as exc:  # noqa: BLE001 - keep polling
                LOG.warning("classifier_refresh_failed", error=str(exc))

    async def route(self, query: str, tenant: str | None = None) -> RoutingDecision:
        """The decision for `query`: Triton + policy (naming the version that answered), shifted
        by `tenant`'s prior when it has one, or the flagged rules fallback."""
        client, priors = self._client, self.priors
        if client is None:
            return fallback_decision(query, "no classifier model published")
        decision = await client.aclassify(query)
        if decision.fallback:
            # Triton may have unloaded our version for a newer one (version policy "latest 1"):
            # look for it now rather than at the next poll.
            self._refresh_soon()
            return decision
        if priors.get(tenant) is None:
            return decision
        return priors.adjust(decision, tenant, client.policy)

    def _refresh_soon(self) -> None:
        """One background `refresh`, at most every `KICK_INTERVAL_S` (Triton down: cheap no-ops)."""
        now = time.monotonic()
        running = self._kick is not None and not self._kick.done()
        if running or now - self._kicked_at < KICK_INTERVAL_S:
            return
        self._kicked_at = now
        self._kick = asyncio.get_running_loop().run_in_executor(None, self.refresh)

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


class DecisionMaker(Protocol):
    async def route(self, query: str) -> RoutingDecision: ...  # no tenant: one router for all


class FixedRouter:
    """A router without versions to swap (rules, a learned router, the LLM judge), shaped like
    `ClassifierRouter` for the server."""

    version: int | None = None

    def __init__(self, name: str, inner: DecisionMaker | None = None) -> None:
        self.model_name = name
        self._inner = inner

    def refresh(self) -> bool:
        return False

    async def poll_forever(self) -> None:
        return None

    async def route(self, query: str, tenant: str | None = None) -> RoutingDecision:
        if self._inner is None:
            return rules_router(query)
        return await self._inner.route(query)

    def close(self) -> None:
        close: Any = getattr(self._inner, "close", None)
        if callable(close):
            close()

