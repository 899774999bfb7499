"""NL_ASSERTION: a judge model grades the conversation against the task's expected outcomes.

The contract is tau2-bench's (prompts in our words): the system prompt asks the judge to grade each
expected outcome on its own and to answer with JSON `{"results": [{"expectedOutcome": ...,
"reasoning": ..., "metExpectation": true|false}, ...]}`; the user prompt holds the conversation, one
message per line as `role: content` (tool-call turns show their content, often `None`; tool results
have role `tool`), then the expected outcomes as a Python list literal. A judge is any callable
(system prompt, user prompt) -> reply text, e.g. a local model in phase 2. The component is 1 iff every
returned item is met (an empty list passes, as in tau2-bench); a reply without a readable `results`
list is a `JudgeError`.

`ModelJudge` is such a callable over a local model (any spec `scope_jax.models.from_pretrained` loads):
the two prompts under the model's chat template, one greedy reply.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import numpy as np

from scope_jax.envs.tau2.tool_calls import loads_object
from scope_jax.models import from_pretrained
from scope_jax.models.hf import model_path
from scope_jax.models.tokenizer import without_thinking
from scope_jax.sampling import SamplingConfig, generate
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


@dataclasses.dataclass
class ModelJudge:
    """A local model as the judge (loaded on first use): its greedy reply of at most `max_new_tokens`
    tokens to the prompts under its chat template. A prompt longer than `max_context` minus the reply
    is a `JudgeError` (counted by the evaluator), not a truncated conversation."""

    spec: str
    max_new_tokens: int = 192
    max_context: int = 4096
    _model: Any = dataclasses.field(default=None, init=False, repr=False)

    def __post_init__(self):
        model_path(self.spec)  # a missing model stops the run here, not after the rollouts that ask it

    def __call__(self, system_prompt: str, user_prompt: str) -> str:
        if self._model is None:
            _, (graphdef, params), tokenizer = from_pretrained(self.spec)
            sampling = SamplingConfig(temperature=0.0, max_new_tokens=self.max_new_tokens,
                                      stop_token_ids=(tokenizer.eos_token_id,),
                                      pad_token_id=tokenizer.pad_token_id or 0)
            self._model = graphdef, params, without_thinking(tokenizer), sampling
        graphdef, params, tokenizer, sampling = self._model
        chat = [{"role": "system", "content": system_prompt}, {"role": "user", "content": user_prompt}]
        text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        prompt = tokenizer(text, add_special_tokens=False).input_ids
        if len(prompt) + self.max_new_tokens > self.max_context:
            raise JudgeError(f"the judge's prompt ({len(prompt)} tokens) and reply do not fit its context "
                             f"of {self.max_context} tokens")
        out = jax.device_get(generate(graphdef, params, np.asarray([prompt], np.int32),
                                      np.asarray([len(prompt)], np.int32), jax.random.key(0), sampling))
        return tokenizer.decode(out.tokens[0, :int(out.lengths[0])], skip_special_tokens=True)
