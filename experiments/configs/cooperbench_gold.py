"""CooperBench with scripted agents and no model: the gold agent must score 1 and the empty one 0 on every
task pair, in coop and solo mode.

    python -m experiments.run --config=experiments/configs/cooperbench_gold.py [--config.tasks_dir=DIR]

DIR is any folder of tasks in the real CooperBench layout (default: our suite,
scope_jax/envs/cooperbench/suite).
"""

from experiments.jobs import cooperbench_gold


def get_config(arg: str | None = None):
    if arg:
        raise ValueError(f"cooperbench_gold takes no config argument, got {arg!r}")
    return cooperbench_gold.default_config()
