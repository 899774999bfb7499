"""The simulator-collapse testbed: python -m experiments.run --config=experiments/configs/collapse.py[:ARG].

default  every arm of the comparison on 5 seeds: untrained, the two controls (frozen collapsed and
         frozen base simulator), Verbalized Sampling, Co-Training (like for like, and the two variants
         that see the base model), Population Co-Training, rotation and self-play; its budget is 10
         minutes on the 2-core CPU (`python -m experiments.bench collapse` measures it).
all      the default plus mixture (the four collapsed simulators within every step) and Population
         Co-Training from the base model's persona modes.
sweep    Co-Training like for like over the simulators' KL weight (0 included) and learning rate, with
         the controls, for the adversarial and the regret objective; the default's setting is chosen
         from the adversarial points by the rule in docs/results/README.md. It pretrains the default's
         models too, so that the default run can resume from its pretraining and controls
         (docs/results/README.md says how).
data     the data curve: at N = 30, 100, 300, 1000 user dialogues, the fitted simulator (the control),
         Verbalized Sampling fitted and Co-Training with a data anchor (weights 1, 4, 16; the rule in
         docs/results/README.md picks one per N), with the default's controls; like the sweep it
         pretrains the default's models, so it can resume from the default's (or the sweep's)
         pretraining and controls. Its budget is 20 minutes on the 2-core CPU.
scarce   scarce user data (issue 33; protocol in docs/results/README.md): at N = 10, 30, 100 user
         dialogues, fitted (the control), fitted calibrated, the fitted population (P = 4, played as a
         mixture), regret + data from the fit and from the population (data anchor weight 16, the best
         response solved every 10 steps), with the default's controls, on 10 seeds. Pretrains the
         default's models. Its budget is 30 minutes on the 2-core CPU.
quick    the end-to-end test's run (at most 2 minutes, mostly compilation): 1-layer models, small
         pretraining, 10 RL steps, 2 seeds, one held-out simulator, the arms of one compiled program
         (P = 1). It checks the plumbing, not the science.
"""

from experiments.jobs import collapse


def get_config(arg: str | None = None):
    config = collapse.default_config()
    if arg == "quick":
        config.seeds = (0, 1)
        config.heldout_seeds = (101,)
        config.arms = ("untrained", "frozen", "frozen_base", "verbalized", "cotrain")
        config.vs_samples = 2
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
        config.arms = config.arms + ("mixture", "population_base")
    elif arg == "sweep":
        config.arms = ("untrained", "frozen", "frozen_base")
        config.pretrain_for = collapse.DEFAULT_ARMS
        config.sweep.kl_coefs = (0.0, 1.0, 2.0, 4.0, 8.0)
        config.sweep.sim_learning_rates = (1e-4, 5e-4, 2e-3)
        config.sweep.objectives = ("adversarial", "regret")
    elif arg == "data":
        config.arms = ("untrained", "frozen", "frozen_base")
        config.pretrain_for = collapse.DEFAULT_ARMS
        config.data.sizes = (30, 100, 300, 1000)
    elif arg == "scarce":
        config.seeds = tuple(range(10))
        config.arms = ("untrained", "frozen", "frozen_base")
        config.pretrain_for = collapse.DEFAULT_ARMS
        config.scarce.sizes = (10, 30, 100)
        config.rl.best_response_every = 10
    elif arg:
        raise ValueError(f"unknown collapse config argument {arg!r} (known: quick, all, sweep, data, scarce)")
    return config
