"""The data curve's rule and sentences, on a hand-made summary whose answers are known."""

import numpy as np

from scope_jax.testbed import data_report
from scope_jax.testbed.statistics import seed_stat


def arm(value, nll):
    return {"heldout_value": seed_stat(np.asarray(value)), "data_nll": seed_stat(np.full(3, nll))}


def summary_and_points():
    arms = {"frozen": arm([0.28, 0.28, 0.28], 2.0), "frozen_base": arm([0.38, 0.38, 0.38], 1.0)}
    points = {}
    for n, fitted in ((30, 0.30), (300, 0.36)):
        arms[f"fitted_n{n}"] = arm([fitted, fitted + 0.01, fitted - 0.01], 1.0)
        arms[f"vs_fitted_n{n}"] = arm([fitted + 0.05, fitted + 0.06, fitted + 0.04], 1.2)  # +0.05 in each seed
        points[f"fitted_n{n}"] = {"kind": "fitted", "n": n, "data_coef": 0.0}
        points[f"vs_fitted_n{n}"] = {"kind": "vs_fitted", "n": n, "data_coef": 0.0}
        for coef, nll in ((1.0, 1.5), (4.0, 1.08), (16.0, 1.02)):
            name = f"cotrain_data{coef:g}_n{n}"
            arms[name] = arm([fitted - 0.1, fitted + 0.1, fitted], nll if n == 30 else 1.5)
            points[name] = {"kind": "cotrain_data", "n": n, "data_coef": coef}
    return {"arms": arms}, points


def test_the_rule_takes_the_smallest_weight_within_tolerance_else_the_largest():
    summary, points = summary_and_points()
    curve = data_report.curve(summary, points, tolerance=0.10)
    assert curve["by_n"]["30"]["data_coef"] == 4.0  # 1.08 <= 1.1 x 1.0; 1.5 is not
    assert curve["by_n"]["300"]["data_coef"] == 16.0  # none within 10%: the largest


def test_the_sentences_follow_the_paired_differences():
    summary, points = summary_and_points()
    curve = data_report.curve(summary, points, tolerance=0.10)
    np.testing.assert_allclose(curve["by_n"]["30"]["vs_fitted"]["vs_fitted"]["mean"], 0.05)
    lines = data_report.sentences(curve)
    assert "0.300 at N = 30 (20% of the gap)" in lines[0] and "0.360 at N = 300 (80% of the gap)" in lines[0]
    cotrain = next(line for line in lines if line.startswith("**Co-Training"))
    assert "above fitted at 95% at no N" in cotrain
    vs = next(line for line in lines if line.startswith("**Verbalized"))
    assert "+0.050 ± 0.000 at N = 30 (higher)" in vs and "above fitted at 95% at N = 30, 300" in vs
    assert len(data_report.table(curve)) == 2 + 2 * 3
