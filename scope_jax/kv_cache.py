"""Per-row KV caches kept across generate calls, so a multi-turn rollout prefills only what is new.

A `RowCache` holds, for every row of a player (or of every member of a population), the keys and values
of the tokens that row has seen, and on the host the ids of those tokens. `generate(..., views)` takes
each row's whole current view (the token ids of its next prompt; None: the row sits the call out), finds
how much of it the row's cache already holds (the longest common prefix with the cached ids), prefills
only the rest at the row's own positions, and decodes; the sampled tokens enter the cache too. `extend`
prefills without sampling. Rows advance independently: each has its own write position.

If a row's view does not extend what it cached (a template that rewrote an earlier turn), the row keeps
only the common prefix and re-prefills the rest: exact, and counted in `RowCache.stats.fallbacks`. (A row
that has not taken part in a call yet holds only its group's shared prefix, taken from the other rows'
views: a view that leaves it early is not counted.)

Shared prefixes. The rows (per member) form `groups` groups of consecutive rows, e.g. the rollouts of one
prompt. At the first call, each group's longest common prefix of its rows' views (the system prompt, a
persona card, a tool policy) is prefilled once for the group into a prefix segment. A row attends over its
group's segment and then over its own cache, one online softmax over both
(`scope_jax.models.attention.shared_prefix`): the prefix is neither recomputed nor copied per row, and a
decode step reads it once for the whole group. `groups=None` turns this off.

Shapes are bucketed (rows per group, new tokens per call and the prefix to powers of two, a row's cache
capacity to a power of two that grows, by a copy, when a row would outgrow it), so a multi-turn run reuses
a few compiled programs. The device arrays are donated to every call: the cache passed in is consumed;
use the one returned. On a mesh, the rows (and their caches) are spread over its (data, fsdp) axes.

A cache belongs to one set of parameters: start a new one when the parameters change.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from scope_jax import sharding
from scope_jax.models.decoder import (KVCache, LayerCache, Params, SharedPrefix, bind, population_axes,
                                      population_member, population_size, state_of)
from scope_jax.sampling import (MIN_PROMPT_BUCKET, SampleOutput, SamplingConfig, bucket, last_logits,
                                sample_loop)

MIN_CAPACITY = 64

View = Sequence[int] | None  # a row's token ids; None: the row sits the call out


class CacheArrays(NamedTuple):
    """The device state: every row's own cache, one (k, v) [(P,) rows, kv_heads, capacity, head_dim] per
    layer (each updated in place by a call: see `Decoder.hidden_by_layer`), and the groups' shared prefixes
    [(P,) layers, groups, kv_heads, prefix_capacity, head_dim] (None: none yet; written once)."""

    rows: tuple[LayerCache, ...]
    prefix: KVCache | None


@dataclasses.dataclass(frozen=True)
class CacheStats:
    """Counts over a cache's life, summed over rows and members.

    Attributes:
      calls: generate and extend calls.
      fallbacks: times a row's view did not extend what its cache held (the rest was re-prefilled).
      reused: view tokens found in a row's cache or its shared prefix, not computed again.
      prefilled: view tokens prefilled into the rows' own caches.
      shared: tokens of the shared prefixes, each prefilled once for its group.
    """

    calls: int = 0
    fallbacks: int = 0
    reused: int = 0
    prefilled: int = 0
    shared: int = 0

    def __add__(self, other: "CacheStats") -> "CacheStats":
        return CacheStats(*map(sum, zip(dataclasses.astuple(self), dataclasses.astuple(other))))


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where the caller's rows sit in the padded device arrays.

    The rows of a member form `groups` groups of `rows // groups` consecutive rows; on the device every
    group is padded to `padded_per_group` rows (a power of two, or more so that the rows divide the mesh's
    data-parallel size). Host-side state is indexed by flat row: member * padded_rows + padded row.
    """

    rows: int
    groups: int | None
    members: int | None
    padded_per_group: int
    mesh: Mesh | None

    @property
    def n_groups(self) -> int:
        return self.groups or 1

    @property
    def padded_rows(self) -> int:
        return self.n_groups * self.padded_per_group

    @property
    def lead(self) -> tuple[int, ...]:
        """The member axis, if any."""
        return () if self.members is None else (self.members,)

    @property
    def flat_rows(self) -> int:
        return (self.members or 1) * self.padded_rows

    def flat_index(self, member: int, row: int) -> int:
        """The flat row of the caller's row `row` of `member`."""
        per_group = self.rows // self.n_groups
        return member * self.padded_rows + row // per_group * self.padded_per_group + row % per_group

    def group(self, flat: int) -> int:
        """The flat group (member * groups + group) of a flat row."""
        return flat // self.padded_per_group

    def place(self, x: np.ndarray) -> jax.Array | np.ndarray:
        """A host array whose row (or group) axis follows the member axis, on the mesh (see `sharding`)."""
        axis = len(self.lead)
        return x if self.mesh is None else jax.device_put(x, self.sharding(x.ndim, axis, x.shape[axis]))

    def sharding(self, rank: int, axis: int, size: int) -> NamedSharding | None:
        """Axis `axis` (of `size`) of a rank-`rank` array over the mesh's (data, fsdp) axes when it divides
        them, else replicated; None without a mesh."""
        if self.mesh is None:
            return None
        if size % sharding.data_parallel_size(self.mesh):
            return sharding.replicated(self.mesh)
        return sharding.batch_sharding(self.mesh, rank, axis)

    def shardings(self, prefix: bool) -> CacheArrays | None:
        """The shardings of the device state: rows over (data, fsdp), prefix groups too if they divide."""
        if self.mesh is None:
            return None
        rows = self.sharding(len(self.lead) + 4, len(self.lead), self.padded_rows)  # every layer's k and v
        groups = KVCache(*[self.sharding(len(self.lead) + 5, len(self.lead) + 1, self.n_groups)] * 2)
        return CacheArrays(rows, groups if prefix else None)


@dataclasses.dataclass(frozen=True)
class RowCache:
    """Per-row KV caches of one player or population; see the module docstring.

    Attributes:
      arrays: the device state (donated to the next call).
      ids: per flat row (`Layout`), the token ids whose keys and values are cached, shared prefix included.
      prefix_lengths: [flat rows] how many of its group's prefix tokens each row sees; its own cache holds
        its tokens from there on.
      prefixes: per flat group, the shared prefix's ids; None until the first call sets them.
      layout: rows, groups, members, padding, mesh.
      stats: counts (`CacheStats`).
    """

    arrays: CacheArrays
    ids: tuple[np.ndarray, ...]
    prefix_lengths: np.ndarray
    prefixes: tuple[np.ndarray, ...] | None
    layout: Layout
    stats: CacheStats

    @property
    def capacity(self) -> int:
        """Slots of every row's own cache."""
        return self.arrays.rows[0][0].shape[-2]

    @property
    def fallbacks(self) -> int:
        return self.stats.fallbacks


def create(graphdef: nnx.GraphDef, params: Params, rows: int, *, groups: int | None = 1,
           population: bool = False, mesh: Mesh | None = None, capacity: int = MIN_CAPACITY) -> RowCache:
    """An empty cache for `rows` rows of the model (graphdef, params); see the module docstring.

    groups: the rows form this many groups of consecutive rows that may share a prompt prefix (it must
      divide `rows`); None: no shared prefixes. population: params are stacked [P, ...] and each member
      has its own `rows` rows. mesh: spread the rows over its (data, fsdp) axes. capacity: initial slots
      of each row's own cache (it grows as needed).
    """
    if groups is not None and (groups < 1 or rows % groups):
        raise ValueError(f"groups={groups} must be a positive divisor of rows={rows}")
    state = jax.eval_shape(lambda p: state_of(population_member(p, 0) if population else p), params)
    config = nnx.merge(graphdef, state).config
    dtype = state["embed_tokens"]["embedding"].dtype
    padded_per_group = bucket(rows // (groups or 1))
    shards = 1 if mesh is None else sharding.data_parallel_size(mesh)
    while (groups or 1) * padded_per_group % shards:
        padded_per_group += 1
    layout = Layout(rows, groups, population_size(params) if population else None, padded_per_group, mesh)
    shape = layout.lead + (layout.padded_rows, config.num_kv_heads, bucket(capacity, MIN_CAPACITY),
                           config.head_dim)
    shardings = layout.shardings(prefix=False)
    zeros = _zeros(shape, dtype, config.num_layers, None if shardings is None else shardings.rows)
    return RowCache(CacheArrays(zeros, None), (np.zeros(0, np.int32),) * layout.flat_rows,
                    np.zeros(layout.flat_rows, np.int32), None, layout, CacheStats())


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _zeros(shape: tuple[int, ...], dtype, layers: int,
           shardings: NamedSharding | None) -> tuple[LayerCache, ...]:
    rows = tuple((jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in range(layers))
    return rows if shardings is None else jax.lax.with_sharding_constraint(rows, shardings)


def _flat_views(layout: Layout, views) -> dict[int, np.ndarray]:
    """{flat row: view} of the rows that take part; views [rows] (or [members][rows])."""
    per_member = [views] if layout.members is None else list(views)
    if len(per_member) != (layout.members or 1) or any(len(v) != layout.rows for v in per_member):
        expected = f"[{layout.members}][{layout.rows}]" if layout.members else f"[{layout.rows}]"
        raise ValueError(f"views must be {expected} token id sequences or None, got "
                         f"{len(per_member)} x {[len(v) for v in per_member]}")
    flat = {}
    for member, member_views in enumerate(per_member):
        for row, view in enumerate(member_views):
            if view is not None:
                if len(view) == 0:
                    raise ValueError(f"row {row} (member {member}) has an empty view")
                flat[layout.flat_index(member, row)] = np.asarray(view, np.int32)
    return flat


def _common_length(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two id arrays."""
    n = min(len(a), len(b))
    mismatch = np.flatnonzero(a[:n] != b[:n])
    return int(mismatch[0]) if len(mismatch) else n


@functools.partial(jax.jit, static_argnames=("graphdef", "population", "shardings"))
def _prefill_prefixes(graphdef: nnx.GraphDef, params: Params, tokens: jax.Array, population: bool,
                      shardings: KVCache | None) -> KVCache:
    """Keys and values of the prefixes tokens [(P,) groups, length] (right-padded)."""

    def member(params, tokens):
        model = bind(graphdef, params)
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
        dtype = model.embed_tokens.embedding[...].dtype
        return model.hidden(tokens, positions, KVCache.zeros(model.config, *tokens.shape, dtype))[1]

    if population:
        member = jax.vmap(member, in_axes=(population_axes(params), 0))
    prefix = member(params, tokens)
    return prefix if shardings is None else jax.lax.with_sharding_constraint(prefix, shardings)


def _with_prefixes(graphdef: nnx.GraphDef, params: Params, cache: RowCache,
                   views: dict[int, np.ndarray]) -> RowCache:
    """At the first call, each group's longest common prefix of its rows' views (each view without its last
    token, whose logits a call needs), prefilled once per group; every row starts from its group's prefix."""
    if cache.prefixes is not None:
        return cache
    layout = cache.layout
    n_flat_groups = (layout.members or 1) * layout.n_groups
    prefixes = [None] * n_flat_groups
    if layout.groups is not None:
        for flat, view in views.items():
            group, head = layout.group(flat), view[:len(view) - 1]
            known = prefixes[group]
            prefixes[group] = head if known is None else head[:_common_length(known, head)]
    prefixes = tuple(np.zeros(0, np.int32) if p is None else p for p in prefixes)
    ids = tuple(prefixes[layout.group(flat)] for flat in range(layout.flat_rows))
    cache = dataclasses.replace(cache, ids=ids, prefix_lengths=np.array([len(i) for i in ids], np.int32),
                                prefixes=prefixes)
    if layout.groups is None:
        return cache
    width = bucket(max(len(p) for p in prefixes), MIN_PROMPT_BUCKET)
    tokens = np.zeros((n_flat_groups, width), np.int32)
    for group, prefix in enumerate(prefixes):
        tokens[group, :len(prefix)] = prefix
    tokens = layout.place(tokens.reshape(layout.lead + (layout.n_groups, width)))
    shardings = layout.shardings(prefix=True)
    prefix = _prefill_prefixes(graphdef, params, tokens, layout.members is not None,
                               None if shardings is None else shardings.prefix)
    return dataclasses.replace(cache, arrays=cache.arrays._replace(prefix=prefix),
                               stats=cache.stats + CacheStats(shared=sum(map(len, prefixes))))


class _Call(NamedTuple):
    """One call's inputs, per flat row: its new tokens (right-padded) and how many, the position of the
    first, and the prefix tokens it sees; plus the slots the rows' own caches need."""

    tokens: np.ndarray
    lengths: np.ndarray
    starts: np.ndarray
    prefix_lengths: np.ndarray
    needed: int
    stats: CacheStats


def _plan(cache: RowCache, views: dict[int, np.ndarray], sampling: SamplingConfig | None) -> _Call:
    """What each row must prefill: its view after the longest prefix its cache holds (when sampling, at
    least the last token, whose logits the first sample needs). Rows sitting out write (nothing they will
    read) just past their cached tokens."""
    starts = np.array([len(ids) for ids in cache.ids], np.int32)
    prefix_lengths = cache.prefix_lengths.copy()
    new, fallbacks = {}, 0
    for flat, view in views.items():
        common = _common_length(cache.ids[flat], view)
        # a row that has not taken part yet holds only its group's prefix, which it never saw as its own
        fallbacks += common < len(cache.ids[flat]) and len(cache.ids[flat]) > cache.prefix_lengths[flat]
        keep = min(common, len(view) - 1) if sampling is not None else common
        prefix_lengths[flat] = min(prefix_lengths[flat], keep)
        starts[flat], new[flat] = keep, view[keep:]
    width = bucket(max(map(len, new.values()), default=1), MIN_PROMPT_BUCKET)
    tokens = np.zeros((len(starts), width), np.int32)
    lengths = np.zeros(len(starts), np.int32)
    for flat, ids in new.items():
        tokens[flat, :len(ids)], lengths[flat] = ids, len(ids)
    decoded = 0 if sampling is None else sampling.max_new_tokens - 1  # tokens fed back while decoding
    needed = int(np.max(starts - prefix_lengths + np.maximum(width, lengths + decoded)))
    stats = CacheStats(calls=1, fallbacks=fallbacks, reused=int(sum(starts[f] for f in views)),
                       prefilled=int(lengths.sum()))
    return _Call(tokens, lengths, starts, prefix_lengths, needed, stats)


@functools.partial(jax.jit, static_argnames=("extra", "shardings"))
def _padded_slots(rows: tuple[LayerCache, ...], extra: int,
                  shardings: NamedSharding | None) -> tuple[LayerCache, ...]:
    rows = jax.tree.map(lambda x: jnp.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, extra), (0, 0)]), rows)
    return rows if shardings is None else jax.lax.with_sharding_constraint(rows, shardings)


def _with_capacity(cache: RowCache, needed: int) -> RowCache:
    """The cache with room for `needed` slots per row (a power of two), copied into larger arrays if need
    be."""
    if needed <= cache.capacity:
        return cache
    shardings = cache.layout.shardings(prefix=False)
    rows = _padded_slots(cache.arrays.rows, bucket(needed, MIN_CAPACITY) - cache.capacity,
                         None if shardings is None else shardings.rows)
    return dataclasses.replace(cache, arrays=cache.arrays._replace(rows=rows))


def _prefill(model: nnx.Module, arrays: CacheArrays, tokens: jax.Array, starts: jax.Array,
             prefix_lengths: jax.Array) -> tuple[jax.Array, list[LayerCache], SharedPrefix | None]:
    """Hidden states of the new tokens [B, W] at positions starts + 0..W-1, written into the rows' caches."""
    positions = starts[:, None] + jnp.arange(tokens.shape[1], dtype=jnp.int32)[None, :]
    prefix = None if arrays.prefix is None else SharedPrefix(arrays.prefix, prefix_lengths)
    hidden, rows = model.hidden_by_layer(tokens, positions, arrays.rows, prefix)
    return hidden, rows, prefix


def _per_member(member, population: bool, params, arrays: CacheArrays, key: jax.Array | None, *rows):
    """`member(params, arrays, *rows, key)` for one player, or vmapped over a population (member p's key
    fold_in(key, p), as in `scope_jax.sampling.generate_population`)."""
    if not population:
        return member(params, arrays, *rows, key)
    members = jnp.arange(rows[0].shape[0])
    keys = None if key is None else jax.vmap(lambda p: jax.random.fold_in(key, p))(members)
    in_axes = (population_axes(params),) + (0,) * (len(rows) + 2)
    return jax.vmap(member, in_axes=in_axes)(params, arrays, *rows,
                                                                                         keys)


def _constrained(arrays: CacheArrays, shardings: CacheArrays | None) -> CacheArrays:
    return arrays if shardings is None else jax.lax.with_sharding_constraint(arrays, shardings)


@functools.partial(jax.jit, static_argnames=("graphdef", "population", "shardings"),
                   donate_argnames=("arrays",))
def _extend_call(graphdef: nnx.GraphDef, params: Params, arrays: CacheArrays, tokens: jax.Array,
                 starts: jax.Array, prefix_lengths: jax.Array, population: bool,
                 shardings: CacheArrays | None) -> CacheArrays:
    def member(params, arrays, tokens, starts, prefix_lengths, _):
        _, rows, _ = _prefill(bind(graphdef, params), arrays, tokens, starts, prefix_lengths)
        return arrays._replace(rows=tuple(rows))

    return _constrained(_per_member(member, population, params, arrays, None, tokens, starts, prefix_lengths),
                        shardings)


@functools.partial(jax.jit, static_argnames=("graphdef", "config", "population", "shardings"),
                   donate_argnames=("arrays",))
def _generate_call(graphdef: nnx.GraphDef, params: Params, arrays: CacheArrays, tokens: jax.Array,
                   lengths: jax.Array, starts: jax.Array, prefix_lengths: jax.Array, key: jax.Array,
                   config: SamplingConfig, population: bool,
                   shardings: CacheArrays | None) -> tuple[SampleOutput, CacheArrays]:
    def member(params, arrays, tokens, lengths, starts, prefix_lengths, key):
        model = bind(graphdef, params)
        hidden, rows, prefix = _prefill(model, arrays, tokens, starts, prefix_lengths)
        logits = last_logits(model, hidden, lengths)
        out, rows = sample_loop(model, rows, prefix, logits, starts + lengths, lengths > 0, key, config)
        return out, arrays._replace(rows=tuple(rows))

    out, arrays = _per_member(member, population, params, arrays, key, tokens, lengths, starts,
                              prefix_lengths)
    return out, _constrained(arrays, shardings)


def _prepared(graphdef: nnx.GraphDef, params: Params, cache: RowCache, views,
              sampling: SamplingConfig | None) -> tuple[RowCache, dict[int, np.ndarray], _Call, tuple]:
    """(the cache with prefixes and capacity for the call, the flat views, the plan, its device inputs)."""
    flat = _flat_views(cache.layout, views)
    cache = _with_prefixes(graphdef, params, cache, flat)
    call = _plan(cache, flat, sampling)
    cache = _with_capacity(cache, call.needed)
    layout = cache.layout
    shaped = lambda x: layout.place(x.reshape(layout.lead + (layout.padded_rows,) + x.shape[1:]))
    inputs = tuple(map(shaped, (call.tokens, call.lengths, call.starts, call.prefix_lengths)))
    return cache, flat, call, inputs


def extend(graphdef: nnx.GraphDef, params: Params, cache: RowCache, views) -> RowCache:
    """Prefill what is new in each row's view (views [rows], or [members][rows]; None: sits out) without
    sampling; returns the updated cache (the one passed in is consumed)."""
    cache, flat, call, (tokens, _, starts, prefix_lengths) = _prepared(graphdef, params, cache, views, None)
    layout = cache.layout
    arrays = _extend_call(graphdef, params, cache.arrays, tokens, starts, prefix_lengths,
                          layout.members is not None, layout.shardings(cache.arrays.prefix is not None))
    ids = list(cache.ids)
    for row, view in flat.items():
        ids[row] = view
    return dataclasses.replace(cache, arrays=arrays, ids=tuple(ids), prefix_lengths=call.prefix_lengths,
                               stats=cache.stats + call.stats)


def generate(graphdef: nnx.GraphDef, params: Params, cache: RowCache, views, key: jax.Array,
             config: SamplingConfig) -> tuple[SampleOutput, RowCache]:
    """Sample a continuation of each row's view (views [rows], or [members][rows]; None: the row sits
    out and generates nothing), prefilling only what its cache does not hold.

    Returns the samples as host arrays over the caller's rows ([rows, ...], or [members, rows, ...]; as
    `scope_jax.sampling.generate` would give for the same prompts) and the updated cache, which holds
    every view and its sampled tokens (the one passed in is consumed).
    """
    cache, flat, call, inputs = _prepared(graphdef, params, cache, views, config)
    layout = cache.layout
    population, shardings = layout.members is not None, layout.shardings(cache.arrays.prefix is not None)
    out, arrays = _generate_call(graphdef, params, cache.arrays, *inputs, key, config, population, shardings)
    out = jax.device_get(out)
    per_row = lambda x: x.reshape((layout.flat_rows,) + x.shape[len(layout.lead) + 1:])
    tokens, lengths = per_row(out.tokens), per_row(out.lengths)
    ids = list(cache.ids)
    for row, view in flat.items():
        ids[row] = np.concatenate([view, tokens[row, :lengths[row] - 1]])  # the last sample is not fed back
    index = np.array([[layout.flat_index(member, row) for row in range(layout.rows)]
                      for member in range(layout.members or 1)]).reshape(layout.lead + (layout.rows,))
    caller = lambda x: per_row(x)[index]
    out = SampleOutput(*map(caller, (out.tokens, out.logprobs, out.lengths, out.done)), out.steps)
    return out, dataclasses.replace(cache, arrays=arrays, ids=tuple(ids), prefix_lengths=call.prefix_lengths,
                                    stats=cache.stats + call.stats)
