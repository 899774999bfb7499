"""Job `cooperbench_gold`: scripted agents (no model) play every task pair of a folder of CooperBench tasks.

The agents (scope_jax/envs/cooperbench/scripted.py): "gold" applies its feature's gold patch through the
tools and must score 1 where its merge had no conflict; "empty" finishes at once and must score 0. Each
plays every pair in each mode ("coop": one feature per seat, the seats' changes merged; "solo": one
agent, both features) through the environment's own methods. Where two gold patches conflict under the
plain merge (76.5% of the real dataset's pairs do), what the union merge makes of them is a measured
outcome, not an expectation: such rows have no expected reward, and the totals give the conflict rate
and the mean reward on conflicting pairs. Writes summary.json (one row per agent, mode and pair: the
rewards, the merge outcome, each feature's test result; and totals per agent and mode) and summary.md.
Rows off their expected reward, and pairs that could not be played (a task whose gold patch fails its own
tests: reward None), are listed in both, and the run then exits with an error.
"""

from __future__ import annotations

import collections
from typing import Any

import ml_collections
import numpy as np

from scope_jax.config import ConfigError
from scope_jax.dialogue.episode import Episode
from scope_jax.dialogue.rollout import rollout_scripted
from scope_jax.envs.cooperbench import CooperBenchEnv, TaskFormatError, load_tasks
from scope_jax.envs.cooperbench.environment import MODES, RECORD
from scope_jax.envs.cooperbench.sandbox import ISOLATIONS
from scope_jax.envs.cooperbench.scripted import SPEAKERS
from scope_jax.envs.cooperbench.suite import SUITE_DIR

EXPECTED_REWARD = {"gold": 1.0, "empty": 0.0}
TOTALS = ("reward", "success", "partial", "naive_conflict", "merge_failed", "messages_sent", "steps")
EXPECTS_ON_CONFLICT = {"gold": False, "empty": True}  # whether the expectation holds after a conflict


def default_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.experiment = "cooperbench_gold"
    c.tasks_dir = str(SUITE_DIR)  # any folder of tasks in the real layout
    c.agents = ("gold", "empty")
    c.modes = ("coop", "solo")
    c.max_turns = 16
    c.isolation = "namespaces"  # sandbox: namespaces, or "process" to accept the weaker level
    c.test_wall_seconds = 20.0
    return c


def check(config: ml_collections.ConfigDict) -> None:
    for key, values, known in (("agents", config.agents, EXPECTED_REWARD), ("modes", config.modes, MODES)):
        unknown = [v for v in values if v not in known]
        if unknown or not values:
            raise ConfigError(f"config key '{key}' must list some of {', '.join(known)}, got {list(values)}")
    if config.isolation not in ISOLATIONS:
        raise ConfigError(f"config key 'isolation' must be one of {', '.join(ISOLATIONS)}")
    try:
        load_tasks(config.tasks_dir)
    except TaskFormatError as e:
        raise ConfigError(f"config key 'tasks_dir': {e}") from None


def _expected(agent: str, conflict_hunks: int) -> float | None:
    """The reward `agent` must get; None: a measured outcome (gold patches that conflict)."""
    return EXPECTED_REWARD[agent] if conflict_hunks == 0 or EXPECTS_ON_CONFLICT[agent] else None


def _row(agent: str, mode: str, episode: Episode) -> dict[str, Any]:
    record = episode.info[RECORD]
    reward = episode.rewards["agent"]
    expected = _expected(agent, record["merge"]["conflicts"])
    return {"agent": agent, "mode": mode, "task": episode.scenario.task.name,
            "features": list(episode.scenario.features), "reward": reward, "expected_reward": expected,
            "ok": expected in (None, reward), "end_reason": episode.end_reason, "rewards": episode.rewards,
            "merge": record["merge"], "feature_results": record["features"], "dropped": record["dropped"],
            "seats": record["seats"]}


def _play_all(env: CooperBenchEnv, agent: str, mode: str, run_dir) -> list[dict[str, Any]]:
    """One row per pair; a task whose gold patch fails its own tests gets an error row (reward None)."""
    speakers = {role: SPEAKERS[agent](env, role) for role in env.roles}
    rows = []
    for group, pair in enumerate(run_dir.progress(env.pairs, desc=f"{agent} {mode}")):
        try:
            rows.append(_row(agent, mode, rollout_scripted(env, [Episode(pair, group)], speakers)[0]))
        except TaskFormatError as e:
            rows.append({"agent": agent, "mode": mode, "task": pair.task.name,
                         "features": list(pair.features), "reward": None,
                         "expected_reward": EXPECTED_REWARD[agent], "ok": False, "end_reason": "error",
                         "error": str(e), "rewards": {}, "merge": {"status": "error", "conflicts": None},
                         "feature_results": []})
    return rows


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def _totals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups = sorted({(r["agent"], r["mode"]) for r in rows})
    totals = []
    for agent, mode in groups:
        members = [r for r in rows if (r["agent"], r["mode"]) == (agent, mode)]
        scored = [r["rewards"] for r in members if r["rewards"]]
        means = {key: _mean([r["agent" if key == "reward" else key] for r in scored]) for key in TOTALS}
        conflicting = [r["reward"] for r in members if r["rewards"] and r["merge"]["conflicts"]]
        totals.append({"agent": agent, "mode": mode, "episodes": len(members),
                       "errors": sum(not r["rewards"] for r in members),
                       "measured": sum(r["expected_reward"] is None for r in members),
                       "reward_on_conflicts": _mean(conflicting),
                       "off_expected": sum(not r["ok"] for r in members), **means})
    return totals


def _number(pattern: str):
    return lambda value: "-" if value is None else pattern.format(value)


ROW_COLUMNS = (  # (header, row key, formatter)
    ("agent", "agent", str), ("mode", "mode", str), ("task", "task", str),
    ("pair", "features", lambda f: f"f{f[0]}+f{f[1]}"), ("merge", "merge", lambda m: m["status"]),
    ("conflict hunks", "merge", lambda m: "-" if m["conflicts"] is None else str(m["conflicts"])),
    ("features passed", "feature_results", lambda fs: "/".join("yes" if f["passed"] else "no" for f in fs)),
    ("reward", "reward", _number("{:.0f}")),
    ("expected", "expected_reward", lambda e: "measured" if e is None else f"{e:.0f}"),
    ("ok", "ok", lambda ok: "yes" if ok else "**NO**"),
)
TOTAL_COLUMNS = (
    ("agent", "agent", str), ("mode", "mode", str), ("episodes", "episodes", str),
    ("mean reward", "reward", _number("{:.3f}")),
    ("naive conflict rate", "naive_conflict", _number("{:.3f}")),
    ("mean reward on conflicting pairs", "reward_on_conflicts", _number("{:.3f}")),
    ("unresolved merges", "merge_failed", _number("{:.3f}")),
    ("messages", "messages_sent", _number("{:.2f}")),
    ("measured", "measured", str), ("errors", "errors", str), ("off expected", "off_expected", str),
)


def markdown_table(columns, rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(header for header, _, _ in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(row[key]) for _, key, fmt in columns) + " |" for row in rows]
    return "\n".join(lines)


def run(config: ml_collections.ConfigDict, run_dir) -> None:
    rows, fallbacks, tampered = [], collections.Counter(), 0
    for mode in config.modes:
        env = CooperBenchEnv(tasks_dir=config.tasks_dir, mode=mode, max_turns=config.max_turns,
                             isolation=config.isolation, test_wall_seconds=config.test_wall_seconds)
        try:
            for agent in config.agents:
                rows += _play_all(env, agent, mode, run_dir)
        finally:
            isolation = env.evaluator.isolation
            fallbacks.update(env.evaluator.fallbacks)
            tampered += env.evaluator.tampered
            env.close()
    totals = _totals(rows)
    failures = [f"{r['agent']} {r['mode']} {r['task']} f{r['features'][0]}+f{r['features'][1]}: "
                + (f"not played ({r['error']})" if "error" in r
                   else f"reward {r['reward']:g}, expected {r['expected_reward']:g}")
                for r in rows if not r["ok"]]
    run_dir.log(0, {f"{t['agent']}/{t['mode']}/{key}": t[key] for t in totals for key in TOTALS
                    if t[key] is not None})
    run_dir.write_json("summary.json", {"tasks_dir": config.tasks_dir, "isolation": isolation,
                                        "sandbox_fallbacks": dict(fallbacks), "tampered_runs": tampered,
                                        "rows": rows, "totals": totals, "failures": failures})
    verdict = ("All rows score their expected reward." if not failures
               else "Rows off their expected reward:\n\n" + "\n".join(f"- {f}" for f in failures))
    caps = "; ".join(f"{cap}: {n} runs" for cap, n in fallbacks.items()) or "none"
    run_dir.write_summary(f"# CooperBench scripted agents\n\nTasks: `{config.tasks_dir}`; sandbox isolation: "
                          f"{isolation}; sandbox fallbacks: {caps}; tampered runs: {tampered}.\n\n"
                          f"{markdown_table(TOTAL_COLUMNS, totals)}\n\n{verdict}\n\n"
                          f"{markdown_table(ROW_COLUMNS, rows)}")
    if failures:
        raise SystemExit(f"error: {len(failures)} row(s) off their expected reward (see summary.md): "
                         + "; ".join(failures[:3]))
