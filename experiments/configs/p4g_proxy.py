"""The P4G human proxy: SmolLM2-135M-Instruct fine-tuned on the train split's human persuadee turns, then its
donation fidelity against held-out participants next to the prompted model and the human noise floor.

    python -m experiments.run --config=experiments/configs/p4g_proxy.py        # this CPU (docs/sft.md)
    python -m experiments.run --config=experiments/configs/p4g_proxy.py:quick  # 2 SFT steps, 4 dialogues
    python -m experiments.run --config=experiments/configs/p4g_proxy.py:committed  # the committed adapter's
                                                                                  # table, no training

The settings are chosen to fit about an hour on this shared 2-core CPU (docs/sft.md has the measurements):
the first 4 turns per role of each dialogue (views of about 410 tokens, median), views up to 640 tokens,
40 steps of 4 dialogues, a rank-8 LoRA adapter (alpha 16) on the four attention projections of every
layer (0.9M parameters, 3.7 MB), the base frozen.
"""

import pathlib

from experiments.jobs.p4g_proxy import default_config

COMMITTED = pathlib.Path(__file__).resolve().parents[2] / "docs" / "results" / "p4g_proxy"


def get_config(arg: str = ""):
    config = default_config()
    config.data.update(max_turns=4, max_length=640, eval_dialogues=32)
    config.train.update(steps=100, batch_size=4, eval_every=50, checkpoint_every=25)
    config.lora.update(rank=8, alpha=16.0, targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    config.optimizer.update(learning_rate=2e-4, warmup_steps=10)
    config.fidelity.update(dialogues=64, batch=32, max_turns=4, max_new_tokens=40)
    if arg == "quick":
        config.data.update(max_turns=2, train_dialogues=8, eval_dialogues=4)
        config.train.update(steps=2, batch_size=2, eval_every=2, checkpoint_every=2)
        config.fidelity.update(dialogues=4, batch=4, max_turns=1, max_new_tokens=16)
    elif arg == "committed":
        config.adapter = str(COMMITTED / "adapter")
    elif arg:
        raise ValueError(f"unknown argument {arg!r}; use nothing, 'quick' or 'committed'")
    return config
