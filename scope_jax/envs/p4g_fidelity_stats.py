"""How close simulated persuadees' donations are to the people's, with intervals (numpy only).

A fidelity run plays each of n held-out participants k times; `donations` [n, k] holds the dollars each
dialogue ended with (NaN: unreadable) and `own` [n] each participant's real donation. A participant counts
once:

- distribution statistics (donation rate, mean, KS and histogram L1 against the n humans) are those of
  one dialogue per participant (draw j: column j, its unreadable dialogues left out), averaged over the
  k draws;
- the unreadable share is the mean over every dialogue (each participant has k);
- the rank correlation with the person's own donation is Spearman's between each participant's mean
  readable donation (participants with none left out) and `own`.

Each has a 95% percentile interval over `DRAWS` bootstrap resamples of the participants (a participant's
k dialogues and own donation move together; `bootstrap`).

References that need no model:
- `human_floors`: the same distances between people. "fresh": as many other people (drawn without
  replacement from `others`) as the arm has readable answers in each draw, against the n humans; "halves":
  the n humans split at random into two halves, one against the other. Each is the mean over `DRAWS`
  draws, with the 2.5 and 97.5 percentiles of those draws.
- `traits_ceiling`: a ridge regression of the donation on the persona's traits alone (numeric traits
  standardised, a missing one at the mean; categories one-hot), fitted on one split's people and scored
  by its Spearman correlation with the held-out people's own donations (with a bootstrap interval): what
  the card carries. Its penalty is chosen before scoring by the squared error of `CV_REPEATS` repeats of
  `CV_FOLDS`-fold cross-validation on the fitting people, over `ALPHAS`.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from scope_jax.envs.p4g import CATEGORICAL, Persona

# Histogram bins in dollars: exactly $0, then quarters; the last bin holds $2.
BINS = np.array([0.0, 0.005, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0 + 1e-9])
BIN_LABELS = ("0", "0-.25", ".25-.5", ".5-.75", ".75-1", "1-1.25", "1.25-1.5", "1.5-1.75", "1.75-2")
DRAWS = 1000  # bootstrap resamples, and random draws of each human floor
ALPHAS = (0.1, 1.0, 10.0, 100.0, 1000.0)
CV_FOLDS = 5
CV_REPEATS = 10  # one split of the folds flips the choice between neighbouring alphas on the judge split
ARM_STATS = ("donation_rate", "mean_donation", "ks", "hist_l1", "unreadable", "rank_corr")
DISTANCES = ("ks", "hist_l1")


def histogram(donations: np.ndarray) -> np.ndarray:
    """Share of donations in each of BINS; as np.histogram bins them (the last bin closed, a donation
    outside every bin in none), without its per-call overhead, which the bootstrap pays many times."""
    inside = donations[(donations >= BINS[0]) & (donations <= BINS[-1])]
    bins = np.minimum(np.searchsorted(BINS, inside, side="right") - 1, len(BINS) - 2)
    return np.bincount(bins, minlength=len(BINS) - 1) / max(len(donations), 1)


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs."""
    grid = np.concatenate([a, b])  # every value of either (repeats change no maximum)
    cdf = lambda x: np.searchsorted(np.sort(x), grid, side="right") / len(x)
    return float(np.max(np.abs(cdf(a) - cdf(b))))


def distances(donations: np.ndarray, humans: np.ndarray) -> dict[str, float]:
    return {"hist_l1": float(np.abs(histogram(donations) - histogram(humans)).sum()),
            "ks": ks_statistic(donations, humans)}


def rank_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation (ties get their average rank); NaN when either side is constant, has
    fewer than 2 values or holds a NaN."""
    def ranks(x: np.ndarray) -> np.ndarray:
        _, value_of, ties = np.unique(x, return_inverse=True, return_counts=True)
        after = np.cumsum(ties)  # each distinct value's 0-based ranks are after - ties .. after - 1
        return (after - (ties + 1) / 2)[value_of]

    if len(a) < 2 or np.isnan(a).any() or np.isnan(b).any():
        return float("nan")
    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def donation_stats(donations: np.ndarray, humans: np.ndarray) -> dict[str, float]:
    """n, donation rate, mean and distances to the humans of readable donations (NaN when there are none)."""
    if not len(donations):
        return {"n": 0, **dict.fromkeys(("donation_rate", "mean_donation", "hist_l1", "ks"), float("nan"))}
    return {"n": len(donations), "donation_rate": float(np.mean(donations > 0)),
            "mean_donation": float(np.mean(donations)), **distances(donations, humans)}


def first_per_participant(personas: Sequence[Persona]) -> list[Persona]:
    """Each participant's first row (file order) with a valid donation: a participant counts once."""
    chosen: dict[str, Persona] = {}
    for persona in personas:
        if persona.donation is not None:
            chosen.setdefault(persona.participant, persona)
    return list(chosen.values())


def arm_statistics(donations: np.ndarray, own: np.ndarray) -> dict[str, float]:
    """The statistics of `donations` [n, k] (NaN: unreadable) against the participants' own [n] (module
    docstring)."""
    draws = [donation_stats(column[~np.isnan(column)], own) for column in donations.T]
    stats = {key: _mean([d[key] for d in draws])
             for key in ("donation_rate", "mean_donation", "ks", "hist_l1")}
    answered = ~np.all(np.isnan(donations), axis=1)
    means = np.nanmean(donations[answered], axis=1) if answered.any() else np.zeros(0)
    return {**stats, "unreadable": float(np.mean(np.isnan(donations))),
            "rank_corr": rank_correlation(means, own[answered])}


def _mean(values: list[float]) -> float:
    values = [v for v in values if not np.isnan(v)]
    return float(np.mean(values)) if values else float("nan")


def resamples(n: int, rng: np.random.Generator, draws: int = DRAWS) -> np.ndarray:
    """[draws, n] participant indices drawn with replacement: the bootstrap resamples."""
    return rng.integers(n, size=(draws, n))


def interval(values: Sequence[float]) -> tuple[float, float]:
    """The 2.5 and 97.5 percentiles of `values`, NaNs left out (NaN, NaN when all are)."""
    values = np.asarray(values, float)
    values = values[~np.isnan(values)]
    if not len(values):
        return float("nan"), float("nan")
    low, high = np.percentile(values, [2.5, 97.5])
    return float(low), float(high)


def bootstrap(statistics: Callable[..., dict[str, float]], indices: np.ndarray,
              *arrays: np.ndarray) -> dict[str, dict[str, float]]:
    """{key: {"value", "low", "high"}}: `statistics(*arrays)` and the 95% percentile interval of
    `statistics(*(a[rows] for a in arrays))` over the resamples `indices` [draws, n] of the rows."""
    value = statistics(*arrays)
    again = [statistics(*(a[rows] for a in arrays)) for rows in indices]
    return {key: dict(zip(("value", "low", "high"), (value[key], *interval([r[key] for r in again]))))
            for key in value}


def human_floors(humans: np.ndarray, others: np.ndarray, sizes: Sequence[int], rng: np.random.Generator,
                 draws: int = DRAWS) -> dict[str, dict]:
    """The human floors of the module docstring: "fresh" (draw d compares sizes[d % len(sizes)] of
    `others` with `humans`) and "halves" (`humans` split in two at random)."""
    fresh, halves = [], []
    half = len(humans) // 2
    for d in range(draws):
        fresh.append(distances(rng.choice(others, sizes[d % len(sizes)], replace=False), humans))
        order = rng.permutation(len(humans))
        halves.append(distances(humans[order[:half]], humans[order[half:]]))
    summary = lambda records: {key: dict(zip(("mean", "low", "high"),
                                             (float(np.mean([r[key] for r in records])),
                                              *interval([r[key] for r in records]))))
                               for key in DISTANCES}
    return {"fresh": {"sizes": [int(s) for s in sizes], **summary(fresh)},
            "halves": {"sizes": [half, len(humans) - half], **summary(halves)}}


# --- the traits-only ceiling ----------------------------------------------------------------------------

def trait_features(fit: Sequence[Persona], score: Sequence[Persona]) -> tuple[np.ndarray, np.ndarray]:
    """Feature matrices of the fitting and the scored personas: numeric traits standardised by the fitting
    people's mean and spread (a missing value at the mean, 0), and one column per category the fitting
    people have (a category only the scored people have is all zeros)."""
    def numeric(personas):
        return np.array([[np.nan if v is None else v for _, v in p.traits] for p in personas], float)

    raw_fit, raw_score = numeric(fit), numeric(score)
    mean, spread = np.nanmean(raw_fit, axis=0), np.nanstd(raw_fit, axis=0)
    spread[spread == 0] = 1.0
    standard = lambda x: np.nan_to_num((x - mean) / spread, nan=0.0)
    levels = [(name, value) for name in CATEGORICAL
              for value in sorted({dict(p.demographics)[name] for p in fit})]
    onehot = lambda personas: np.array([[float(dict(p.demographics)[name] == value) for name, value in levels]
                                        for p in personas])
    return (np.hstack([standard(raw_fit), onehot(fit)]), np.hstack([standard(raw_score), onehot(score)]))


def ridge(x: np.ndarray, y: np.ndarray, alpha: float) -> tuple[np.ndarray, float]:
    """(weights, intercept) minimising |y - x w - b|^2 + alpha |w|^2 (the intercept is not penalised)."""
    xm, ym = x.mean(axis=0), y.mean()
    xc = x - xm
    w = np.linalg.solve(xc.T @ xc + alpha * np.eye(x.shape[1]), xc.T @ (y - ym))
    return w, float(ym - xm @ w)


def choose_alpha(x: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> float:
    """The alpha of ALPHAS with the least squared error of CV_REPEATS repeats of CV_FOLDS-fold
    cross-validation on (x, y)."""
    splits = [np.array_split(rng.permutation(len(y)), CV_FOLDS) for _ in range(CV_REPEATS)]

    def error(alpha: float) -> float:
        total = 0.0
        for fold in (fold for folds in splits for fold in folds):
            keep = np.setdiff1d(np.arange(len(y)), fold)
            w, b = ridge(x[keep], y[keep], alpha)
            total += float(np.sum((x[fold] @ w + b - y[fold]) ** 2))
        return total

    return min(ALPHAS, key=error)


def traits_ceiling(fit: Sequence[Persona], score: Sequence[Persona], rng: np.random.Generator) -> dict:
    """The traits-only ridge regression fitted on `fit` and its rank correlation on `score` (one persona
    per participant each, with a donation), with a bootstrap interval over the scored people."""
    x_fit, x_score = trait_features(fit, score)
    y_fit = np.array([p.donation for p in fit])
    alpha = choose_alpha(x_fit, y_fit, rng)
    w, b = ridge(x_fit, y_fit, alpha)
    predicted, own = x_score @ w + b, np.array([p.donation for p in score])
    corr = bootstrap(lambda p, o: {"rank_corr": rank_correlation(p, o)}, resamples(len(own), rng),
                     predicted, own)
    return {"alpha": alpha, "fitted": len(fit), "scored": len(score), **corr}
