"""Verbalized Sampling, text side: prompt, tolerant parser, sampling with an explicit key, turn records.

At a simulator turn the simulator is asked for k candidate replies, each with a stated probability
(`build_prompt`). Its answer is parsed and repaired into a `VerbalizedDistribution` (`parse`), one
candidate is drawn with an explicit PRNG key (`sample`), and that candidate's text is the simulator's
reply. `VerbalizedSampler` runs one turn end to end: it retries generation when the answer cannot be
parsed, falls back to ordinary (direct) generation after `max_retries` retries, and records every
failure and fallback in the turn's `TurnRecord` (`summarize` aggregates them); a parse failure never
raises. `scope_jax.simulators.verbalized_speaker` runs it as the simulator side of the dialogue loop.

Candidates may be whole replies or reply *types* (set `candidate_noun`, e.g. "reply type"). The chosen
text is then either the reply itself or a type that the caller uses to condition a second, ordinary
generation; this module does not distinguish the two.

Only the chosen text is meant for the dialogue: the agent never sees the verbalization. It is kept in
the per-turn `TurnRecord` for diagnostics only (1 - p_max is the simulator's verbalized deviation).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
from typing import Any, Callable, Literal, Sequence

import jax
import jax.numpy as jnp
import numpy as np

logger = logging.getLogger(__name__)

OutputFormat = Literal["json", "tags"]

# Accepted spellings, tried in order. The prompt asks for the first of each.
_LIST_KEYS = ("responses", "candidates", "replies")
_TEXT_KEYS = ("text", "response", "reply")
_PROB_KEYS = ("probability", "prob", "confidence")

_FENCE = re.compile(r"```[\w.+-]*")
_TRAILING_COMMA = re.compile(r",\s*(?=[}\]])")
_TAG_RESPONSE = re.compile(r"<response>(.*?)</response>", re.S | re.I)
_TAG_TEXT = re.compile(r"<text>(.*?)</text>", re.S | re.I)
_TAG_PROB = re.compile(r"<(probability|prob|confidence)>(.*?)</\1>", re.S | re.I)
_NUMBER = re.compile(r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(%?)")
# Bounds the work on long chatter full of braces: each start is one JSON decode attempt.
_MAX_JSON_STARTS = 32


@dataclasses.dataclass(frozen=True)
class VerbalizedConfig:
    """Settings of Verbalized Sampling.

    Attributes:
      k: number of candidates the prompt asks for.
      output_format: "json" (`{"responses": [{"text": ..., "probability": ...}]}`) or "tags"
        (`<response><text>...</text><probability>...</probability></response>`). The parser accepts
        both whatever this says; it tries this one first.
      probability_word: the word the prompt uses for the stated number ("probability", "confidence",
        ...). The field / tag name stays "probability".
      candidate_noun: what a candidate is, in the prompt: "reply", or "reply type" for type mode.
      tail_threshold: None, or p in (0, 1]: the prompt then asks for every probability to be below p.
      min_probability: candidates whose repaired stated probability (before renormalisation) is below
        this are dropped ...
      min_keep: ... unless fewer than `min_keep` would survive; then the `min_keep` most probable
        candidates are kept (ties broken by order).
      max_retries: generation is retried this many times after a failed parse (so at most
        1 + max_retries attempts) before falling back to direct sampling.
    """

    k: int = 5
    output_format: OutputFormat = "json"
    probability_word: str = "probability"
    candidate_noun: str = "reply"
    tail_threshold: float | None = None
    min_probability: float = 0.0
    min_keep: int = 1
    max_retries: int = 2

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if self.output_format not in ("json", "tags"):
            raise ValueError(f"output_format must be 'json' or 'tags', got {self.output_format!r}")
        if self.tail_threshold is not None and not 0.0 < self.tail_threshold <= 1.0:
            raise ValueError(f"tail_threshold must be None or in (0, 1], got {self.tail_threshold}")
        if not 0.0 <= self.min_probability <= 1.0:
            raise ValueError(f"min_probability must be in [0, 1], got {self.min_probability}")
        if self.min_keep < 1:
            raise ValueError(f"min_keep must be >= 1, got {self.min_keep}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")


def verbalized_config(group: Any) -> VerbalizedConfig:
    """A config group of VerbalizedConfig's fields plus `max_new_tokens` (the sampler's budget for a
    verbalized answer, not a field of VerbalizedConfig) as a VerbalizedConfig; ValueError on a bad setting."""
    return VerbalizedConfig(**{k: v for k, v in group.items() if k != "max_new_tokens"})


@dataclasses.dataclass(frozen=True, eq=False)
class VerbalizedDistribution:
    """Parsed candidates: non-empty texts and their probabilities (float64, >= 0, summing to 1)."""

    texts: tuple[str, ...]
    probs: np.ndarray

    def __post_init__(self) -> None:
        probs = np.array(self.probs, dtype=np.float64)
        if probs.shape != (len(self.texts),) or not probs.size:
            raise ValueError(f"need one probability per text and at least one, got {probs.shape}")
        probs.setflags(write=False)
        object.__setattr__(self, "probs", probs)

    @property
    def p_max(self) -> float:
        """Largest probability; 1 - p_max is the verbalized deviation."""
        return float(self.probs.max())

    @property
    def entropy(self) -> float:
        """Shannon entropy in nats."""
        p = self.probs[self.probs > 0]
        return float(-(p * np.log(p)).sum())

    @property
    def num_kept(self) -> int:
        """Number of candidates kept after repair and filtering."""
        return len(self.texts)


def build_prompt(instruction: str, config: VerbalizedConfig) -> str:
    """`instruction` followed by the request for `config.k` candidates with stated probabilities."""
    word, noun = config.probability_word, config.candidate_noun
    ask = (
        f"Do not answer with a single {noun}. Instead, list {config.k} different candidates, each a {noun} "
        f"you could realistically give at this point, and attach to each your {word} of giving it, "
        f"a number from 0 to 1."
    )
    if config.tail_threshold is not None:
        ask += (
            f" Choose candidates from the unlikely end of what you might say: "
            f"each {word} must be below {config.tail_threshold:g}."
        )
    if config.output_format == "json":
        shape = (
            "Write one JSON object and nothing else, in this shape:\n"
            f'{{"responses": [{{"text": "<{noun}>", "probability": <{word}>}}, ...]}}'
        )
    else:
        shape = (
            f"Write {config.k} blocks and nothing else, each in this shape:\n"
            f"<response><text>{noun}</text><probability>{word}</probability></response>"
        )
    request = f"{ask}\n{shape}"
    return f"{instruction}\n\n{request}" if instruction else request


def repair_probability(raw: object) -> float:
    """A stated probability as a float in [0, 1].

    Numbers and numeric strings are read; "70%" / "30 %" are percents; a value in (1, 100] without
    a percent sign is also read as a percent (70 -> 0.7, 1.5 -> 0.015); larger values (and +inf)
    clip to 1, negatives to 0. Anything unreadable (NaN, booleans, None, words) is 0.
    """
    if isinstance(raw, bool):
        return 0.0
    if isinstance(raw, (int, float)):
        try:
            value = float(raw)
        except OverflowError:  # an int too large for a float
            value = math.inf if raw > 0 else -math.inf
        percent = False
    elif isinstance(raw, str) and (match := _NUMBER.fullmatch(raw.strip())):
        value, percent = float(match.group(1)), bool(match.group(2))
    else:
        return 0.0
    if math.isnan(value):
        return 0.0
    if percent or 1.0 < value <= 100.0:
        value /= 100.0
    return min(max(value, 0.0), 1.0)


def _first(mapping: dict, keys: Sequence[str]) -> Any:
    return next((mapping[key] for key in keys if key in mapping), None)


def _json_items(text: str) -> list[tuple[Any, Any]]:
    """(text, raw probability) pairs from the outermost JSON object holding a responses list."""
    text = _FENCE.sub("", text)
    decoder = json.JSONDecoder()
    # Try the text as is first, so a ", }" inside a string literal is only touched when needed.
    for variant in (text, _TRAILING_COMMA.sub("", text)):
        for start in [m.start() for m in re.finditer(r"\{", variant)][:_MAX_JSON_STARTS]:
            try:
                obj, _ = decoder.raw_decode(variant, start)
            except (ValueError, RecursionError):
                continue
            responses = _first(obj, _LIST_KEYS) if isinstance(obj, dict) else None
            if isinstance(responses, list):
                items = [
                    (_first(r, _TEXT_KEYS), _first(r, _PROB_KEYS)) for r in responses if isinstance(r, dict)
                ]
                if items:
                    return items
    return []


def _tag_items(text: str) -> list[tuple[Any, Any]]:
    """(text, raw probability) pairs from <response> blocks; a missing tag gives None."""
    items = []
    for block in _TAG_RESPONSE.findall(text):
        body, prob = _TAG_TEXT.search(block), _TAG_PROB.search(block)
        items.append((body and body.group(1), prob and prob.group(2)))
    return items


def parse(text: str, config: VerbalizedConfig) -> VerbalizedDistribution | None:
    """The distribution stated in `text`, repaired and renormalised; None if none can be read.

    Never raises. Reads the configured format first, then the other. Candidates with empty text are
    dropped, probabilities are repaired (`repair_probability`), candidates under
    `config.min_probability` are dropped (keeping the top `config.min_keep`), and the rest are
    renormalised; if all kept probabilities are 0 the result is uniform over the kept candidates.
    """
    if not isinstance(text, str):
        return None
    readers = (_json_items, _tag_items) if config.output_format == "json" else (_tag_items, _json_items)
    raw_items = next((items for read in readers if (items := read(text))), [])
    items = [(t.strip(), repair_probability(p)) for t, p in raw_items if isinstance(t, str) and t.strip()]
    if not items:
        return None
    probs = np.array([p for _, p in items], dtype=np.float64)
    keep = probs >= config.min_probability
    if keep.sum() < config.min_keep:
        keep[np.argsort(-probs, kind="stable")[: config.min_keep]] = True
    probs = probs[keep]
    total = probs.sum()
    probs = probs / total if total > 0 else np.full(probs.shape, 1.0 / probs.size)
    return VerbalizedDistribution(tuple(t for (t, _), k in zip(items, keep) if k), probs)


@jax.jit
def _categorical(key: jax.Array, probs: jax.Array) -> jax.Array:
    return jax.random.categorical(key, jnp.log(probs))


def sample(dist: VerbalizedDistribution, key: jax.Array) -> int:
    """Index of one candidate drawn from `dist` with the PRNG key `key`."""
    return int(_categorical(key, dist.probs))


@dataclasses.dataclass(frozen=True)
class TurnRecord:
    """What happened at one verbalized turn (for logging; none of it goes to the agent).

    Attributes:
      distribution: the parsed distribution, or None when the turn fell back to direct sampling.
      choice: index of the chosen candidate in `distribution`, or None on fallback.
      attempts: generation attempts made (1 + retries).
      parse_failures: attempts whose output could not be parsed.

    `fell_back` says whether the reply came from direct sampling; `p_max`, `entropy` and `num_kept`
    are those of `distribution` (NaN, NaN and 0 on fallback).
    """

    distribution: VerbalizedDistribution | None
    choice: int | None
    attempts: int
    parse_failures: int

    @property
    def fell_back(self) -> bool:
        return self.distribution is None

    @property
    def p_max(self) -> float:
        return self.distribution.p_max if self.distribution is not None else math.nan

    @property
    def entropy(self) -> float:
        return self.distribution.entropy if self.distribution is not None else math.nan

    @property
    def num_kept(self) -> int:
        return self.distribution.num_kept if self.distribution is not None else 0

    def metrics(self) -> dict[str, float]:
        """Scalars to log for this turn (p_max and entropy are NaN on fallback)."""
        return {
            "p_max": self.p_max,
            "entropy": self.entropy,
            "num_kept": self.num_kept,
            "attempts": self.attempts,
            "parse_failures": self.parse_failures,
            "fell_back": float(self.fell_back),
        }


Generate = Callable[[list[str], int, list[int]], Sequence[str]]
Direct = Callable[[list[str], list[int]], Sequence[str]]


class VerbalizedSampler:
    """Runs verbalized turns for batches of simulator prompts.

    Each call gets the two generators of its turn. `generate(prompts, attempt, rows)` returns the
    simulator's verbalized answers to `prompts` (outputs of `build_prompt`) for the batch rows `rows`;
    `attempt` counts from 0 so a generator can vary its randomness across retries, and only rows that
    still lack a parsable answer are asked again.
    `direct(instructions, rows)` is ordinary generation from the plain instructions, the fallback.
    Only parse failures are handled: an exception raised by `generate` or `direct` is the caller's bug
    and propagates, and a non-str output raises TypeError. What happened at each turn is its
    `TurnRecord`; `summarize` turns the records of many turns into rates and means.
    """

    def __init__(self, config: VerbalizedConfig):
        self.config = config

    def choose(self, instruction: str, key: jax.Array, generate: Generate,
               direct: Direct) -> tuple[str, TurnRecord]:
        """One turn: the simulator's reply (or reply type) and the turn's record."""
        return self.choose_batch([instruction], [key], generate, direct)[0]

    def choose_batch(
        self, instructions: Sequence[str], keys: Sequence[jax.Array] | jax.Array, generate: Generate,
        direct: Direct,
    ) -> list[tuple[str, TurnRecord]]:
        """One turn for each instruction, each drawn with its own key (e.g. `jax.random.split(key, n)`)."""
        if len(instructions) != len(keys):
            raise ValueError(f"{len(instructions)} instructions but {len(keys)} keys")
        prompts = [build_prompt(instruction, self.config) for instruction in instructions]
        dists: list[VerbalizedDistribution | None] = [None] * len(prompts)
        attempts = [0] * len(prompts)
        pending = list(range(len(prompts)))
        for attempt in range(self.config.max_retries + 1):
            if not pending:
                break
            outputs = _checked_all(generate([prompts[r] for r in pending], attempt, pending),
                                   len(pending), "generate")
            for row, output in zip(pending, outputs):
                attempts[row] += 1
                dists[row] = parse(output, self.config)
            pending = [row for row in pending if dists[row] is None]
            if pending:
                logger.debug("verbalized sampling: %d answers of attempt %d could not be parsed",
                             len(pending), attempt + 1)
        fallback = []
        if pending:
            logger.warning("verbalized sampling: %d of %d answers could not be parsed in %d attempts; they "
                           "fall back to direct sampling", len(pending), len(prompts),
                           self.config.max_retries + 1)
            fallback = _checked_all(direct([instructions[r] for r in pending], pending), len(pending),
                                    "direct")
        replies = dict(zip(pending, fallback))

        results = []
        for row, (dist, key) in enumerate(zip(dists, keys)):
            failures = attempts[row] - (dist is not None)
            if dist is None:
                results.append((replies[row], TurnRecord(None, None, attempts[row], failures)))
            else:
                choice = sample(dist, key)
                results.append((dist.texts[choice], TurnRecord(dist, choice, attempts[row], failures)))
        return results


def summarize(records: Sequence[dict[str, float]]) -> dict[str, float]:
    """Totals and rates of many turns' `TurnRecord.metrics()`; means over the turns that did not fall back
    (NaN when every turn fell back), and the stated deviation 1 - mean p_max."""
    stated = [r for r in records if not r["fell_back"]]
    mean = lambda key: float(np.mean([r[key] for r in stated])) if stated else math.nan
    failures, attempts = sum(r["parse_failures"] for r in records), sum(r["attempts"] for r in records)
    return {
        "turns": len(records),
        "parse_failures": failures,
        "fallbacks": len(records) - len(stated),
        "parse_failure_rate": _ratio(failures, attempts),
        "fallback_rate": _ratio(len(records) - len(stated), len(records)),
        "mean_p_max": mean("p_max"),
        "deviation": 1.0 - mean("p_max"),
        "mean_entropy": mean("entropy"),
        "mean_num_kept": mean("num_kept"),
    }


def _checked_all(outputs: Sequence[object], expected: int, name: str) -> list[str]:
    outputs = list(outputs)
    if len(outputs) != expected:
        raise ValueError(f"{name} returned {len(outputs)} outputs for {expected} prompts")
    for output in outputs:
        if not isinstance(output, str):
            raise TypeError(f"{name} must return str, got {type(output).__name__}")
    return outputs


def _ratio(numerator: float, denominator: int) -> float:
    return numerator / denominator if denominator else math.nan
