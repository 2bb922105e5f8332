"""Per-tenant prior shifts over the global router's probabilities.

The global router learned from thousands of benchmark labels; a support tenant's traffic has
other tier proportions (most questions are one FAQ look-up, B), and a few dozen of its live
labels vanish among the benchmark ones when the router is refitted. A tenant's prior shift is
the small, robust correction: three log-probability offsets (A, B, C; B fixed at 0) added to the
served version's log-probabilities before the policy picks the tier - the label-shift
adjustment of Saerens et al. (2002), fitted on the tenant's own labels
(`adaptive_rag.training.tenant_adaptation`). The global router and every other tenant are
untouched.

The shifts live beside the model version they were fitted for (`<version>/tenant_priors.json`,
written atomically), because they correct that version's probabilities; a new version starts
without them. The front door reloads the file when it changes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adaptive_rag.contracts import TIER_VALUES, RoutingDecision
from adaptive_rag.errors import ConfigurationError
from adaptive_rag.routing.policy import shift

TENANT_PRIORS_FILE = "tenant_priors.json"


@dataclass(frozen=True)
class TenantPrior:
    """One tenant's offsets (log-probability, A/B/C order) and the revision that set them."""

    offsets: tuple[float, float, float]
    revision: int = 1
    note: str = ""

    def label(self) -> str:
        """Short text for a decision's reason: the revision and the offsets."""
        shifts = ", ".join(f"{t} {o:+.2f}" for t, o in zip(TIER_VALUES, self.offsets) if t != "B")
        return f"r{self.revision}: {shifts}"


@dataclass(frozen=True)
class TenantPriors:
    """Every tenant's prior of one model version (empty: no tenant has one)."""

    tenants: dict[str, TenantPrior] = field(default_factory=dict)

    def get(self, tenant: str | None) -> TenantPrior | None:
        return self.tenants.get(tenant) if tenant is not None else None

    def adjust(self, decision: RoutingDecision, tenant: str | None, policy: Any) -> RoutingDecision:
        """`decision` re-decided by `policy` on `tenant`'s shifted probabilities (unchanged when
        the tenant has no prior or the rules decided)."""
        prior = self.get(tenant)
        if prior is None or decision.fallback or not decision.probabilities:
            return decision
        shifted = shift(decision.probabilities, prior.offsets)
        tier, reason = policy.tier(shifted)
        return decision.model_copy(update={
            "tier": tier, "probabilities": shifted, "reason": f"{reason}; tenant prior {prior.label()}",
        })

    def with_tenant(self, tenant: str, offsets: tuple[float, float, float], note: str = "") -> TenantPriors:
        """A copy where `tenant` has `offsets` (its revision one above the one it replaces)."""
        old = self.tenants.get(tenant)
        prior = TenantPrior(tuple(round(float(o), 6) for o in offsets),  # type: ignore[arg-type]
                            (old.revision + 1) if old else 1, note)
        return TenantPriors({**self.tenants, tenant: prior})

    def to_json(self) -> str:
        return json.dumps({"tenants": {
            name: {"offsets": list(p.offsets), "revision": p.revision, "note": p.note}
            for name, p in sorted(self.tenants.items())
        }}, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> TenantPriors:
        try:
            data = json.loads(text)
            tenants = {
                str(name): TenantPrior(tuple(float(o) for o in entry["offsets"]),  # type: ignore[arg-type]
                                       int(entry.get("revision", 1)), str(entry.get("note", "")))
                for name, entry in data.get("tenants", {}).items()
            }
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigurationError(f"unreadable {TENANT_PRIORS_FILE}: {exc}") from exc
        for name, prior in tenants.items():
            if len(prior.offsets) != len(TIER_VALUES) or not all(math.isfinite(o) for o in prior.offsets):
                raise ConfigurationError(f"{TENANT_PRIORS_FILE}: tenant {name!r} needs 3 finite offsets")
        return cls(tenants)

    @classmethod
    def load_or_empty(cls, version_dir: Path | None) -> TenantPriors:
        """The priors stored beside a model version, or none."""
        path = Path(version_dir) / TENANT_PRIORS_FILE if version_dir is not None else None
        if path is None or not path.is_file():
            return cls()
        return cls.from_json(path.read_text(encoding="utf-8"))

    def save(self, version_dir: Path) -> Path:
        """Write `<version_dir>/tenant_priors.json` so a reader sees the old or the new file."""
        from adaptive_rag.routing.model_repository import atomic_write

        path = Path(version_dir) / TENANT_PRIORS_FILE
        atomic_write(path, self.to_json())
        return path


def priors_stamp(version_dir: Path | None) -> int | None:
    """The priors file's modification time (ns), None without one: a cheap change check."""
    if version_dir is None:
        return None
    try:
        return (Path(version_dir) / TENANT_PRIORS_FILE).stat().st_mtime_ns
    except OSError:
        return None
