"""Example: tiny agent vs. tiny simulator(s) on the target-word task (CPU, about a minute per mode).

One config key, `sim.mode`, picks the simulator mode; the argument after the colon sets it:

    python -m experiments.run --config=experiments/configs/target_word.py             # frozen simulator
    python -m experiments.run --config=experiments/configs/target_word.py:verbalized  # Verbalized Sampling
    python -m experiments.run --config=experiments/configs/target_word.py:cotrain     # simulator trains too
    python -m experiments.run --config=experiments/configs/target_word.py:population  # 2 co-trained sims
    python -m experiments.run --config=experiments/configs/target_word.py:rotation    # 2 frozen sims in turn
    python -m experiments.run --config=experiments/configs/target_word.py:mixture     # 2 frozen sims per step
    python -m experiments.run --config=experiments/configs/target_word.py:selfplay    # one model, both roles

A trained simulator (cotrain, population, selfplay) plays against the agent: its reward is minus the
agent's (`sim.objective = "adversarial"`), with the KL anchor `algo.sim_kl_coef` to its start.
The tiny random simulator cannot write a verbalized distribution, so in `verbalized` mode every turn
falls back to direct sampling (counted as verbalized/fallback_rate); the mode does its real work with an
instruction-tuned simulator (experiments/configs/p4g_*.py) and in the collapse testbed's token language.
"""

from scope_jax.simulators.modes import sim_settings
from scope_jax.training.config import default_config


def get_config(mode: str = "frozen"):
    config = default_config()
    config.sim.update(sim_settings(mode, model="tiny:1", models=("tiny:1", "tiny:2"), population=2),
                      objective="adversarial")
    config.algo.sim_kl_coef = 0.1  # keep a trained simulator near its initial policy
    config.optimizer.learning_rate = 3e-3
    config.optimizer.sim_learning_rate = 3e-3
    config.train.steps = 40
    return config
