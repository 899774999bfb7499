"""The dialogue loop's data anchor: each step's simulator batch carries rows of the simulator split's human
P4G dialogues in the simulator's view (the SFT job's tokens), drawn by (seed, step), and the update uses
them; no row is a judge's or a held-out person's."""

import pathlib

import numpy as np
import pytest

from experiments.configs.p4g_rl import get_config
from scope_jax.config import ConfigError
from scope_jax.dialogue.episode import SIM
from scope_jax.envs.p4g import P4GEnv
from scope_jax.envs.p4g_human import HumanDialogues
from scope_jax.models.tiny import word_tokenizer
from scope_jax.training import rl_step
from scope_jax.training.batch import TokenBatch
from scope_jax.training.config import check
from scope_jax.training.data_anchor import DataAnchor
from scope_jax.training.setup import build
from scope_jax.training.sft_data import dialogue_view

DATA = pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "data" / "p4g"


def needs_data():
    if not (DATA / "FullData" / "full_dialog.csv").exists():
        pytest.skip(f"P4G data folder absent ({DATA})")


@pytest.fixture(scope="module")
def anchored():
    needs_data()
    config = get_config("cotrain", model="tiny:0")
    config.env.data_dir = str(DATA)
    config.sim.update(data_coef=1.0, data="p4g_human:simulator")
    config.rollout.update(groups=2, group_size=2)
    config.sampling.max_new_tokens = 4
    config.eval.sim_models = ("tiny:2",)
    return build(config)


def rows_of(tokens: TokenBatch) -> list[tuple[int, ...]]:
    """Each row's ids up to the end of its last reply (a view ends with the simulator's last reply)."""
    ids, mask = np.asarray(tokens.tokens), np.asarray(tokens.loss_mask)
    ids, mask = ids.reshape(-1, ids.shape[-1]), mask.reshape(-1, mask.shape[-1])
    return [tuple(t[:int(np.nonzero(m)[0].max()) + 1].tolist()) for t, m in zip(ids, mask)]


def test_rows_are_simulator_split_human_dialogues_in_the_simulators_view_drawn_by_the_step():
    """With a tokenizer that knows the dialogues' words, every row is the SFT view of a simulator-split
    dialogue and of no judge or held-out one; a step's rows are a function of the step."""
    needs_data()
    env = P4GEnv(data_dir=str(DATA), max_turns=1)
    splits = ("simulator", "judge", "eval")
    dialogues = {split: HumanDialogues.load(env, split, 1).episodes for split in splits}
    episodes = [e for split in splits for e in dialogues[split]]
    words = {w for e in episodes for m in e.messages for w in m.text.split()}
    words |= {w for e in episodes for w in env.system_prompt(e.scenario, SIM).split()}
    tokenizer = word_tokenizer(tuple(sorted(words)))
    views = {split: {tuple(dialogue_view(env, e, SIM, tokenizer).ids) for e in episodes}
             for split, episodes in dialogues.items()}
    anchor = DataAnchor.load("p4g_human:simulator", env, tokenizer, seed=0)
    rows = rows_of(anchor.rows(step=3, members=4, per_member=8))
    assert len(rows) == 32 and all(row in views["simulator"] for row in rows)
    assert not any(row in views["judge"] or row in views["eval"] for row in rows)
    assert rows == rows_of(anchor.rows(step=3, members=4, per_member=8))  # a resumed step draws the same
    assert rows != rows_of(anchor.rows(step=4, members=4, per_member=8))


def test_each_steps_simulator_batch_carries_the_anchors_rows(anchored):
    setup = anchored
    episodes = rl_step.play_episodes(setup, setup.state, 0)
    batch = rl_step.make_batch(setup, episodes, rl_step.role_advantages(setup, episodes), 1)
    assert batch.sim_data.tokens.shape[:2] == batch.sims.tokens.shape[:2]  # [P, M]: one row per episode
    assert rows_of(batch.sim_data) == rows_of(setup.anchor.rows(1, *batch.sims.tokens.shape[:2]))


def test_the_step_update_includes_the_anchors_nll(anchored):
    setup = anchored
    _, metrics, _ = rl_step.rl_step(setup, setup.state, 0)
    assert np.isfinite(metrics["sims/nll"]) and metrics["sims/nll"] > 0


def test_a_malformed_data_name_is_refused_in_one_line(anchored):
    setup = anchored
    tokenizer = setup.agent.tokenizer
    for spec, said in [("p4g_human", "SOURCE:SPLIT"), ("p4g_human:test", "split"),
                       ("humans:train", "SOURCE:SPLIT"), ("p4g_human:judge", "never share a person"),
                       ("p4g_human:train", "never share a person")]:
        with pytest.raises(ConfigError, match=said) as error:
            DataAnchor.load(spec, setup.env, tokenizer, seed=0)
        assert "'sim.data'" in str(error.value) and "\n" not in str(error.value)


def test_p4g_rl_trains_on_simulator_people_and_its_fitted_arm_needs_its_adapter():
    """p4g_rl's arms check (the anchor on the simulator split); `fitted` checks with its committed adapter
    (fitted on the simulator split by sft.py:fitted) and is refused in one line without one."""
    needs_data()
    for arm in ("frozen", "cotrain_data"):
        config = get_config(arm)
        config.env.data_dir = str(DATA)
        check(config)
        assert config.env.train_split == "simulator" and config.train.eval_first
    config = get_config("fitted")
    config.env.data_dir = str(DATA)
    check(config)  # the committed adapter, fitted on the simulator split (its fitted_on.json)
    base, adapter = config.sim.model.split("+", 1)
    config.sim.model = f"{base}+{adapter}-missing"
    with pytest.raises(ConfigError, match="adapter folder does not exist") as error:
        check(config)
    assert "'sim.model'" in str(error.value)
