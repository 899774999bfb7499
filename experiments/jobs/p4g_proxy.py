"""The P4G human proxy, the held-out judge: a persuadee fine-tuned on the judge split's human persuadee
turns, and its fidelity on every held-out participant, with intervals.

Training is the SFT loop (`scope_jax.training.sft`) on the persuadee role of the judge split's human
dialogues; fitting the judge on any other split is refused (`envs.user_dialogues.check_fit`), and the
saved adapter records its data. With `adapter` set to a saved adapter folder (`p4g_proxy.py:committed`)
there is no training: the proxy is `model` + that adapter; fidelity.json records the sha256 of its file.

Fidelity cases: every held-out participant (the environment's "eval" split) with a valid donation, once,
in the human dialogue of their first row with one (file order), if it has at least `fidelity.max_turns`
persuader turns (the others are counted as left out); `fidelity.dialogues` = D > 0 takes the first D of
them (with one sample and D = `fidelity.batch`, exactly the first batch a full run plays: `:replay`). Each
arm plays every case `fidelity.samples` times at `fidelity.temperature` against the participant's own
human persuader, whose turns are replayed as written (`fidelity.max_turns`, then the environment's
closing question if no amount was stated):

  prompted  the model before fine-tuning: today's prompted simulator
  proxy     the fine-tuned model

Both arms use the same cases, persuader turns and sampling keys. With `transcripts` set to a
dialogues.jsonl of this job, nothing is played: its arms are scored (all of a participant's dialogues,
each read from its text by today's donation reader); with `fidelity.arms` empty, only the references are
written.
The statistics, their bootstrap intervals over participants, the human floors and the traits-only ceiling
(a ridge regression fitted on the judge split's people) are `envs.p4g_fidelity_stats`'. Outputs:
fidelity.json, fidelity.md (the table), figures/donations.png, dialogues.jsonl, and summary.md.
"""

from __future__ import annotations

import gzip
import json
import math
import operator
import pathlib
from typing import Callable

import jax
import ml_collections
import numpy as np

from experiments.jobs import p4g_fidelity, sft as sft_job
from scope_jax.config import ConfigError
from scope_jax.dialogue.episode import AGENT, SIM, Episode, Message
from scope_jax.dialogue.rollout import rollout
from scope_jax.dialogue.speakers import ModelSpeaker, Player, ScriptedSpeaker
from scope_jax.dialogue.transcript import transcript
from scope_jax.envs import p4g_fidelity_stats as fs
from scope_jax.envs.p4g import CLOSING_QUESTION, P4GEnv, stated_donation
from scope_jax.envs.p4g_donations import readable
from scope_jax.envs.p4g_human import HumanDialogues
from scope_jax.models import lora
from scope_jax.sampling import SamplingConfig
from scope_jax.training import sft
from scope_jax.training.players import load_model
from scope_jax.training.run_dir import RunDir

ARMS = ("prompted", "proxy")
PURPOSE = "judge"


def default_config() -> ml_collections.ConfigDict:
    c = sft.default_config()
    c.experiment = "p4g_proxy"
    c.data.train_split = "judge"
    c.adapter = ""  # a saved adapter folder to evaluate instead of training one
    c.transcripts = ""  # a dialogues.jsonl (or .jsonl.gz) of this job to score instead of playing
    c.fidelity = ml_collections.ConfigDict({
        "arms": ARMS, "dialogues": 0, "samples": 4, "batch": 32, "max_turns": 4, "temperature": 1.0,
        "max_new_tokens": 40, "max_context": 2048, "distinct_n": 2})
    return c


def check(config: ml_collections.ConfigDict) -> None:
    if config.role != SIM:
        raise ConfigError(f"config key 'role' is {config.role!r}; the proxy is the persuadee, 'sim'")
    if set(config.fidelity.arms) - set(ARMS):
        raise ConfigError(f"config key 'fidelity.arms' is {config.fidelity.arms}; a subset of "
                          f"{', '.join(ARMS)}")
    if config.fidelity.samples < 1:
        raise ConfigError(f"config key 'fidelity.samples' is {config.fidelity.samples}; it must be at "
                          "least 1")
    if config.adapter:
        try:
            lora.adapter_weights_file(config.adapter)
        except (FileNotFoundError, ValueError) as error:
            raise ConfigError(f"config key 'adapter': {error}") from None
    if config.transcripts and not pathlib.Path(config.transcripts).is_file():
        raise ConfigError(f"config key 'transcripts' is {config.transcripts!r}, which is not a file")
    sft.check(config, PURPOSE)


def heldout_cases(config) -> tuple[P4GEnv, list[Episode], dict[str, int]]:
    """(the environment of the fidelity dialogues, one human dialogue per held-out participant with a
    valid donation, how many such participants were left out and why)."""
    env = P4GEnv(data_dir=config.data.data_dir, max_turns=config.fidelity.max_turns)
    dialogues = {e.scenario: e for e in HumanDialogues.load(env, "eval", config.fidelity.max_turns).episodes}
    people = fs.first_per_participant(env.splits["eval"])
    left_out = {"no_dialogue": sum(p not in dialogues for p in people),
                "too_few_persuader_turns": sum(p in dialogues and dialogues[p].turns_taken.get(AGENT, 0)
                                               < config.fidelity.max_turns for p in people)}
    cases = [dialogues[p] for p in people
             if p in dialogues and dialogues[p].turns_taken.get(AGENT, 0) == config.fidelity.max_turns]
    if len(cases) < config.fidelity.dialogues:
        raise ConfigError(f"config key 'fidelity.dialogues' is {config.fidelity.dialogues}, but only "
                          f"{len(cases)} held-out participants have a dialogue of "
                          f"{config.fidelity.max_turns} persuader turns")
    return env, cases[:config.fidelity.dialogues or None], left_out


def human_persuader(cases: list[Episode]) -> ScriptedSpeaker:
    """The persuader of each case's persona replays that case's human persuader turns in order."""
    turns = {case.scenario: [m.text for m in case.messages if m.role == AGENT] for case in cases}
    return ScriptedSpeaker(lambda episode: turns[episode.scenario][episode.turns_taken.get(AGENT, 0)])


def play_arm(env: P4GEnv, cases: list[Episode], persuadee: Player, config, arm: str) -> list[Episode]:
    """`fidelity.samples` dialogues per case (sample-major), `fidelity.batch` at a time; chunk c uses the same
    key in every arm, so the first D cases at one sample (`fidelity.dialogues` = D = `fidelity.batch`)
    replay the first chunk of a run on all of them."""
    episodes = [Episode(case.scenario, group=i) for _ in range(config.fidelity.samples)
                for i, case in enumerate(cases)]
    speakers = {AGENT: human_persuader(cases), SIM: ModelSpeaker(persuadee)}
    key = jax.random.key(config.seed)
    starts = range(0, len(episodes), config.fidelity.batch)
    for c, start in RunDir.progress(enumerate(starts), desc=f"fidelity {arm}", total=len(starts)):
        rollout(env, episodes[start:start + config.fidelity.batch], speakers, jax.random.fold_in(key, c))
    return episodes


def fidelity_results(arms: dict[str, np.ndarray], own: np.ndarray, others: np.ndarray, ceiling: dict,
                     seed: int) -> dict:
    """The statistics of each arm's donations [n, k] against the participants' own [n] with bootstrap
    intervals, the humans' own, and the references: the human floors (fresh people, `others`, at each arm's
    readable sizes; halves of the n humans) and the traits-only `ceiling`."""
    indices = fs.resamples(len(own), np.random.default_rng([seed, 5]))
    humans = lambda o: {"donation_rate": float(np.mean(o > 0)), "mean_donation": float(np.mean(o))}
    results = {"humans": {"n": len(own), "histogram": fs.histogram(own).tolist(),
                          **fs.bootstrap(humans, indices, own)},
               "arms": {}, "ceiling": ceiling}
    full = fs.human_floors(own, others, [len(own)], np.random.default_rng([seed, 6]))
    results["floors"] = {"halves": full["halves"], "fresh_all_read": full["fresh"]}
    for arm, donations in arms.items():
        sizes = [int(s) for s in np.sum(~np.isnan(donations), axis=0)]
        readable = [column[~np.isnan(column)] for column in donations.T]
        results["arms"][arm] = {
            "n": len(own), "samples": donations.shape[1], "readable": sizes,
            "histogram": np.mean([fs.histogram(r) for r in readable], axis=0).tolist(),
            "floor": fs.human_floors(own, others, [max(s, 1) for s in sizes],
                                     np.random.default_rng([seed, 7]))["fresh"],
            **fs.bootstrap(fs.arm_statistics, indices, donations, own)}
    return results


Cell = Callable[[dict], str]


def ranged_cell(key: str) -> Cell:
    """The cell of `row[key]`: its value (or mean) [low, high]; empty when absent or NaN."""
    def cell(row: dict) -> str:
        if key not in row:
            return ""
        value = row[key]
        middle = value.get("value", value.get("mean"))
        if middle is None or np.isnan(middle):
            return ""
        return f"{middle:.3f} [{value['low']:.3f}, {value['high']:.3f}]"
    return cell


COLUMNS: tuple[tuple[str, Cell], ...] = (
    ("people", lambda row: str(row.get("n", ""))),
    ("donation rate", ranged_cell("donation_rate")),
    ("mean $", ranged_cell("mean_donation")),
    ("hist L1", ranged_cell("hist_l1")),
    ("KS", ranged_cell("ks")),
    ("unreadable", ranged_cell("unreadable")),
    ("rank corr. with own donation", ranged_cell("rank_corr")),
)


def table_rows(results: dict) -> list[tuple[str, dict]]:
    """(label, row) of the table: the humans, the references, each arm and the human floor at its sizes."""
    floors, ceiling = results["floors"], results["ceiling"]
    rows = [("humans (these participants)", results["humans"]),
            (f"human floor: half vs half ({floors['halves']['sizes'][0]} people each)", floors["halves"]),
            (f"human floor: {floors['fresh_all_read']['sizes'][0]} other people", floors["fresh_all_read"]),
            (f"traits-only ridge (fitted on {ceiling['fitted']} judge-split people)",
             {"n": ceiling["scored"], "rank_corr": ceiling["rank_corr"]})]
    for arm, row in results["arms"].items():
        each = f"{row['samples']} dialogue{'s' if row['samples'] > 1 else ''} each"
        rows += [(f"{arm} ({each})", row),
                 (f"human floor: other people, as many as {arm} read", row["floor"])]
    return rows


def fidelity_table(results: dict) -> str:
    lines = ["| | " + " | ".join(name for name, _ in COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    lines += [f"| {label} | " + " | ".join(cell(row) for _, cell in COLUMNS) + " |"
              for label, row in table_rows(results)]
    lines += ["", "Value [95% interval]: arms, humans and the ridge, a bootstrap over participants (the "
              "percentile interval of a distance leans high, so a value may sit below it); floors, the mean "
              f"[2.5th, 97.5th percentile] of {fs.DRAWS} random draws. {results['cases']}"]
    return "\n".join(lines)


# Issue 32's goals for the judge, read from the proxy arm of a fidelity result: (goal, the proxy's value,
# the target, whether the value meets it).
Goal = tuple[str, Callable[[dict], float], Callable[[dict], float], Callable[[float, float], bool]]
GOALS: tuple[Goal, ...] = (
    ("KS at most 0.12", lambda p: p["ks"]["value"], lambda p: 0.12, operator.le),
    ("hist L1 at most the human floor at the proxy's sizes", lambda p: p["hist_l1"]["value"],
     lambda p: p["floor"]["hist_l1"]["mean"], operator.le),
    ("unreadable at most 5%", lambda p: p["unreadable"]["value"], lambda p: 0.05, operator.le),
    ("rank corr. with own donation: its interval's lower end above 0", lambda p: p["rank_corr"]["low"],
     lambda p: 0.0, operator.gt),
)


def goals_met(proxy: dict) -> list[bool]:
    """Whether the proxy arm's statistics `proxy` meet each of GOALS."""
    return [bool(meets(value(proxy), target(proxy))) for _, value, target, meets in GOALS]


def goals_table(results: dict) -> str:
    """The judge's goals, met or not, from `results`' proxy arm."""
    proxy = results["arms"]["proxy"]
    lines = ["| goal | proxy | target | met |", "|---|---|---|---|"]
    lines += [f"| {goal} | {value(proxy):.3f} | {target(proxy):.3f} | {'yes' if met else 'no'} |"
              for (goal, value, target, _), met in zip(GOALS, goals_met(proxy))]
    return "\n".join(lines)


def references(config, env: P4GEnv) -> tuple[np.ndarray, dict]:
    """(other people's donations: the non-held-out participants', once each; the traits-only ceiling fitted
    on the judge split and scored on the held-out participants)."""
    others = np.array([p.donation for p in fs.first_per_participant(env.splits["train"])])
    ceiling = fs.traits_ceiling(fs.first_per_participant(env.splits["judge"]),
                                fs.first_per_participant(env.splits["eval"]),
                                np.random.default_rng([config.seed, 8]))
    return others, ceiling


def read_donation(record: dict) -> float:
    """The donation a dialogue record's text states, read by today's reader (`p4g.stated_donation`; NaN if
    none is readable): not the reward its run recorded, so that a change of the reader shows in every
    rescored table."""
    messages = [Message(m["role"], m["text"]) for m in record["messages"]]
    donation = stated_donation(Episode(record["scenario"], record["group"], messages=messages))
    return donation if readable(donation) else math.nan


def scored_transcripts(path: pathlib.Path) -> tuple[dict[str, np.ndarray], np.ndarray, int]:
    """({arm: donations [n, k]}, own [n], the file's dialogue count) of a dialogues.jsonl: every dialogue of
    each participant, in file order (this job writes them sample-major, so [:, j] is sample j), its donation
    read from its text (`read_donation`); people in the order of the file's first arm. ValueError if a record
    lacks a key this job writes, if an arm has other people, or not k dialogues of each."""
    with (gzip.open if path.suffix == ".gz" else open)(path, "rt") as f:
        records = [json.loads(line) for line in f]
    arms: dict[str, dict[str, list[float]]] = {}
    own: dict[str, float] = {}
    for line, r in enumerate(records, 1):
        try:
            arms.setdefault(r["arm"], {}).setdefault(r["scenario"], []).append(read_donation(r))
            own.setdefault(r["scenario"], r["human_donation"])
        except KeyError as error:
            raise ValueError(f"{path.name}: line {line} has no {error}: not a dialogue record of this job") \
                from None
    people = list(next(iter(arms.values())))
    for arm, found in arms.items():
        counts = {len(d) for d in found.values()}
        if set(found) != set(people) or len(counts) != 1:
            raise ValueError(f"{path.name}: arm {arm!r} does not hold the same number of dialogues of the "
                             f"same {len(people)} participants as the first arm")
    return ({arm: np.array([found[p] for p in people]) for arm, found in arms.items()},
            np.array([own[p] for p in people]), len(records))


def evaluate(config, run_dir: RunDir, played: dict[str, tuple] | None, adapter: pathlib.Path | None) -> dict:
    """The fidelity results: of `played` ({arm: (graphdef, params, tokenizer)}) on the held-out cases, or
    with `transcripts`, of those dialogues; `adapter`: the proxy's adapter folder (its sha256 is recorded)."""
    env, cases, left_out = heldout_cases(config)
    others, ceiling = references(config, env)
    if config.transcripts:
        try:
            arms, own, count = scored_transcripts(pathlib.Path(config.transcripts))
        except ValueError as error:
            raise ConfigError(f"config key 'transcripts': {error}") from None
        about = (f"Scored from the {count} dialogues of {pathlib.Path(config.transcripts).name}, each "
                 f"participant once with all of their dialogues; left out: {left_out}.")
    else:
        own = np.array([case.scenario.donation for case in cases])
        arms, transcripts = {}, []
        for arm, (graphdef, params, tokenizer) in (played or {}).items():
            sampling = SamplingConfig(temperature=config.fidelity.temperature,
                                      max_new_tokens=config.fidelity.max_new_tokens,
                                      stop_token_ids=(tokenizer.eos_token_id,),
                                      pad_token_id=tokenizer.pad_token_id or 0)
            player = Player(graphdef, params, tokenizer, sampling, config.fidelity.max_context)
            episodes = play_arm(env, cases, player, config, arm)
            arms[arm] = np.array([e.rewards["donation"] for e in episodes]).reshape(-1, len(cases)).T
            transcripts += [dict(transcript(env, e), arm=arm, human_donation=e.scenario.donation)
                            for e in episodes]
        if transcripts:
            run_dir.write_text("dialogues.jsonl", "".join(json.dumps(t) + "\n" for t in transcripts))
        about = (f"Every held-out participant with a valid donation counts once, in the human dialogue of "
                 f"their first row with one; left out: {left_out}.")
    results = fidelity_results(arms, own, others, ceiling, config.seed)
    results["cases"] = about
    if adapter is not None:
        results["adapter_sha256"] = lora.adapter_sha256(adapter)
    write(run_dir, results, config.model)
    return results


def write(run_dir: RunDir, results: dict, model: str) -> None:
    """fidelity.json, fidelity.md and figures/donations.png of `results`."""
    run_dir.write_json("fidelity.json", results)
    run_dir.write_text("fidelity.md", fidelity_table(results) + "\n")
    series = [(f"humans (n={results['humans']['n']})", results["humans"]["histogram"])]
    series += [(arm, stats["histogram"]) for arm, stats in results["arms"].items()]
    p4g_fidelity.plot(run_dir, series, f"P4G held-out donations: humans and simulated persuadees ({model})")


def run(config, run_dir: RunDir) -> None:
    arms, adapter, lines, played = set(config.fidelity.arms), None, [], {}
    if not config.transcripts and arms:
        base_graphdef, base_params, tokenizer = load_model(config.model, dtype=config.dtype)
        if "prompted" in arms:
            played["prompted"] = (base_graphdef, base_params, tokenizer)
        if "proxy" in arms:
            if config.adapter:
                adapter = pathlib.Path(config.adapter)
                played["proxy"] = (*lora.load(adapter, base_graphdef, base_params), tokenizer)
                lines = [f"# The P4G human proxy `{config.model}` + `{adapter}` (no training)"]
            else:
                trained = sft.train_sft(config, run_dir, PURPOSE)
                adapter = run_dir.path / sft.ADAPTER
                played["proxy"] = (trained.graphdef, trained.params, tokenizer)
                lines = sft_job.summary_lines(config, trained, run_dir)
    elif config.adapter:
        adapter = pathlib.Path(config.adapter)
    results = evaluate(config, run_dir, played, adapter)
    lines += ["", "## Fidelity on held-out participants", "",
              f"{results['humans']['n']} held-out participants, {config.fidelity.samples} dialogues each at "
              f"temperature {config.fidelity.temperature} against their own human persuader's first "
              f"{config.fidelity.max_turns} turns, replies of at most {config.fidelity.max_new_tokens} "
              "tokens.", "", fidelity_table(results), "", "![donations](figures/donations.png)"]
    run_dir.write_summary("\n".join(lines))
