"""The simulator-collapse testbed: python -m experiments.run --config=experiments/configs/collapse.py[:ARG].

default  untrained, frozen, Verbalized Sampling, Co-Training, Population Co-Training; 3 seeds; within
         10 minutes on the 2-core CPU (`python -m experiments.bench collapse`).
all      the default plus rotation over 4 frozen collapsed simulators and Co-Training started from the
         collapsed simulator (a few minutes more).
quick    the end-to-end test's run (at most 2 minutes): small pretraining, few RL steps, 2 seeds,
         the arms of one compiled program (P = 1: untrained, frozen, Verbalized Sampling, Co-Training).
"""

from experiments.jobs import collapse


def get_config(arg: str | None = None):
    config = collapse.default_config()
    if arg == "quick":
        config.seeds = (0, 1)
        config.arms = ("untrained", "frozen", "verbalized", "cotrain")
        config.pretrain.agent_steps = 40
        config.pretrain.sim_steps = 60
        config.pretrain.collapse_steps = 30
        config.rl.steps = 20
        config.rl.eval_every = 10
        config.rl.groups = 8
        config.rl.group_size = 8
    elif arg == "all":
        config.arms = config.arms + ("rotation", "cotrain_collapsed")
    elif arg:
        raise ValueError(f"unknown collapse config argument {arg!r} (known: quick, all)")
    return config
