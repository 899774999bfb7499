"""The simulator-collapse testbed: python -m experiments.run --config=experiments/configs/collapse.py[:ARG].

default  untrained, frozen, Verbalized Sampling, Co-Training, Population Co-Training; 3 seeds; within
         10 minutes on the 2-core CPU (`python -m experiments.bench collapse`).
all      the default plus rotation over 4 frozen collapsed simulators and Co-Training started from the
         collapsed simulator (a few minutes more).
quick    the end-to-end test's run (at most 2 minutes, mostly compilation): 1-layer models, small
         pretraining, 10 RL steps, 2 seeds, one held-out simulator, the arms of one compiled program
         (P = 1: untrained, frozen, Verbalized Sampling, Co-Training). It checks the plumbing, not the
         science.
"""

from experiments.jobs import collapse


def get_config(arg: str | None = None):
    config = collapse.default_config()
    if arg == "quick":
        config.seeds = (0, 1)
        config.heldout_seeds = (101,)
        config.arms = ("untrained", "frozen", "verbalized", "cotrain")
        config.pretrain.num_layers = 1
        config.pretrain.heldout_priors = ((0.25, 0.25, 0.25, 0.25),)
        config.pretrain.agent_steps = 30
        config.pretrain.sim_steps = 40
        config.pretrain.collapse_steps = 30
        config.rl.steps = 10
        config.rl.eval_every = 5
        config.rl.groups = 4
        config.rl.group_size = 8
    elif arg == "all":
        config.arms = config.arms + ("rotation", "cotrain_collapsed")
    elif arg:
        raise ValueError(f"unknown collapse config argument {arg!r} (known: quick, all)")
    return config
