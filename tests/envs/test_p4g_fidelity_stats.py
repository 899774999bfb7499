"""Fidelity statistics against independent references: scipy's KS and Spearman, hand-computed arm
statistics and bootstrap percentiles on tiny cases, the ridge regression against least squares on the
augmented system, and the human floors on cases whose distances are known."""

import numpy as np
import pytest

from scope_jax.envs import p4g_fidelity_stats as fs
from scope_jax.envs.p4g import CATEGORICAL, NUMERIC, Persona

stats = pytest.importorskip("scipy.stats")


def test_ks_statistic_matches_scipy():
    rng = np.random.default_rng(0)
    for _ in range(20):
        a = rng.choice([0.0, 0.5, 1.0, 2.0], rng.integers(1, 30))
        b = np.round(rng.uniform(0, 2, rng.integers(1, 30)), 1)
        assert fs.ks_statistic(a, b) == pytest.approx(stats.ks_2samp(a, b).statistic)


def test_rank_correlation_matches_scipy():
    rng = np.random.default_rng(1)
    a, b = rng.choice([0.0, 0.5, 1.0, 2.0], 40), rng.choice([0.0, 0.1, 1.0], 40)
    assert fs.rank_correlation(a, b) == pytest.approx(stats.spearmanr(a, b).statistic)
    assert np.isnan(fs.rank_correlation(np.zeros(5), b[:5]))
    a[3] = np.nan
    assert np.isnan(stats.spearmanr(a, b).statistic) and np.isnan(fs.rank_correlation(a, b))


def test_histogram_bins():
    shares = fs.histogram(np.array([0.0, 0.01, 0.25, 0.5, 1.0, 1.0, 1.99, 2.0]))
    assert shares.sum() == pytest.approx(1.0) and len(shares) == len(fs.BIN_LABELS)
    assert shares[0] == shares[1] == 1 / 8 and shares[5] == 2 / 8 and shares[-1] == 2 / 8
    humans = np.array([0.0, 0.0, 1.0, 2.0])
    assert fs.distances(humans, humans) == {"hist_l1": 0.0, "ks": 0.0}
    assert fs.distances(np.zeros(4), humans) == {"hist_l1": 1.0, "ks": 0.5}


def test_histogram_bins_as_numpy_does_at_every_edge():
    """np.histogram as the reference: each edge, either side of it, and donations outside every bin."""
    rng = np.random.default_rng(0)
    edges = np.concatenate([fs.BINS, np.nextafter(fs.BINS, -np.inf), np.nextafter(fs.BINS, np.inf)])
    for donations in (edges, np.array([-1.0, 3.0]), np.zeros(0), rng.uniform(-0.5, 2.5, 200),
                      np.round(rng.uniform(0, 2, 200) * 4) / 4):
        np.testing.assert_array_equal(fs.histogram(donations),
                                      np.histogram(donations, fs.BINS)[0] / max(len(donations), 1))


def test_arm_statistics_by_hand():
    """Three participants, two dialogues each. Draw 0 reads [0, 1] (rate 1/2, mean 0.5, KS 1/3 against
    [0, 1, 2]), draw 1 reads [2] (rate 1, mean 2, KS 2/3); 3 of 6 dialogues are unreadable; the mean
    readable donations [0, 1.5] of the first two rank as their own [0, 1]."""
    donations = np.array([[0.0, np.nan], [1.0, 2.0], [np.nan, np.nan]])
    own = np.array([0.0, 1.0, 2.0])
    r = fs.arm_statistics(donations, own)
    assert r["donation_rate"] == pytest.approx(0.75) and r["mean_donation"] == pytest.approx(1.25)
    assert r["ks"] == pytest.approx(0.5) and r["unreadable"] == 0.5 and r["rank_corr"] == pytest.approx(1.0)
    l1 = (np.abs(fs.histogram(np.array([0.0, 1.0])) - fs.histogram(own)).sum()
          + np.abs(fs.histogram(np.array([2.0])) - fs.histogram(own)).sum()) / 2
    assert r["hist_l1"] == pytest.approx(l1)


def test_bootstrap_percentiles_by_hand():
    """Four given resamples of three values: the statistic of each, sorted, and numpy's linear
    percentiles worked out by hand (2.5%: 7.5% of the way from the 1st to the 2nd value; 97.5%: 92.5% of
    the way from the 3rd to the 4th)."""
    values = np.array([1.0, 4.0, 10.0])
    indices = np.array([[0, 0, 1], [2, 2, 2], [0, 1, 2], [1, 1, 0]])
    result = fs.bootstrap(lambda v: {"mean": float(np.mean(v))}, indices, values)["mean"]
    means = sorted([2.0, 10.0, 5.0, 3.0])
    assert result["value"] == pytest.approx(5.0)
    assert result["low"] == pytest.approx(means[0] + 0.075 * (means[1] - means[0]))
    assert result["high"] == pytest.approx(means[2] + 0.925 * (means[3] - means[2]))


def test_resamples_move_a_participants_rows_together():
    rows = fs.resamples(5, np.random.default_rng(0), draws=50)
    donations = np.arange(10.0).reshape(5, 2)
    own = np.arange(5.0)
    seen = fs.bootstrap(lambda d, o: {"gap": float(np.max(np.abs(d[:, 0] / 2 - o)))}, rows, donations, own)
    assert seen["gap"] == {"value": 0.0, "low": 0.0, "high": 0.0}  # row i's dialogues stay with own[i]


def test_human_floors_on_known_cases():
    zeros, twos = np.zeros(10), np.full(30, 2.0)
    floors = fs.human_floors(zeros, twos, sizes=[5, 7], rng=np.random.default_rng(0), draws=20)
    assert floors["fresh"]["ks"] == {"mean": 1.0, "low": 1.0, "high": 1.0}
    assert floors["fresh"]["hist_l1"]["mean"] == 2.0 and floors["fresh"]["sizes"] == [5, 7]
    assert floors["halves"]["ks"]["mean"] == 0.0 and floors["halves"]["sizes"] == [5, 5]
    mixed = np.array([0.0] * 5 + [2.0] * 5)
    halves = fs.human_floors(mixed, twos, [5], np.random.default_rng(1), draws=200)["halves"]
    ks = halves["ks"]
    assert 0 < ks["mean"] < 1 and ks["low"] <= ks["mean"] <= ks["high"]


def test_ridge_matches_least_squares_on_the_augmented_system():
    """min |y - Xw - b|^2 + alpha |w|^2 with b free: centre X and y, then least squares on
    [Xc; sqrt(alpha) I] w = [yc; 0]."""
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(40, 5)), rng.normal(size=40)
    for alpha in (0.0, 3.0):
        w, b = fs.ridge(x, y, alpha)
        xc, yc = x - x.mean(0), y - y.mean()
        augmented = np.vstack([xc, np.sqrt(alpha) * np.eye(5)])
        expected = np.linalg.lstsq(augmented, np.concatenate([yc, np.zeros(5)]), rcond=None)[0]
        np.testing.assert_allclose(w, expected, atol=1e-10)
        assert b == pytest.approx(y.mean() - x.mean(0) @ expected)


def test_cross_validation_picks_a_small_penalty_for_signal_and_the_largest_for_noise():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(200, 4))
    assert fs.choose_alpha(x, x @ np.array([1.0, -2.0, 0.5, 1.0]) + 0.1 * rng.normal(size=200), rng) \
        == min(fs.ALPHAS)
    assert fs.choose_alpha(x, rng.normal(size=200), rng) == max(fs.ALPHAS)


def persona(participant, donation, age, sex):
    traits = tuple((name, age if name == "age" else None) for name in NUMERIC)
    return Persona(participant, donation, traits, tuple((name, sex if name == "sex" else "")
                                                        for name in CATEGORICAL))


def test_traits_ceiling_finds_a_trait_that_sets_the_donation_and_one_row_per_participant():
    rng = np.random.default_rng(4)
    ages, sexes = rng.integers(20, 60, 120), rng.choice(["Male", "Female"], 120)
    people = [persona(f"p{i}", float(age > 40), float(age), sex)
              for i, (age, sex) in enumerate(zip(ages, sexes))]
    ceiling = fs.traits_ceiling(people[:80], people[80:], rng)
    assert ceiling["rank_corr"]["value"] > 0.8 and ceiling["rank_corr"]["low"] > 0.5
    assert (ceiling["fitted"], ceiling["scored"]) == (80, 40)
    rows = [persona("a", None, 30, "Male"), persona("a", 1.0, 30, "Male"), persona("a", 0.5, 30, "Male"),
            persona("b", 0.0, 40, "Female")]
    assert [(p.participant, p.donation) for p in fs.first_per_participant(rows)] == [("a", 1.0), ("b", 0.0)]
