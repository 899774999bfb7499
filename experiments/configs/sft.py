"""SFT of SmolLM2-135M-Instruct on the P4G human persuadee turns (all parameters), a fitted simulator, or a
smoke test.

    python -m experiments.run --config=experiments/configs/sft.py            # the persuadee, this CPU
    python -m experiments.run --config=experiments/configs/sft.py:fitted     # p4g_rl's fitted simulator
    python -m experiments.run --config=experiments/configs/sft.py:persuader  # the persuader's turns
    python -m experiments.run --config=experiments/configs/sft.py:quick      # a tiny model, seconds

A persuadee is fitted on the simulator split of the people (the judge's are the judge split; docs/p4g.md).
`fitted` is the judge's recipe (`lora_persuadee`, shared with experiments/configs/p4g_proxy.py) on the
simulator split: the frozen simulator of `p4g_rl.py:fitted`, which reads its adapter from
docs/results/p4g_fitted/adapter (copy the run's adapter/ folder there). See docs/sft.md for what the job
does and the measured cost.
"""

from experiments.jobs.sft import default_config


def lora_persuadee(config):
    """The P4G human proxy's SFT recipe for this CPU (docs/sft.md): the first 4 turns per role, views up to
    640 tokens, 100 steps of 4 dialogues, a rank-8 LoRA adapter (alpha 16) on the four attention
    projections of every layer, learning rate 2e-4 with 10 warm-up steps, 32 held-out dialogues; the
    adapter saved in peft's layout, naming the hub's SmolLM2 as its base (docs/lora.md)."""
    config.data.update(max_turns=4, max_length=640, eval_dialogues=32)
    config.train.update(steps=100, batch_size=4, eval_every=50, checkpoint_every=25)
    config.lora.update(rank=8, alpha=16.0, targets=("q_proj", "k_proj", "v_proj", "o_proj"), format="peft",
                       base_model="HuggingFaceTB/SmolLM2-135M-Instruct")
    config.optimizer.update(learning_rate=2e-4, warmup_steps=10)
    return config


def get_config(arg: str = ""):
    config = default_config()
    if arg == "persuader":
        config.role = "agent"
    elif arg == "fitted":
        lora_persuadee(config)
    elif arg == "quick":
        config.model = "tiny:0"
        config.data.update(max_turns=2, train_dialogues=8, eval_dialogues=4)
        config.train.update(steps=4, batch_size=2, eval_every=2, checkpoint_every=2)
        config.optimizer.learning_rate = 3e-3
    elif arg:
        raise ValueError(f"unknown argument {arg!r}; use nothing, 'fitted', 'persuader' or 'quick'")
    return config
