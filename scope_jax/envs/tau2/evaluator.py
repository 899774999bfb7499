"""tau2-bench's evaluator: termination gate, the reward components, their product over the reward basis,
and pass^k.

Components (each 0 or 1):
  DB             the live databases' hashes (agent and user side) equal those after replaying the gold
                 actions on a fresh initial state; 1 when the task has neither actions nor assertions
  ENV_ASSERTION  every environment assertion, run on the live state, returns its `assert_value`
  ACTION         every gold action is matched by some tool call of the episode: same name and equal
                 arguments over `compare_args` (None: the keys the predicted call gives; []: name only)
  COMMUNICATE    every `communicate_info` string occurs, lower-cased, in some assistant text with its
                 commas removed (the greeting and text next to tool calls count)
  NL_ASSERTION   a judge model finds every natural-language assertion met (scope_jax.envs.tau2.judge)
The reward is the product over the basis: the task's `reward_basis` (grading "basis", tau2-bench from
1.0.0 on) or DB x COMMUNICATE for every task (grading "db_communicate", tau2-bench before 1.0.0, which
most published RL numbers use). An episode that did not end normally (user or agent stop) gets 0; its
cheap components are still computed, for diagnosis, but the judge is not asked. Without a judge (or
when the judge's reply breaks the contract, counted) NL_ASSERTION is *not evaluated*: the reward is the
product over the basis components that were scored, and the evaluation says which were and which not.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from scope_jax.envs.tau2.domain import DomainState
from scope_jax.envs.tau2.judge import Judge, JudgeError, judge_assertions
from scope_jax.envs.tau2.tasks import ACTION, COMMUNICATE, DB, ENV_ASSERTION, NL_ASSERTION, Action, Task
from scope_jax.envs.tau2.toolkit import ASSISTANT, ToolCall
from scope_jax.envs.tau2.trajectory import Turn

USER_STOP, AGENT_STOP = "user_stop", "agent_stop"
ENDED_NORMALLY = (USER_STOP, AGENT_STOP)
GRADINGS = ("basis", "db_communicate")
LEGACY_BASIS = (DB, COMMUNICATE)
SUCCESS_TOLERANCE = 1e-6


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """reward: the product over `scored`. basis: the components the grading asks for; scored: those that
    entered the reward; not_evaluated: those that could not be scored (NL_ASSERTION without a judge).
    components: every component computed, in or out of the basis."""

    reward: float
    termination: str
    basis: tuple[str, ...]
    scored: tuple[str, ...]
    not_evaluated: tuple[str, ...]
    components: dict[str, float]
    judge_failures: int = 0

    @property
    def ended_normally(self) -> bool:
        return self.termination in ENDED_NORMALLY


def action_matches(gold: Action, call: ToolCall) -> bool:
    if gold.call.name != call.name:
        return False
    keys = gold.compare_args if gold.compare_args is not None else tuple(call.arguments)
    return all(call.arguments.get(k) == gold.call.arguments.get(k) for k in keys)


def communicated(info: str, turns: Sequence[Turn]) -> bool:
    texts = [t.content for t in turns if t.role == ASSISTANT and t.content and t.content.strip()]
    return any(info.lower() in text.lower().replace(",", "") for text in texts)


def _assertion_holds(state: DomainState, assertion) -> bool:
    try:
        value = state.toolkit(assertion.env_type).invoke(assertion.func_name, assertion.arguments)
    except Exception:  # an assertion about something that does not exist fails
        return False
    return value == assertion.assert_value


def evaluate(task: Task, turns: Sequence[Turn], termination: str, live: DomainState,
             gold_hashes: tuple[str, str | None], judge: Judge | None = None,
             grading: str = "basis") -> Evaluation:
    """Grade one episode of `task`: its turns, how it ended, its live state and the gold state's hashes."""
    if grading not in GRADINGS:
        raise ValueError(f"grading {grading!r} is not one of {', '.join(GRADINGS)}")
    criteria = task.criteria
    if criteria is None:
        reward = float(termination in ENDED_NORMALLY)
        return Evaluation(reward, termination, (), (), (), {})
    basis = criteria.reward_basis if grading == "basis" else LEGACY_BASIS
    calls = [call for turn in turns for call in turn.tool_calls]
    components = {
        DB: 1.0 if criteria.actions is None and criteria.env_assertions is None
        else float(live.hashes() == tuple(gold_hashes)),
        ENV_ASSERTION: float(all(_assertion_holds(live, a) for a in criteria.env_assertions or ())),
        ACTION: float(all(any(action_matches(a, c) for c in calls) for a in criteria.actions or ())),
        COMMUNICATE: float(all(communicated(info, turns) for info in criteria.communicate_info)),
    }
    not_evaluated, judge_failures = [], 0
    if NL_ASSERTION in basis and termination in ENDED_NORMALLY:
        if not criteria.nl_assertions:
            components[NL_ASSERTION] = 1.0
        elif judge is None:
            not_evaluated.append(NL_ASSERTION)
        else:
            try:
                components[NL_ASSERTION] = float(all(judge_assertions(judge, turns, criteria.nl_assertions)))
            except JudgeError:
                not_evaluated.append(NL_ASSERTION)
                judge_failures = 1
    scored = tuple(c for c in basis if c in components)
    reward = math.prod(components[c] for c in scored) if termination in ENDED_NORMALLY else 0.0
    return Evaluation(float(reward), termination, tuple(basis), scored, tuple(not_evaluated), components,
                      judge_failures)


def is_success(reward: float) -> bool:
    return abs(reward - 1.0) <= SUCCESS_TOLERANCE


def pass_hat_k(trials: Sequence[Sequence[float]], k: int) -> float:
    """pass^k (tau-bench): the mean over tasks of C(c, k) / C(n, k), where a task's n trials hold c
    successes; every task needs n >= k."""
    if not trials or k < 1:
        raise ValueError("pass^k needs at least one task and k >= 1")
    scores = []
    for rewards in trials:
        n, c = len(rewards), sum(is_success(r) for r in rewards)
        if n < k:
            raise ValueError(f"pass^{k} needs at least {k} trials per task; a task has {n}")
        scores.append(math.comb(c, k) / math.comb(n, k))
    return sum(scores) / len(scores)
