"""A loaded domain (policy, databases, tasks, splits, toolkits) and the states episodes start from.

`load_domain(data_dir, name)` reads a domain once per process (cached), normalises its records into
tau2-bench's field order, and keeps them as the shared base of every episode's databases. A
`DomainState` is one episode's pair of toolkits (agent side, and user side where the domain has one)
over fresh databases; `Domain.initial_state(task)` applies the task's initial state to one, and
`Domain.gold_replay(task)` runs the task's gold actions on another (failing ones fail and are kept, as
in tau2-bench, whose evaluator ignores them).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
from typing import Callable

from scope_jax.envs.tau2 import data, mock, retail
from scope_jax.envs.tau2.db import BaseTables, Database, Record, copy_json, deep_merge
from scope_jax.envs.tau2.tasks import Task, Tau2DataError
from scope_jax.envs.tau2.toolkit import ASSISTANT, USER, Toolkit
from scope_jax.envs.tau2.trajectory import TOOL, Turn, history_turns


@dataclasses.dataclass(frozen=True)
class DomainSpec:
    """What a domain's code provides: its toolkits, table names and record normaliser."""

    agent_tools: type[Toolkit]
    agent_tables: tuple[str, ...]
    normalize: Callable[[str, Record], Record]
    user_tools: type[Toolkit] | None = None
    user_tables: tuple[str, ...] = ()


DOMAINS = {
    "retail": DomainSpec(retail.RetailTools, retail.TABLES, retail.normalize_record),
    "mock": DomainSpec(mock.MockTools, mock.AGENT_TABLES, mock.normalize_record, mock.MockUserTools,
                       mock.USER_TABLES),
}


@dataclasses.dataclass
class DomainState:
    """One episode's toolkits over its databases; `user` is None where the user has no tools."""

    agent: Toolkit
    user: Toolkit | None

    def toolkit(self, side: str) -> Toolkit:
        if side == ASSISTANT:
            return self.agent
        if side == USER and self.user is not None:
            return self.user
        raise ValueError(f"no {side!r} toolkit in this domain")

    def hashes(self) -> tuple[str, str | None]:
        """(agent-side DB hash, user-side DB hash or None)."""
        return self.agent.db.hash(), None if self.user is None else self.user.db.hash()


@dataclasses.dataclass(frozen=True)
class GoldReplay:
    state: DomainState
    errors: tuple[tuple[str, str], ...]  # (action id, error result) of each failing gold action


@dataclasses.dataclass(frozen=True, eq=False)
class Domain:
    name: str
    policy: str
    tasks: dict[str, Task]
    splits: dict[str, tuple[str, ...]]
    spec: DomainSpec
    agent_base: BaseTables
    user_base: BaseTables | None

    def fresh(self, fix_quirks: bool = False) -> DomainState:
        """Toolkits over fresh copies of the loaded databases."""
        user = None
        if self.spec.user_tools is not None:
            user = self.spec.user_tools(Database(self.user_base), fix_quirks)
        return DomainState(self.spec.agent_tools(Database(self.agent_base), fix_quirks), user)

    def initial_state(self, task: Task, fix_quirks: bool = False) -> DomainState:
        """A fresh state with the task's initial state applied, in tau2-bench's order: data merged into
        the databases, initialisation actions run, then the tool calls of the message history replayed
        (their recorded results must match)."""
        state = self.fresh(fix_quirks)
        init = task.initial_state
        for key, side in (("agent_data", ASSISTANT), ("user_data", USER)):
            update = (init.initialization_data or {}).get(key)
            if update:
                self._merge(state.toolkit(side).db, update, task)
        for action in init.initialization_actions:
            try:
                state.toolkit(action.env_type).invoke(action.func_name, action.arguments)
            except Exception as e:  # a data error: the task cannot start
                raise Tau2DataError(f"task {task.id}: initialization action {action.func_name} failed: "
                                    f"{e}") from e
        self._replay_history(state, history_turns(init.message_history, task.id), task)
        return state

    def _merge(self, db: Database, update: dict, task: Task) -> None:
        for table, records in update.items():
            if table not in db.table_names or not isinstance(records, dict):
                raise Tau2DataError(f"task {task.id}: initialization data names no table {table!r}")
            for key, record in records.items():
                if db.get(table, key) is None:
                    db.insert(table, key, self.spec.normalize(table, copy_json(record)))
                else:
                    merged = db.writable(table, key)
                    deep_merge(merged, record)
                    db.insert(table, key, self.spec.normalize(table, merged))

    @staticmethod
    def _replay_history(state: DomainState, turns: list[Turn], task: Task) -> None:
        recorded = {t.tool_call_id: t.content for t in turns if t.role == TOOL}
        for turn in turns:
            for call in turn.tool_calls:
                result = state.toolkit(call.requestor).call(call.name, call.arguments)
                if call.id in recorded and not _same_result(result.content, recorded[call.id]):
                    raise Tau2DataError(f"task {task.id}: replaying history call {call.id} ({call.name}) "
                                        f"gives {result.content!r}; the history has {recorded[call.id]!r}")

    def gold_replay(self, task: Task, fix_quirks: bool = False) -> GoldReplay:
        """The task's initial state with its gold actions run in order, each on its requestor's toolkit."""
        state = self.initial_state(task, fix_quirks)
        errors = []
        actions = task.criteria.actions if task.criteria is not None else None
        for action in actions or ():
            result = state.toolkit(action.call.requestor).call(action.call.name, action.call.arguments)
            if result.error:
                errors.append((action.action_id, result.content))
        return GoldReplay(state, tuple(errors))

    def split(self, name: str) -> tuple[Task, ...]:
        if name not in self.splits:
            raise ValueError(f"domain {self.name} has no split {name!r}; its splits: "
                             f"{', '.join(self.splits)}")
        return tuple(self.tasks[i] for i in self.splits[name])


def _same_result(content: str, recorded: str | None) -> bool:
    """Results compared as tau2-bench does: as JSON where both parse, else as text."""
    try:
        return json.loads(content) == json.loads(recorded or "")
    except json.JSONDecodeError:
        return content == recorded


@functools.lru_cache(maxsize=None)
def _load(data_dir: str, name: str) -> Domain:
    folder = data.domain_dir(data_dir, name)
    spec = DOMAINS[name]

    def base(file: str, tables: tuple[str, ...]) -> BaseTables:
        path = folder / file
        raw = data.read_tables(path)
        if sorted(raw) != sorted(tables):
            raise Tau2DataError(f"tau2 database {path} has the tables {', '.join(raw)}; "
                                f"expected {', '.join(tables)}")
        try:
            return BaseTables({t: {k: spec.normalize(t, r) for k, r in raw[t].items()} for t in tables})
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise Tau2DataError(f"tau2 database {path}: {e}") from None

    tasks = data.read_tasks(folder / "tasks.json")
    return Domain(name=name, policy=data.read_text(folder / "policy.md"), tasks=tasks,
                  splits=data.read_splits(folder / "split_tasks.json", tasks), spec=spec,
                  agent_base=base("db.json", spec.agent_tables),
                  user_base=base("user_db.json", spec.user_tables) if spec.user_tools is not None else None)


def load_domain(data_dir: str | pathlib.Path, name: str) -> Domain:
    """The domain `name` ("retail" or "mock") of a tau2 data folder, read once per process."""
    if name not in DOMAINS:
        raise ValueError(f"unknown tau2 domain {name!r}; known: {', '.join(DOMAINS)}")
    return _load(str(pathlib.Path(data_dir).resolve()), name)
