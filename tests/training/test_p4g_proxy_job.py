"""The P4G proxy job end to end with a tiny model (slow): SFT, then both arms against the replayed human
persuaders of the same held-out participants, and the fidelity table, figure and dialogues written; the
saved adapter alone reproduces the table. And the committed proxy's table is its records'."""

import json
import pathlib

import pytest

from experiments.jobs import p4g_proxy
from experiments.run import prepare
from scope_jax.envs.p4g import CLOSING_QUESTION
from scope_jax.envs.p4g_human import load_turns
from scope_jax.training.run_dir import RunDir

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data" / "p4g"
COMMITTED = ROOT / "docs" / "results" / "p4g_proxy"


@pytest.mark.slow
def test_proxy_job_replays_the_human_persuaders_and_writes_the_fidelity_table(tmp_path):
    if not (DATA / "FullData" / "full_dialog.csv").exists():
        pytest.skip(f"P4G data folder absent ({DATA})")
    from experiments.configs.p4g_proxy import get_config

    config = get_config("quick")
    config.model = "tiny:0"
    config.data.data_dir = str(DATA)
    config.fidelity.max_turns = 2
    config.optimizer.update(learning_rate=0.05, warmup_steps=0)  # two steps that change what the proxy says
    prepare(config)
    with RunDir.create(tmp_path / "run", config) as run_dir:
        p4g_proxy.run(config, run_dir)
    results = json.loads((tmp_path / "run" / "fidelity.json").read_text())
    assert set(results["arms"]) == {"prompted", "proxy"}
    assert (tmp_path / "run" / "figures" / "donations.png").exists()
    assert "| proxy |" in (tmp_path / "run" / "fidelity.md").read_text()
    dialogues = [json.loads(line) for line in (tmp_path / "run" / "dialogues.jsonl").read_text().splitlines()]
    assert len(dialogues) == 2 * config.fidelity.dialogues
    assert [d["scenario"] for d in dialogues[:4]] == [d["scenario"] for d in dialogues[4:]]  # same people
    assert [d["messages"] for d in dialogues[:4]] != [d["messages"] for d in dialogues[4:]]  # trained
    human = load_turns(DATA)
    personas = {str(c.scenario): c.scenario for c in p4g_proxy.heldout_cases(config)[1]}
    for d in dialogues:
        said = [m["text"] for m in d["messages"] if m["role"] == "agent"]
        written = [text for role, text in human[personas[d["scenario"]].dialogue] if role == "agent"]
        assert said == written[:config.fidelity.max_turns]
        assert d["messages"][-2]["text"] == CLOSING_QUESTION or d["rewards"]["unreadable"] == 0.0

    # the saved adapter, evaluated on its own (no training), gives the same table
    config.adapter = str(tmp_path / "run" / "adapter")
    with RunDir.create(tmp_path / "again", config) as run_dir:
        p4g_proxy.run(config, run_dir)
    assert results["adapter_sha256"] == p4g_proxy.adapter_sha256(config.adapter)
    assert json.loads((tmp_path / "again" / "fidelity.json").read_text()) == results
    said = lambda run: (tmp_path / run / "dialogues.jsonl").read_text()
    assert said("again") == said("run")
    assert not (tmp_path / "again" / "checkpoints").exists()  # nothing trained


def test_the_committed_table_is_its_records_and_names_the_committed_adapter():
    if not (COMMITTED / "fidelity.json").exists():
        pytest.skip("the P4G proxy's fidelity table is not committed yet")
    results = json.loads((COMMITTED / "fidelity.json").read_text())
    assert (COMMITTED / "fidelity.md").read_text() == p4g_proxy.fidelity_table(results) + "\n"
    assert p4g_proxy.adapter_sha256(COMMITTED / "adapter") == results["adapter_sha256"]
