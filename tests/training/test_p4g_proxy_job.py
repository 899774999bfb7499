"""The P4G proxy job end to end with a tiny model (slow): SFT on the judge split, then both arms against the
replayed human persuaders of the same held-out participants, several dialogues each, and the fidelity table,
figure and dialogues written; the saved adapter alone reproduces the table. The committed tables are
their records', and the committed references (human floors, traits-only ceiling) are what the data gives
now. Fitting the judge on simulator data is refused in one line."""

import json
import pathlib

import numpy as np
import pytest

from experiments.jobs import p4g_proxy
from experiments.run import prepare
from scope_jax.config import ConfigError
from scope_jax.envs.p4g import CLOSING_QUESTION
from scope_jax.envs.p4g_human import load_turns
from scope_jax.envs.user_dialogues import FIT_FILE
from scope_jax.models import lora
from scope_jax.training.run_dir import RunDir

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data" / "p4g"
COMMITTED = ROOT / "docs" / "results" / "p4g_proxy"


def fitted_on(folder: pathlib.Path) -> dict:
    return json.loads((folder / FIT_FILE).read_text())


@pytest.mark.slow
def test_proxy_job_replays_the_human_persuaders_and_writes_the_fidelity_table(tmp_path):
    if not (DATA / "FullData" / "full_dialog.csv").exists():
        pytest.skip(f"P4G data folder absent ({DATA})")
    from experiments.configs.p4g_proxy import get_config

    config = get_config("quick")
    config.model = "tiny:0"
    config.data.data_dir = str(DATA)
    config.fidelity.update(max_turns=2, dialogues=2)  # 2 people x 2 dialogues: as many as 4 x 1 before
    config.optimizer.update(learning_rate=0.05, warmup_steps=0)  # two steps that change what the proxy says
    prepare(config)
    with RunDir.create(tmp_path / "run", config) as run_dir:
        p4g_proxy.run(config, run_dir)
    results = json.loads((tmp_path / "run" / "fidelity.json").read_text())
    assert set(results["arms"]) == {"prompted", "proxy"}
    assert fitted_on(tmp_path / "run" / "adapter") == {"data": "p4g_human:judge", "purpose": "judge"}
    assert (tmp_path / "run" / "figures" / "donations.png").exists()
    assert "| proxy (2 dialogues each) |" in (tmp_path / "run" / "fidelity.md").read_text()
    dialogues = [json.loads(line) for line in (tmp_path / "run" / "dialogues.jsonl").read_text().splitlines()]
    people, samples = config.fidelity.dialogues, config.fidelity.samples
    assert len(dialogues) == 2 * people * samples and results["humans"]["n"] == people
    arms = [dialogues[:people * samples], dialogues[people * samples:]]
    assert [d["scenario"] for d in arms[0]] == [d["scenario"] for d in arms[1]]  # same people
    assert [d["scenario"] for d in arms[0][:people]] * samples == [d["scenario"] for d in arms[0]]
    assert len({d["scenario"] for d in arms[0]}) == people  # a participant counts once
    assert [d["messages"] for d in arms[0]] != [d["messages"] for d in arms[1]]  # trained
    human = load_turns(DATA)
    env, cases, _ = p4g_proxy.heldout_cases(config)
    personas = {str(c.scenario): c.scenario for c in cases}
    assert all(c.scenario.participant not in {p.participant for p in env.splits["train"]} for c in cases)
    for d in dialogues:
        said = [m["text"] for m in d["messages"] if m["role"] == "agent"]
        written = [text for role, text in human[personas[d["scenario"]].dialogue] if role == "agent"]
        assert said == written[:config.fidelity.max_turns]
        assert d["messages"][-2]["text"] == CLOSING_QUESTION or d["rewards"]["unreadable"] == 0.0

    # the saved adapter, evaluated on its own (no training), gives the same table
    config.adapter = str(tmp_path / "run" / "adapter")
    with RunDir.create(tmp_path / "again", config) as run_dir:
        p4g_proxy.run(config, run_dir)
    assert results["adapter_sha256"] == lora.adapter_sha256(config.adapter)
    assert json.loads((tmp_path / "again" / "fidelity.json").read_text()) == results
    said = lambda run: (tmp_path / run / "dialogues.jsonl").read_text()
    assert said("again") == said("run")
    assert not (tmp_path / "again" / "checkpoints").exists()  # nothing trained


def test_fitting_the_judge_on_simulator_or_held_out_people_is_refused_in_one_line():
    from experiments.configs.p4g_proxy import get_config

    for split in ("simulator", "train", "eval"):
        config = get_config("quick")
        config.data.train_split = split
        with pytest.raises(ConfigError, match="never share a person") as error:
            prepare(config)
        assert "'data.train_split'" in str(error.value) and "\n" not in str(error.value)


def test_the_committed_table_is_its_records_and_names_the_committed_adapter():
    if not (COMMITTED / "fidelity.json").exists():
        pytest.skip("the P4G proxy's fidelity table is not committed yet")
    results = json.loads((COMMITTED / "fidelity.json").read_text())
    assert (COMMITTED / "fidelity.md").read_text() == p4g_proxy.fidelity_table(results) + "\n"
    assert lora.adapter_sha256(COMMITTED / "adapter") == results["adapter_sha256"]


def test_the_committed_dialogues_rescored_give_the_committed_table(tmp_path):
    """p4g_proxy.py:rescore: the committed table is a function of the committed dialogues (every dialogue of
    each participant), with no model. The judge's table was written by this rescore (docs/sft.md: adopting
    a run), so even the sentence on where the cases came from is equal."""
    if not (DATA / "FullData" / "full_dialog.csv").exists():
        pytest.skip(f"P4G data folder absent ({DATA})")
    from experiments.configs.p4g_proxy import get_config

    config = get_config("rescore")
    config.data.data_dir = str(DATA)
    with RunDir.create(tmp_path / "rescored", config) as run_dir:
        p4g_proxy.run(config, run_dir)
    committed = json.loads((COMMITTED / "fidelity.json").read_text())
    rescored = json.loads((tmp_path / "rescored" / "fidelity.json").read_text())
    assert rescored == committed
    assert rescored["arms"]["proxy"]["samples"] == 4


def test_transcripts_with_uneven_dialogues_are_refused_in_one_line(tmp_path):
    def record(arm: str, person: str) -> str:
        return json.dumps({"arm": arm, "scenario": person, "group": 0, "human_donation": 0.5,
                           "messages": [{"role": "sim", "text": "I'll donate $1."}]})

    path = tmp_path / "dialogues.jsonl"
    refused = r"^dialogues.jsonl: arm 'proxy' does not hold the same number of dialogues of the same 2 " \
              r"participants as the first arm$"
    prompted = [record("prompted", "a"), record("prompted", "b")]
    for proxy in ([record("proxy", "a")] * 2,  # other people
                  [record("proxy", "a"), record("proxy", "a"), record("proxy", "b")]):  # uneven counts
        path.write_text("\n".join(prompted + proxy) + "\n")
        with pytest.raises(ValueError, match=refused):
            p4g_proxy.scored_transcripts(path)
    path.write_text("\n".join(prompted + [record("proxy", "a"), record("proxy", "b")]) + "\n")
    arms, own, count = p4g_proxy.scored_transcripts(path)
    assert arms["proxy"].tolist() == [[1.0], [1.0]] and own.tolist() == [0.5, 0.5] and count == 4
    path.write_text(json.dumps({"arm": "prompted", "scenario": "a", "human_donation": 0.5}) + "\n")
    with pytest.raises(ValueError, match=r"^dialogues.jsonl: line 1 has no 'messages': not a dialogue"):
        p4g_proxy.scored_transcripts(path)


def test_the_committed_references_are_their_records_and_what_the_data_gives():
    """The human floors and the traits-only ceiling need no model: recomputed from the data, they equal the
    committed ones (p4g_proxy.py:references)."""
    results = json.loads((COMMITTED / "references" / "fidelity.json").read_text())
    assert (COMMITTED / "references" / "fidelity.md").read_text() == p4g_proxy.fidelity_table(results) + "\n"
    if not (DATA / "FullData" / "full_dialog.csv").exists():
        pytest.skip(f"P4G data folder absent ({DATA})")
    from experiments.configs.p4g_proxy import get_config

    config = get_config("references")
    config.data.data_dir = str(DATA)
    env, cases, _ = p4g_proxy.heldout_cases(config)
    others, ceiling = p4g_proxy.references(config, env)
    own = np.array([case.scenario.donation for case in cases])
    again = json.loads(json.dumps(p4g_proxy.fidelity_results({}, own, others, ceiling, config.seed)))
    assert again == {k: v for k, v in results.items() if k != "cases"}


def test_the_goals_table_says_which_goal_is_met():
    proxy = {"ks": {"value": 0.10}, "hist_l1": {"value": 0.20}, "floor": {"hist_l1": {"mean": 0.25}},
             "unreadable": {"value": 0.06}, "rank_corr": {"low": 0.01}}
    met = lambda table: [line.rsplit("|", 2)[1].strip() for line in table.splitlines()[2:]]  # noqa: E731
    assert met(p4g_proxy.goals_table({"arms": {"proxy": proxy}})) == ["yes", "yes", "no", "yes"]
    proxy.update(ks={"value": 0.13}, floor={"hist_l1": {"mean": 0.19}}, unreadable={"value": 0.05},
                 rank_corr={"low": 0.0})
    assert met(p4g_proxy.goals_table({"arms": {"proxy": proxy}})) == ["no", "no", "yes", "no"]
