"""Hypothesis strategies for the theory tests: batches of random exact instances.

Hypothesis draws the seed, the horizon, the reward range and how sharp the simulator and the policy are
(scale 0 gives uniform distributions, large scales near-deterministic ones); each example is a batch of
BATCH instances so one compiled function covers many instances. shortcut_problem derives a one-turn
instance's shortcut sets and gaps (Propositions 3.4 to 3.6).
"""

from __future__ import annotations

import jax
import numpy as np
from hypothesis import settings
from hypothesis import strategies as st

from theory import concentration, toy

BATCH = 8
PROPERTY = settings(max_examples=15, deadline=None)

# one shape per horizon keeps the number of compilations small
DIALOGUE_SHAPES = {1: toy.Shape(2, 3, 3, 1), 2: toy.Shape(2, 3, 2, 2), 3: toy.Shape(1, 2, 2, 3)}
BANDIT_SHAPE = toy.Shape(2, 4, 3, 1)


@st.composite
def reward_ranges(draw) -> tuple[float, float]:
    r_min = draw(st.floats(-2.0, 1.0))
    return r_min, r_min + draw(st.floats(0.1, 3.0))


@st.composite
def instances(draw, shape: toy.Shape, binary: bool = False) -> tuple[toy.Tables, toy.Game, float, float]:
    """(logits, games, r_min, r_max) for BATCH instances of `shape`."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    r_min, r_max = draw(reward_ranges())
    sim_scale = np.full(BATCH, draw(st.floats(0.0, 40.0)))
    games = toy.random_games(rng, shape, sim_scale, r_min, r_max, binary)
    logits = toy.random_logits(rng, shape, np.full(BATCH, draw(st.floats(0.0, 8.0))))
    return logits, games, r_min, r_max


@st.composite
def dialogues(draw, binary: bool = False):
    """instances() of a dialogue shape with horizon 1, 2 or 3."""
    return draw(instances(DIALOGUE_SHAPES[draw(st.sampled_from(sorted(DIALOGUE_SHAPES)))], binary))


@jax.jit
def shortcut_problem(games, r_min, r_max):
    """Q_mode, Q_phi, the shortcut mask (tolerance 5% of dr), Delta_x and Delta_x - 2 eps* dr."""
    dr = r_max - r_min
    q_mode = toy.one_turn_values(games._replace(sim=toy.mode_user(games.sim)))
    q_true = toy.one_turn_values(games)
    mask = concentration.shortcut_set(q_mode, 0.05 * dr)
    gap = concentration.separation(q_mode, mask)
    return q_mode, q_true, mask, gap, gap - 2 * toy.deviation(games.sim)[0].max(-1) * dr
