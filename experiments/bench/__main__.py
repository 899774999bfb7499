"""python -m experiments.bench NAME [flags]: the benchmark NAME's subcommand (see experiments/bench/__init__.py)."""

from __future__ import annotations

import argparse
import importlib

from experiments.bench.harness import MODEL_NAMES, bfloat16_note, header

BENCHMARKS = ("sampler", "rollout", "train_step", "sft", "collapse", "distributed", "rl_step")
DEFAULT_REPEATS = {"rollout": 1}  # warm runs per measurement where not 2


def parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per benchmark module, its flags and the shared ones."""
    import experiments.bench as package

    main = argparse.ArgumentParser(prog="python -m experiments.bench", description=package.__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = main.add_subparsers(dest="name", required=True)
    for name in BENCHMARKS:
        module = importlib.import_module(f"experiments.bench.{name}")
        sub = commands.add_parser(name, description=module.__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        repeats = DEFAULT_REPEATS.get(name, 2)
        sub.add_argument("--repeats", type=int, default=repeats,
                         help=f"warm runs per measurement (the best is kept); default {repeats}")
        sub.add_argument("--models", nargs="+", default=list(MODEL_NAMES), choices=MODEL_NAMES)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return main


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    print("\n".join(header()), flush=True)
    if note := bfloat16_note(getattr(args, "dtypes", [])):
        print(note, flush=True)
    ratio = args.run(args)
    print(f"ratio={ratio:.3f}")


if __name__ == "__main__":
    main()
