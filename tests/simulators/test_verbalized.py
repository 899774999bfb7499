"""Verbalized Sampling: prompt, tolerant parser, sampler statistics, retry / fallback driver."""

import json
import logging
import math

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from scope_jax.simulators.verbalized import (
    VerbalizedConfig,
    VerbalizedDistribution,
    VerbalizedSampler,
    build_prompt,
    parse,
    repair_probability,
    sample,
    summarize,
)

DEFAULT = VerbalizedConfig()

# (LLM output, expected texts, expected probabilities) with the default config; None = parse failure.
PARSE_CASES = {
    "clean json": (
        '{"responses": [{"text": "Sure, I can give $1.", "probability": 0.6}, '
        '{"text": "Not today, sorry.", "probability": 0.4}]}',
        ("Sure, I can give $1.", "Not today, sorry."),
        [0.6, 0.4],
    ),
    "fenced json with language tag": (
        '```json\n{"responses": [\n  {"text": "Tell me more.", "probability": 0.5},\n'
        '  {"text": "No thanks.", "probability": 0.25}\n]}\n```',
        ("Tell me more.", "No thanks."),
        [2 / 3, 1 / 3],
    ),
    "fenced json without language tag": (
        '```\n{"responses": [{"text": "Okay.", "probability": 1.0}]}\n```',
        ("Okay.",),
        [1.0],
    ),
    "trailing commas": (
        '{"responses": [{"text": "Yes", "probability": 0.7,}, {"text": "No", "probability": 0.3,},],}',
        ("Yes", "No"),
        [0.7, 0.3],
    ),
    "json in chatter with braces": (
        "Sure {thinking}... here are my candidates:\n"
        '{"responses": [{"text": "Maybe later.", "probability": 0.2}, '
        '{"text": "How much?", "probability": 0.8}]}\nLet me know if you need {more}!',
        ("Maybe later.", "How much?"),
        [0.2, 0.8],
    ),
    "json wrapped in another object": (
        '{"result": {"responses": [{"text": "A", "probability": 0.5}, {"text": "B", "probability": 0.5}]}}',
        ("A", "B"),
        [0.5, 0.5],
    ),
    "key variants": (
        '{"responses": [{"response": "A", "prob": 0.3}, {"reply": "B", "confidence": "70%"}]}',
        ("A", "B"),
        [0.3, 0.7],
    ),
    "tags": (
        "<response><text>I already gave.</text><probability>0.10</probability></response>\n"
        "<response><text>What is the charity?</text><probability>0.90</probability></response>",
        ("I already gave.", "What is the charity?"),
        [0.1, 0.9],
    ),
    "tags with percents, whitespace and a missing probability": (
        "Candidates:\n<response>\n  <text>\n  Who runs it?\n  </text>\n  <probability>25%</probability>\n"
        "</response>\n<response><text>Sounds good.</text><probability> 75 % </probability></response>\n"
        "<response><text>Hm.</text></response>",
        ("Who runs it?", "Sounds good.", "Hm."),
        [0.25, 0.75, 0.0],
    ),
    "percent strings": (
        '{"responses": [{"text": "A", "probability": "70%"}, {"text": "B", "probability": "30 %"}]}',
        ("A", "B"),
        [0.7, 0.3],
    ),
    "bare numbers above 1 are percents": (
        '{"responses": [{"text": "A", "probability": 60}, {"text": "B", "probability": "40"}]}',
        ("A", "B"),
        [0.6, 0.4],
    ),
    "negatives become 0": (
        '{"responses": [{"text": "A", "probability": 0.5}, {"text": "B", "probability": -0.2}, '
        '{"text": "C", "probability": 0.5}]}',
        ("A", "B", "C"),
        [0.5, 0.0, 0.5],
    ),
    "above 100 clips to 1": (
        '{"responses": [{"text": "A", "probability": 250}, {"text": "B", "probability": 0.5}]}',
        ("A", "B"),
        [2 / 3, 1 / 3],
    ),
    "unreadable probabilities become 0": (
        '{"responses": [{"text": "A", "probability": "likely"}, {"text": "B", "probability": null}, '
        '{"text": "C"}, {"text": "D", "probability": true}, {"text": "E", "probability": 0.4}]}',
        ("A", "B", "C", "D", "E"),
        [0.0, 0.0, 0.0, 0.0, 1.0],
    ),
    "all zero is uniform": (
        '{"responses": [{"text": "A", "probability": 0}, {"text": "B", "probability": "n/a"}, '
        '{"text": "C", "probability": 0.0}]}',
        ("A", "B", "C"),
        [1 / 3, 1 / 3, 1 / 3],
    ),
    "empty and non-string texts dropped, others stripped": (
        '{"responses": [{"text": "  ", "probability": 0.5}, {"text": 7, "probability": 0.2}, '
        '{"text": "  Hello there. ", "probability": 0.3}]}',
        ("Hello there.",),
        [1.0],
    ),
    "empty responses list": ('{"responses": []}', None, None),
    "only empty texts": ('{"responses": [{"text": "", "probability": 1}]}', None, None),
    "object without responses": ('{"answer": "yes", "probability": 0.9}', None, None),
    "plain reply": ("I'm not sure what you mean, can you explain?", None, None),
    "empty string": ("", None, None),
    "broken json": ('{"responses": [{"text": "A", "probability": 0.5', None, None),
    "unclosed tags": ("<response><text>A</text><probability>0.5</probability>", None, None),
}


@pytest.mark.parametrize("name", list(PARSE_CASES))
def test_parse_table(name):
    text, texts, probs = PARSE_CASES[name]
    dist = parse(text, DEFAULT)
    if texts is None:
        assert dist is None
        return
    assert dist is not None
    assert dist.texts == texts
    np.testing.assert_allclose(dist.probs, probs, rtol=0, atol=1e-12)
    assert dist.probs.dtype == np.float64


def test_parse_reads_either_format_whatever_the_config():
    tags = "<response><text>A</text><probability>0.2</probability></response>"
    js = '{"responses": [{"text": "A", "probability": 0.2}]}'
    for config in (VerbalizedConfig(output_format="json"), VerbalizedConfig(output_format="tags")):
        assert parse(tags, config).texts == ("A",)
        assert parse(js, config).texts == ("A",)


@pytest.mark.parametrize(
    "raw, expected",
    [
        (0.3, 0.3),
        ("0.3", 0.3),
        (" .5 ", 0.5),
        ("1e-1", 0.1),
        ("70%", 0.7),
        ("30 %", 0.3),
        (0, 0.0),
        (1, 1.0),
        (70, 0.7),
        (1.5, 0.015),
        (100, 1.0),
        (250, 1.0),
        ("150%", 1.0),
        (-0.2, 0.0),
        ("-5%", 0.0),
        (math.nan, 0.0),
        (math.inf, 1.0),
        (-math.inf, 0.0),
        (10**400, 1.0),
        ("high", 0.0),
        ("~0.3", 0.0),
        (None, 0.0),
        (True, 0.0),
        ([0.3], 0.0),
    ],
)
def test_repair_probability(raw, expected):
    assert repair_probability(raw) == pytest.approx(expected, abs=1e-15)


def _json_listing(items):
    """The JSON answer listing (text, probability) pairs."""
    return json.dumps({"responses": [{"text": t, "probability": p} for t, p in items]})


def _tag_listing(items):
    """The tags answer listing (text, probability) pairs."""
    return "".join(f"<response><text>{t}</text><probability>{p}</probability></response>" for t, p in items)


@pytest.mark.parametrize(
    "min_probability, min_keep, probs, texts, expected",
    [
        (0.1, 1, [0.6, 0.35, 0.05], ("A", "B"), [0.6 / 0.95, 0.35 / 0.95]),
        (0.5, 2, [0.25, 0.4, 0.35], ("B", "C"), [0.4 / 0.75, 0.35 / 0.75]),  # top 2 kept, order kept
        (0.5, 2, [0.0, 0.0, 0.0], ("A", "B"), [0.5, 0.5]),  # ties: the first ones
        (0.5, 5, [0.9, 0.1], ("A", "B"), [0.9, 0.1]),  # min_keep above the count keeps all
        (0.0, 1, [0.0, 0.2], ("A", "B"), [0.0, 1.0]),  # the default drops nothing
    ],
)
def test_threshold_keeps_top_few(min_probability, min_keep, probs, texts, expected):
    config = VerbalizedConfig(min_probability=min_probability, min_keep=min_keep)
    dist = parse(_json_listing(zip("ABCDE", probs)), config)
    assert dist.texts == texts
    np.testing.assert_allclose(dist.probs, expected, rtol=0, atol=1e-12)


# --- property tests: arbitrary text never breaks the parser ------------------------------------------

_raw_probs = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.text(max_size=8),
    st.sampled_from(["70%", "30 %", "-5%", "1e400", "nan", "0.0"]),
    st.none(),
    st.booleans(),
)
_items = st.lists(st.tuples(st.text(max_size=20), _raw_probs), max_size=6)
_json_doc = _items.map(_json_listing)
_tag_doc = _items.map(_tag_listing)
_noise = st.text(alphabet=st.sampled_from('{}[],:"`<>/ \n0.5%-abcjson'), max_size=60)
_documents = st.one_of(
    st.text(),
    _noise,
    _json_doc,
    _tag_doc,
    # near misses: valid documents cut, wrapped or spliced with noise
    st.tuples(_noise, st.one_of(_json_doc, _tag_doc), _noise).map("".join),
    st.tuples(st.one_of(_json_doc, _tag_doc), st.integers(0, 200)).map(lambda d: d[0][: d[1]]),
    st.just('{"responses": ' + "[" * 100_000),  # deep nesting
)
_configs = st.builds(
    VerbalizedConfig,
    output_format=st.sampled_from(["json", "tags"]),
    min_probability=st.floats(0.0, 1.0),
    min_keep=st.integers(1, 4),
)


@settings(max_examples=300, deadline=None)
@given(text=_documents, config=_configs)
def test_parse_never_raises_and_returns_a_distribution(text, config):
    dist = parse(text, config)
    if dist is None:
        return
    assert len(dist.texts) == len(dist.probs) == dist.num_kept >= 1
    assert all(isinstance(t, str) and t and t == t.strip() for t in dist.texts)
    assert np.all(np.isfinite(dist.probs)) and np.all(dist.probs >= 0)
    assert abs(dist.probs.sum() - 1.0) <= 1e-9
    assert 0 < dist.p_max <= 1 and 0 <= dist.entropy <= math.log(dist.num_kept) + 1e-9


@settings(max_examples=100, deadline=None)
@given(items=st.lists(st.tuples(st.text(st.characters(exclude_characters="`")), _raw_probs), min_size=1))
def test_parse_reads_every_well_formed_json_listing(items):
    dist = parse(_json_listing(items), DEFAULT)
    texts = tuple(t.strip() for t, _ in items if t.strip())
    assert (dist.texts if dist is not None else ()) == texts


# --- distribution and sampling -----------------------------------------------------------------------


def test_distribution_summaries():
    dist = VerbalizedDistribution(("a", "b", "c"), np.array([0.5, 0.5, 0.0]))
    assert dist.p_max == 0.5 and dist.num_kept == 3
    assert dist.entropy == pytest.approx(math.log(2))
    assert VerbalizedDistribution(("a",), np.array([1.0])).entropy == 0.0
    with pytest.raises(ValueError):
        VerbalizedDistribution(("a", "b"), np.array([1.0]))


def test_sample_matches_verbalized_probabilities():
    probs = [0.5, 0.3, 0.15, 0.05]
    dist = VerbalizedDistribution(("a", "b", "c", "d", "never"), np.array(probs + [0.0]))
    n = 20_000
    keys = jax.random.split(jax.random.key(1234), n)
    counts = np.bincount([sample(dist, key) for key in keys], minlength=5)
    assert counts[4] == 0
    assert chisquare(counts[:4], n * np.array(probs)).pvalue > 1e-3
    # the test has power: nearby wrong distributions are rejected
    for wrong in ([0.25, 0.25, 0.25, 0.25], [0.47, 0.32, 0.15, 0.06]):
        assert chisquare(counts[:4], n * np.array(wrong)).pvalue < 1e-3


def test_sample_is_a_function_of_the_key():
    dist = VerbalizedDistribution(tuple("abcdefgh"), np.full(8, 1 / 8))
    keys = jax.random.split(jax.random.key(0), 16)
    assert [sample(dist, k) for k in keys] == [sample(dist, k) for k in keys]
    assert len({sample(dist, k) for k in keys}) > 1
    assert sample(dist, jax.random.PRNGKey(3)) == sample(dist, jax.random.PRNGKey(3))  # raw keys work too


# --- prompt ------------------------------------------------------------------------------------------


def test_build_prompt_json():
    prompt = build_prompt("You are a skeptical donor.", VerbalizedConfig(k=4))
    assert prompt.startswith("You are a skeptical donor.\n\n")
    assert "list 4 different candidates, each a reply you" in prompt
    assert '"responses"' in prompt and '"probability"' in prompt
    assert "below" not in prompt


def test_build_prompt_tags_tail_and_wording():
    config = VerbalizedConfig(
        k=3,
        output_format="tags",
        probability_word="confidence",
        candidate_noun="reply type",
        tail_threshold=0.1,
    )
    prompt = build_prompt("", config)
    assert "3 different candidates, each a reply type you" in prompt
    assert "<response><text>reply type</text><probability>confidence</probability></response>" in prompt
    assert "each confidence must be below 0.1" in prompt
    assert "{" not in prompt


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(k=0),
        dict(output_format="xml"),
        dict(tail_threshold=0.0),
        dict(min_probability=1.5),
        dict(min_keep=0),
        dict(max_retries=-1),
    ],
)
def test_config_rejects_impossible_values(kwargs):
    with pytest.raises(ValueError):
        VerbalizedConfig(**kwargs)


# --- per-turn driver ---------------------------------------------------------------------------------

GOOD = '{"responses": [{"text": "Yes", "probability": 0.75}, {"text": "No", "probability": 0.25}]}'


def direct_stub(instructions, rows):
    return ["direct"] * len(instructions)


class FakeGenerate:
    """Returns `outputs` in turn and records the calls."""

    def __init__(self, *outputs):
        self.outputs = list(outputs)
        self.calls = []

    def __call__(self, prompts, attempt, rows):
        self.calls.extend((prompt, attempt) for prompt in prompts)
        return [self.outputs.pop(0) for _ in prompts]


def test_retry_then_success_and_fallback_are_counted(caplog):
    config = VerbalizedConfig(max_retries=2)
    generate = FakeGenerate("sorry?", "```json\n{oops", GOOD, "nope", "still nope", "no JSON here")
    direct_calls = []

    def direct(instructions, rows):
        direct_calls.extend(instructions)
        return ["Hi."] * len(instructions)

    sampler = VerbalizedSampler(config)

    reply, record = sampler.choose("Be a donor.", jax.random.key(0), generate, direct)
    assert reply in ("Yes", "No") and reply == record.distribution.texts[record.choice]
    assert (record.attempts, record.parse_failures, record.fell_back) == (3, 2, False)
    assert generate.calls == [(build_prompt("Be a donor.", config), a) for a in range(3)]
    assert record.metrics() == {
        "p_max": 0.75,
        "entropy": record.distribution.entropy,
        "num_kept": 2,
        "attempts": 3,
        "parse_failures": 2,
        "fell_back": 0.0,
    }
    first = record

    with caplog.at_level(logging.WARNING, logger="scope_jax.simulators.verbalized"):
        reply, record = sampler.choose("Be a donor.", jax.random.key(1), generate, direct)
    assert reply == "Hi." and direct_calls == ["Be a donor."]
    assert (record.attempts, record.parse_failures, record.fell_back) == (3, 3, True)
    assert math.isnan(record.p_max) and record.num_kept == 0 and record.choice is None
    assert [r.levelname for r in caplog.records] == ["WARNING"] and "fall back" in caplog.text

    assert summarize([first.metrics(), record.metrics()]) == {
        "turns": 2,
        "parse_failures": 5,
        "fallbacks": 1,
        "parse_failure_rate": 5 / 6,
        "fallback_rate": 0.5,
        "mean_p_max": 0.75,
        "deviation": 0.25,
        "mean_entropy": pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25))),
        "mean_num_kept": 2.0,
    }


def test_no_retries_falls_back_after_one_attempt():
    sampler = VerbalizedSampler(VerbalizedConfig(max_retries=0))
    record = sampler.choose("x", jax.random.key(0), FakeGenerate("??"), direct_stub)[1]
    assert record.attempts == 1
    summary = summarize([record.metrics()])
    assert summary["fallback_rate"] == 1.0 and math.isnan(summary["mean_p_max"])


def test_choose_batch_uses_one_key_per_instruction():
    sampler = VerbalizedSampler(DEFAULT)
    always_good = lambda prompts, attempt, rows: [GOOD] * len(prompts)
    keys = jax.random.split(jax.random.key(7), 64)
    results = sampler.choose_batch(["x"] * 64, keys, always_good, direct_stub)
    expected = [("Yes", "No")[sample(record.distribution, key)] for (_, record), key in zip(results, keys)]
    assert [text for text, _ in results] == expected
    assert {text for text, _ in results} == {"Yes", "No"}
    with pytest.raises(ValueError):
        sampler.choose_batch(["x", "y"], keys[:1], always_good, direct_stub)


def test_generator_errors_are_not_swallowed():
    def broken(prompts, attempt, rows):
        raise RuntimeError("model crashed")

    sampler = VerbalizedSampler(DEFAULT)
    with pytest.raises(RuntimeError, match="model crashed"):
        sampler.choose("x", jax.random.key(0), broken, direct_stub)
    returns_none = lambda prompts, attempt, rows: [None] * len(prompts)
    with pytest.raises(TypeError, match="generate must return str"):
        sampler.choose("x", jax.random.key(0), returns_none, direct_stub)
    unparsable = lambda prompts, attempt, rows: ["??"] * len(prompts)
    direct_returns_bytes = lambda instructions, rows: [b"hi"] * len(instructions)
    with pytest.raises(TypeError, match="direct must return str"):
        sampler.choose("x", jax.random.key(0), unparsable, direct_returns_bytes)


def test_choose_batch_retries_only_the_rows_that_failed():
    calls = []

    def generate(prompts, attempt, rows):
        calls.append((attempt, list(rows)))
        return [GOOD if (row + attempt) % 2 else "garbage" for row in rows]

    sampler = VerbalizedSampler(VerbalizedConfig(max_retries=1))
    results = sampler.choose_batch(["a", "b", "c", "d"], jax.random.split(jax.random.key(0), 4), generate,
                                   direct_stub)
    # Odd rows parse at once; even rows fail, are retried alone, and parse on attempt 1.
    assert calls == [(0, [0, 1, 2, 3]), (1, [0, 2])]
    assert [record.attempts for _, record in results] == [2, 1, 2, 1]
    summary = summarize([record.metrics() for _, record in results])
    assert summary["fallbacks"] == 0 and summary["parse_failures"] == 2
