"""NL_ASSERTION: a judge model grades the conversation against the task's expected outcomes.

The contract is tau2-bench's (prompts in our words): the system prompt asks the judge to grade each
expected outcome on its own and to answer with JSON `{"results": [{"expectedOutcome": ...,
"reasoning": ..., "metExpectation": true|false}, ...]}`; the user prompt holds the conversation, one
message per line as `role: content` (tool-call turns show their content, often `None`; tool results
have role `tool`), then the expected outcomes as a Python list literal. A judge is any callable
(system prompt, user prompt) -> reply text, e.g. a local model in phase 2. The component is 1 iff every
returned item is met (an empty list passes, as in tau2-bench); a reply without a readable `results`
list is a `JudgeError`.
"""

from __future__ import annotations

from typing import Callable, Sequence

from scope_jax.envs.tau2.tool_calls import loads_object
from scope_jax.envs.tau2.trajectory import Turn

Judge = Callable[[str, str], str]

SYSTEM_PROMPT = (
    "You grade a conversation between a customer service agent and a customer. You are given the "
    "conversation and a list of expected outcomes. Judge each expected outcome on its own: say whether "
    "the conversation shows it was met, with a short justification.\n"
    "Answer with JSON only, in this form:\n"
    '{"results": [{"expectedOutcome": "<the outcome, as given>", "reasoning": "<why>", '
    '"metExpectation": true or false}, ...]}\n'
    "with one result for each expected outcome, in the given order.")


class JudgeError(ValueError):
    """The judge's reply does not follow the JSON contract."""


def user_prompt(turns: Sequence[Turn], assertions: Sequence[str]) -> str:
    conversation = "\n".join(f"{turn.role}: {turn.content}" for turn in turns)
    return f"Conversation:\n{conversation}\n\nExpected outcomes:\n{list(assertions)!r}"


def parse_verdicts(reply: str) -> list[bool]:
    """`metExpectation` of each result in the judge's reply."""
    obj = loads_object(reply)
    results = None if obj is None else obj.get("results")
    if not isinstance(results, list) or not all(isinstance(r, dict) for r in results):
        raise JudgeError(f"the judge's reply has no 'results' list of objects: {reply[:200]!r}")
    verdicts = [r.get("metExpectation") for r in results]
    if not all(isinstance(v, bool) for v in verdicts):
        raise JudgeError(f"a result of the judge's reply has no true/false 'metExpectation': {reply[:200]!r}")
    return verdicts


def judge_assertions(judge: Judge, turns: Sequence[Turn], assertions: Sequence[str]) -> list[bool]:
    """Ask `judge` about `assertions`; one verdict per returned result."""
    return parse_verdicts(judge(SYSTEM_PROMPT, user_prompt(turns, assertions)))
