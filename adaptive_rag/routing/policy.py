"""Routing policy: from the classifier's probabilities over A/B/C to a tier.

Cost-aware and asymmetric. Sending a multi-step (C) question to single step (B) is the dangerous
direction (the paper's classifier sends 31 % of C questions to B), so:

- **escalate to C** whenever P(C) >= `c_threshold`, even when B (or A) is the argmax; C as the
  argmax is never demoted;
- **A only when confident**: with `a_threshold` set, A is chosen only if A wins and
  P(A) >= `a_threshold`; an A that is not confident enough goes to B;
- otherwise the argmax.

A **price on time** (`time_price`, with each tier's time as a share of C's, `tier_costs`) comes
first when set: the probabilities are shifted by `-time_price x cost` per tier in log space (as a
tenant prior shifts them) before the rules above, so a question goes to a dearer tier only when
the router is that much surer of it. The price is chosen on `train` labels to hold routed time to
a budget (`adaptive_rag.training.time_price`); none: the router's own decision.

Thresholds live in a small JSON file stored beside the model version they were calibrated for
(`arag calibrate`); `adaptive_rag.training.calibration` picks them on a validation slice to
maximise F1 under a step budget. When the classifier cannot be reached, `fallback_decision` routes with the rules
(`adaptive_rag.routing.rules.rule_tier`) and flags the decision as a fallback.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from adaptive_rag.contracts import CLASSIFIER_MODEL, TIERS, RoutingDecision, Tier
from adaptive_rag.errors import ConfigurationError
from adaptive_rag.routing.rules import rule_tier

THRESHOLDS_FILE = "thresholds.json"


@dataclass(frozen=True)
class PolicyThresholds:
    """The policy's two knobs; `None` switches a rule off."""

    c_threshold: float | None = 0.35
    a_threshold: float | None = None
    # Where the numbers came from (e.g. "default", "calibrated on 412 validation questions").
    note: str = "default"
    # Validation figures of the calibration that chose them, if any.
    metrics: dict[str, float] = field(default_factory=dict)
    # The price on time (log-probability per unit of C's time) and each tier's time as a share
    # of C's (A, B, C); both or neither.
    time_price: float | None = None
    tier_costs: tuple[float, float, float] | None = None

    def __post_init__(self) -> None:
        for name in ("c_threshold", "a_threshold"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {value}")
        if (self.time_price is None) != (self.tier_costs is None):
            raise ValueError("time_price and tier_costs are set together or not at all")
        if self.time_price is not None and not (math.isfinite(self.time_price) and self.time_price >= 0.0):
            raise ValueError(f"time_price must be a finite number >= 0, got {self.time_price}")
        if self.tier_costs is not None:
            costs = tuple(self.tier_costs)
            if len(costs) != len(TIERS) or not all(math.isfinite(c) and c >= 0.0 for c in costs):
                raise ValueError(f"tier_costs must be {len(TIERS)} finite numbers >= 0 (A, B, C), got {costs}")
            object.__setattr__(self, "tier_costs", tuple(float(c) for c in costs))

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> PolicyThresholds:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, got {type(data).__name__}")
        known = {k: data[k] for k in ("c_threshold", "a_threshold", "note", "metrics", "time_price", "tier_costs")
                 if k in data}
        return cls(**known)

    def save(self, path: Path) -> Path:
        """Write to `path`, or to `path/thresholds.json` when `path` is a directory."""
        path = Path(path)
        if path.is_dir():
            path = path / THRESHOLDS_FILE
        path.write_text(self.to_json() + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: Path) -> PolicyThresholds:
        """Read from `path`, or from `path/thresholds.json` when `path` is a directory."""
        path = Path(path)
        if path.is_dir():
            path = path / THRESHOLDS_FILE
        try:
            return cls.from_json(path.read_text(encoding="utf-8"))
        except (ValueError, TypeError, AttributeError) as exc:  # JSON errors are ValueErrors
            raise ConfigurationError(f"unreadable policy thresholds {path}: {exc}") from exc

    @classmethod
    def load_or_default(cls, version_dir: Path | None) -> PolicyThresholds:
        """The thresholds stored beside a model version, or the defaults when there are none."""
        if version_dir is not None and (Path(version_dir) / THRESHOLDS_FILE).is_file():
            return cls.load(Path(version_dir) / THRESHOLDS_FILE)
        return cls()


def softmax(logits: Sequence[float]) -> list[float]:
    """Numerically stable softmax of one row of logits."""
    top = max(logits)
    exps = [math.exp(x - top) for x in logits]
    total = sum(exps)
    return [e / total for e in exps]


def shift(probabilities: Mapping[str, float], offsets: tuple[float, float, float]) -> dict[str, float]:
    """`probabilities` times exp(offset) per tier (log-space offsets, A, B, C), renormalised: a
    tenant's prior and the price on time both move the classifier's probabilities this way."""
    weighted = {t.value: max(float(probabilities[t.value]), 1e-12) * math.exp(o) for t, o in zip(TIERS, offsets)}
    total = sum(weighted.values())
    return {t: w / total for t, w in weighted.items()}


def _as_probabilities(probabilities: Sequence[float] | Mapping[str, float]) -> dict[str, float]:
    if isinstance(probabilities, Mapping):
        probs = {t.value: float(probabilities[t.value]) for t in TIERS}
    else:
        if len(probabilities) != len(TIERS):
            raise ValueError(f"expected {len(TIERS)} probabilities (A, B, C), got {len(probabilities)}")
        probs = {t.value: float(p) for t, p in zip(TIERS, probabilities)}
    if any(p < 0 or math.isnan(p) for p in probs.values()):
        raise ValueError(f"probabilities must be non-negative numbers: {probs}")
    return probs


@dataclass(frozen=True)
class RoutingPolicy:
    """Turns probabilities (or logits) over A/B/C into a `RoutingDecision`."""

    thresholds: PolicyThresholds = field(default_factory=PolicyThresholds)

    def tier(self, probabilities: Sequence[float] | Mapping[str, float]) -> tuple[Tier, str]:
        """The tier for these probabilities and a short reason."""
        probs = _as_probabilities(probabilities)
        price, costs = self.thresholds.time_price, self.thresholds.tier_costs
        if price is not None and costs is not None and price > 0.0:
            tier, reason = self._rules(shift(probs, tuple(-price * c for c in costs)))  # type: ignore[arg-type]
            return tier, f"{reason} (time priced at {price:g})"
        return self._rules(probs)

    def _rules(self, probs: Mapping[str, float]) -> tuple[Tier, str]:
        argmax = max(TIERS, key=lambda t: probs[t.value])
        p_a, p_c = probs["A"], probs["C"]
        c_thr, a_thr = self.thresholds.c_threshold, self.thresholds.a_threshold
        if argmax is Tier.C:
            return Tier.C, "argmax C"
        if c_thr is not None and p_c >= c_thr:
            return Tier.C, f"escalated to C: P(C)={p_c:.3f} >= c_threshold {c_thr:.3f} (argmax {argmax.value})"
        if argmax is Tier.A and a_thr is not None and p_a < a_thr:
            return Tier.B, f"A not confident: P(A)={p_a:.3f} < a_threshold {a_thr:.3f}; B instead"
        return argmax, f"argmax {argmax.value}"

    def decide(
        self, probabilities: Sequence[float] | Mapping[str, float], model_name: str = CLASSIFIER_MODEL,
        model_version: int | None = None,
    ) -> RoutingDecision:
        probs = _as_probabilities(probabilities)
        tier, reason = self.tier(probs)
        return RoutingDecision(
            tier=tier, probabilities=probs, model_name=model_name, model_version=model_version,
            fallback=False, reason=reason,
        )

    def decide_logits(
        self, logits: Sequence[float], model_name: str = CLASSIFIER_MODEL, model_version: int | None = None,
    ) -> RoutingDecision:
        return self.decide(softmax([float(x) for x in logits]), model_name, model_version)


def fallback_decision(query: str, reason: str = "classifier unavailable") -> RoutingDecision:
    """The rules' tier for `query`, flagged as a fallback."""
    return RoutingDecision(tier=rule_tier(query), fallback=True, reason=f"rules fallback: {reason}")
