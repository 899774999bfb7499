"""Example: train a tiny agent against a frozen tiny simulator on the target-word task (CPU, ~minutes).

    python -m experiments.run --config=experiments/configs/target_word.py
    python -m experiments.run --config=experiments/configs/target_word.py:cotrain   # simulator trains too
"""

from scope_jax.training.loop import default_config


def get_config(mode: str = "frozen"):
    config = default_config()
    config.sim.mode = mode
    config.optimizer.learning_rate = 3e-3
    config.optimizer.sim_learning_rate = 3e-3
    config.train.steps = 40
    return config
