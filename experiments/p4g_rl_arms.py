"""The P4G RL arms against the judge, gathered from their runs:

    python -m experiments.p4g_rl_arms [--runs DIR] [--arms ARM ...]

Each arm is one run of `experiments/configs/p4g_rl.py:ARM` in DIR/p4g-rl-ARM (the README's commands). For
every held-out evaluation (samples/eval-step-S.jsonl: the agent of that step, before its update, against
the judge) it counts the dialogues' outcomes; for every train step, the reward and unreadable share
against what the agent trained against (metrics.jsonl). Every arm must have been judged by the committed
judge (`JUDGE`): the sha256 its run recorded of the judge's adapter (adapters.json) is checked. Written to
docs/results/p4g_rl/: arms.json, arms.md (the table, from arms.json alone) and each arm's evaluation
transcripts (ARM/eval-step-S.jsonl).
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import shutil
from typing import Any, Callable

from scope_jax.models import lora
from scope_jax.training.run_dir import ADAPTERS

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results" / "p4g_rl"
JUDGE = ROOT / "docs" / "results" / "p4g_proxy" / "adapter"
ARMS = ("frozen", "verbalized", "fitted", "cotrain_data")
LABELS = {"frozen": "prompted simulator, frozen", "verbalized": "Verbalized Sampling",
          "fitted": "fitted on the simulator split, frozen", "cotrain_data": "Co-Training + data anchor"}


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def outcomes(rewards: list[dict[str, float]]) -> dict[str, float]:
    """Mean agent reward, unreadable share, and donation rate and mean among the readable dialogues."""
    readable = [r for r in rewards if not r["unreadable"]]
    return {"dialogues": len(rewards), "reward": mean([r["agent"] for r in rewards]),
            "unreadable": mean([r["unreadable"] for r in rewards]),
            "donating": mean([float(r["donation"] > 0) for r in readable]),
            "donation": mean([r["donation"] for r in readable])}


def gather(run: pathlib.Path) -> dict[str, Any]:
    """One arm's evaluations against the judge, by step, and its train steps."""
    if not (run / "metrics.jsonl").exists():
        raise SystemExit(f"p4g_rl_arms: {run} has no metrics.jsonl; run its config first (README)")
    evaluations = {}
    for path in sorted((run / "samples").glob("eval-step-*.jsonl")):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        evaluations[path.stem.removeprefix("eval-step-")] = outcomes([r["rewards"] for r in records])
    if not evaluations:
        raise SystemExit(f"p4g_rl_arms: {run}/samples has no eval-step-S.jsonl (train.eval_first and "
                         "train.eval_every write them)")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [{"step": r["step"], "reward": r["reward"], "unreadable": r.get("env/unreadable", math.nan)}
             for r in records]
    return {"evaluations": evaluations, "train": train, "judge_adapter_sha256": judge_sha256(run)}


def judge_sha256(run: pathlib.Path) -> str:
    """The sha256 of the judge's adapter as the run recorded it when it began."""
    if not (run / ADAPTERS).exists():
        raise SystemExit(f"p4g_rl_arms: {run} has no {ADAPTERS} (the run predates that record); run it again")
    (judge,) = json.loads((run / "config.json").read_text())["eval"]["sim_models"]
    return json.loads((run / ADAPTERS).read_text())[judge]


def check_judge(results: dict[str, dict], committed: str) -> None:
    """Refuse arms judged by any adapter other than the committed judge's (sha256 `committed`)."""
    for arm, record in results.items():
        if record["judge_adapter_sha256"] != committed:
            raise SystemExit(f"p4g_rl_arms: {arm} was judged by the adapter with sha256 "
                             f"{record['judge_adapter_sha256'][:12]}, not the committed judge's "
                             f"{committed[:12]} ({JUDGE}); run it again")


def fmt(value: float) -> str:
    return "" if value is None or math.isnan(value) else f"{value:.3f}"


def first(arm: dict) -> dict:
    return arm["evaluations"][min(arm["evaluations"], key=int)]


def last(arm: dict) -> dict:
    return arm["evaluations"][max(arm["evaluations"], key=int)]


def first_and_last(key: str) -> Callable[[dict], str]:
    return lambda arm: f"{fmt(first(arm)[key])} / {fmt(last(arm)[key])}"


# The table: (header, cell of one arm's record)
COLUMNS: tuple[tuple[str, Callable[[dict], str]], ...] = (
    ("held-out reward vs the judge, step 0 (untrained agent) / last evaluation", first_and_last("reward")),
    ("held-out dialogues per evaluation", lambda arm: str(last(arm)["dialogues"])),
    ("held-out donating among readable, step 0 / last", first_and_last("donating")),
    ("held-out unreadable, step 0 / last", first_and_last("unreadable")),
    ("train reward by step", lambda arm: ", ".join(fmt(t["reward"]) for t in arm["train"])),
    ("train unreadable by step", lambda arm: ", ".join(fmt(t["unreadable"]) for t in arm["train"])),
)


def table(results: dict[str, dict]) -> str:
    lines = ["| trained against | " + " | ".join(h for h, _ in COLUMNS) + " |",
             "|---" * (len(COLUMNS) + 1) + "|"]
    lines += [f"| {LABELS[name]} | " + " | ".join(cell(arm) for _, cell in COLUMNS) + " |"
              for name, arm in results.items()]
    steps = sorted({int(s) for arm in results.values() for s in arm["evaluations"]})
    judges = sorted({arm["judge_adapter_sha256"][:12] for arm in results.values()})
    return "\n".join(lines) + (f"\n\nEvaluations at steps {', '.join(map(str, steps))}, each before that "
                               "step's update, on the held-out personas drawn for that step, against the "
                               f"judge whose adapter's sha256 begins {' / '.join(judges)}.\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default="runs", help="the folder holding p4g-rl-ARM run directories")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    args = parser.parse_args(argv)
    runs = {arm: pathlib.Path(args.runs) / f"p4g-rl-{arm}" for arm in args.arms}
    results = {arm: gather(run) for arm, run in runs.items()}
    check_judge(results, lora.adapter_sha256(JUDGE))
    RESULTS.mkdir(parents=True, exist_ok=True)
    for arm, run in runs.items():
        shutil.rmtree(RESULTS / arm, ignore_errors=True)
        (RESULTS / arm).mkdir()
        for path in (run / "samples").glob("eval-step-*.jsonl"):
            shutil.copy(path, RESULTS / arm / path.name)
    (RESULTS / "arms.json").write_text(json.dumps(results, indent=1) + "\n")
    (RESULTS / "arms.md").write_text(table(results))
    print(table(results))


if __name__ == "__main__":
    main()
