"""The SFT job end to end with a tiny model on a few P4G human dialogues: it lowers the held-out NLL, a run
stopped after a checkpoint resumes to the same metrics, bad data settings stop it in one line, and the
last-reply weight lands on the closing answer of the train views only."""

import json
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest

from experiments.jobs import sft
from experiments.run import prepare
from scope_jax.config import ConfigError
from scope_jax.dialogue.episode import SIM
from scope_jax.models import lora
from scope_jax.training import sft as train_sft
from scope_jax.training.checkpoint import Checkpointer
from scope_jax.training.loss import aggregation_weights
from scope_jax.training.players import load_model
from scope_jax.training.run_dir import RunDir

DATA = pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "data" / "p4g"
DETERMINISTIC = ("loss", "grad_norm", "tokens", "padded_tokens", "heldout_nll")


@pytest.fixture(scope="module", autouse=True)
def data_folder():
    if not (DATA / "FullData" / "full_dialog.csv").exists():
        pytest.skip(f"P4G data folder absent ({DATA})")


def tiny_config(**train):
    config = sft.default_config()
    config.model = "tiny:0"
    config.data.update(data_dir=str(DATA), max_turns=2, train_dialogues=8, eval_dialogues=4)
    config.train.update(steps=6, batch_size=2, eval_every=3, checkpoint_every=2, **train)
    config.optimizer.learning_rate = 3e-3
    return config


def records(path: pathlib.Path) -> list[dict]:
    lines = (path / "metrics.jsonl").read_text().splitlines()
    return [{k: r[k] for k in ("step", *DETERMINISTIC) if k in r} for r in map(json.loads, lines)]


class Stop(Exception):
    pass


@pytest.mark.parametrize("rank", [0, 2])  # the whole model, a LoRA adapter
def test_a_stopped_run_resumes_to_the_same_metrics(tmp_path, monkeypatch, rank):
    config = tiny_config()
    config.lora.update(rank=rank, format="peft", base_model="org/base")
    prepare(config)
    with RunDir.create(tmp_path / "reference", config) as run_dir:
        sft.run(config, run_dir)
    reference = records(tmp_path / "reference")
    nll = [r["heldout_nll"] for r in reference if "heldout_nll" in r]
    assert [r["step"] for r in reference if "heldout_nll" in r] == [0, 3, 6] and nll[-1] < nll[0]

    save = Checkpointer.save

    def save_then_stop(self, step, state, host):
        save(self, step, state, host)
        if step == 4:
            raise Stop  # killed right after the checkpoint of step 4; steps 4.. are redone on resume

    monkeypatch.setattr(Checkpointer, "save", save_then_stop)
    with pytest.raises(Stop), RunDir.create(tmp_path / "stopped", config) as run_dir:
        sft.run(config, run_dir)
    monkeypatch.undo()
    with RunDir.create(tmp_path / "stopped", config) as run_dir:
        sft.run(config, run_dir)
    assert records(tmp_path / "stopped") == reference
    adapter = tmp_path / "stopped" / sft.ADAPTER
    assert (adapter / lora.PEFT_ADAPTER_FILE).exists() == bool(rank)
    if rank:  # peft's layout, naming the base it was given
        assert json.loads((adapter / lora.CONFIG_FILE).read_text())["base_model_name_or_path"] == "org/base"


def test_missing_data_file_and_bad_split_are_one_line_config_errors(tmp_path):
    config = tiny_config()
    config.data.data_dir = str(tmp_path)
    with pytest.raises(ConfigError, match=r"^config key 'data.data_dir': P4G data file .*full_info.csv is "
                                          r"missing$"):
        prepare(config)
    config = tiny_config()
    config.data.eval_split = "test"
    splits = "train, judge, simulator, eval, all"
    with pytest.raises(ConfigError, match=rf"data.eval_split is 'test'; one of {splits}$"):
        prepare(config)


@pytest.mark.parametrize("key, value, message", [
    ("optimizer.name", "adam", r"^config key 'optimizer.name' is 'adam'; it must be one of 'adamw', 'sgd'$"),
    ("dtype", "float99", r"^config key 'dtype' is 'float99'; it must be one of 'float32', 'bfloat16'$"),
    ("model", "nosuch", r"^config key 'model' is 'nosuch'; 'nosuch' is neither an HF folder, a .gguf file "),
    ("model", "tiny:x", r"^config key 'model' is 'tiny:x'; a tiny model is tiny:SEED, SEED a whole number$"),
    ("model", "tiny:0+nowhere", r"^config key 'model' is 'tiny:0\+nowhere'; its adapter folder 'nowhere' "),
    ("data.max_length", 0, r"^config key 'data.max_length' is 0; it must be at least 1$"),
    ("optimizer.learning_rate", float("nan"), r"^config key 'optimizer.learning_rate' is nan; it must be "
                                              r"finite and at least 0$"),
    ("data.train_dialogues", -1, r"^config key 'data.train_dialogues' is -1; it must be at least 0$"),
    ("data.train_dialogues", 1, r"^config key 'data.train_dialogues' gives 1 train dialogues, fewer than one "
                                r"batch \(train.batch_size = 2\)$"),
    ("train.eval_every", 0, r"^config key 'train.eval_every' is 0; it must be at least 1$"),
])
def test_a_bad_setting_is_one_line_before_any_work(key, value, message):
    config = tiny_config()
    config.update_from_flattened_dict({key: value})
    with pytest.raises(ConfigError, match=message):
        prepare(config)


def test_the_last_reply_weight_lands_on_the_closing_answer_of_the_train_views_only():
    config = tiny_config(last_reply_weight=5.0)
    tokenizer = load_model(config.model)[2]
    data = train_sft.prepare_data(config, tokenizer)
    episodes = train_sft.dialogues(config)[1]
    assert data.dropped_too_long == {"train": 0, "eval": 0}
    for view, episode in zip(data.train, episodes["train"]):
        mask = np.asarray(view.loss_mask)
        weighted = [i for i, m in zip(view.ids, mask) if m == 5.0]
        closing = episode.messages[-1]
        assert closing.role == SIM and "$" in closing.text  # p4g_human's closing answer
        closing_ids = tokenizer(closing.text, add_special_tokens=False).input_ids
        assert weighted == [*closing_ids, tokenizer.eos_token_id]
        assert set(np.unique(mask)) == {0.0, 1.0, 5.0}
        weights = np.asarray(aggregation_weights(jnp.asarray(mask[None]), "token_mean"))[0]
        np.testing.assert_allclose(weights, mask / mask.sum(), rtol=1e-6)  # a weighted token mean
    assert all(set(v.loss_mask) == {0.0, 1.0} for v in data.eval)
    config.train.last_reply_weight = 0.0
    with pytest.raises(ConfigError, match=r"^config key 'train.last_reply_weight' is 0.0; it must be "
                                          r"positive$"):
        prepare(config)
