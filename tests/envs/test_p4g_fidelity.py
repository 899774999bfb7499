"""The P4G fidelity job: an arm's statistics, and a whole run with tiny models on a toy data file."""

import json

import numpy as np
import pytest

from experiments.jobs import p4g_fidelity as job
from experiments.run import prepare
from scope_jax.config import ConfigError
from scope_jax.dialogue.episode import SIM, Episode, Message
from scope_jax.envs import p4g
from scope_jax.training.run_dir import RunDir
from tests.envs.test_p4g import _row, write_info


def test_unreadable_donations_are_left_out_and_counted():
    stats = pytest.importorskip("scipy.stats")
    """Three readable donations and one unreadable: the statistics are those of the three, the unreadable
    share is 1/4 (computed by hand: rate 2/3, mean 0.5, against humans [0, 0, 1, 2])."""
    humans = np.array([0.0, 0.0, 1.0, 2.0])
    persona = lambda donation: p4g.Persona("p", donation, (), ())
    episodes = []
    for donated, human in ((0.0, 0.0), (0.5, 1.0), (1.0, 2.0), (float("nan"), 0.0)):
        e = Episode(persona(human), group=0, messages=[Message(SIM, f"I think {human} then")])
        e.rewards = {"donation": donated}
        episodes.append(e)
    r = job.arm_results(episodes, humans, distinct_n=2)
    assert r["n"] == 3 and r["unreadable"] == 0.25
    assert r["donation_rate"] == pytest.approx(2 / 3) and r["mean_donation"] == pytest.approx(0.5)
    assert r["ks"] == pytest.approx(stats.ks_2samp([0.0, 0.5, 1.0], humans).statistic)
    assert r["persona_corr"] == pytest.approx(1.0)  # the readable three rank as their humans do
    assert sum(r["histogram"]) == pytest.approx(1.0)


def tiny_config(data_dir):
    config = job.default_config()
    config.update(dialogues=4, batch=2)
    config.env.update(data_dir=str(data_dir), max_turns=1)
    config.persuader.update(model="tiny:0", max_new_tokens=4)
    config.simulator.update(model="tiny:1", max_new_tokens=4)
    config.verbalized.max_new_tokens = 8
    return config


def test_config_errors(tmp_path):
    config = tiny_config(tmp_path / "absent")
    with pytest.raises(ConfigError, match=r"^config key 'env.data_dir': P4G data file .*full_info.csv is "
                                          r"missing$"):
        prepare(config)
    config = tiny_config(write_info(tmp_path, [_row(f"u{i}") for i in range(8)]))
    config.arms = ("direct", "guess")
    with pytest.raises(ConfigError, match="'arms'"):
        prepare(config)


@pytest.mark.parametrize("key", ["batch", "dialogues", "distinct_n"])
def test_a_count_of_zero_is_one_line_before_any_work(tmp_path, key):
    config = tiny_config(write_info(tmp_path, [_row(f"u{i}") for i in range(8)]))
    config.update_from_flattened_dict({key: 0})
    with pytest.raises(ConfigError, match=rf"^config key '{key}' is 0; it must be at least 1$"):
        prepare(config)


def test_run_writes_table_figure_and_dialogues(tmp_path):
    data = write_info(tmp_path / "data", [_row(f"u{i}", donation=str(i % 5 * 0.5)) for i in range(12)])
    config = tiny_config(data)
    prepare(config)
    with RunDir.create(tmp_path / "run", config) as run_dir:
        job.run(config, run_dir)
    results = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert results["humans"]["n"] == 12 and results["humans"]["mean_donation"] == pytest.approx(0.875)
    for arm in job.ARMS:
        r = results["arms"][arm]
        # tiny random models never state an amount: every dialogue is asked at the end and stays unreadable,
        # left out of the donation statistics (not read as $0)
        assert r["n"] == 0 and r["unreadable"] == 1.0 and r["asked_closing"] == 1.0
        assert np.isnan(r["donation_rate"]) and np.isnan(r["ks"]) and 0.0 <= r["identical"] <= 1.0
    assert results["arms"]["verbalized"]["vs_fallback_rate"] == 1.0
    assert (tmp_path / "run" / "figures" / "donations.png").stat().st_size > 0
    assert "| direct | 0 |" in (tmp_path / "run" / "summary.md").read_text()
    dialogues = [json.loads(line) for line in (tmp_path / "run" / "dialogues.jsonl").read_text().splitlines()]
    assert len(dialogues) == 8 and {d["arm"] for d in dialogues} == set(job.ARMS)
    # the same personas in both arms
    assert [d["scenario"] for d in dialogues[:4]] == [d["scenario"] for d in dialogues[4:]]
