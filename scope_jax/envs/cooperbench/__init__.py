"""CooperBench: two coding agents, one feature each, in their own worktrees, merged and tested in a sandbox.

Modules, one concept each: tasks (the task layout and loader), repo (git: base repositories, worktrees,
diffs), sandbox (limited test runs), tools (tool calls as text, the file tools), merge (stripping and
merging the agents' changes), evaluation (hidden tests on the merge), environment (the Environment),
scripted (gold and empty agents and their host loop), check (the suite's build check), suite/ (our
tasks). docs/cooperbench.md describes the whole.
"""

from scope_jax.envs.cooperbench.environment import CooperBenchEnv, Pair
from scope_jax.envs.cooperbench.tasks import Task, TaskFormatError, load_task, load_tasks

__all__ = ["CooperBenchEnv", "Pair", "Task", "TaskFormatError", "load_task", "load_tasks"]
