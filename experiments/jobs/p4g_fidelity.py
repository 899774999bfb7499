"""Simulator fidelity on Persuasion for Good: do simulated persuadees donate like the humans in the data?

N persona cards of real P4G participants (with a valid donation) each hold one dialogue with a fixed
persuader (a model with the environment's persuader prompt). The same personas, persuader and sampling
keys are played once per arm:

  direct      the simulator model answers by ordinary sampling
  verbalized  the same model answers by Verbalized Sampling (k candidates with stated probabilities,
              one drawn), closing answer included

Each arm's donations (scope_jax.envs.p4g: stated in the dialogue, else asked at the end) are compared with
the human donations of the whole data (B6 in $0..$2, n = 982): donation rate, mean, L1 distance between
histograms over BINS, and the Kolmogorov-Smirnov statistic. A dialogue whose donation cannot be read is
left out of these statistics (its arm's n counts the readable ones) and reported as the unreadable share.
Because N is small, the expected L1 and KS of N humans drawn at random against all humans are reported
too: distances at that level are sampling noise.
Reply diversity across personas (distinct-n of the persuadee's replies at the same turn, and the share of
replies identical to another persona's) and the Verbalized Sampling parse failure and fallback rates
complete the table. Outputs: summary.md (table), summary.json, figures/donations.png, dialogues.jsonl.
"""

from __future__ import annotations

import dataclasses
import json
import time

import jax
import matplotlib
import ml_collections
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from scope_jax import diagnostics  # noqa: E402
from scope_jax.config import ConfigError, at_least, require  # noqa: E402
from scope_jax.dialogue.episode import AGENT, SIM, Episode  # noqa: E402
from scope_jax.dialogue.rollout import rollout  # noqa: E402
from scope_jax.dialogue.speakers import ModelSpeaker, Player, Speaker  # noqa: E402
from scope_jax.dialogue.transcript import transcript  # noqa: E402
from scope_jax.envs.p4g import CLOSING_QUESTION, P4GEnv, Persona  # noqa: E402
from scope_jax.envs.p4g_csv import P4GDataError  # noqa: E402
from scope_jax.envs.p4g_fidelity_stats import (BIN_LABELS, distances, donation_stats, histogram,  # noqa: E402
                                               rank_correlation)
from scope_jax.sampling import SamplingConfig  # noqa: E402
from scope_jax.simulators.verbalized import (VerbalizedConfig, VerbalizedSampler, summarize,  # noqa: E402
                                             verbalized_config)
from scope_jax.simulators.verbalized_speaker import VerbalizedSpeaker  # noqa: E402
from scope_jax.training.players import load_model  # noqa: E402
from scope_jax.training.run_dir import RunDir  # noqa: E402

ARMS = ("direct", "verbalized")
NOISE_DRAWS = 2000


def default_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.experiment = "p4g_fidelity"
    c.seed = 0
    c.dialogues = 32            # N personas, one dialogue each per arm
    c.batch = 32                # dialogues rolled out together (one generate call per turn)
    c.split = "all"             # personas from "all", "train" or "eval" (held out)
    c.arms = ARMS
    c.distinct_n = 2
    c.env = ml_collections.ConfigDict({"data_dir": "../shared/data/p4g", "max_turns": 1})
    player = {"model": "smollm2-135m-instruct", "temperature": 0.7, "top_p": 0.9, "max_new_tokens": 40}
    c.persuader = ml_collections.ConfigDict(player)
    c.simulator = ml_collections.ConfigDict(player)
    c.dtype = "float32"
    c.max_context = 2048
    c.verbalized = ml_collections.ConfigDict(dict(dataclasses.asdict(VerbalizedConfig()), max_new_tokens=160))
    return c


RULES = {"dialogues": at_least(1), "batch": at_least(1), "distinct_n": at_least(1)}


def check(config: ml_collections.ConfigDict) -> None:
    require(config, RULES)
    unknown = set(config.arms) - set(ARMS)
    if unknown or not config.arms:
        raise ConfigError(f"config key 'arms' must be a non-empty subset of {', '.join(ARMS)}; "
                          f"got {config.arms}")
    if config.dialogues % config.batch:
        raise ConfigError("config key 'dialogues' must be a multiple of 'batch'")
    try:
        verbalized_config(config.verbalized)
    except ValueError as e:
        raise ConfigError(f"config group 'verbalized': {e}") from None
    try:
        _env(config)
    except P4GDataError as e:
        raise ConfigError(f"config key 'env.data_dir': {e}") from None
    except ValueError as e:
        raise ConfigError(f"config group 'env': {e}") from None


def _env(config) -> P4GEnv:
    return P4GEnv(data_dir=config.env.data_dir, max_turns=config.env.max_turns)


# --- statistics ----------------------------------------------------------------------------------------

def noise_floor(humans: np.ndarray, n: int, rng: np.random.Generator) -> dict[str, float]:
    """Mean L1 and KS of n humans drawn at random (with replacement) against all humans."""
    draws = [distances(rng.choice(humans, n), humans) for _ in range(NOISE_DRAWS)]
    return {key: float(np.mean([d[key] for d in draws])) for key in ("hist_l1", "ks")}


def reply_diversity(episodes: list[Episode], n: int) -> dict[str, float]:
    """Across personas, per persuadee turn (the closing answer is a turn too): distinct-n of the replies'
    words pooled over personas, and the share of replies identical to another persona's; mean over turns."""
    replies = [[m.text.strip().lower() for m in e.messages if m.role == SIM] for e in episodes]
    turns = [[r[t] for r in replies if len(r) > t] for t in range(max(map(len, replies)))]
    distinct = [diagnostics.distinct_n([r.split() for r in t], n) for t in turns]
    return {f"distinct_{n}": float(np.nanmean(distinct)),
            "identical": float(np.mean([diagnostics.identical_fraction(t) for t in turns]))}


# --- the run -------------------------------------------------------------------------------------------

def _players(config) -> tuple[Player, Player]:
    """(persuader, simulator); one set of weights when both name the same model."""
    loaded = {}

    def player(group) -> Player:
        if group.model not in loaded:
            loaded[group.model] = load_model(group.model, dtype=config.dtype)
        graphdef, params, tokenizer = loaded[group.model]
        sampling = SamplingConfig(temperature=group.temperature, top_p=group.top_p,
                                  max_new_tokens=group.max_new_tokens,
                                  stop_token_ids=(tokenizer.eos_token_id,),
                                  pad_token_id=tokenizer.pad_token_id or 0)
        return Player(graphdef, params, tokenizer, sampling, config.max_context)

    return player(config.persuader), player(config.simulator)


def choose_personas(env: P4GEnv, config) -> list[Persona]:
    """N distinct personas of the split whose human donation is known."""
    pool = [p for p in env.splits[config.split] if p.donation is not None]
    rng = np.random.default_rng([config.seed, 1])
    return [pool[i] for i in rng.choice(len(pool), config.dialogues, replace=False)]


def play_arm(env: P4GEnv, personas: list[Persona], persuader: Player, simulator: Speaker,
             config) -> list[Episode]:
    """One dialogue per persona, `config.batch` at a time; chunk c uses the same key in every arm."""
    episodes = [Episode(persona, group=i) for i, persona in enumerate(personas)]
    speakers = {AGENT: ModelSpeaker(persuader), SIM: simulator}
    key = jax.random.key(config.seed)
    for c, start in enumerate(range(0, len(episodes), config.batch)):
        rollout(env, episodes[start:start + config.batch], speakers, jax.random.fold_in(key, c))
        print(f"  {start + config.batch}/{len(episodes)} dialogues", flush=True)
    return episodes


def arm_results(episodes: list[Episode], humans: np.ndarray, distinct_n: int) -> dict:
    """An arm's statistics: those of its readable donations against the humans' (the unreadable ones left
    out, their share reported), against each persona's own human, reply diversity, the closing question's
    share, and the Verbalized Sampling records' summary (vs_*), if any."""
    donations = np.array([e.rewards["donation"] for e in episodes])
    read = ~np.isnan(donations)
    own_humans = np.array([e.scenario.donation for e in episodes])
    results = {**donation_stats(donations[read], humans), **reply_diversity(episodes, distinct_n),
               "asked_closing": float(np.mean([any(m.text == CLOSING_QUESTION for m in e.messages)
                                               for e in episodes])),
               "unreadable": float(np.mean(~read)),
               "persona_corr": rank_correlation(donations[read], own_humans[read]),
               "histogram": histogram(donations[read]).tolist()}
    records = [r for e in episodes for r in e.info.get("verbalized", [])]
    if records:
        results.update({f"vs_{k}": v for k, v in summarize(records).items()})
    return results


def run(config, run_dir: RunDir) -> None:
    env = _env(config)
    humans = np.array([p.donation for p in env.personas if p.donation is not None])
    personas = choose_personas(env, config)
    persuader, simulator = _players(config)
    results = {"humans": donation_stats(humans, humans),
               "humans_sampled": donation_stats(np.array([p.donation for p in personas]), humans),
               "noise_floor": noise_floor(humans, config.dialogues, np.random.default_rng([config.seed, 2]))}
    arms, transcripts = {}, []
    for arm in config.arms:
        print(f"arm {arm}", flush=True)
        sampler = VerbalizedSampler(verbalized_config(config.verbalized))
        speaker = (ModelSpeaker(simulator) if arm == "direct" else
                   VerbalizedSpeaker(simulator, sampler, config.verbalized.max_new_tokens))
        start = time.perf_counter()
        episodes = play_arm(env, personas, persuader, speaker, config)
        arms[arm] = {**arm_results(episodes, humans, config.distinct_n),
                     "seconds": time.perf_counter() - start}
        transcripts += [dict(transcript(env, e), arm=arm, human_donation=e.scenario.donation)
                        for e in episodes]
    results["arms"] = arms
    results["humans"]["histogram"] = histogram(humans).tolist()
    run_dir.write_text("dialogues.jsonl", "".join(json.dumps(t) + "\n" for t in transcripts))
    run_dir.write_json("summary.json", results)
    series = [("humans (n=%d)" % results["humans"]["n"], results["humans"]["histogram"])]
    series += [(f"{arm} (n={stats['n']})", stats["histogram"]) for arm, stats in results["arms"].items()]
    plot(run_dir, series, f"P4G donations: humans vs simulated persuadees ({config.simulator.model})")
    run_dir.write_summary(summary(results, config, transcripts))


def plot(run_dir: RunDir, series: list[tuple[str, list[float]]], title: str) -> None:
    """figures/donations.png: the donation histograms (shares per bin of BINS) of `series` (label, shares)."""
    fig, ax = plt.subplots(figsize=(8, 3.4))
    width = 0.8 / len(series)
    for i, (label, shares) in enumerate(series):
        ax.bar(np.arange(len(BIN_LABELS)) + (i - (len(series) - 1) / 2) * width, shares, width, label=label)
    ax.set_xticks(np.arange(len(BIN_LABELS)), BIN_LABELS)
    ax.set_xlabel("donation (dollars)")
    ax.set_ylabel("share of persuadees")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    run_dir.save_figure(fig, "donations")


def summary(results: dict, config, transcripts: list[dict]) -> str:
    floor = results["noise_floor"]
    n = config.distinct_n
    lines = [
        "# P4G simulator fidelity", "",
        f"{config.dialogues} dialogues per arm, persuader `{config.persuader.model}`, simulator "
        f"`{config.simulator.model}`, personas from split `{config.split}`, at most {config.env.max_turns} "
        "turn(s) per role, then the closing question if no amount was stated; a dialogue without a readable "
        "amount (none, or above $2) is left out of the donation statistics (n counts the readable ones) "
        "and counted as unreadable.", "",
        f"| | n | donation rate | mean $ | hist L1 | KS | persona corr. | asked at end | unreadable "
        f"| distinct-{n} | identical | VS parse failures | VS fallbacks | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = [("humans (all)", results["humans"]), ("humans (these personas)", results["humans_sampled"])]
    rows += list(results["arms"].items())
    columns = ("donation_rate", "mean_donation", "hist_l1", "ks", "persona_corr", "asked_closing",
               "unreadable", f"distinct_{n}", "identical", "vs_parse_failure_rate", "vs_fallback_rate")
    for name, r in rows:
        cells = [f"{r[key]:.3f}" if key in r else "" for key in columns]
        cells.append(f"{r['seconds']:.0f}" if "seconds" in r else "")
        lines.append(f"| {name} | {r['n']} | " + " | ".join(cells) + " |")
    lines += [
        "", f"Sampling noise at n = {config.dialogues}: {config.dialogues} humans drawn at random score "
        f"hist L1 {floor['hist_l1']:.3f} and KS {floor['ks']:.3f} against all humans on average. Persona "
        "corr.: Spearman correlation between each simulated persuadee's donation and its human's.", "",
        "![donations](figures/donations.png)", "",
    ]
    for arm in results["arms"]:
        example = next(t for t in transcripts if t["arm"] == arm)
        lines += [f"## Example dialogue ({arm}; persona {example['scenario']}, human donation "
                  f"${example['human_donation']:.2f}, "
                  f"simulated {_dollars(example['rewards']['donation'])})", ""]
        lines += [f"- **{m['role']}**: {m['text']}" for m in example["messages"]] + [""]
    return "\n".join(lines)


def _dollars(amount: float) -> str:
    return "unreadable" if np.isnan(amount) else f"${amount:.2f}"
