"""Tasks of a domain (tasks.json) and their splits (split_tasks.json), as read-only records.

A task holds the user's scenario, an optional initial state (mock only: a message history to resume,
data merged into the databases, toolkit calls to run first) and the evaluation criteria: gold actions,
environment assertions, strings the agent must communicate, natural-language assertions for a judge,
and the reward basis (tau2-bench's default [DB, COMMUNICATE] where the field is absent).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from scope_jax.envs.tau2.toolkit import ASSISTANT, ToolCall

REWARD_TYPES = DB, ENV_ASSERTION, ACTION, COMMUNICATE, NL_ASSERTION = (
    "DB", "ENV_ASSERTION", "ACTION", "COMMUNICATE", "NL_ASSERTION")
DEFAULT_BASIS = (DB, COMMUNICATE)


class Tau2DataError(ValueError):
    """A tau2 data file is missing or does not have the expected form."""


@dataclasses.dataclass(frozen=True)
class Action:
    """A gold action: a tool call; `compare_args` (None: the predicted call's own keys) decides which
    arguments must match for the ACTION check."""

    action_id: str
    call: ToolCall
    compare_args: tuple[str, ...] | None = None


@dataclasses.dataclass(frozen=True)
class ToolkitCall:
    """A call of a tool or helper on one side's toolkit: an environment assertion (it must return
    `assert_value`) or an initialisation action."""

    env_type: str  # "assistant" or "user"
    func_name: str
    arguments: dict[str, Any]
    assert_value: bool = True


@dataclasses.dataclass(frozen=True)
class Criteria:
    actions: tuple[Action, ...] | None
    env_assertions: tuple[ToolkitCall, ...] | None
    communicate_info: tuple[str, ...]
    nl_assertions: tuple[str, ...]
    reward_basis: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class InitialState:
    message_history: tuple[dict[str, Any], ...] = ()
    initialization_data: dict[str, Any] | None = None
    initialization_actions: tuple[ToolkitCall, ...] = ()


@dataclasses.dataclass(frozen=True, eq=False)
class Task:
    """One task. `instructions` is a string (mock) or the structured retail form (a dict with domain,
    reason_for_call, known_info, unknown_info, task_instructions)."""

    id: str
    persona: str | None
    instructions: str | dict[str, Any]
    initial_state: InitialState
    criteria: Criteria | None

    def __str__(self) -> str:
        return self.id


def _field(record: dict, key: str, where: str) -> Any:
    if key not in record:
        raise Tau2DataError(f"{where} lacks the field {key!r}")
    return record[key]


def _toolkit_call(record: dict, where: str) -> ToolkitCall:
    return ToolkitCall(env_type=_field(record, "env_type", where),
                       func_name=_field(record, "func_name", where),
                       arguments=dict(record.get("arguments") or {}),
                       assert_value=bool(record.get("assert_value", True)))


def _criteria(record: dict | None, where: str) -> Criteria | None:
    if record is None:
        return None
    actions = None
    if record.get("actions") is not None:
        actions = tuple(
            Action(action_id=str(a.get("action_id", i)),
                   call=ToolCall(_field(a, "name", where), dict(a.get("arguments") or {}),
                                 requestor=a.get("requestor") or ASSISTANT),
                   compare_args=None if a.get("compare_args") is None else tuple(a["compare_args"]))
            for i, a in enumerate(record["actions"]))
    assertions = record.get("env_assertions")
    basis = tuple(record.get("reward_basis") or DEFAULT_BASIS)
    unknown = set(basis) - set(REWARD_TYPES)
    if unknown:
        raise Tau2DataError(f"{where}: unknown reward basis {', '.join(sorted(unknown))}")
    return Criteria(actions=actions,
                    env_assertions=None if assertions is None else tuple(_toolkit_call(x, where)
                                                                         for x in assertions),
                    communicate_info=tuple(record.get("communicate_info") or ()),
                    nl_assertions=tuple(record.get("nl_assertions") or ()), reward_basis=basis)


def parse_task(record: dict, where: str) -> Task:
    """A task from its tasks.json record; `where` names it in errors."""
    task_id = str(_field(record, "id", where))
    where = f"{where}, task {task_id}"
    scenario = _field(record, "user_scenario", where)
    initial = record.get("initial_state") or {}
    return Task(
        id=task_id, persona=scenario.get("persona"), instructions=_field(scenario, "instructions", where),
        initial_state=InitialState(
            message_history=tuple(initial.get("message_history") or ()),
            initialization_data=initial.get("initialization_data"),
            initialization_actions=tuple(_toolkit_call(x, where)
                                         for x in initial.get("initialization_actions") or ())),
        criteria=_criteria(record.get("evaluation_criteria"), where))


_INSTRUCTION_FIELDS = (("domain", "Domain"), ("reason_for_call", "Reason for call"),
                       ("known_info", "Known info"), ("unknown_info", "Unknown info"),
                       ("task_instructions", "Task instructions"))


def scenario_text(task: Task) -> str:
    """The user's scenario as the simulator is told it: an optional persona, then the instructions
    (structured ones one heading per field, each text indented below it)."""
    lines = []
    if task.persona:
        lines += ["Persona:", f"\t{task.persona}"]
    if isinstance(task.instructions, str):
        lines += ["Instructions:", task.instructions]
    else:
        lines.append("Instructions:")
        for key, heading in _INSTRUCTION_FIELDS:
            value = task.instructions.get(key)
            if key == "domain" and value:
                lines.append(f"\t{heading}: {value}")
            elif value:
                lines += [f"\t{heading}:", f"\t\t{value}"]
    return "\n".join(lines)
