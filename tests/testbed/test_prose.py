"""summary.md's sentences follow the numbers: directions and interval checks come from the summary."""

from scope_jax.testbed import prose, statistics


def seed_stat(seeds):
    mean, hw = statistics.interval(seeds)
    return {"mean": mean, "ci95": hw, "seeds": list(seeds)}


def _summary(gain):
    """Two controls and one fix whose per-seed held-out gain over the frozen arm is `gain`."""
    frozen, base = [0.28, 0.29, 0.28, 0.30, 0.29], [0.37, 0.38, 0.36, 0.39, 0.38]
    fix = [f + g for f, g in zip(frozen, gain)]
    arm = lambda values: {"heldout_value": seed_stat(values)}
    diff = lambda a, b: {"heldout_value": seed_stat([x - y for x, y in zip(a, b)])}
    return {"arms": {"frozen": arm(frozen), "frozen_base": arm(base), "cotrain": arm(fix)},
            "deltas": {"frozen": {"frozen_base": diff(base, frozen), "cotrain": diff(fix, frozen)},
                       "frozen_base": {"frozen": diff(frozen, base), "cotrain": diff(fix, base)}},
            "labels": {"frozen": "frozen collapsed simulator", "frozen_base": "frozen base simulator",
                       "cotrain": "Co-Training"}}


def test_direction_needs_the_interval_to_exclude_zero():
    assert statistics.direction(seed_stat([0.1, 0.12, 0.09, 0.11, 0.1])) == "higher"
    assert statistics.direction(seed_stat([-0.1, -0.12, -0.09, -0.11, -0.1])) == "lower"
    assert statistics.direction(seed_stat([0.1, -0.12, 0.09, -0.11, 0.1])) == "not distinguishable from 0"


def test_comparison_sentences_say_what_the_paired_differences_say():
    higher = prose.comparison_sentences(_summary([0.09, 0.1, 0.08, 0.1, 0.09]))
    null = prose.comparison_sentences(_summary([0.02, -0.03, 0.01, -0.02, 0.02]))
    co_higher = next(line for line in higher if line.startswith("**Co-Training**"))
    co_null = next(line for line in null if line.startswith("**Co-Training**"))
    assert "vs the frozen collapsed simulator (higher)" in co_higher
    assert "vs the frozen base simulator (not distinguishable from 0)" in co_higher
    assert "vs the frozen collapsed simulator (not distinguishable from 0)" in co_null
    assert "vs the frozen base simulator (lower)" in co_null


def test_the_sweep_rule_chooses_among_adversarial_points_and_the_verdict_covers_every_objective():
    """The rule picks the default run's (adversarial) setting even when a regret point deviates more; the
    README's verdict has a part per objective."""
    deviations = {"cotrain_kl1": 0.3, "cotrain_kl2": 0.2, "cotrain_regret_kl1": 0.6}
    summary = _summary([0.02, -0.03, 0.01, -0.02, 0.02])
    summary["seeds"] = [0, 1, 2, 3, 4]
    objective = lambda name: "regret" if "regret" in name else "adversarial"
    summary["sweep"] = {name: {"kl": 1.0, "lr": 2e-3, "objective": objective(name)} for name in deviations}
    for name, deviation in deviations.items():
        summary["arms"][name] = {"sim_deviation": seed_stat([deviation] * 5)}
        summary["deltas"]["frozen"][name] = summary["deltas"]["frozen"]["cotrain"]
    assert statistics.selected_sweep_point(summary) == "cotrain_kl1"
    sentence = prose.sweep_null_sentence(summary)
    assert "adversarial: 2 settings" in sentence and "regret: 1 settings" in sentence
