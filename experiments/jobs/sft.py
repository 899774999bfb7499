"""Supervised fine-tuning of one role of written user dialogues (the loop: `scope_jax.training.sft`), with a
summary of its held-out NLL and speed.

With role "sim" (the persuadee) the model fitted is a training *simulator*, fitted on the simulator split
of the people only (`envs.user_dialogues.check_fit`); its adapter records that (`fitted_on.json`). The
persuader (role "agent") is neither a simulator nor the judge.
"""

from __future__ import annotations

import numpy as np

from scope_jax.dialogue.episode import SIM
from scope_jax.training import sft
from scope_jax.training.run_dir import RunDir

default_config = sft.default_config
ADAPTER = sft.ADAPTER


def purpose(config) -> str | None:
    """What a fitted persuadee is: a training simulator; a persuader is neither simulator nor judge."""
    return "simulator" if config.role == SIM else None


def check(config) -> None:
    sft.check(config, purpose(config))


def summary_lines(config, trained: sft.Trained, run_dir: RunDir) -> list[str]:
    records = run_dir.read_metrics()
    evals = [(r["step"], r["heldout_nll"]) for r in records if "heldout_nll" in r]
    steps = [r for r in records if "tokens_per_s" in r]
    data = trained.data
    lines = [f"# SFT of the {config.role} role", "",
             f"model `{config.model}`, {config.train.steps} steps of {config.train.batch_size} dialogues "
             f"(length buckets), {len(data.train)} train and {len(data.eval)} held-out dialogues "
             f"(splits {config.data.train_split} / {config.data.eval_split}, at most {config.data.max_turns} "
             f"turns per role, views up to {config.data.max_length} tokens; left out as too long: "
             f"{data.dropped_too_long}; personas without a dialogue: {data.skipped}; the last reply's tokens "
             f"weigh {config.train.last_reply_weight:g} in the train loss, 1 in the held-out NLL).", "",
             "| step | held-out NLL |", "|---|---|"]
    lines += [f"| {step} | {nll:.4f} |" for step, nll in evals]
    if steps:
        lines += ["", f"Median tokens/s (padded rows): {np.median([r['tokens_per_s'] for r in steps]):.0f}; "
                  f"median seconds per step: {np.median([r['time/step'] for r in steps]):.2f}."]
    return lines


def run(config, run_dir: RunDir) -> None:
    trained = sft.train_sft(config, run_dir, purpose(config))
    run_dir.write_summary("\n".join(summary_lines(config, trained, run_dir)))
