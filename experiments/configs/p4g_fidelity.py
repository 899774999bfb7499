"""P4G simulator fidelity: simulated persuadees' donations vs the humans', direct vs Verbalized Sampling.

    python -m experiments.run --config=experiments/configs/p4g_fidelity.py        # SmolLM2-135M, CPU
    python -m experiments.run --config=experiments/configs/p4g_fidelity.py:quick  # 4 dialogues: smoke test
    python -m experiments.run --config=experiments/configs/p4g_fidelity.py \\
        --config.simulator.model=/models/Qwen3-1.7B --config.dialogues=256 --config.batch=64 \\
        --config.env.max_turns=10                                            # a real simulator (GPU)

The default fits this 2-core CPU (see docs/p4g.md for the measured time): 32 personas in one batch, one
turn per role plus the closing question, replies of at most 40 tokens; Verbalized Sampling asks for 4
candidates in at most 160 tokens, and an unreadable answer falls back to direct sampling at once.
"""

from experiments.jobs.p4g_fidelity import default_config


def get_config(arg: str = ""):
    config = default_config()
    config.verbalized.update(k=4, max_retries=0)
    if arg == "quick":
        config.dialogues, config.batch = 4, 4
        config.env.max_turns = 1
        config.persuader.max_new_tokens = config.simulator.max_new_tokens = 16
        config.verbalized.max_new_tokens = 48
    elif arg:
        raise ValueError(f"unknown argument {arg!r}; use nothing or 'quick'")
    return config
