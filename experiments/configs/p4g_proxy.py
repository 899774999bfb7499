"""The P4G human proxy (the judge): SmolLM2-135M-Instruct fine-tuned on the judge split's human persuadee
turns, then its donation fidelity on the held-out participants, with intervals, next to the prompted model,
the human floors and the traits-only ceiling.

    python -m experiments.run --config=experiments/configs/p4g_proxy.py        # the judge (docs/sft.md)
    python -m experiments.run --config=experiments/configs/p4g_proxy.py:recipe # the recipe, before the levers
    python -m experiments.run --config=experiments/configs/p4g_proxy.py:quick  # 2 SFT steps, 4 people x 2
    python -m experiments.run --config=experiments/configs/p4g_proxy.py:committed  # the committed adapter's
                                                                                  # table, no training
    python -m experiments.run --config=experiments/configs/p4g_proxy.py:rescore    # the committed dialogues,
                                                                                  # scored, no model: the
                                                                                  # committed table
    python -m experiments.run --config=experiments/configs/p4g_proxy.py:replay     # the committed adapter's
                                                                                  # first batch of dialogues
    python -m experiments.run --config=experiments/configs/p4g_proxy.py:references # floors, ceiling, no model

The judge is fitted on the judge split of the people only (no training simulator shares a person with
it; docs/p4g.md), with the recipe of `sft.lora_persuadee` and the two levers `JUDGE_LEVERS` (chosen by a
rule fixed before their run; docs/sft.md has the measurements; `:recipe` leaves them out), then played
on every held-out participant with a valid donation, `fidelity.samples` dialogues each. `replay` plays the
committed proxy on the first `fidelity.batch` participants once: the first batch of the committed run, so
its dialogues.jsonl equals the first lines of the committed proxy dialogues (docs/sft.md shows the check).
"""

import pathlib

from experiments.configs.sft import lora_persuadee
from experiments.jobs.p4g_proxy import default_config

COMMITTED = pathlib.Path(__file__).resolve().parents[2] / "docs" / "results" / "p4g_proxy"
JUDGE_LEVERS = {"steps": 200, "last_reply_weight": 7.0}  # the judge's train settings beyond the recipe


def get_config(arg: str = ""):
    config = lora_persuadee(default_config())
    config.data.train_split = "judge"
    if arg != "recipe":
        config.train.update(JUDGE_LEVERS)
    config.fidelity.update(dialogues=0, samples=4, batch=32, max_turns=4, max_new_tokens=40)
    if arg == "quick":
        config.data.update(max_turns=2, train_dialogues=8, eval_dialogues=4)
        config.train.update(steps=2, batch_size=2, eval_every=2, checkpoint_every=2)
        config.fidelity.update(dialogues=4, samples=2, batch=8, max_turns=1, max_new_tokens=16)
    elif arg in ("committed", "rescore", "replay"):
        config.adapter = str(COMMITTED / "adapter")
        config.transcripts = str(COMMITTED / "dialogues.jsonl.gz") if arg == "rescore" else ""
        if arg == "replay":
            config.fidelity.update(arms=("proxy",), dialogues=config.fidelity.batch, samples=1)
    elif arg == "references":
        config.fidelity.arms = ()
    elif arg not in ("", "recipe"):
        raise ValueError(f"unknown argument {arg!r}; use nothing, 'recipe', 'quick', 'committed', 'rescore', "
                         "'replay' or 'references'")
    return config
