"""The routing policy: escalation to C, confident-A rule, thresholds file, fallback."""

from __future__ import annotations

import math

import pytest

from adaptive_rag.contracts import Tier
from adaptive_rag.routing.policy import PolicyThresholds, RoutingPolicy, fallback_decision, softmax


def test_escalates_to_c_when_p_c_passes_threshold_although_b_is_argmax():
    policy = RoutingPolicy(PolicyThresholds(c_threshold=0.3))
    decision = policy.decide([0.1, 0.55, 0.35], model_version=3)
    assert decision.tier is Tier.C
    assert not decision.fallback
    assert decision.model_version == 3 and decision.model_name == "complexity"
    assert "escalated" in decision.reason and "argmax B" in decision.reason
    assert decision.probabilities == {"A": 0.1, "B": 0.55, "C": 0.35}


def test_escalation_also_overrides_an_a_argmax():
    assert RoutingPolicy(PolicyThresholds(c_threshold=0.3)).tier([0.4, 0.25, 0.35])[0] is Tier.C


def test_below_threshold_keeps_the_argmax():
    policy = RoutingPolicy(PolicyThresholds(c_threshold=0.4))
    assert policy.tier([0.1, 0.6, 0.3])[0] is Tier.B
    assert policy.tier([0.7, 0.2, 0.1])[0] is Tier.A


def test_threshold_is_inclusive():
    assert RoutingPolicy(PolicyThresholds(c_threshold=0.25)).tier([0.0, 0.75, 0.25])[0] is Tier.C


def test_c_argmax_is_never_demoted_even_below_the_threshold():
    tier, reason = RoutingPolicy(PolicyThresholds(c_threshold=0.9)).tier([0.3, 0.3, 0.4])
    assert tier is Tier.C and reason == "argmax C"


def test_no_c_threshold_means_plain_argmax():
    assert RoutingPolicy(PolicyThresholds(c_threshold=None)).tier([0.05, 0.5, 0.45])[0] is Tier.B


def test_a_needs_confidence_when_a_threshold_is_set():
    policy = RoutingPolicy(PolicyThresholds(c_threshold=None, a_threshold=0.8))
    tier, reason = policy.tier([0.6, 0.3, 0.1])
    assert tier is Tier.B and "A not confident" in reason
    assert policy.tier([0.85, 0.1, 0.05])[0] is Tier.A


def test_probabilities_as_mapping_and_logits():
    policy = RoutingPolicy(PolicyThresholds(c_threshold=0.5))
    assert policy.decide({"A": 0.2, "B": 0.2, "C": 0.6}).tier is Tier.C
    decision = policy.decide_logits([5.0, 0.0, 0.0])
    assert decision.tier is Tier.A
    assert math.isclose(sum(decision.probabilities.values()), 1.0)


def test_softmax_is_stable_for_large_logits():
    probs = softmax([1000.0, 1000.0, -1000.0])
    assert probs[0] == pytest.approx(0.5) and probs[2] == pytest.approx(0.0)


def test_rejects_wrong_shapes_and_values():
    with pytest.raises(ValueError):
        RoutingPolicy().decide([0.5, 0.5])
    with pytest.raises(ValueError):
        RoutingPolicy().decide([0.5, float("nan"), 0.5])
    with pytest.raises(ValueError):
        PolicyThresholds(c_threshold=1.5)


def test_thresholds_round_trip_through_json_beside_a_model_version(tmp_path):
    version_dir = tmp_path / "complexity" / "4"
    version_dir.mkdir(parents=True)
    assert PolicyThresholds.load_or_default(version_dir) == PolicyThresholds()
    saved = PolicyThresholds(c_threshold=0.25, a_threshold=0.7, note="calibrated", metrics={"f1": 0.4})
    path = saved.save(version_dir)
    assert path.name == "thresholds.json"
    assert PolicyThresholds.load(path) == saved
    assert PolicyThresholds.load_or_default(version_dir) == saved


def test_fallback_uses_the_rules_and_is_flagged():
    decision = fallback_decision("What is the difference between a lamp and a bulb?", "timeout")
    assert decision.fallback and decision.tier is Tier.C
    assert decision.probabilities is None and decision.model_version is None
    assert "timeout" in decision.reason
    assert fallback_decision("hello there").tier is Tier.A
    assert fallback_decision("Who wrote the novel Dune?").tier is Tier.B


# --- a price on time -------------------------------------------------------------------------------


def priced(price: float, **thresholds) -> RoutingPolicy:
    return RoutingPolicy(PolicyThresholds(time_price=price, tier_costs=(0.25, 0.5, 1.0),
                                          **{"c_threshold": None, "a_threshold": None, **thresholds}))


def test_a_price_on_time_sends_a_question_to_a_dearer_tier_only_when_the_router_is_that_much_surer():
    probs = [0.05, 0.4, 0.55]  # argmax C by log(0.55 / 0.4) = 0.32
    assert priced(0.0).tier(probs)[0] is Tier.C
    assert priced(0.5).tier(probs)[0] is Tier.C  # C pays 0.5 x (1 - 0.5) = 0.25 < 0.32 more than B
    tier, reason = priced(1.0).tier(probs)  # 0.5 > 0.32: B
    assert tier is Tier.B and "time priced at 1" in reason
    assert priced(1.0).tier([0.02, 0.08, 0.9])[0] is Tier.C  # sure enough of C, whatever B costs


def test_a_high_price_reaches_a_and_the_rules_apply_to_the_priced_probabilities():
    assert priced(20.0).tier([0.2, 0.5, 0.3])[0] is Tier.A
    # the escalation threshold reads the priced P(C): 0.35 before the price, below 0.3 after
    assert priced(0.0, c_threshold=0.3).tier([0.1, 0.55, 0.35])[0] is Tier.C
    assert priced(1.0, c_threshold=0.3).tier([0.1, 0.55, 0.35])[0] is Tier.B


def test_the_decision_records_the_routers_own_probabilities():
    decision = priced(1.0).decide([0.05, 0.4, 0.55])
    assert decision.tier is Tier.B and decision.probabilities == {"A": 0.05, "B": 0.4, "C": 0.55}


def test_a_price_survives_the_thresholds_file_and_an_old_file_has_none(tmp_path):
    thresholds = PolicyThresholds(c_threshold=None, a_threshold=None, time_price=2.5, tier_costs=(0.2, 0.45, 1.0))
    path = thresholds.save(tmp_path)
    assert PolicyThresholds.load(path) == thresholds
    old = PolicyThresholds.from_json('{"c_threshold": 0.3, "a_threshold": null, "note": "old"}')
    assert old.time_price is None and old.tier_costs is None


@pytest.mark.parametrize("bad", [
    {"time_price": 1.0},  # no costs
    {"tier_costs": (0.2, 0.5, 1.0)},  # no price
    {"time_price": -1.0, "tier_costs": (0.2, 0.5, 1.0)},
    {"time_price": float("nan"), "tier_costs": (0.2, 0.5, 1.0)},
    {"time_price": 1.0, "tier_costs": (0.2, 1.0)},
    {"time_price": 1.0, "tier_costs": (0.2, -0.5, 1.0)},
])
def test_a_broken_price_is_refused(bad):
    with pytest.raises(ValueError):
        PolicyThresholds(**bad)


@pytest.mark.parametrize("text", [
    "{not json",
    '{"c_threshold": null, "a_threshold": null, "time_price": 2.0}',  # a price without costs
    '{"c_threshold": null, "a_threshold": null, "time_price": 2.0, "tier_costs": 5}',
    '["a list"]',
])
def test_a_broken_thresholds_file_is_a_configuration_error_naming_it(tmp_path, text):
    from adaptive_rag.errors import ConfigurationError

    (tmp_path / "thresholds.json").write_text(text)
    with pytest.raises(ConfigurationError, match="thresholds.json"):
        PolicyThresholds.load(tmp_path)
