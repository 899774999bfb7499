"""Job `tau2_replay`: every task's gold actions played through the tau2 environment, no model.

For each task of each domain, an oracle agent (scope_jax.envs.tau2.scripted) makes the task's gold
agent actions as tool calls, one per turn, against a scripted user that opens and then stops; the
environment executes the calls, and its evaluator grades the episode (NL assertions: not evaluated,
there is no judge). Three checks, each mismatch logged as an error, listed in summary.md and raised
at the end (after everything is written):
  live     the episode's end-state hash equals the gold replay's (the driver changes nothing)
  sheet    the gold hash equals the fact sheet's (Appendix A: retail, quirks reproduced)
  initial  the fresh retail DB hash equals the sheet's
summary.json: per domain the initial hash and per task {hash, user_hash, gold_hash, sheet_prefix,
live_match, sheet_match, reward, termination, basis, scored, not_evaluated, gold_errors}, plus the
mismatch list.
"""

from __future__ import annotations

import json
import logging
import pathlib

import ml_collections

from scope_jax.config import ConfigError, at_least, one_of, require
from scope_jax.dialogue.episode import AGENT, SIM, Episode
from scope_jax.dialogue.rollout import rollout_scripted
from scope_jax.envs.tau2 import Tau2Env, scripted
from scope_jax.envs.tau2.domain import DOMAINS
from scope_jax.envs.tau2.evaluator import GRADINGS
from scope_jax.training.run_dir import RunDir

log = logging.getLogger(__name__)


def default_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.experiment = "tau2_replay"
    c.data_dir = "../shared/data/tau2"
    c.domains = ("retail", "mock")
    c.fix_quirks = False  # True: hashes change by design, so the sheet check is skipped
    c.grading = "basis"
    c.max_steps = 200
    c.max_errors = 10
    c.reference = "experiments/configs/tau2_gold_hashes.json"  # the fact sheet's hashes
    return c


RULES = {"grading": one_of(GRADINGS), "max_steps": at_least(1), "max_errors": at_least(1)}


def check(config: ml_collections.ConfigDict) -> None:
    unknown = set(config.domains) - set(DOMAINS)
    if unknown or not config.domains:
        raise ConfigError(f"config key 'domains' must be a non-empty subset of {', '.join(DOMAINS)}")
    require(config, RULES)
    if not pathlib.Path(config.reference).is_file():
        raise ConfigError(f"config key 'reference': no file {config.reference}")
    for domain in config.domains:
        try:
            _env(config, domain)  # reads the domain's files, once per process: the run's come from its cache
        except ValueError as e:  # Tau2DataError, or a split the folder's split_tasks.json lacks
            raise ConfigError(f"config key 'data_dir': {e}") from None


def _env(config, domain: str) -> Tau2Env:
    splits = {} if domain == "retail" else {"train_split": "base", "eval_split": "base"}
    return Tau2Env(data_dir=config.data_dir, domain=domain, max_steps=config.max_steps,
                   max_errors=config.max_errors, grading=config.grading, fix_quirks=config.fix_quirks,
                   **splits)


def replay_domain(config, domain: str, reference: dict) -> tuple[dict, list[str]]:
    """(the domain's summary, its mismatches)."""
    env = _env(config, domain)
    sheet = reference["retail_gold_prefixes"] if domain == "retail" and not config.fix_quirks else {}
    mismatches = []
    initial = env.domain_data.fresh(config.fix_quirks).hashes()[0]
    if domain == "retail" and not config.fix_quirks and initial != reference["retail_initial"]:
        mismatches.append(f"initial retail hash {initial} != sheet {reference['retail_initial']}")
    tasks = {}
    tasks_of = env.domain_data.tasks
    for task_id, task in RunDir.progress(tasks_of.items(), desc=f"{domain} tasks", total=len(tasks_of)):
        replies = {AGENT: scripted.oracle_agent(task), SIM: scripted.scripted_user()}
        episode = rollout_scripted(env, [Episode(task, group=0)], replies)[0]
        evaluation = episode.info["tau2_evaluation"]
        live = episode.info["tau2"].state.hashes()
        gold = env.gold_hashes(task)
        prefix = sheet.get(task_id)
        record = {"hash": live[0], "user_hash": live[1], "gold_hash": gold[0], "sheet_prefix": prefix,
                  "live_match": live == gold,
                  "sheet_match": None if prefix is None else gold[0].startswith(prefix),
                  "reward": evaluation.reward, "termination": evaluation.termination,
                  "basis": list(evaluation.basis), "scored": list(evaluation.scored),
                  "not_evaluated": list(evaluation.not_evaluated),
                  "gold_errors": [e for _, e in env.domain_data.gold_replay(task, config.fix_quirks).errors]}
        if not record["live_match"]:
            mismatches.append(f"{domain} task {task_id}: end state {live} != gold replay {gold}")
        if record["sheet_match"] is False:
            mismatches.append(f"{domain} task {task_id}: gold hash {gold[0][:10]} != sheet {prefix}")
        tasks[task_id] = record
    missing = sorted(set(sheet) - set(tasks), key=int)
    if missing:
        mismatches.append(f"{domain}: tasks of the sheet not in the data: {', '.join(missing)}")
    return {"initial_hash": initial, "tasks": tasks}, mismatches


def run(config: ml_collections.ConfigDict, run_dir) -> None:
    reference = json.loads(pathlib.Path(config.reference).read_text())
    summary, mismatches = {"domains": {}}, []
    for domain in config.domains:
        summary["domains"][domain], found = replay_domain(config, domain, reference)
        mismatches += found
    summary["mismatches"] = mismatches
    for line in mismatches:
        log.error("MISMATCH %s", line)
    run_dir.write_json("summary.json", summary)
    run_dir.write_summary(_summary(config, summary))
    if mismatches:
        raise RuntimeError(f"tau2 replay: {len(mismatches)} mismatches (summary.md lists them); first: "
                           f"{mismatches[0]}")


def _summary(config, summary: dict) -> str:
    rows = []
    for domain, result in summary["domains"].items():
        tasks = result["tasks"].values()
        checked = [t for t in tasks if t["sheet_match"] is not None]
        rows.append(f"| {domain} | {len(tasks)} | {sum(t['live_match'] for t in tasks)} | "
                    f"{sum(bool(t['sheet_match']) for t in checked)} / {len(checked)} | "
                    f"{sum(t['reward'] == 1.0 for t in tasks)} | "
                    f"{sum(bool(t['not_evaluated']) for t in tasks)} |")
    lines = ["# tau2 gold replay", "",
             f"Oracle agent (gold actions) vs scripted user through Tau2Env; grading `{config.grading}`, "
             f"quirk fixes {'on' if config.fix_quirks else 'off'}; no judge.", "",
             "| domain | tasks | end state = gold replay | gold = sheet | reward 1 | NL not evaluated |",
             "|---|---|---|---|---|---|", *rows, ""]
    if summary["mismatches"]:
        lines += ["## MISMATCHES", "", *[f"- {m}" for m in summary["mismatches"]]]
    else:
        lines.append("No mismatches.")
    return "\n".join(lines)
