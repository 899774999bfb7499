"""tau2-bench as an Environment: the agent serves a simulated customer under a policy, calling tools.

Scenarios are the tasks of a split. The dialogue opens with the agent's fixed greeting and the user
simulator speaks first (a mock task with a message history resumes it instead). Each message is one
of tau2-bench's steps; `after_turn` does what tau2-bench's orchestrator does with it:
  agent message with tool calls (parsed from its text, `tool_calls.py`): the calls run in order on the
      agent's toolkit, each result an env message visible to the agent only (never trained on: it has no
      sampled ids); the agent's message is hidden from the simulator (its `visible_to` is set to the
      agent); that is two steps (the message and the tool execution), and the agent speaks next;
  agent message with text only: goes to the user, one step;
  agent message with neither text nor a readable tool call: the episode ends as "agent_error" (reward
      0, counted), where tau2-bench would crash and exclude the run;
  user message: ends the episode as "user_stop" if it contains ###STOP###, ###TRANSFER### or
      ###OUT-OF-SCOPE###; a user with tools (mock) may call them like the agent (results visible to the
      user only); an empty user message ends the episode as "user_error".
After each step, unless tool calls are pending, the limits are checked in tau2-bench's order, overriding
a stop on the same step: `max_steps` steps end the episode as "max_steps", `max_errors` failed tool
calls as "too_many_errors" (so a stop on the step that reaches max_steps scores 0, and the 10th
failing call ends the episode at once). A pending tool call always runs first.

`TurnResult.next_speaker` names who speaks next ("agent" after the agent's tool results and after a
user message, "sim" after agent text and after the user's own tool results); None once done.

The per-episode state (databases, evaluator turns, counters) lives in `episode.info["tau2"]`, made on
first use from the scenario, so episodes can be copied (forks share the loaded database records).
`rewards` runs the evaluator (`evaluator.py`) and leaves the full `Evaluation` in
`episode.info["tau2_evaluation"]`.

Tool formats: "template" (the role's chat template renders its tools, `template_tools`, and the raw
tool output as its tool turns, `Message.tool_result`: Qwen3's) or "text" (for templates without tool
support, SmolLM2's: the tools and the calling convention are in the system prompts, results are user
turns wrapped in <tool_response> tags).
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, ClassVar

import numpy as np

from scope_jax.dialogue.environment import TurnResult
from scope_jax.dialogue.episode import AGENT, ENV, SIM, Episode, Message
from scope_jax.envs.tau2 import data, prompts
from scope_jax.envs.tau2.domain import Domain, DomainState, load_domain
from scope_jax.envs.tau2.evaluator import GRADINGS, USER_STOP, Evaluation, evaluate
from scope_jax.envs.tau2.judge import Judge, ModelJudge
from scope_jax.envs.tau2.schemas import toolkit_schemas
from scope_jax.envs.tau2.tasks import (ACTION, COMMUNICATE, DB, ENV_ASSERTION, NL_ASSERTION, Task,
                                       Tau2DataError, scenario_text)
from scope_jax.envs.tau2.tool_calls import ParsedMessage, format_tool_call, parse_tool_calls
from scope_jax.envs.tau2.toolkit import ASSISTANT, USER
from scope_jax.envs.tau2.trajectory import TOOL, Turn, history_turns

GREETING = "Hi! How can I help you today?"
STOP_TOKENS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")
MAX_STEPS, TOO_MANY_ERRORS = "max_steps", "too_many_errors"
AGENT_ERROR, USER_ERROR = "agent_error", "user_error"
TOOL_FORMATS = ("template", "text")
AGENT_PROMPTS = ("full", "compact")
_SPEAKER = {ASSISTANT: AGENT, USER: SIM}


@dataclasses.dataclass
class EpisodeState:
    """One episode's live state: databases, the turns the evaluator reads, tau2-bench's counters."""

    state: DomainState
    turns: list[Turn]
    steps: int = 0
    errors: int = 0  # failed tool calls
    tool_calls: int = 0
    parse_failures: list[str] = dataclasses.field(default_factory=list)
    termination: str = ""
    ids_given: int = dataclasses.field(init=False)  # tool-call ids handed out, a resumed history's included

    def __post_init__(self):
        self.ids_given = sum(len(t.tool_calls) for t in self.turns)

    def next_call_id(self) -> str:
        self.ids_given += 1
        return f"call_{self.ids_given}"


@dataclasses.dataclass
class Tau2Env:
    """data_dir: the tau2 data folder. domain: "retail" or "mock". max_steps / max_errors: tau2-bench's
    limits (200 and 10 in its CLI; 100 steps in its gym). grading: "basis" or "db_communicate"
    (evaluator.py). fix_quirks: the retail quirk fixes (retail.py). tool_format: "template" or "text".
    train_split / eval_split: the task splits that the engine's "train" and "eval" draw from (mock has
    only "base"). judge: the NL_ASSERTION judge (None: NL assertions not evaluated); judge_model: a
    model spec (name, HF folder, .gguf) to judge with when no judge is given (`ModelJudge`). agent_prompt:
    "full" (instructions, policy, tools) or "compact" (no policy, one line per tool in the "text" format:
    a CPU stand-in, since the agent no longer sees the rules it is graded by)."""

    data_dir: str = data.DEFAULT_DATA_DIR
    domain: str = "retail"
    max_steps: int = 200
    max_errors: int = 10
    grading: str = "basis"
    fix_quirks: bool = False
    tool_format: str = "template"
    train_split: str = "train"
    eval_split: str = "test"
    judge: Judge | None = None
    judge_model: str = ""
    agent_prompt: str = "full"
    first_speaker: ClassVar[str] = SIM

    def __post_init__(self):
        if self.grading not in GRADINGS:
            raise ValueError(f"grading {self.grading!r} is not one of {', '.join(GRADINGS)}")
        if self.tool_format not in TOOL_FORMATS:
            raise ValueError(f"tool_format {self.tool_format!r} is not one of {', '.join(TOOL_FORMATS)}")
        if self.agent_prompt not in AGENT_PROMPTS:
            raise ValueError(f"agent_prompt {self.agent_prompt!r} is not one of {', '.join(AGENT_PROMPTS)}")
        if self.max_steps < 1 or self.max_errors < 1:
            raise ValueError("max_steps and max_errors must be at least 1")
        if self.judge is None and self.judge_model:
            self.judge = ModelJudge(self.judge_model)
        self.domain_data: Domain = load_domain(self.data_dir, self.domain)
        for split in (self.train_split, self.eval_split):
            self.domain_data.split(split)
        has_user_tools = self.domain_data.spec.user_tools is not None
        self._guidelines = data.read_text(
            pathlib.Path(self.data_dir) / (data.GUIDELINES_WITH_TOOLS if has_user_tools else data.GUIDELINES))
        self._gold: dict[str, tuple[str, str | None]] = {}

    @property
    def max_turns(self) -> int:
        """Turns per role: an upper bound only, since every message is a step."""
        return self.max_steps

    # ------------------------------------------------------------------------ Environment protocol

    def sample_scenarios(self, n: int, rng: np.random.Generator, split: str = "train") -> list[Any]:
        """n tasks of a split ("train", "eval", or a split name of the data), distinct while it lasts."""
        name = {"train": self.train_split, "eval": self.eval_split}.get(split, split)
        pool = self.domain_data.split(name)
        return [pool[i] for i in rng.choice(len(pool), n, replace=n > len(pool))]

    def tool_schemas(self, role: str) -> list[dict[str, Any]]:
        """The OpenAI function schemas of `role`'s tools (for a chat template's `tools=`); [] for none."""
        spec = self.domain_data.spec
        toolkit = spec.agent_tools if role == AGENT else spec.user_tools
        return toolkit_schemas(toolkit) if toolkit is not None else []

    def template_tools(self, role: str) -> list[dict[str, Any]]:
        """The tools `role`'s chat template renders: its schemas in the "template" tool format, else none
        (the "text" format lists them in the system prompt)."""
        return self.tool_schemas(role) if self.tool_format == "template" else []

    def system_prompt(self, scenario: Any, role: str) -> str:
        tools = self.tool_schemas(role)
        compact = role == AGENT and self.agent_prompt == "compact"
        listing = prompts.tools_text(tools, compact) if tools and self.tool_format == "text" else ""
        if role == AGENT:
            return prompts.agent_prompt(None if compact else self.domain_data.policy, listing)
        return prompts.user_prompt(self._guidelines, scenario_text(scenario), listing)

    def opening(self, scenario: Any) -> list[Message]:
        """The greeting, or the task's message history (which must end with agent text: the user speaks)."""
        turns = self._opening_turns(scenario)
        return [self._message(turn) for turn in turns]

    def after_turn(self, episode: Episode, message: Message) -> TurnResult:
        run = self.episode_state(episode)
        if run.termination:
            raise ValueError(f"episode of task {episode.scenario} already ended ({run.termination})")
        if message.role == AGENT:
            return self._agent_turn(run, message)
        if message.role == SIM:
            return self._user_turn(run, message)
        return TurnResult(next_speaker=None)

    def rewards(self, episode: Episode) -> dict[str, float]:
        """The evaluation of a finished episode as numbers: reward ("agent" and "sim"), each component,
        whether NL_ASSERTION was judged or not evaluated, and the episode's counters."""
        run = self.episode_state(episode)
        evaluation = self.evaluate(episode)
        episode.info["tau2_evaluation"] = evaluation
        components = {c: evaluation.components.get(c, 1.0) for c in (DB, ENV_ASSERTION, ACTION, COMMUNICATE)}
        return {
            "agent": evaluation.reward, "sim": evaluation.reward,
            **{c.lower(): v for c, v in components.items()},
            "nl_judged": float(NL_ASSERTION in evaluation.components),
            "nl_met": evaluation.components.get(NL_ASSERTION, 0.0),
            "nl_not_evaluated": float(NL_ASSERTION in evaluation.not_evaluated),
            "judge_failures": float(evaluation.judge_failures),
            "ended_normally": float(evaluation.ended_normally),
            "agent_error": float(evaluation.termination == AGENT_ERROR),
            "steps": float(run.steps), "tool_calls": float(run.tool_calls), "tool_errors": float(run.errors),
            "parse_failures": float(len(run.parse_failures)),
        }

    # ------------------------------------------------------------------------------------ episodes

    def episode_state(self, episode: Episode) -> EpisodeState:
        """The live state of `episode` (made from its task on first use)."""
        run = episode.info.get("tau2")
        if run is None:
            task = self._task(episode.scenario)
            run = episode.info["tau2"] = EpisodeState(self.domain_data.initial_state(task, self.fix_quirks),
                                                      self._opening_turns(task))
        return run

    def evaluate(self, episode: Episode) -> Evaluation:
        run = self.episode_state(episode)
        task = self._task(episode.scenario)
        return evaluate(task, run.turns, episode.end_reason or run.termination, run.state,
                        self.gold_hashes(task), judge=self.judge, grading=self.grading)

    def gold_hashes(self, task: Task) -> tuple[str, str | None]:
        """(agent, user) DB hashes after the task's gold actions (computed once per task)."""
        if task.id not in self._gold:
            self._gold[task.id] = self.domain_data.gold_replay(task, self.fix_quirks).state.hashes()
        return self._gold[task.id]

    def _task(self, scenario: Any) -> Task:
        if not isinstance(scenario, Task) or self.domain_data.tasks.get(scenario.id) is not scenario:
            raise ValueError(f"scenario {scenario!r} is not a task of the {self.domain} domain")
        return scenario

    def _opening_turns(self, task: Task) -> list[Turn]:
        history = task.initial_state.message_history
        if not history:
            return [Turn(ASSISTANT, GREETING)]
        turns = history_turns(history, task.id)
        last = turns[-1]
        if last.role != ASSISTANT or last.tool_calls or not last.content:
            raise Tau2DataError(f"task {task.id}: the message history must end with agent text (the user "
                                "speaks first)")
        return turns

    def _message(self, turn: Turn) -> Message:
        """A turn as the engine's message: tool traffic visible to its requestor's role only."""
        if turn.role == TOOL:
            if self.tool_format == "text":
                return Message(ENV, prompts.tool_response_text(turn.content or ""),
                               visible_to=(_SPEAKER[turn.requestor],))
            return Message(ENV, turn.content or "", visible_to=(_SPEAKER[turn.requestor],), tool_result=True)
        speaker = _SPEAKER[turn.role]
        if turn.tool_calls:
            text = "\n".join([turn.content or ""] + [format_tool_call(c) for c in turn.tool_calls]).strip()
            return Message(speaker, text, visible_to=(speaker,))
        return Message(speaker, turn.content or "")

    def _agent_turn(self, run: EpisodeState, message: Message) -> TurnResult:
        run.steps += 1
        parsed = parse_tool_calls(message.text, run.next_call_id, ASSISTANT)
        run.parse_failures.extend(parsed.failures)
        if parsed.calls:
            message.visible_to = (AGENT,)
            return self._run_calls(run, parsed, ASSISTANT, next_speaker=AGENT)
        if parsed.content is None:
            return self._end(run, AGENT_ERROR)
        run.turns.append(Turn(ASSISTANT, message.text.strip()))
        return self._checked(run, [], next_speaker=SIM)

    def _user_turn(self, run: EpisodeState, message: Message) -> TurnResult:
        run.steps += 1
        if run.state.user is not None:
            parsed = parse_tool_calls(message.text, run.next_call_id, USER)
            run.parse_failures.extend(parsed.failures)
        else:
            parsed = ParsedMessage(message.text.strip() or None, (), ())
        if any(token in message.text for token in STOP_TOKENS):
            run.turns.append(Turn(USER, message.text, parsed.calls))
            if parsed.calls:  # tau2-bench ends here with the calls pending: no limit check
                return self._end(run, USER_STOP)
            return self._checked(run, [], next_speaker=AGENT, stop=USER_STOP)
        if parsed.calls:
            message.visible_to = (SIM,)
            return self._run_calls(run, parsed, USER, next_speaker=SIM)
        if parsed.content is None:
            return self._end(run, USER_ERROR)
        run.turns.append(Turn(USER, message.text))
        return self._checked(run, [], next_speaker=AGENT)

    def _run_calls(self, run: EpisodeState, parsed: ParsedMessage, side: str,
                   next_speaker: str) -> TurnResult:
        """Record the tool-call message, execute its calls in order (one step), then check the limits."""
        run.turns.append(Turn(side, parsed.content, parsed.calls))
        toolkit = run.state.toolkit(side)
        messages = []
        for call in parsed.calls:
            result = toolkit.call(call.name, call.arguments)
            run.tool_calls += 1
            run.errors += result.error
            turn = Turn(TOOL, result.content, tool_call_id=call.id, requestor=side, error=result.error)
            run.turns.append(turn)
            messages.append(self._message(turn))
        run.steps += 1
        return self._checked(run, messages, next_speaker=next_speaker)

    def _checked(self, run: EpisodeState, messages: list[Message], next_speaker: str,
                 stop: str = "") -> TurnResult:
        """tau2-bench's limit checks after a step; they override a stop on the same step."""
        reason = stop
        if run.steps >= self.max_steps:
            reason = MAX_STEPS
        if run.errors >= self.max_errors:
            reason = TOO_MANY_ERRORS
        if reason:
            return self._end(run, reason, messages)
        return TurnResult(messages, next_speaker=next_speaker)

    @staticmethod
    def _end(run: EpisodeState, reason: str, messages: list[Message] | None = None) -> TurnResult:
        run.termination = reason
        return TurnResult(messages or [], done=True, reason=reason)
