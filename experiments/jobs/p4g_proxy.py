"""The P4G human proxy: a persuadee fine-tuned on human persuadee turns, and its fidelity on held-out people.

Training is the `sft` job on the persuadee role (`role` = "sim") of the train split's human dialogues.
Then, on `fidelity.dialogues` held-out participants (the environment's "eval" split, a valid donation,
at least `fidelity.max_turns` persuader turns; drawn by the seed), each arm plays one dialogue per
participant at `fidelity.temperature` against that participant's own human persuader, whose turns are
replayed as written (`fidelity.max_turns` of them, then the environment's closing question if no amount
was stated):

  prompted  the model before fine-tuning: today's prompted simulator
  proxy     the fine-tuned model

With `adapter` set to a saved adapter folder (`p4g_proxy.py:committed`: the committed one in
docs/results/p4g_proxy/adapter) there is no training: the proxy is `model` + that adapter. fidelity.json
records the sha256 of the proxy's adapter file, so a table can be traced to the adapter that made it.

Both arms use the same personas, persuader turns and sampling keys. Each arm's readable donations are
compared with those participants' real donations (`p4g_fidelity.arm_results`: donation rate, mean,
histogram L1, KS, unreadable share, Spearman correlation with each participant's own donation). Two
references: the human noise floor (the held-out humans split at random into halves, one half against
the other) and the sampling noise of n humans drawn from them (`p4g_fidelity.noise_floor`).
Outputs: fidelity.json, fidelity.md (the table), figures/donations.png (humans, prompted, proxy),
dialogues.jsonl, and summary.md (the SFT curve and the table).
"""

from __future__ import annotations

import hashlib
import json
import pathlib
from typing import Callable

import jax
import ml_collections
import numpy as np

from experiments.jobs import p4g_fidelity, sft
from scope_jax.config import ConfigError
from scope_jax.dialogue.episode import AGENT, SIM, Episode
from scope_jax.dialogue.rollout import rollout
from scope_jax.dialogue.speakers import ModelSpeaker, Player, ScriptedSpeaker
from scope_jax.dialogue.transcript import transcript
from scope_jax.envs.p4g import P4GEnv
from scope_jax.envs.p4g_human import HumanDialogues
from scope_jax.models import lora
from scope_jax.sampling import SamplingConfig
from scope_jax.training.players import load_model
from scope_jax.training.run_dir import RunDir


def default_config() -> ml_collections.ConfigDict:
    c = sft.default_config()
    c.experiment = "p4g_proxy"
    c.adapter = ""  # a saved adapter folder to evaluate instead of training one
    c.fidelity = ml_collections.ConfigDict({"dialogues": 32, "batch": 32, "max_turns": 4, "temperature": 1.0,
                                            "max_new_tokens": 40, "max_context": 2048, "distinct_n": 2})
    return c


def check(config: ml_collections.ConfigDict) -> None:
    if config.role != SIM:
        raise ConfigError(f"config key 'role' is {config.role!r}; the proxy is the persuadee, 'sim'")
    if config.fidelity.dialogues % config.fidelity.batch:
        raise ConfigError("config key 'fidelity.dialogues' must be a multiple of 'fidelity.batch'")
    if config.adapter:
        try:
            lora.adapter_weights_file(config.adapter)
        except (FileNotFoundError, ValueError) as error:
            raise ConfigError(f"config key 'adapter': {error}") from None
    sft.check(config)


def heldout_cases(config) -> tuple[P4GEnv, list[Episode], np.ndarray]:
    """(the environment of the fidelity dialogues, the chosen held-out human dialogues, the donations of
    every held-out participant with one)."""
    env = P4GEnv(data_dir=config.data.data_dir, max_turns=config.fidelity.max_turns)
    every = HumanDialogues.load(env, "eval", config.fidelity.max_turns).episodes
    long_enough = [e for e in every if e.turns_taken.get(AGENT, 0) == config.fidelity.max_turns]
    if len(long_enough) < config.fidelity.dialogues:
        raise ConfigError(f"config key 'fidelity.dialogues' is {config.fidelity.dialogues}, but only "
                          f"{len(long_enough)} held-out dialogues have {config.fidelity.max_turns} persuader "
                          "turns")
    rng = np.random.default_rng([config.seed, 3])
    chosen = [long_enough[i] for i in rng.choice(len(long_enough), config.fidelity.dialogues, replace=False)]
    return env, chosen, np.array([e.scenario.donation for e in every])


def human_persuader(cases: list[Episode]) -> ScriptedSpeaker:
    """The persuader of each case's persona replays that case's human persuader turns in order."""
    turns = {case.scenario: [m.text for m in case.messages if m.role == AGENT] for case in cases}
    return ScriptedSpeaker(lambda episode: turns[episode.scenario][episode.turns_taken.get(AGENT, 0)])


def play_arm(env: P4GEnv, cases: list[Episode], persuadee: Player, config) -> list[Episode]:
    """One dialogue per case, `fidelity.batch` at a time; chunk c uses the same key in every arm."""
    episodes = [Episode(case.scenario, group=i) for i, case in enumerate(cases)]
    speakers = {AGENT: human_persuader(cases), SIM: ModelSpeaker(persuadee)}
    key = jax.random.key(config.seed)
    for c, start in enumerate(range(0, len(episodes), config.fidelity.batch)):
        rollout(env, episodes[start:start + config.fidelity.batch], speakers, jax.random.fold_in(key, c))
    return episodes


def half_against_half(humans: np.ndarray, seed: int) -> dict[str, float]:
    """The held-out humans split at random into two halves: the statistics of one against the other."""
    order = np.random.default_rng([seed, 4]).permutation(len(humans))
    half = len(humans) // 2
    return p4g_fidelity.donation_stats(humans[order[:half]], humans[order[half:]])


Cell = Callable[[dict], str]
number = lambda key: (lambda row: f"{row[key]:.3f}" if key in row else "")
COLUMNS: tuple[tuple[str, Cell], ...] = (
    ("n", lambda row: str(row["n"])),
    ("donation rate", number("donation_rate")),
    ("mean $", number("mean_donation")),
    ("hist L1", number("hist_l1")),
    ("KS", number("ks")),
    ("unreadable", number("unreadable")),
    ("rank corr. with own human", number("persona_corr")),
    ("asked at end", number("asked_closing")),
    ("distinct-2", number("distinct_2")),
)


def fidelity_table(results: dict) -> str:
    rows = [("humans (these participants)", results["humans"]),
            ("human noise floor (half vs half)", results["human_halves"]),
            *((f"{arm}", stats) for arm, stats in results["arms"].items())]
    lines = ["| | " + " | ".join(name for name, _ in COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    lines += [f"| {label} | " + " | ".join(cell(row) for _, cell in COLUMNS) + " |" for label, row in rows]
    floor = results["sampling_noise"]
    lines += ["", f"Sampling noise at n = {results['humans']['n']}: that many held-out humans drawn at "
              f"random score hist L1 {floor['hist_l1']:.3f} and KS {floor['ks']:.3f} against those humans "
              "on average."]
    return "\n".join(lines)


def adapter_sha256(folder: str | pathlib.Path) -> str:
    return hashlib.sha256(lora.adapter_weights_file(folder).read_bytes()).hexdigest()


def evaluate(config, tokenizer, arms: dict[str, tuple], run_dir: RunDir, adapter: pathlib.Path) -> dict:
    """The fidelity results of `arms` ({name: (graphdef, params)}) on the held-out participants; `adapter`:
    the proxy's adapter folder."""
    env, cases, heldout = heldout_cases(config)
    humans = np.array([case.scenario.donation for case in cases])
    fid = config.fidelity
    sampling = SamplingConfig(temperature=fid.temperature, max_new_tokens=fid.max_new_tokens,
                              stop_token_ids=(tokenizer.eos_token_id,),
                              pad_token_id=tokenizer.pad_token_id or 0)
    results = {"humans": {**p4g_fidelity.donation_stats(humans, humans),
                          "histogram": p4g_fidelity.histogram(humans).tolist()},
               "human_halves": half_against_half(heldout, config.seed),
               "sampling_noise": p4g_fidelity.noise_floor(humans, len(humans),
                                                          np.random.default_rng([config.seed, 2])),
               "arms": {}, "adapter_sha256": adapter_sha256(adapter)}
    transcripts = []
    for arm, (graphdef, params) in arms.items():
        print(f"fidelity: {arm}", flush=True)
        player = Player(graphdef, params, tokenizer, sampling, fid.max_context)
        episodes = play_arm(env, cases, player, config)
        results["arms"][arm] = p4g_fidelity.arm_results(episodes, humans, fid.distinct_n)
        transcripts += [dict(transcript(env, e), arm=arm, human_donation=e.scenario.donation)
                        for e in episodes]
    run_dir.write_text("dialogues.jsonl", "".join(json.dumps(t) + "\n" for t in transcripts))
    run_dir.write_json("fidelity.json", results)
    run_dir.write_text("fidelity.md", fidelity_table(results) + "\n")
    series = [(f"humans (n={results['humans']['n']})", results["humans"]["histogram"])]
    series += [(f"{arm} (n={stats['n']})", stats["histogram"]) for arm, stats in results["arms"].items()]
    p4g_fidelity.plot(run_dir, series, f"P4G held-out donations: humans, prompted and proxy ({config.model})")
    return results


def run(config, run_dir: RunDir) -> None:
    base_graphdef, base_params, tokenizer = load_model(config.model, dtype=config.dtype)
    if config.adapter:
        adapter = pathlib.Path(config.adapter)
        proxy = lora.load(adapter, base_graphdef, base_params)
        lines = [f"# The P4G human proxy `{config.model}` + `{adapter}` (no training)"]
    else:
        trained = sft.train_sft(config, run_dir)
        adapter, proxy = run_dir.path / sft.ADAPTER, (trained.graphdef, trained.params)
        lines = sft.summary_lines(config, trained, run_dir)
    results = evaluate(config, tokenizer, {"prompted": (base_graphdef, base_params), "proxy": proxy}, run_dir,
                       adapter)
    lines += ["", "## Fidelity on held-out participants", "",
              f"{config.fidelity.dialogues} held-out participants, one dialogue each at temperature "
              f"{config.fidelity.temperature} against their own human persuader's first "
              f"{config.fidelity.max_turns} turns, replies of at most {config.fidelity.max_new_tokens} "
              "tokens.", "",
              fidelity_table(results), "", "![donations](figures/donations.png)"]
    run_dir.write_summary("\n".join(lines))
