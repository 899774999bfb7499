"""Per-row KV caches across calls (`scope_jax.kv_cache`) against re-prefilling every view
(`scope_jax.sampling.generate`): multi-turn dialogues with rows of different lengths, rows that sit turns out,
shared prefixes, blockwise attention, 8 devices, populations, views that stop being extensions; and the
cache's memory: donated, prefix stored once per group."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax import kv_cache, sharding
from scope_jax.logprobs import token_logprobs
from scope_jax.models import PARTITION_RULES, ModelConfig, init
from scope_jax.sampling import SamplingConfig, generate, generate_population

VOCAB = 64
ROWS = 4
TURNS = 3
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=6, stop_token_ids=(32,), pad_token_id=0)
CONFIG = ModelConfig(model_type="llama", vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                     num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16)


def tiny(block: int, seed: int = 0):
    """A tiny decoder with a scaled-up head (peaked next-token distributions); `block` small makes the
    prefill and the prefix attention blockwise."""
    graphdef, params = init(CONFIG, seed=seed, attention_block=block)
    params["lm_head"]["kernel"] = params["lm_head"]["kernel"] * 10.0
    return graphdef, params


def first_views(rng, rows=ROWS):
    """A 20-token system prompt shared by all rows, then per-row openings of different lengths; rows 2, 3
    also share their first opening token (so groups of two have longer prefixes than the whole batch)."""
    system = list(rng.integers(6, VOCAB, 20))
    views = [system + list(rng.integers(6, VOCAB, 3 + 2 * row)) for row in range(rows)]
    views[3][20] = views[2][20]
    return views


def play(graphdef, params, groups, *, turns=TURNS, mesh=None, config=GREEDY, seed=0, reference=True):
    """Turns of a synthetic dialogue, each sampled by the cache and by re-prefilling the same views.
    Row r sits out turn t when (t + r) % 3 == 0 (after turn 0); after each turn a row's view grows by its
    sample and an 'other side' message of 2 + r random tokens. Returns [(cached, reprefilled or None, live
    rows)],
    the cache, the first views and the tokens the later turns should prefill (each live row: the message,
    and its last sample, which decoding never feeds back)."""
    rng = np.random.default_rng(seed)
    views = first_views(rng)
    first = [list(v) for v in views]
    cache = kv_cache.create(graphdef, params, ROWS, groups=groups, mesh=mesh)
    turns_out, later = [], 0
    for turn in range(turns):
        key = jax.random.key(turn)
        live = [r for r in range(ROWS) if turn == 0 or (turn + r) % 3]
        later += 0 if turn == 0 else sum(3 + r for r in live)
        taking_part = [views[r] if r in live else None for r in range(ROWS)]
        cached, cache = kv_cache.generate(graphdef, params, cache, taking_part, key, config)
        turns_out.append((cached, reprefilled(graphdef, params, [views[r] for r in live], key, config)
                          if reference else None, live))
        for r in live:
            message = list(rng.integers(6, VOCAB, 2 + r))
            views[r] = views[r] + list(cached.tokens[r, :cached.lengths[r]]) + message
    return turns_out, cache, first, later


def reprefilled(graphdef, params, views, key, config):
    """`scope_jax.sampling.generate` over the whole views (right-padded), on the host."""
    tokens = np.zeros((len(views), max(map(len, views))), np.int32)
    for row, view in enumerate(views):
        tokens[row, :len(view)] = view
    return jax.device_get(generate(graphdef, params, tokens, np.array(list(map(len, views))), key, config))


def assert_same(turns_out, atol=2e-5):
    for turn, (cached, again, live) in enumerate(turns_out):
        for i, r in enumerate(live):
            n = int(again.lengths[i])
            assert int(cached.lengths[r]) == n, (turn, r)
            np.testing.assert_array_equal(cached.tokens[r], again.tokens[i], err_msg=f"turn {turn} row {r}")
            np.testing.assert_allclose(cached.logprobs[r], again.logprobs[i], atol=atol,
                                       err_msg=f"turn {turn} row {r}")
        sat_out = [r for r in range(ROWS) if r not in live]
        assert not cached.lengths[sat_out].any() and not cached.done[sat_out].any()


@pytest.mark.parametrize("block, groups", [(512, None), (512, 2), (8, 1)],
                         ids=["dense-no-prefix", "dense-two-prefixes", "blockwise-one-prefix"])
def test_multi_turn_greedy_equals_reprefilling_every_view(block, groups):
    turns_out, cache, first, later = play(*tiny(block), groups)
    assert_same(turns_out)
    lengths = {int(n) for cached, _, live in turns_out for n in cached.lengths[live]}
    assert len(lengths) > 1 and any(cached.done.any() for cached, _, _ in turns_out)  # rows end apart
    assert cache.stats.fallbacks == 0 and cache.stats.calls == TURNS
    prefix = {None: [0] * 4, 1: [20] * 4, 2: [20, 20, 21, 21]}[groups]  # each group's common first tokens
    if groups is None:
        assert cache.arrays.prefix is None and cache.stats.shared == 0
    else:
        assert [len(p) for p in cache.prefixes] == prefix[::4 // groups]
        assert cache.stats.shared == sum(prefix[::4 // groups])  # prefilled once per group
    # Each row prefilled its first view after its prefix, then only what each later turn added.
    assert cache.stats.prefilled == sum(len(v) - p for v, p in zip(first, prefix)) + later


def test_population_equals_reprefilling_each_member():
    graphdef, _ = tiny(8)
    members = [tiny(8, seed)[1] for seed in (3, 4)]
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *members)
    rng = np.random.default_rng(1)
    views = [first_views(rng), first_views(rng)]
    views[1][0] = None  # member 1's row 0 sits out
    config = dataclasses.replace(GREEDY, temperature=1.0)
    cache = kv_cache.create(graphdef, stacked, ROWS, groups=2, population=True)
    key = jax.random.key(7)
    for turn in range(2):
        out, cache = kv_cache.generate(graphdef, stacked, cache, views, jax.random.fold_in(key, turn), config)
        width = max(len(v) for member in views for v in member if v is not None)
        tokens = np.zeros((2, ROWS, width), np.int32)
        lengths = np.zeros((2, ROWS), np.int32)
        for p, member in enumerate(views):
            for r, view in enumerate(member):
                if view is not None:
                    tokens[p, r, :len(view)], lengths[p, r] = view, len(view)
        again = jax.device_get(generate_population(graphdef, stacked, tokens, lengths,
                                                   jax.random.fold_in(key, turn), config))
        np.testing.assert_array_equal(out.tokens, again.tokens)
        np.testing.assert_array_equal(out.lengths, again.lengths)
        np.testing.assert_allclose(out.logprobs, again.logprobs, atol=2e-5)
        for p, member in enumerate(views):
            for r, view in enumerate(member):
                if view is not None:
                    member[r] = view + list(out.tokens[p, r, :out.lengths[p, r]]) + [7, 8, 9]
    assert out.tokens.shape[:2] == (2, ROWS) and not out.lengths[1, 0]


def test_rows_over_eight_devices_give_the_tokens_of_one_and_stay_sharded():
    """Parameters on their FSDP shardings, rows over (data, fsdp) = 8 devices, against one device (whose
    tokens the test above checks against re-prefilling)."""
    graphdef, params = tiny(8)
    mesh = sharding.make_mesh(data=2, fsdp=4)
    on_mesh = jax.device_put(params, sharding.named_shardings(params, PARTITION_RULES, mesh))
    alone, _, _, _ = play(graphdef, params, 2, reference=False)
    spread, cache, _, _ = play(graphdef, on_mesh, 2, mesh=mesh, reference=False)
    for (a, _, _), (b, _, _) in zip(alone, spread):
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=2e-5)
    # 4 rows padded to 8, one or more per device; the cache's row axis stays split over (data, fsdp)
    for k, v in cache.arrays.rows:
        for x in (k, v):
            assert x.shape[0] == 8
            assert x.sharding.spec[0] == sharding.BATCH_AXES
            assert len({shard.device for shard in x.addressable_shards}) == 8


def test_a_view_that_is_not_an_extension_is_reprefilled_and_counted():
    graphdef, params = tiny(8)
    rng = np.random.default_rng(2)
    views = first_views(rng)
    cache = kv_cache.create(graphdef, params, ROWS, groups=1)
    out, cache = kv_cache.generate(graphdef, params, cache, views, jax.random.key(0), GREEDY)
    grown = [v + list(out.tokens[r, :out.lengths[r]]) + [9, 9] for r, v in enumerate(views)]
    grown[1][22] = 7 if grown[1][22] != 7 else 8  # an earlier token of row 1 rewritten (after the prefix)
    grown[3][4] = 7 if grown[3][4] != 7 else 8  # row 3 rewritten inside the shared prefix
    out, cache = kv_cache.generate(graphdef, params, cache, grown, jax.random.key(1), GREEDY)
    assert cache.stats.fallbacks == 2
    assert cache.prefix_lengths[cache.layout.flat_index(0, 3)] == 4  # row 3 sees only the prefix's start
    again = reprefilled(graphdef, params, grown, jax.random.key(1), GREEDY)
    np.testing.assert_array_equal(out.tokens, again.tokens)
    np.testing.assert_allclose(out.logprobs, again.logprobs, atol=2e-5)


def test_extend_then_generate_equals_generate():
    graphdef, params = tiny(8)
    views = first_views(np.random.default_rng(3))
    cache = kv_cache.create(graphdef, params, ROWS)
    cache = kv_cache.extend(graphdef, params, cache, [v[:-2] for v in views])  # all but the last 2 tokens
    assert cache.stats.prefilled == sum(len(v) - 2 - 20 for v in views)  # the shared 20: once, apart
    out, cache = kv_cache.generate(graphdef, params, cache, views, jax.random.key(0), GREEDY)
    assert cache.stats.prefilled == sum(len(v) for v in views) - 4 * 20
    alone, _ = kv_cache.generate(graphdef, params, kv_cache.create(graphdef, params, ROWS), views,
                                 jax.random.key(0), GREEDY)
    np.testing.assert_array_equal(out.tokens, alone.tokens)
    np.testing.assert_allclose(out.logprobs, alone.logprobs, atol=2e-5)


def test_sampled_logprobs_equal_the_training_recomputation_over_the_dialogue():
    """Temperature-1 multi-turn sampling through the cache: the behaviour log-probs of every sampled token
    equal `token_logprobs` (the train step's recomputation) over the final full sequence."""
    graphdef, params = tiny(8)
    config = SamplingConfig(temperature=1.0, max_new_tokens=6, pad_token_id=0)
    rng = np.random.default_rng(4)
    views = first_views(rng)
    sampled = [[] for _ in range(ROWS)]  # (position, log-prob) of every sampled token
    cache = kv_cache.create(graphdef, params, ROWS, groups=1)
    for turn in range(3):
        out, cache = kv_cache.generate(graphdef, params, cache, views, jax.random.key(turn), config)
        for r in range(ROWS):
            n = int(out.lengths[r])
            sampled[r] += [(len(views[r]) + i, float(out.logprobs[r, i])) for i in range(n)]
            views[r] = views[r] + list(out.tokens[r, :n]) + list(rng.integers(6, VOCAB, 3))
    width = max(map(len, views))
    tokens = np.zeros((ROWS, width), np.int32)
    for r, view in enumerate(views):
        tokens[r, :len(view)] = view
    positions = np.broadcast_to(np.arange(width), tokens.shape)
    recomputed = token_logprobs(graphdef, params, jnp.asarray(tokens), jnp.asarray(positions)).logprobs
    recomputed = np.asarray(recomputed)
    for r in range(ROWS):
        where, logprobs = map(np.array, zip(*sampled[r]))
        np.testing.assert_allclose(recomputed[r, where], logprobs, atol=2e-5)


def test_the_cache_is_donated_and_a_shared_prefix_is_stored_once_per_group():
    """16 rows share a 1,000-token prompt: the prefix segment holds it once, each row's own cache only its
    own tokens, the generate program's scratch memory is below half of one per-row copy of the prefix, and
    the arrays passed in are consumed."""
    graphdef, params = tiny(64)
    prompt = list(np.random.default_rng(5).integers(6, VOCAB, 1000))
    views = [prompt + [6 + r, 7 + r] for r in range(16)]
    cache = kv_cache.create(graphdef, params, 16)
    config = dataclasses.replace(GREEDY, stop_token_ids=())
    before = cache.arrays.rows[0][0]
    out, cache = kv_cache.generate(graphdef, params, cache, views, jax.random.key(0), config)
    assert before.is_deleted()
    assert cache.arrays.prefix.k.shape[1] == 1 and cache.arrays.prefix.k.shape[3] == 1024
    assert cache.capacity == kv_cache.MIN_CAPACITY
    per_token = 2 * CONFIG.num_layers * CONFIG.num_kv_heads * CONFIG.head_dim * 4
    views = [v + list(out.tokens[r]) + [9] for r, v in enumerate(views)]
    flat = kv_cache._flat_views(cache.layout, views)
    call = kv_cache._plan(cache, flat, config)
    inputs = (call.tokens, call.lengths, call.starts, call.prefix_lengths)
    compiled = kv_cache._generate_call.lower(graphdef, params, cache.arrays, *inputs, jax.random.key(1),
                                             config, False, None).compile()
    assert compiled.memory_analysis().temp_size_in_bytes < 16 * 1000 * per_token / 2


def test_a_call_writes_into_the_rows_caches_in_place():
    """Generating and extending write each row's new keys and values into the donated per-layer arrays:
    each program's scratch memory stays below a third of the rows' caches. A program that copies the
    caches (as a scan over a stacked cache does, out of it and back) needs at least one whole copy. (Four
    layers of 64-wide heads, so that the attention's scores are small beside the caches.)"""
    config = dataclasses.replace(CONFIG, num_layers=4, num_kv_heads=4, head_dim=64)
    graphdef, params = init(config)
    cache = kv_cache.create(graphdef, params, 16, groups=None, capacity=1024)
    rows_bytes = sum(x.nbytes for layer in cache.arrays.rows for x in layer)
    flat = kv_cache._flat_views(cache.layout, [[6 + r, 7, 8] for r in range(16)])
    call = kv_cache._plan(cache, flat, GREEDY)
    generating = kv_cache._generate_call.lower(graphdef, params, cache.arrays, call.tokens, call.lengths,
                                               call.starts, call.prefix_lengths, jax.random.key(0), GREEDY,
                                               False, None)
    call = kv_cache._plan(cache, flat, None)
    extending = kv_cache._extend_call.lower(graphdef, params, cache.arrays, call.tokens, call.starts,
                                            call.prefix_lengths, False, None)
    for program in (generating, extending):
        assert program.compile().memory_analysis().temp_size_in_bytes < rows_bytes / 3


def test_bad_input_is_refused_with_a_clear_error():
    graphdef, params = tiny(512)
    with pytest.raises(ValueError, match="groups=3 must be a positive divisor of rows=4"):
        kv_cache.create(graphdef, params, ROWS, groups=3)
    cache = kv_cache.create(graphdef, params, ROWS)
    with pytest.raises(ValueError, match=r"views must be \[4\]"):
        kv_cache.generate(graphdef, params, cache, [[1, 2]] * 3, jax.random.key(0), GREEDY)
    with pytest.raises(ValueError, match="row 1 .* empty view"):
        kv_cache.generate(graphdef, params, cache, [[1, 2], [], None, None], jax.random.key(0), GREEDY)
