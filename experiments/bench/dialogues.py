"""Synthetic multi-turn dialogues and our two ways of playing them (per-row KV caches kept across turns,
and re-prefilling every turn's history): shared by `bench rollout` and experiments/gpu_check.py."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import jax
import numpy as np

from scope_jax import kv_cache, sampling
from scope_jax.sampling import SamplingConfig, generate


@dataclasses.dataclass(frozen=True)
class RolloutShape:
    """A synthetic dialogue: `turns` replies of `message` tokens after a shared `prompt`-token prompt, each
    reply preceded by an other-side message of `message` tokens wrapped in TEMPLATE_TOKENS template ids."""

    turns: int
    message: int
    prompt: int


ROLLOUT_SHAPES = {"p4g": RolloutShape(turns=10, message=40, prompt=512),
                  "tau2": RolloutShape(turns=20, message=40, prompt=4096)}
TEMPLATE_TOKENS = 8  # e.g. "<|im_end|>\n<|im_start|>user\n" before and "...assistant\n" after a message


@dataclasses.dataclass(frozen=True)
class Played:
    """One played dialogue: each turn's replies [rows, reply_tokens] and its wall seconds."""

    replies: list[np.ndarray]
    seconds: list[float]


@dataclasses.dataclass(frozen=True)
class SyntheticDialogue:
    """The fixed inputs of one rollout: the first history [rows, prompt + message + template] (a shared
    prompt, then each row's first other-side turn) and the other side's later turns [turns, rows, ...]."""

    first: np.ndarray
    others: np.ndarray
    reply_tokens: int

    @classmethod
    def make(cls, shape: RolloutShape, turns: int, rows: int, vocab: int) -> "SyntheticDialogue":
        rng = np.random.RandomState(0)
        prompt = np.broadcast_to(rng.randint(1, vocab, shape.prompt), (rows, shape.prompt))
        others = rng.randint(1, vocab, (turns, rows, shape.message + TEMPLATE_TOKENS)).astype(np.int32)
        return cls(np.concatenate([prompt, others[0]], axis=1).astype(np.int32), others, shape.message)

    def history_lengths(self) -> list[int]:
        """The length of the history each turn replies to."""
        grown = self.reply_tokens + self.others.shape[2]  # a reply, then the other side's next turn
        return [self.first.shape[1] + turn * grown for turn in range(len(self.others))]

    def play(self, reply: Callable[[np.ndarray], np.ndarray], turns: int | None = None) -> Played:
        """The first `turns` turns (default: all); `reply` maps the history so far to the turn's replies."""
        history, played = self.first, Played([], [])
        for turn in range(turns or len(self.others)):
            start = time.perf_counter()
            played.replies.append(np.asarray(reply(history)))
            played.seconds.append(time.perf_counter() - start)
            if turn + 1 < len(self.others):
                history = np.concatenate([history, played.replies[-1], self.others[turn + 1]], axis=1)
        return played


PlayFn = Callable[..., Played]  # play(turns=None): the first `turns` turns of the dialogue (default all)


def ours_rollout_columns(graphdef, params, dialogue: SyntheticDialogue, mesh=None) -> dict[str, PlayFn]:
    """{column: play the dialogue greedily}: with per-row caches kept across turns (one group, so the
    prompt is a shared prefix), and re-prefilling every turn's history."""
    config = SamplingConfig(temperature=0.0, max_new_tokens=dialogue.reply_tokens)
    key, rows = jax.random.key(0), len(dialogue.first)

    def cached(turns: int | None = None) -> Played:
        cache = kv_cache.create(graphdef, params, rows, mesh=mesh)

        def reply(history):
            nonlocal cache
            out, cache = kv_cache.generate(graphdef, params, cache, list(history), key, config)
            return out.tokens

        return dialogue.play(reply, turns)

    def reprefilling(turns: int | None = None) -> Played:
        reply = lambda history: reprefilled_reply(graphdef, params, history, config, mesh)
        return dialogue.play(reply, turns)

    return {"ours, cached": cached, "ours, re-prefilling": reprefilling}


def reprefilled_reply(graphdef, params, history: np.ndarray, config: SamplingConfig, mesh=None) -> np.ndarray:
    """Ours re-prefilling: the replies [rows, max_new_tokens] to whole histories [rows, length]."""
    lengths, key = np.full(len(history), history.shape[1]), jax.random.key(0)
    return jax.device_get(generate(graphdef, params, history, lengths, key, config, mesh).tokens)


def reprefilling_compiles(dialogue: SyntheticDialogue, turns: int) -> list[int]:
    """The turns (of the first `turns`) at which ours re-prefilling meets a new padded history length,
    so compiles a new program: `generate` pads each history to `bucket(length, MIN_PROMPT_BUCKET)`."""
    first_turn = {}
    for turn, length in enumerate(dialogue.history_lengths()[:turns]):
        first_turn.setdefault(sampling.bucket(length, sampling.MIN_PROMPT_BUCKET), turn)
    return sorted(first_turn.values())
