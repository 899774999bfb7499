"""What each lever of the judge's recipe did (issue 32, part 3), gathered from its runs:

    python -m experiments.p4g_proxy_levers --recipe DIR --lever NAME=DIR [--lever NAME=DIR ...]
    python -m experiments.p4g_proxy_levers --rescore    # the committed runs, scored by today's reader

Each DIR is one run of `experiments/configs/p4g_proxy.py` (the lever's settings given on its command line,
e.g. `--config.train.last_reply_weight=7.0`; a lever may play the proxy arm alone,
`--config.fidelity.arms="('proxy',)"`). `--recipe` is the run of `p4g_proxy.py:recipe`. For each run:
the settings it changed from the recipe (read from the two config.json; a key a run predates has the
recipe's value, `p4g_proxy.py:recipe`), its last held-out NLL
(metrics.jsonl), and its proxy's fidelity on the held-out participants (dialogues.jsonl, each donation
read from its text by today's reader, `p4g_proxy.read_donation`): the statistics
with bootstrap intervals, the human floor at its sizes, and the goals met (`p4g_proxy.GOALS`); for a lever,
its change from the recipe, paired by participant (the same bootstrap resamples for both). Written to
docs/results/p4g_proxy/levers/: levers.json, levers.md (the table, from levers.json alone) and each run's
summary.md and gzipped dialogues (NAME/, the recipe's in recipe/: they stay when another run becomes the
judge). `--rescore` writes levers.json and levers.md again from the committed runs alone (`rescored`).
"""

from __future__ import annotations

import argparse
import gzip
import json
import pathlib
import shutil
from typing import Any, Callable

import ml_collections
import numpy as np

from experiments.configs.p4g_proxy import get_config
from experiments.jobs import p4g_proxy
from scope_jax.envs import p4g_fidelity_stats as fs

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results" / "p4g_proxy" / "levers"
UNCOMPARED = ("fidelity.arms", "adapter", "transcripts")  # settings that change what runs, not the proxy
CHANGES = ("unreadable", "ks", "hist_l1", "rank_corr")


def flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        out |= flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value}
    return out


def changed_settings(recipe: dict[str, Any], lever: dict[str, Any]) -> dict[str, list]:
    """{key: [recipe's value, lever's value]} of the config keys the lever changed (UNCOMPARED left out).
    A key a run's config.json lacks (the run predates the key) has the recipe's value
    (`p4g_proxy.py:recipe`)."""
    now = flat(get_config("recipe").to_dict())
    a, b = now | flat(recipe), now | flat(lever)
    return {k: [a[k], b[k]] for k in sorted(a) if a[k] != b[k] and k not in UNCOMPARED}


def dialogues_file(run: pathlib.Path) -> pathlib.Path:
    for name in ("dialogues.jsonl", "dialogues.jsonl.gz"):
        if (run / name).exists():
            return run / name
    raise SystemExit(f"p4g_proxy_levers: {run} has no dialogues.jsonl; run its p4g_proxy config to the end")


def last_heldout_nll(run: pathlib.Path) -> float:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["heldout_nll"] for r in records if "heldout_nll" in r][-1]


def gather(recipe: pathlib.Path, levers: dict[str, pathlib.Path]) -> dict[str, Any]:
    """levers.json's content: the recipe's and each lever's record."""
    runs = {"recipe": recipe, **levers}
    configs = {name: json.loads((run / "config.json").read_text()) for name, run in runs.items()}
    settings = {name: {"changed": changed_settings(configs["recipe"], configs[name]),
                       "heldout_nll": last_heldout_nll(run)} for name, run in runs.items()}
    dialogues = {name: dialogues_file(run) for name, run in runs.items()}
    return scored(settings, dialogues, ml_collections.ConfigDict(configs["recipe"]))


def rescored(data_dir: str | None = None) -> dict[str, Any]:
    """levers.json's content again from the committed runs (RESULTS): their recorded settings and held-out
    NLLs, their dialogues scored by today's donation reader, with the recipe's config
    (`p4g_proxy.py:recipe`; `data_dir` overrides its data folder)."""
    committed = json.loads((RESULTS / "levers.json").read_text())
    settings = {name: {key: r[key] for key in ("changed", "heldout_nll")} for name, r in committed.items()}
    config = get_config("recipe")
    if data_dir is not None:
        config.data.data_dir = data_dir
    return scored(settings, {name: RESULTS / name / "dialogues.jsonl.gz" for name in committed}, config)


def scored(settings: dict[str, dict], dialogues: dict[str, pathlib.Path],
           config: ml_collections.ConfigDict) -> dict[str, Any]:
    """Each run's record: its `settings` (changed settings and held-out NLL), its proxy's fidelity scored
    from its `dialogues`, the goals met and, for a lever, its paired change from the recipe's."""
    transcripts = {name: p4g_proxy.scored_transcripts(path) for name, path in dialogues.items()}
    own = transcripts["recipe"][1]
    for name, (_, theirs, _) in transcripts.items():
        if not np.array_equal(theirs, own):
            raise SystemExit(f"p4g_proxy_levers: {name}'s dialogues are not of the recipe's participants")
    donations = {name: arms["proxy"] for name, (arms, _, _) in transcripts.items()}
    env, _, _ = p4g_proxy.heldout_cases(config)
    others, ceiling = p4g_proxy.references(config, env)
    seed = config.seed
    indices = fs.resamples(len(own), np.random.default_rng([seed, 5]))  # fidelity_results' resamples
    results = {}
    for name in dialogues:
        fidelity = p4g_proxy.fidelity_results({"proxy": donations[name]}, own, others, ceiling, seed)
        proxy = fidelity["arms"]["proxy"]
        results[name] = {**settings[name], "proxy": proxy, "goals_met": p4g_proxy.goals_met(proxy)}
        if name != "recipe":
            results[name]["vs_recipe"] = fs.bootstrap(paired_change, indices, donations[name],
                                                      donations["recipe"], own)
    return results


def paired_change(lever: np.ndarray, recipe: np.ndarray, own: np.ndarray) -> dict[str, float]:
    """The lever's statistics minus the recipe's, on the same participants."""
    a, b = fs.arm_statistics(lever, own), fs.arm_statistics(recipe, own)
    return {key: a[key] - b[key] for key in CHANGES}


def ranged(value: dict[str, float]) -> str:
    return f"{value['value']:+.3f} [{value['low']:+.3f}, {value['high']:+.3f}]"


def stat(key: str) -> Callable[[dict], str]:
    cell = p4g_proxy.ranged_cell(key)
    return lambda r: cell(r["proxy"])


def settings(r: dict) -> str:
    return ", ".join(f"`{k}` {a} -> {b}" for k, (a, b) in r["changed"].items()) or "(the recipe)"


def change(key: str) -> Callable[[dict], str]:
    return lambda r: ranged(r["vs_recipe"][key]) if "vs_recipe" in r else ""


# The table: (header, cell of one run's record)
COLUMNS: tuple[tuple[str, Callable[[dict], str]], ...] = (
    ("changed from the recipe", settings),
    ("held-out NLL", lambda r: f"{r['heldout_nll']:.4f}"),
    ("unreadable", stat("unreadable")),
    ("KS", stat("ks")),
    ("hist L1 (human floor at its sizes)",
     lambda r: f"{stat('hist_l1')(r)} ({r['proxy']['floor']['hist_l1']['mean']:.3f})"),
    ("rank corr. with own donation", stat("rank_corr")),
    ("goals met", lambda r: f"{sum(r['goals_met'])} of {len(r['goals_met'])}"),
    ("Δ unreadable", change("unreadable")),
    ("Δ KS", change("ks")),
    ("Δ hist L1", change("hist_l1")),
    ("Δ rank corr.", change("rank_corr")),
)


def table(results: dict[str, dict]) -> str:
    lines = ["| run | " + " | ".join(h for h, _ in COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    lines += [f"| {name} | " + " | ".join(cell(r) for _, cell in COLUMNS) + " |"
              for name, r in results.items()]
    return "\n".join(lines) + (
        "\n\nValue [95% interval]: a bootstrap over the held-out participants. Δ: the lever minus the "
        "recipe, paired by participant (the same resamples for both), so an interval that excludes 0 is a "
        f"change the lever made. Goals (issue 32): {'; '.join(goal for goal, *_ in p4g_proxy.GOALS)}.")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", help="the run directory of the recipe as committed")
    parser.add_argument("--lever", action="append", default=[], metavar="NAME=DIR",
                        help="a lever's name and run directory (repeatable)")
    parser.add_argument("--rescore", action="store_true",
                        help="no runs: the committed table again from the committed dialogues (`rescored`)")
    args = parser.parse_args(argv)
    if args.rescore:
        if args.recipe or args.lever:
            parser.error("--rescore takes no --recipe or --lever: it scores the committed runs")
        write_table(rescored())
        return
    if not (args.recipe and args.lever):
        parser.error("give --recipe and at least one --lever (or --rescore)")
    levers = {}
    for spec in args.lever:
        name, sep, run = spec.partition("=")
        if not sep or not name or name == "recipe":
            raise SystemExit(f"p4g_proxy_levers: --lever {spec!r} is not NAME=DIR (NAME not 'recipe')")
        levers[name] = pathlib.Path(run)
    results = gather(pathlib.Path(args.recipe), levers)
    RESULTS.mkdir(parents=True, exist_ok=True)
    for name, run in {"recipe": pathlib.Path(args.recipe), **levers}.items():
        shutil.rmtree(RESULTS / name, ignore_errors=True)
        (RESULTS / name).mkdir()
        shutil.copy(run / "summary.md", RESULTS / name / "summary.md")
        source = dialogues_file(run)
        with (gzip.open if source.suffix == ".gz" else open)(source, "rb") as f, \
                gzip.GzipFile(RESULTS / name / "dialogues.jsonl.gz", "wb", mtime=0) as out:  # same bytes
            shutil.copyfileobj(f, out)
    write_table(results)


def write_table(results: dict[str, dict]) -> None:
    (RESULTS / "levers.json").write_text(json.dumps(results, indent=1) + "\n")
    (RESULTS / "levers.md").write_text(table(results) + "\n")
    print(table(results))


if __name__ == "__main__":
    main()
