"""The tabular study's step rule and README sentence, on hand-made curves and a hand-made tabular.json."""

import numpy as np
import pytest

from experiments import tabular_objectives as study


def _curves(settle_at: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Training values [R, PROBE_STEPS] that are 0.5 below their final value 1 before step settle_at[r]."""
    t = np.arange(study.PROBE_STEPS)
    return np.stack([np.where(t < s, 0.5, 1.0) for s in settle_at]), np.ones(len(settle_at))


def test_the_step_rule_takes_the_slowest_seed_rounded_up_to_the_unit():
    assert study.choose_steps(*_curves([120, 260])) == 300
    assert study.choose_steps(*_curves([0, 50])) == study.STEP_UNIT
    with pytest.raises(ValueError, match="does not settle"):
        study.choose_steps(*_curves([120, study.PROBE_STEPS]))


def _stat(mean: float, ci95: float) -> dict:
    return {"mean": mean, "ci95": ci95, "seeds": []}


def test_the_sentence_counts_verdicts_from_the_intervals():
    deltas = {"adv_a": _stat(0.02, 0.01), "adv_b": _stat(-0.05, 0.1), "reg_a": _stat(-0.03, 0.01)}
    objective = {"adv_a": "adversarial", "adv_b": "adversarial", "reg_a": "regret"}
    summary = {"seeds": [0, 1, 2], "arms": {n: {"objective": o} for n, o in objective.items()},
               "deltas": {n: {"heldout_value": d} for n, d in deltas.items()},
               "frozen_base_gap": _stat(0.4, 0.01)}
    sentence = study.tabular_null_sentence(summary)
    assert "3 seeds" in sentence
    assert ("adversarial: 2 settings, held-out value -0.050 to +0.020 against the frozen collapsed simulator "
            "(paired by seed), above it at 95% at 1, below at 0;") in sentence
    assert ("regret (exact best response): 1 settings, held-out value -0.030 to -0.030 against the frozen "
            "collapsed simulator (paired by seed), above it at 95% at 0, below at 1;") in sentence
    assert sentence.endswith("the frozen base simulator is +0.400 ± 0.010 above the frozen collapsed one, "
                             "and the largest difference above is 5% of that gap.")
