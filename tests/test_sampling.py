"""The sampler against the full no-cache forward, its stop handling, its statistics, its buckets and its
rows spread over a mesh."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from scope_jax import sharding
from scope_jax.models import PARTITION_RULES, ModelConfig, forward, init
from scope_jax.sampling import (SamplingConfig, _bucketed, _decode_jit, bucket, generate, generate_population,
                                sample_logits)

VOCAB = 64
PROMPTS = np.random.RandomState(0).randint(1, VOCAB, (3, 13)).astype(np.int32)
LENGTHS = np.array([13, 5, 1], np.int32)  # three rows: the batch is padded to 4 and the prompt to 16
NEW = 12
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=NEW)


@pytest.fixture(scope="module")
def model():
    """A tiny random decoder whose output head is scaled up, so its next-token distributions are peaked."""
    config = ModelConfig(model_type="llama", vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16)
    graphdef, params = init(config, seed=0)
    params["lm_head"]["kernel"] = params["lm_head"]["kernel"] * 10.0
    return graphdef, params


def full_logits(model, prompts, lengths, generated):
    """Float64 logits [B, P + N, V] of each row's prompt followed by its generated tokens (no cache).

    The rows are right-padded after their generated tokens; causal attention keeps that padding from
    touching the positions we read.
    """
    rows = [np.concatenate([p[:n], g]) for p, n, g in zip(prompts, lengths, generated)]
    width = max(map(len, rows))
    tokens = np.stack([np.pad(r, (0, width - len(r))) for r in rows])
    positions = np.broadcast_to(np.arange(width), tokens.shape)
    logits, _ = forward(*model, jnp.asarray(tokens), jnp.asarray(positions))
    return np.asarray(logits, np.float64)


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.fixture(scope="module")
def greedy_run(model):
    return generate(*model, PROMPTS, LENGTHS, jax.random.key(0), GREEDY)


def test_greedy_is_argmax_of_the_full_forward(model, greedy_run):
    tokens, logprobs = np.asarray(greedy_run.tokens), np.asarray(greedy_run.logprobs)
    assert tokens.shape == logprobs.shape == (3, NEW)
    np.testing.assert_array_equal(greedy_run.lengths, NEW)
    assert not np.asarray(greedy_run.done).any() and int(greedy_run.steps) == NEW
    logits = full_logits(model, PROMPTS, LENGTHS, tokens)
    for row, n in enumerate(LENGTHS):
        step_logits = logits[row, n - 1:n - 1 + NEW]  # the logits each generated token was chosen from
        np.testing.assert_array_equal(tokens[row], step_logits.argmax(-1))
        expected = np.take_along_axis(log_softmax(step_logits), tokens[row][:, None], -1)[:, 0]
        np.testing.assert_allclose(logprobs[row], expected, atol=1e-5)


def test_stop_tokens_end_rows_independently(model, greedy_run):
    free = np.asarray(greedy_run.tokens)
    stop_ids = tuple(sorted({int(free[0, 6]), int(free[1, 2]), int(free[2, 4])}))
    ends = np.array([np.flatnonzero(np.isin(row, stop_ids))[0] + 1 for row in free])  # lengths
    assert len(set(ends)) > 1 and ends.max() < NEW
    config = SamplingConfig(temperature=0.0, max_new_tokens=NEW, stop_token_ids=stop_ids, pad_token_id=0)
    out = generate(*model, PROMPTS, LENGTHS, jax.random.key(0), config)
    np.testing.assert_array_equal(out.lengths, ends)
    assert np.asarray(out.done).all()
    assert int(out.steps) == ends.max()  # the loop exited as soon as the last row stopped
    for row, end in enumerate(ends):
        np.testing.assert_array_equal(out.tokens[row, :end], free[row, :end])
        np.testing.assert_array_equal(out.tokens[row, end:], 0)
        np.testing.assert_allclose(out.logprobs[row, :end], greedy_run.logprobs[row, :end], atol=1e-6)
        np.testing.assert_array_equal(out.logprobs[row, end:], 0.0)


ROWS = 4096


@pytest.fixture(scope="module")
def first_token_logits(model):
    """Float64 next-token logits after PROMPTS[0], from the no-cache forward."""
    return full_logits(model, PROMPTS[:1], LENGTHS[:1], np.zeros((1, 0), np.int32))[0, LENGTHS[0] - 1]


def sample_first_tokens(model, config):
    """ROWS independent first tokens (and log-probs) after PROMPTS[0], through `generate`."""
    prompts = np.repeat(PROMPTS[:1], ROWS, axis=0)
    out = generate(*model, prompts, np.full(ROWS, LENGTHS[0]), jax.random.key(1),
                   SamplingConfig(max_new_tokens=1, **config))
    return np.asarray(out.tokens[:, 0]), np.asarray(out.logprobs[:, 0])


def chi_square_pvalue(tokens, probs):
    """Chi-square goodness of fit of token counts to probs [V], tokens with expected count < 5 pooled."""
    expected = probs * len(tokens)
    observed = np.bincount(tokens, minlength=len(probs)).astype(np.float64)
    assert observed[probs == 0].sum() == 0, "sampled a token of probability 0"
    big = expected >= 5
    observed = np.append(observed[big], observed[~big].sum())
    expected = np.append(expected[big], expected[~big].sum())
    keep = expected > 0
    return stats.chisquare(observed[keep], expected[keep]).pvalue


def test_temperature_one_matches_softmax(model, first_token_logits):
    tokens, logprobs = sample_first_tokens(model, dict(temperature=1.0))
    probs = np.exp(log_softmax(first_token_logits))
    assert probs.max() < 0.5 and (probs * ROWS >= 5).sum() >= 5  # the test has something to detect
    assert chi_square_pvalue(tokens, probs) > 1e-3
    assert chi_square_pvalue(tokens, np.exp(log_softmax(first_token_logits / 0.5))) < 1e-6
    assert chi_square_pvalue(tokens, np.exp(log_softmax(first_token_logits / 1.5))) < 1e-6
    np.testing.assert_allclose(logprobs, np.log(probs[tokens]), atol=1e-5)


def renormalised(logits, top_k=0, top_p=1.0):
    """Probabilities [V] after a top-k then top-p filter (numpy reference)."""
    order = np.argsort(-logits)
    keep = np.zeros(len(logits), bool)
    keep[order[:top_k or len(logits)]] = True
    probs = np.where(keep, np.exp(log_softmax(np.where(keep, logits, -np.inf))), 0.0)
    sorted_probs = probs[order]
    mass_before = np.cumsum(sorted_probs) - sorted_probs
    keep[order[mass_before >= top_p]] = False
    probs = np.where(keep, probs, 0.0)
    return probs / probs.sum()


@pytest.mark.parametrize("config", [dict(temperature=1.0, top_k=5), dict(temperature=1.0, top_p=0.7),
                                    dict(temperature=0.7, top_k=12, top_p=0.8)], ids=str)
def test_filters_sample_the_renormalised_distribution(first_token_logits, config):
    logits = jnp.broadcast_to(jnp.asarray(first_token_logits, jnp.float32), (ROWS, VOCAB))
    sample = jax.jit(sample_logits, static_argnums=2)
    tokens, logprobs = map(np.asarray, sample(logits, jax.random.key(2), SamplingConfig(**config)))
    filters = {k: v for k, v in config.items() if k != "temperature"}
    probs = renormalised(first_token_logits / config["temperature"], **filters)
    assert set(np.unique(tokens)) <= set(np.flatnonzero(probs))  # never outside the top-k / nucleus
    assert (probs > 0).sum() < VOCAB // 2
    assert chi_square_pvalue(tokens, probs) > 1e-3
    np.testing.assert_allclose(logprobs, np.log(probs[tokens]), atol=1e-5)


def test_sample_logits_keeps_the_top_token_when_it_exceeds_top_p():
    logits = jnp.array([[5.0, 0.0, -1.0, 0.5]])
    tokens, logprobs = jax.jit(jax.vmap(lambda k: sample_logits(logits, k, SamplingConfig(top_p=0.5))))(
        jax.random.split(jax.random.key(0), 64))
    np.testing.assert_array_equal(tokens, 0)
    np.testing.assert_array_equal(logprobs, 0.0)


def test_bucket():
    assert [bucket(n, 16) for n in (1, 16, 17, 32, 33)] == [16, 16, 32, 32, 64]
    assert [bucket(n) for n in (1, 3, 4, 5)] == [1, 4, 4, 8]


def test_prompts_in_one_bucket_share_a_compiled_program_and_padding_changes_nothing(model):
    prompts = np.random.RandomState(1).randint(1, VOCAB, (2, 27)).astype(np.int32)
    config = SamplingConfig(temperature=0.0, max_new_tokens=4)
    first = generate(*model, prompts[:, :20], np.array([20, 17]), jax.random.key(0), config)
    compiled = _decode_jit._cache_size()
    generate(*model, prompts, np.array([27, 18]), jax.random.key(0), config)
    assert _decode_jit._cache_size() == compiled  # same bucket (32): no new program

    # The same prompts padded further (bucket 64, batch 4) give the same tokens.
    wide = np.pad(prompts[:, :20], ((0, 1), (0, 20)))
    again = generate(*model, wide, np.array([20, 17, 3]), jax.random.key(0), config)
    np.testing.assert_array_equal(again.tokens[:2], first.tokens)
    np.testing.assert_allclose(again.logprobs[:2], first.logprobs, atol=1e-5)


@pytest.mark.parametrize("axes", [dict(data=2, fsdp=4), dict(data=2, fsdp=2, tensor=2)])
@pytest.mark.parametrize("config", [GREEDY, SamplingConfig(max_new_tokens=NEW, stop_token_ids=(5, 9))],
                         ids=["greedy", "sampled"])
def test_generation_with_rows_over_the_mesh_gives_the_tokens_of_one_device(model, axes, config):
    """Three rows (padded to a multiple of data x fsdp) over the mesh, parameters on their FSDP / tensor
    shardings."""
    mesh = sharding.make_mesh(**axes)
    graphdef, params = model
    on_mesh = jax.device_put(params, sharding.named_shardings(params, PARTITION_RULES, mesh))
    alone = generate(graphdef, params, PROMPTS, LENGTHS, jax.random.key(3), config)
    out = generate(graphdef, on_mesh, PROMPTS, LENGTHS, jax.random.key(3), config, mesh=mesh)
    np.testing.assert_array_equal(out.tokens, alone.tokens)
    np.testing.assert_array_equal(out.lengths, alone.lengths)
    np.testing.assert_allclose(out.logprobs, alone.logprobs, atol=1e-5)


def test_rows_over_the_mesh_split_the_kv_cache(model):
    """Each device holds its own rows' cache: the decode program's per-device scratch memory (the KV
    cache dominates it at 64 rows x 512 slots) drops about 8-fold on 8 data-parallel devices."""
    graphdef, params = model
    prompts = np.random.RandomState(2).randint(1, VOCAB, (64, 500)).astype(np.int32)
    lengths = np.full(64, 500, np.int32)
    config = dataclasses.replace(GREEDY, max_new_tokens=4)

    def scratch(params, mesh):
        tokens, lengths_ = _bucketed(prompts, lengths, config.pad_token_id, mesh)
        compiled = _decode_jit.lower(graphdef, params, tokens, lengths_, jax.random.key(0), config).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    mesh = sharding.make_mesh(data=2, fsdp=4)
    on_mesh = jax.device_put(params, sharding.named_shardings(params, PARTITION_RULES, mesh))
    assert scratch(on_mesh, mesh) < scratch(params, None) / 4


TINY_POPULATION = ModelConfig(model_type="llama", vocab_size=32, hidden_size=32, intermediate_size=64,
                              num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8)


def test_population_generation_equals_a_loop_over_members():
    graphdef, _ = init(TINY_POPULATION, seed=0)
    members = [init(TINY_POPULATION, seed=s)[1] for s in (3, 4, 5)]
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *members)
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, TINY_POPULATION.vocab_size, (3, 5, 7)).astype(np.int32)
    lengths = np.asarray([[7, 3, 5, 0, 0], [2, 7, 7, 1, 4], [6, 6, 0, 0, 0]], np.int32)
    config = SamplingConfig(temperature=1.0, max_new_tokens=6, stop_token_ids=(1,))
    key = jax.random.key(9)
    together = jax.device_get(generate_population(graphdef, stacked, tokens, lengths, key, config))
    # each member's rows over 8 devices
    sharded = generate_population(graphdef, stacked, tokens, lengths, key, config,
                                  mesh=sharding.make_mesh(data=2, fsdp=4))
    np.testing.assert_array_equal(sharded.tokens, together.tokens)
    np.testing.assert_allclose(sharded.logprobs, together.logprobs, atol=1e-5)
    for p, params in enumerate(members):
        alone = jax.device_get(generate(graphdef, params, tokens[p], lengths[p], jax.random.fold_in(key, p),
                                        config))
        active = lengths[p] > 0
        np.testing.assert_array_equal(together.tokens[p][active], alone.tokens[active])
        np.testing.assert_array_equal(together.lengths[p][active], alone.lengths[active])
        np.testing.assert_allclose(together.logprobs[p][active], alone.logprobs[active], atol=1e-5)
        assert not together.lengths[p][~active].any()
