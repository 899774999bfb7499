"""Theory checks: python -m experiments.run --config=experiments/configs/theory.py[:quick].

`quick` (used by the end-to-end test) draws 100 instances per check and runs shorter optimisations.
"""

from experiments.jobs import theory


def get_config(arg: str | None = None):
    config = theory.default_config()
    if arg == "quick":
        config.instances = 100
        config.sweep_points = 12
        config.md.steps = 60
        config.pg.steps = 400
        config.toy.grid = 21
    elif arg:
        raise ValueError(f"unknown theory config argument {arg!r} (known: quick)")
    return config
