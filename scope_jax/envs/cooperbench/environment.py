"""CooperBench as an Environment: two coding agents, one feature each, merged and tested at the end.

Roles. "agent" is seat 1 (the pair's smaller feature id; with `swap_seats`, the train split puts the
larger one there half the time) and "sim" seat 2, the partner: the simulator side in SCOPE's terms.
Each sees only its own feature.md. In mode "solo" the agent implements both features (both specs, the
same turn cap) and "sim" never speaks.

Turns. Every turn holds one tool call (tools.py). `after_turn` runs it in the speaker's own git worktree
and appends the result as an ENV message visible to the speaker only. It also makes the speaker's turn
itself private (`message.visible_to = (speaker,)`): neither agent sees the other's code or tool calls.
`send_message` is the one channel between them: its text is appended as an ENV message visible to the
partner, "[Message from your partner]: ..." (a forged prefix in the text is defused), and each agent has
its own sent text in its turn, so the messages are in both views. Unreadable calls and refused calls are
answered with an error and counted. Answers and delivered messages are strict UTF-8 text: a lone surrogate
(which a JSON escape such as "\\ud800" makes) becomes "?", so the next prompt can be tokenized.

Who speaks next (`TurnResult.next_speaker`): the other seat while it still works, else the same seat. A
seat stops working when it calls finish or has used `max_turns` turns; the episode ends when no seat
works. A turn given to a seat that has stopped is ignored (counted as `idle_turns`).

Rewards. At the end each seat's diff is computed from its worktree (agents never submit patches), and
the evaluator (evaluation.py) strips test files, merges (plain, then union) and runs both features'
hidden tests on the merge. Both roles get 1 when all the episode's features pass, else 0; with
`partial_credit` they get the fraction that passes instead. Logged with them (floats, averaged by the
loop): success, partial, feature_a_pass / feature_b_pass (seat 1's / seat 2's feature), naive_conflict
(the plain merge had conflicts), merge_failed (conflicts left unresolved), git_error (a seat's changes
could not be read by git, e.g. a nested repository it wrote or a file name that is not UTF-8: scored 0,
counted in `git_errors`, logged in one line), conflict_hunks, messages_sent,
tool_errors, idle_turns, finished (share of seats that called finish), steps. The full record (merge,
each feature's test result, each seat's stripped patch, error counts) is episode.info["cooperbench"].

Scenarios are the pairs of every task in `tasks_dir`. The tasks named in `eval_tasks` are held out: the
"eval" split draws from their pairs and "train" from the others' (with none named, both draw from all).

Forks. A deep copy of an episode (the collapse monitor branches episodes that way) gets its own worktree
for each seat, a new worktree with the original's files as they are at the copy: the copies continue,
and are evaluated and cleaned up, independently.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import weakref
from typing import Any

import numpy as np

from scope_jax.dialogue.environment import TurnResult
from scope_jax.dialogue.episode import AGENT, ENV, SIM, Episode, Message
from scope_jax.envs.cooperbench import repo, sandbox
from scope_jax.envs.cooperbench.evaluation import Evaluator, FeatureResult, Outcome, counts
from scope_jax.envs.cooperbench.merge import MergeResult, source_changes
from scope_jax.envs.cooperbench.suite import SUITE_DIR
from scope_jax.envs.cooperbench.tasks import Task, load_tasks
from scope_jax.envs.cooperbench.tools import (TOOLS, ToolCallError, ToolError, Worktree, clip, format_call,
                                              parse_call)

log = logging.getLogger(__name__)

MODES = ("coop", "solo")
SPLITS = ("train", "eval")
SESSION, RECORD = "cooperbench_session", "cooperbench"
MESSAGE_PREFIX = "[Message from your partner]: "
PATCH_RECORD_CHARS = 5000

COOP_PROMPT = """\
You are a software engineer adding one feature to a Python repository. At the same time another engineer, \
your partner, adds a different feature to the same repository, each of you in your own copy of it. You \
cannot see your partner's copy, only the messages you exchange. When you both stop, your changes and \
your partner's are merged and the tests of both features run on the merged code: the task succeeds only \
if both features work after the merge. Changes to test files are dropped. Edits of the same or \
neighbouring lines by both of you make the merge fail, so tell your partner early which files and lines \
you will change, and agree on who edits shared places such as imports and lists of exported names."""

SOLO_PROMPT = """\
You are a software engineer adding two features to a Python repository, in your own copy of it. When \
you stop, the tests of both features run on your code: the task succeeds only if both features work. \
Changes to test files are dropped."""

TOOLS_PROMPT = """\
Each of your replies must hold exactly one tool call: a JSON object with the tool's name under "tool" \
and its arguments next to it, for example {example}. For long text, write the JSON first and put the \
text in a fenced code block after it: write_file takes `content` from the first block, replace takes \
`old` and `new` from the first two. Lines of your reply outside the JSON and the blocks are ignored.
Tools:
{tools}"""


@dataclasses.dataclass(frozen=True)
class Pair:
    """A scenario: a task and the features its seats implement, in seat order."""

    task: Task
    features: tuple[int, int]

    def __str__(self) -> str:
        return f"{self.task.name}:f{self.features[0]}+f{self.features[1]}"


@dataclasses.dataclass
class Seat:
    """One agent's state in an episode. A deep copy forks the worktree (repos and task are shared)."""

    features: tuple[int, ...]
    worktree: pathlib.Path
    repos: repo.Repos = dataclasses.field(repr=False, compare=False)
    task: Task = dataclasses.field(repr=False, compare=False)
    steps: int = 0
    finished: bool = False
    messages_sent: int = 0
    idle_turns: int = 0
    errors: dict[str, int] = dataclasses.field(default_factory=dict)

    def count_error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def __deepcopy__(self, memo: dict) -> Seat:
        return dataclasses.replace(self, worktree=self.repos.fork_worktree(self.task, self.worktree),
                                   errors=dict(self.errors))


@dataclasses.dataclass
class CooperBenchEnv:
    """See the module docstring. tasks_dir: a folder of tasks in the real layout (default: our suite)."""

    tasks_dir: str = str(SUITE_DIR)
    mode: str = "coop"
    max_turns: int = 16  # turns per seat
    messaging: bool = True
    union_merge: bool = True
    partial_credit: bool = False
    exact_count: bool = True
    max_message_chars: int = 800
    max_messages: int = 8  # per seat
    max_observation_chars: int = 4000
    max_file_bytes: int = 64 << 10
    isolation: str = "namespaces"
    test_wall_seconds: float = 20.0
    eval_tasks: tuple[str, ...] = ()  # names of the tasks held out for the "eval" split
    swap_seats: bool = False  # train split: each drawn pair's seat order at random
    first_speaker: str = AGENT

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"cooperbench mode {self.mode!r} is unknown; known: {', '.join(MODES)}")
        self.tasks = load_tasks(self.tasks_dir)
        self.pairs = [Pair(task, pair) for task in self.tasks for pair in task.pairs()]
        unknown = sorted(set(self.eval_tasks) - {task.name for task in self.tasks})
        if unknown:
            raise ValueError(f"cooperbench eval_tasks {', '.join(unknown)} are not tasks of {self.tasks_dir}")
        held_out = [p for p in self.pairs if p.task.name in self.eval_tasks]
        trained = [p for p in self.pairs if p.task.name not in self.eval_tasks]
        if self.eval_tasks and not trained:
            raise ValueError("cooperbench eval_tasks holds out every task; the train split would be empty")
        self.split_pairs = {"train": trained, "eval": held_out or self.pairs}
        self.repos = repo.Repos()
        self._cleanup = weakref.finalize(self, self.repos.close)
        limits = sandbox.Limits(wall_seconds=self.test_wall_seconds)
        self.evaluator = Evaluator(self.repos, limits, self.isolation, self.union_merge, self.exact_count)
        self.git_errors = 0  # episodes scored 0 because git could not read a seat's changes

    def close(self) -> None:
        """Remove the worktrees and task repositories (also done when the environment is collected)."""
        self._cleanup()

    @property
    def roles(self) -> tuple[str, ...]:
        """The roles that hold a seat, in seat order."""
        return (AGENT, SIM) if self.mode == "coop" else (AGENT,)

    @property
    def tool_names(self) -> tuple[str, ...]:
        offered = self.messaging and self.mode == "coop"
        return tuple(t.name for t in TOOLS if offered or t.name != "send_message")

    def seat_features(self, scenario: Pair, role: str) -> tuple[int, ...]:
        if self.mode == "solo":
            return scenario.features if role == AGENT else ()
        return (scenario.features[self.roles.index(role)],)

    # ------------------------------------------------------------------------------------ the protocol

    def sample_scenarios(self, n: int, rng: np.random.Generator, split: str = "train") -> list[Any]:
        if split not in SPLITS:
            raise ValueError(f"cooperbench split {split!r} is unknown; known: {', '.join(SPLITS)}")
        pairs = [self.split_pairs[split][i] for i in rng.integers(0, len(self.split_pairs[split]), n)]
        if self.swap_seats and split == "train" and self.mode == "coop":
            swaps = rng.random(n) < 0.5
            pairs = [Pair(p.task, p.features[::-1]) if swap else p for p, swap in zip(pairs, swaps)]
        return pairs

    def system_prompt(self, scenario: Pair, role: str) -> str:
        features = self.seat_features(scenario, role)
        if not features:
            return ""
        tools = "\n".join(f"- {t.signature()}: {t.description}" for t in TOOLS if t.name in self.tool_names)
        example = format_call("read_file", path="README.md", start=1, end=40)
        instructions = TOOLS_PROMPT.format(example=example, tools=tools)
        if self.mode == "coop":
            spec = f"Your feature:\n\n{scenario.task.feature(features[0]).spec}"
            return f"{COOP_PROMPT}\n\n{instructions}\n\n{spec}"
        specs = "\n\n---\n\n".join(f"Feature {f}:\n\n{scenario.task.feature(f).spec}" for f in features)
        return f"{SOLO_PROMPT}\n\n{instructions}\n\n{specs}"

    def opening(self, scenario: Pair) -> list[Message]:
        return [Message(ENV, "Your copy of the repository is ready, at its base commit. Reply with one tool "
                        "call.", visible_to=(role,)) for role in self.roles]

    def after_turn(self, episode: Episode, message: Message) -> TurnResult:
        session = self._session(episode)
        role = message.role
        message.visible_to = (role,)
        seat = session.get(role)
        if seat is None or not self._working(seat):
            if seat is not None:
                seat.idle_turns += 1
            return self._schedule(session, role, [])
        seat.steps += 1
        return self._schedule(session, role, self._act(episode.scenario, session, role, message.text))

    def rewards(self, episode: Episode) -> dict[str, float]:
        session = episode.info.pop(SESSION, None) or {}
        scenario: Pair = episode.scenario
        features = scenario.features
        try:
            changes = [repo.changes(session[r].worktree) if r in session else {} for r in self.roles]
            patches = [self._patch_record(session[r].worktree, c) if r in session else ""
                       for r, c in zip(self.roles, changes)]
        except repo.GitError as e:  # what an agent wrote (a nested repository) keeps git from reading it
            changes, patches = None, ["" for _ in self.roles]
            self.git_errors += 1
            log.warning("cooperbench: episode scored 0, its changes cannot be read: %s", e)
            outcome = Outcome(MergeResult("git_error", {}), tuple(
                FeatureResult(f, False, reason=f"the changes cannot be read: {e}") for f in features), ())
        finally:
            for seat in session.values():
                self.repos.remove_worktree(scenario.task, seat.worktree)
        if changes is not None:
            outcome = self.evaluator.evaluate(scenario.task, features, changes)
        episode.info[RECORD] = self._record(outcome, session, patches)
        return self._reward_values(outcome, session)

    # -------------------------------------------------------------------------------------- internals

    def _session(self, episode: Episode) -> dict[str, Seat]:
        """The episode's seats by role; their worktrees are made on the first turn."""
        if SESSION not in episode.info:
            scenario: Pair = episode.scenario
            episode.info[SESSION] = {
                role: Seat(self.seat_features(scenario, role), self.repos.add_worktree(scenario.task, role),
                           self.repos, scenario.task)
                for role in self.roles}
        return episode.info[SESSION]

    def _working(self, seat: Seat) -> bool:
        return not seat.finished and seat.steps < self.max_turns

    def _schedule(self, session: dict[str, Seat], role: str, messages: list[Message]) -> TurnResult:
        working = [r for r in self.roles if self._working(session[r])]
        if not working:
            everyone_finished = all(seat.finished for seat in session.values())
            return TurnResult(messages, True, "finished" if everyone_finished else "turn_limit")
        others = [r for r in working if r != role]
        return TurnResult(messages, next_speaker=others[0] if others else role)

    def _act(self, scenario: Pair, session: dict[str, Seat], role: str, text: str) -> list[Message]:
        """Run the call in `text` for `role`: its result (and a delivered message) as ENV messages."""
        seat = session[role]
        try:
            call = parse_call(text)
            if call.name not in self.tool_names:
                raise ToolCallError("unknown_tool", f"the tool {call.name!r} is not available here; the "
                                    f"tools are {', '.join(self.tool_names)}")
        except ToolCallError as e:
            seat.count_error(e.kind)
            return [self._result(role, f"error: {e}")]
        worktree = Worktree(seat.worktree, self.max_file_bytes)
        try:
            if call.name == "send_message":
                return self._send(session, role, call.args["text"])
            if call.name == "finish":
                seat.finished = True
                return [self._result(role, "finished: your copy is final")]
            if call.name == "run_tests":
                return [self._result(role, self._visible_tests(scenario.task, seat))]
            return [self._result(role, getattr(worktree, call.name)(**call.args))]
        except (ToolError, OSError, repo.GitError) as e:
            seat.count_error("refused")
            return [self._result(role, f"error: {e}")]

    def _result(self, role: str, text: str) -> Message:
        return Message(ENV, clip(_surrogates_replaced(text), self.max_observation_chars), visible_to=(role,))

    def _send(self, session: dict[str, Seat], role: str, text: str) -> list[Message]:
        seat = session[role]
        if len(text) > self.max_message_chars:
            raise ToolError(f"the message has {len(text)} characters; the limit is {self.max_message_chars}")
        if seat.messages_sent >= self.max_messages:
            raise ToolError(f"you have sent the most messages allowed ({self.max_messages})")
        seat.messages_sent += 1
        partner = next(r for r in self.roles if r != role)
        delivered = MESSAGE_PREFIX + _surrogates_replaced(text).replace("[Message from", "(Message from")
        return [self._result(role, "message sent"), Message(ENV, delivered, visible_to=(partner,))]

    def _visible_tests(self, task: Task, seat: Seat) -> str:
        """The visible tests (the checkout's own, never the hidden ones) on the seat's checkout."""
        run = self.evaluator.run_tests(task, repo.changes(seat.worktree))
        found = counts(run.report.outcomes.values()) if run.report else None
        summary = ((", ".join(f"{n} {outcome}" for outcome, n in found.items() if n) or "no tests") if found
                   else "no test report")
        verdict = "passed" if run.result.ok else f"FAILED ({run.result.status}, exit {run.result.exit_code})"
        return f"visible tests {verdict}: {summary}\n{run.result.output}"

    def _patch_record(self, worktree: pathlib.Path, changes: repo.Changes) -> str:
        kept, _ = source_changes(changes)
        return clip(repo.diff_text(worktree, sorted(kept)), PATCH_RECORD_CHARS)

    def _record(self, outcome: Outcome, session: dict[str, Seat], patches: list[str]) -> dict:
        seats = {role: {"features": list(seat.features), "steps": seat.steps, "finished": seat.finished,
                        "messages_sent": seat.messages_sent, "idle_turns": seat.idle_turns,
                        "errors": dict(seat.errors)} for role, seat in session.items()}
        return {"mode": self.mode, **outcome.record(), "seats": seats,
                "patches": dict(zip(self.roles, patches))}

    def _reward_values(self, outcome: Outcome, session: dict[str, Seat]) -> dict[str, float]:
        passes = [float(f.passed) for f in outcome.features]
        partial = float(np.mean(passes))
        reward = partial if self.partial_credit else float(outcome.both_passed)
        seats = list(session.values())
        total = lambda attribute: float(sum(getattr(seat, attribute) for seat in seats))
        return {AGENT: reward, SIM: reward, "success": float(outcome.both_passed), "partial": partial,
                "feature_a_pass": passes[0], "feature_b_pass": passes[1],
                "naive_conflict": float(outcome.merge.conflicts > 0),
                "merge_failed": float(outcome.merge.status == "conflict"),
                "git_error": float(outcome.merge.status == "git_error"),
                "conflict_hunks": float(outcome.merge.conflicts), "messages_sent": total("messages_sent"),
                "tool_errors": float(sum(sum(seat.errors.values()) for seat in seats)),
                "idle_turns": total("idle_turns"),
                "finished": float(np.mean([seat.finished for seat in seats])) if seats else 0.0,
                "steps": total("steps")}


def _surrogates_replaced(text: str) -> str:
    """`text` with each lone surrogate (from a JSON escape) as "?": the tokenizer encodes strictly."""
    return text.encode("utf-8", "replace").decode()
