"""SFT of SmolLM2-135M-Instruct on the P4G human persuadee turns (all parameters), or a smoke test.

    python -m experiments.run --config=experiments/configs/sft.py            # the persuadee, this CPU
    python -m experiments.run --config=experiments/configs/sft.py:persuader  # the persuader's turns
    python -m experiments.run --config=experiments/configs/sft.py:quick      # a tiny model, seconds

See docs/sft.md for what the job does and the measured cost.
"""

from experiments.jobs.sft import default_config


def get_config(arg: str = ""):
    config = default_config()
    if arg == "persuader":
        config.role = "agent"
    elif arg == "quick":
        config.model = "tiny:0"
        config.data.update(max_turns=2, train_dialogues=8, eval_dialogues=4)
        config.train.update(steps=4, batch_size=2, eval_every=2, checkpoint_every=2)
        config.optimizer.learning_rate = 3e-3
    elif arg:
        raise ValueError(f"unknown argument {arg!r}; use nothing, 'persuader' or 'quick'")
    return config
