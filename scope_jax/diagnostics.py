"""Collapse monitor: the quantities the theory talks about, estimated from one training step's data.

Pure numpy on the host; the inputs are small per-step arrays and lists (rewards, group ids, reply token ids
or words, behaviour log-probs, returns of forked episodes). A metric with no data to average over (no
groups, no n-grams, no unmasked tokens, ...) is NaN rather than a made-up 0 or 1. Inconsistent shapes
raise ValueError.

* Group statistics (GRPO groups share a scenario): `zero_variance_fraction`, and `grouped` applied to
  `distinct_n` / `identical_fraction` for the diversity of the agent's replies within a group.
* Token entropy of a role: `sampled_entropy`, the Monte-Carlo estimate from the sampled tokens' log-probs.
* Simulator deviation (Theorem 3.2's eps): `mode_deviation` / `simulator_deviation`, from the simulator's
  greedy reply and k resampled replies on a fixed probe set of contexts.
* Variance split (Lemma 3.3): `branching_variance_split` estimates it from episodes forked at a simulator
  turn (tests/test_diagnostics.py computes it exactly on finite toys, the reference it is tested against).

A reply (for equality) is a str, compared as a whole, or a sequence of tokens or words, compared
element-wise: `[1, 2]`, `(1, 2)` and `np.array([1, 2])` are the same reply.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Hashable, Sequence, TypeVar

import numpy as np

Reply = str | Sequence[Any]
Item = TypeVar("Item")


def _key(reply: Reply) -> Hashable:
    return reply if isinstance(reply, str) else tuple(reply)


def _mean_of_defined(values: Sequence[float]) -> float:
    """Mean of the non-NaN values; NaN if there are none (np.nanmean would also warn)."""
    values = np.asarray(values, dtype=np.float64)
    values = values[~np.isnan(values)]
    return float(values.mean()) if values.size else float("nan")


def grouped(metric_fn: Callable[[list[Item]], float], items: Sequence[Item],
            groups: Sequence[Hashable]) -> float:
    """Mean over groups g of metric_fn([items[i] for i with groups[i] == g]).

    Each group counts once, whatever its size. Groups whose metric is NaN (undefined, e.g. no n-grams) are
    left out of the mean; NaN if there are no groups or every group's metric is NaN. For a metric with
    parameters bind them first: `grouped(functools.partial(distinct_n, n=2), replies, groups)`.
    """
    if len(items) != len(groups):
        raise ValueError(f"{len(items)} items but {len(groups)} group ids")
    members: dict[Hashable, list[Item]] = collections.defaultdict(list)
    for item, group in zip(items, groups):
        members[group].append(item)
    return _mean_of_defined([metric_fn(group_items) for group_items in members.values()])


def zero_variance_fraction(rewards: Sequence[float] | np.ndarray,
                           groups: Sequence[Hashable] | np.ndarray) -> float:
    """Fraction of groups whose rewards are all equal (max - min == 0, exactly): rewards [N], groups [N].

    Such a group gets advantage 0 for every rollout and so contributes no policy gradient (Lemma 3.3).
    A group of one rollout counts as zero-variance. NaN when there are no rollouts.
    """
    return grouped(lambda r: float(np.ptp(r) == 0), np.asarray(rewards, dtype=np.float64), groups)


def distinct_n(sequences: Sequence[Sequence[int | str]], n: int) -> float:
    """distinct-n = |distinct n-grams| / |n-grams|, pooled over all the given sequences (Li et al., 2016).

    An n-gram is n consecutive tokens (or words) of one sequence; n-grams never span two sequences, and a
    sequence shorter than n contributes none. 1.0 means no n-gram repeats; it falls towards 1 / |n-grams|
    as the replies collapse onto one. NaN when there are no n-grams at all. A bare str is rejected: pass
    token ids, or words (`text.split()`).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    ngrams: list[tuple[Any, ...]] = []
    for seq in sequences:
        if isinstance(seq, str):
            raise TypeError("distinct_n takes sequences of tokens or words (e.g. text.split()), not a str")
        seq = tuple(seq)
        ngrams.extend(seq[i : i + n] for i in range(len(seq) - n + 1))
    return len(set(ngrams)) / len(ngrams) if ngrams else float("nan")


def identical_fraction(replies: Sequence[Reply]) -> float:
    """Fraction of replies equal to at least one *other* reply of the list.

    (1 / N) * sum_i 1[exists j != i : reply_j == reply_i]; e.g. ["a", "a", "b"] -> 2/3, all distinct -> 0,
    all equal (N >= 2) -> 1. A single reply -> 0; NaN for an empty list.
    """
    if len(replies) == 0:
        return float("nan")
    counts = collections.Counter(_key(r) for r in replies)
    return sum(c for c in counts.values() if c > 1) / len(replies)


def mode_deviation(greedy: Reply, samples: Sequence[Reply]) -> float:
    """1 - (1/k) sum_j 1[samples_j == greedy] for one probe context, k = len(samples); NaN if k = 0.

    With the k samples drawn from the simulator phi(. | h) used in training (same temperature), this is
    unbiased for 1 - phi(g | h), g the greedy reply. Greedy decoding need not find the most likely reply m,
    and phi(g | h) <= phi(m | h), so its expectation is at least the deviation eps(h) = 1 - phi(m | h):
    an over-estimate, which keeps Theorem 3.2's bias bound valid.
    """
    if len(samples) == 0:
        return float("nan")
    g = _key(greedy)
    return 1.0 - sum(_key(s) == g for s in samples) / len(samples)


def simulator_deviation(greedy_replies: Sequence[Reply], sampled_replies: Sequence[Sequence[Reply]]) -> float:
    """Mean over probe contexts c of mode_deviation(greedy_replies[c], sampled_replies[c]).

    Contexts with no samples are left out; NaN if none has any.
    """
    if len(greedy_replies) != len(sampled_replies):
        raise ValueError(f"{len(greedy_replies)} greedy replies but {len(sampled_replies)} sample lists")
    return _mean_of_defined([mode_deviation(g, s) for g, s in zip(greedy_replies, sampled_replies)])


def sampled_entropy(logprobs: np.ndarray, mask: np.ndarray) -> float:
    """Monte-Carlo token entropy -sum(mask * logprobs) / sum(mask); logprobs, mask of one shape ([B, L]).

    logprobs[b, t] = log p(y_t | y_<t) of the token y_t that was sampled from p(. | y_<t) (the behaviour
    log-probs of one role), mask selects that role's sampled tokens. Since E[-log p(y_t | y_<t) | y_<t] =
    H(p(. | y_<t)), each term is an unbiased estimate of the exact entropy at its position, so this is an
    estimate of the mean per-token entropy H_t over the batch's tokens (unbiased for a fixed mask; with
    lengths that depend on the samples, the division by the token count makes it consistent rather than
    exactly unbiased). It is the entropy of the distribution the tokens were *sampled* from (after
    temperature, top-p): log-probs of another distribution (untempered, or a stale policy) give a
    cross-entropy instead. The exact entropy needs the logits (`scope_jax.logprobs.token_logprobs`).
    NaN when the mask selects no token.
    """
    logprobs, mask = np.asarray(logprobs, dtype=np.float64), np.asarray(mask, dtype=np.float64)
    if logprobs.shape != mask.shape:
        raise ValueError(f"logprobs {logprobs.shape} and mask {mask.shape} differ in shape")
    count = mask.sum()
    # where() keeps masked-out padding (possibly -inf or nan) out of the sum: 0 * -inf is nan.
    return float(-(np.where(mask > 0, logprobs, 0.0) * mask).sum() / count) if count > 0 else float("nan")


@dataclasses.dataclass(frozen=True)
class VarianceSplit:
    """Var(r) = simulator_side + agent_side, at a simulator turn (Lemma 3.3).

    For a history h that ends with the agent's move a_t, just before the simulator's reply u_t:
    simulator_side = E_h[Var(r | h)], agent_side = Var_h(E[r | h]), total = Var(r),
    simulator_share = simulator_side / total (NaN when total == 0).
    """

    total: float
    simulator_side: float
    agent_side: float
    simulator_share: float

    @classmethod
    def of(cls, simulator_side: float, agent_side: float, total: float) -> "VarianceSplit":
        share = simulator_side / total if total > 0 else float("nan")
        return cls(float(total), float(simulator_side), float(agent_side), float(share))


def branching_variance_split(returns: np.ndarray) -> VarianceSplit:
    """Unbiased estimate of the split from returns [F, k] of F forks with k >= 2 branches each (F >= 2).

    Fork f takes an on-policy history h_f up to a simulator turn (the agent's move made, the reply not yet
    drawn); each of its k branches resamples the simulator's reply and finishes the episode, so the returns
    r_f1..r_fk are i.i.d. given h_f, with mean Q(h_f) and variance s^2(h_f); the forks are i.i.d.
    With fork means m_f = mean_j r_fj and sample variances (ddof=1) S_f^2 = var_j r_fj:

        simulator_side = mean_f S_f^2                          estimates E_h[s^2(h)] = E_h[Var(r | h)]
        agent_side     = var_f(m_f, ddof=1) - simulator_side/k  estimates Var_h(Q(h))   = Var_h(E[r | h])
        total          = simulator_side + agent_side            estimates Var(r)

    Unbiased: E[S_f^2 | h_f] = s^2(h_f), hence E[simulator_side] = E_h[s^2]. The m_f are i.i.d. with
    Var(m_f) = Var_h(Q) + E_h[s^2] / k (law of total variance: Var(m_f | h_f) = s^2(h_f) / k), so
    var_f(m_f, ddof=1) is unbiased for it, and subtracting the unbiased simulator_side / k leaves Var_h(Q).
    (These are the one-way random-effects ANOVA estimators.) The naive alternatives, ddof=0 or no 1/k
    correction, are biased: the spread of k-sample means carries a share s^2 / k of the simulator noise.

    Equivalently, with pairs of distinct returns: simulator_side = mean over same-fork pairs of
    (r - r')^2 / 2, and total = mean over pairs from different forks of (r - r')^2 / 2, i.e.
    total = SS_tot / (k (F - 1)) - SS_within / (k F (F - 1)) with SS_tot = sum_fj (r_fj - mean r)^2 and
    SS_within = sum_fj (r_fj - m_f)^2; a pair from different forks is two independent draws of r, which
    shows directly that total is unbiased for Var(r). simulator_side and total are >= 0; agent_side, a
    difference, can be negative from noise (it is not clipped: clipping would bias it), and then
    simulator_share exceeds 1.

    Which of Lemma 3.3's Doob terms land where, forking at simulator turn t of a T-turn dialogue:
    simulator_side = the simulator term of turn t + every term (agent and simulator) of turns t+1..T;
    agent_side = every term before it: agent turns 1..t and simulator turns 1..t-1. So at T = 1 this is
    exactly the lemma's split; at T > 1 simulator_side also holds the later agent turns' terms and
    agent_side the earlier simulator turns' terms.
    The terms are conditional on what all forks share: fork within one context x (one GRPO group) for the
    lemma's per-context split; forks over several contexts add Var_x(E[r | x]) to agent_side.
    """
    returns = np.asarray(returns, dtype=np.float64)
    if returns.ndim != 2 or returns.shape[0] < 2 or returns.shape[1] < 2:
        raise ValueError(f"returns must be [F, k] with F >= 2 forks and k >= 2 branches, got {returns.shape}")
    k = returns.shape[1]
    # Centring on one return changes no variance, and makes constant returns give exactly 0 (NaN share).
    returns = returns - returns[0, 0]
    simulator_side = returns.var(axis=1, ddof=1).mean()
    spread_of_means = returns.mean(axis=1).var(ddof=1)
    # total as a sum of non-negative terms, so round-off cannot make it negative.
    return VarianceSplit.of(simulator_side=simulator_side, agent_side=spread_of_means - simulator_side / k,
                            total=spread_of_means + simulator_side * (k - 1) / k)
