"""experiments/p4g_proxy_levers.py: a lever's changed settings are read from the configs, its change from
the recipe is paired by participant (a lever that plays what the recipe played changes nothing; one whose
persuadee never states a readable amount changes the unreadable share by exactly what the recipe had
left), and the committed table is its records' and its dialogues' as today's reader reads them."""

import gzip
import json
import pathlib

import pytest

from experiments import p4g_proxy_levers as levers
from experiments.configs.p4g_proxy import COMMITTED, get_config

DATA = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data" / "p4g"


def write_run(folder: pathlib.Path, config, dialogues: list[dict]) -> pathlib.Path:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config.to_dict()))
    (folder / "metrics.jsonl").write_text(json.dumps({"step": 100, "heldout_nll": 2.5}) + "\n")
    (folder / "dialogues.jsonl").write_text("".join(json.dumps(d) + "\n" for d in dialogues))
    return folder


def test_a_lever_is_compared_with_the_recipe_participant_by_participant(tmp_path):
    if not (DATA / "FullData" / "full_dialog.csv").exists():
        pytest.skip(f"P4G data folder absent ({DATA})")
    with gzip.open(COMMITTED / "dialogues.jsonl.gz", "rt") as f:
        played = [json.loads(line) for line in f]
    config = get_config("recipe")
    config.data.data_dir = str(DATA)
    recipe = write_run(tmp_path / "recipe", config, played)
    saved = json.loads((recipe / "config.json").read_text())
    del saved["train"]["last_reply_weight"]  # a run from before the key: it had the recipe's value, 1
    (recipe / "config.json").write_text(json.dumps(saved))
    config.train.last_reply_weight = 7.0
    config.fidelity.arms = ("proxy",)
    proxy = [d for d in played if d["arm"] == "proxy"]
    same = write_run(tmp_path / "same", config, proxy)
    mute = write_run(tmp_path / "mute", config, [
        {**d, "messages": [{**m, "text": "..."} if m["role"] == "sim" else m for m in d["messages"]]}
        for d in proxy])
    results = levers.gather(recipe, {"same": same, "mute": mute})
    assert results["recipe"]["changed"] == {}
    assert results["same"]["changed"] == {"train.last_reply_weight": [1.0, 7.0]}
    unchanged = {k: {"value": 0.0, "low": 0.0, "high": 0.0} for k in levers.CHANGES}
    assert results["same"]["vs_recipe"] == unchanged
    committed = json.loads((COMMITTED / "fidelity.json").read_text())["arms"]["proxy"]
    assert results["recipe"]["proxy"]["unreadable"] == committed["unreadable"]
    assert results["mute"]["vs_recipe"]["unreadable"]["value"] == pytest.approx(
        1 - committed["unreadable"]["value"])
    assert results["mute"]["proxy"]["unreadable"]["value"] == 1.0
    assert "| same | `train.last_reply_weight` 1.0 -> 7.0 | 2.5000 |" in levers.table(results)


def test_the_committed_dialogues_rescored_give_the_committed_lever_table():
    """`--rescore`: the committed table is a function of the committed runs' dialogues, as today's donation
    reader reads them, and of their recorded settings and held-out NLLs."""
    if not (DATA / "FullData" / "full_dialog.csv").exists():
        pytest.skip(f"P4G data folder absent ({DATA})")
    committed = json.loads((levers.RESULTS / "levers.json").read_text())
    assert json.loads(json.dumps(levers.rescored(str(DATA)))) == committed


def test_the_committed_lever_table_is_its_records():
    results = json.loads((levers.RESULTS / "levers.json").read_text())
    assert (levers.RESULTS / "levers.md").read_text() == levers.table(results) + "\n"
