"""LoRA (`scope_jax.models.lora`): a fresh adapter is the base bit for bit, the unmerged forward equals
the merged model and transformers' (PyTorch) forward with the merged weights, no base gradient is computed,
the sampler and the KV-cache rollout run an adapter (and a population of adapters over one base) as the
merged plain model, and adapters save and load on their own."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax import kv_cache
from scope_jax.models import ModelConfig, forward, from_pretrained, init, lora, save_pretrained
from scope_jax.models.decoder import population_member
from scope_jax.sampling import SamplingConfig, generate, generate_population
from tests.jaxprs import dot_generals
from scope_jax.training.state import stack_population

from ..test_kv_cache import play

CONFIG = ModelConfig(model_type="llama", vocab_size=64, hidden_size=64, intermediate_size=128, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=16)
EVERY = lora.LoRAConfig(rank=4, alpha=8.0, targets=lora.ATTENTION_TARGETS + lora.MLP_TARGETS)
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=8, pad_token_id=0)
jit_forward = jax.jit(forward, static_argnums=0)


def trained_like(adapter, seed: int, scale: float = 0.2):
    """`adapter` with random A and B, as after some training (a fresh B is zero)."""
    leaves, treedef = jax.tree.flatten(adapter)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(treedef, [scale * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves)])


def tiny_llama_with_adapter(tiny_hf, scale: float):
    """(HF folder, graphdef, base, LoRA graphdef, LoRAParams) of the tiny random Llama of the parity tests
    with an `EVERY` adapter of random non-zero A and B."""
    folder, _ = tiny_hf("llama")
    _, (graphdef, base), _ = from_pretrained(folder)
    lora_graphdef, params = lora.init(graphdef, base, EVERY, seed=3)
    adapter = trained_like(params.adapter, 4, scale)
    return folder, graphdef, base, lora_graphdef, params._replace(adapter=adapter)


def tokens_and_positions(seed: int, shape=(2, 11), vocab: int = 64):
    tokens = jnp.asarray(np.random.default_rng(seed).integers(0, vocab, shape), jnp.int32)
    return tokens, jnp.broadcast_to(jnp.arange(shape[1], dtype=jnp.int32), shape)


@pytest.fixture(scope="module")
def adapted():
    """(plain graphdef, base params, LoRA graphdef, LoRAParams with a trained-like adapter); the head is
    scaled up so that greedy decoding is decided by clear margins."""
    graphdef, base = init(CONFIG, seed=0, attention_block=8)
    base["lm_head"]["kernel"] = base["lm_head"]["kernel"] * 10.0
    lora_graphdef, params = lora.init(graphdef, base, EVERY, seed=1)
    return graphdef, base, lora_graphdef, params._replace(adapter=trained_like(params.adapter, 2))


def test_a_fresh_adapter_gives_the_base_logits_bit_for_bit(adapted):
    graphdef, base, _, _ = adapted
    lora_graphdef, fresh = lora.init(graphdef, base, EVERY, seed=5)
    assert all(np.any(np.asarray(p["lora_a"]) != 0) for p in jax.tree.leaves(
        fresh.adapter, is_leaf=lambda n: isinstance(n, dict) and "lora_a" in n))
    tokens, positions = tokens_and_positions(0)
    plain, _ = jit_forward(graphdef, base, tokens, positions)
    with_adapter, _ = jit_forward(lora_graphdef, fresh, tokens, positions)
    np.testing.assert_array_equal(np.asarray(with_adapter), np.asarray(plain))


def test_merged_and_unmerged_forwards_agree(adapted):
    graphdef, base, lora_graphdef, params = adapted
    tokens, positions = tokens_and_positions(1)
    unmerged, _ = jit_forward(lora_graphdef, params, tokens, positions)
    merged_graphdef, merged = lora.merge(lora_graphdef, params)
    plain, _ = jit_forward(merged_graphdef, merged, tokens, positions)
    base_logits, _ = jit_forward(graphdef, base, tokens, positions)
    assert float(jnp.max(jnp.abs(unmerged - base_logits))) > 1.0  # the adapter matters
    np.testing.assert_allclose(np.asarray(unmerged), np.asarray(plain), atol=5e-4, rtol=1e-5)


def test_no_base_weight_gradient_is_computed(adapted):
    """Gradients reach only the adapter: the base's are exactly zero, and the differentiated program has no
    matmul whose result is shaped like a base kernel (none is computed and thrown away)."""
    _, base, lora_graphdef, params = adapted
    tokens, positions = tokens_and_positions(2)

    def loss(p):
        logits, _ = forward(lora_graphdef, p, tokens, positions)
        return jnp.mean(jax.nn.log_softmax(logits)[..., 3])

    grads = jax.grad(loss)(params)
    assert all(not np.any(np.asarray(g)) for g in jax.tree.leaves(grads.base))
    assert all(np.any(np.asarray(g)) for g in jax.tree.leaves(grads.adapter))
    kernels = {x.shape[-2:] for x in jax.tree.leaves(base) if x.ndim >= 2}
    kernels |= {s[::-1] for s in kernels}
    products = _matmul_shapes(jax.make_jaxpr(jax.grad(loss))(params).jaxpr)
    # The forward merges A B into each adapted kernel (a kernel-shaped product over the rank); a weight
    # gradient would contract over tokens.
    over_tokens = {shape for shape, contracted in products if contracted != EVERY.rank}
    assert products and not kernels & over_tokens, kernels & over_tokens


def test_the_adapted_matmul_backward_equals_autodiff_and_refuses_a_trained_kernel(matmul_path):
    x, w, a, b, cotangent = (jax.random.normal(jax.random.key(i), shape) for i, shape in
                             enumerate([(2, 5, 12), (12, 7), (12, 3), (3, 7), (2, 5, 7)]))
    frozen = lambda x, a, b: lora.adapted_matmul(x, jax.lax.stop_gradient(w), a, b)
    out, vjp = jax.vjp(frozen, x, a, b)
    want_out, want_vjp = jax.vjp(lambda x, a, b: x @ w + (x @ a) @ b, x, a, b)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want_out), rtol=1e-5, atol=1e-5)
    for got, want in zip(vjp(cotangent), want_vjp(cotangent)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="kernel must be frozen"):
        jax.grad(lambda w: jnp.sum(lora.adapted_matmul(x, w, a, b)))(w)


@pytest.mark.parametrize("up_rank", [3, 0], ids=["all-adapted", "up-plain"])
def test_the_adapted_swiglu_backward_equals_autodiff_and_refuses_a_trained_kernel(up_rank, matmul_path):
    """Against autodiff of silu(x Wg') * (x Wu') Wd' with W' = W + A B written out; a projection that
    is not a target has a rank-0 update."""
    keys = iter(jax.random.split(jax.random.key(0), 12))
    normal = lambda *shape: jax.random.normal(next(keys), shape)
    x, cotangent = normal(2, 5, 12), normal(2, 5, 12)
    projections = [(normal(12, 9), normal(12, 3), normal(3, 9)), (normal(12, 9), normal(12, up_rank),
                                                                   normal(up_rank, 9)),
                   (normal(9, 12), normal(9, 2), normal(2, 12))]
    kernels = [w for w, _, _ in projections]
    adapters = [(a, b) for _, a, b in projections]

    def ours(x, adapters):
        frozen = [(jax.lax.stop_gradient(w), a, b) for w, (a, b) in zip(kernels, adapters)]
        return lora.adapted_swiglu_mlp(x, *frozen)

    def plain(x, adapters):
        (wg, wu, wd), ((ag, bg), (au, bu), (ad, bd)) = kernels, adapters
        return (jax.nn.silu(x @ wg + x @ ag @ bg) * (x @ wu + x @ au @ bu)) @ (wd + ad @ bd)

    out, vjp = jax.vjp(ours, x, adapters)
    want_out, want_vjp = jax.vjp(plain, x, adapters)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want_out), rtol=1e-4, atol=1e-4)
    for got, want in zip(jax.tree.leaves(vjp(cotangent)), jax.tree.leaves(want_vjp(cotangent))):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="kernels must be frozen"):
        trained_gate = lambda w: jnp.sum(lora.adapted_swiglu_mlp(x, (w, *adapters[0]), *projections[1:]))
        jax.grad(trained_gate)(kernels[0])


def _matmul_shapes(jaxpr) -> set[tuple[tuple[int, ...], int]]:
    """(output shape, contracted size) of every dot_general in `jaxpr` and the jaxprs nested in it."""
    shapes = set()
    for eqn in dot_generals(jaxpr):
        (contracting, _), _ = eqn.params["dimension_numbers"]
        contracted = int(np.prod([eqn.invars[0].aval.shape[d] for d in contracting]))
        shapes |= {(tuple(v.aval.shape), contracted) for v in eqn.outvars}
    return shapes


def test_merged_export_equals_transformers_with_the_merged_weights(tiny_hf, tmp_path):
    """The adapter (as saved) added to the PyTorch weights, W + alpha/rank (A B)^T in HF's [out, in] layout,
    gives the logits of our unmerged forward; `save_pretrained` of `merge` loads in transformers as it."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    folder, _, _, lora_graphdef, params = tiny_llama_with_adapter(tiny_hf, scale=0.3)
    lora.save_adapter(tmp_path / "adapter", params.adapter, EVERY)

    _, saved = lora.load_adapter(tmp_path / "adapter")
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        for owner, projections in saved["layers"].items():
            for name, factors in projections.items():
                a, b = (torch.as_tensor(np.asarray(factors[k])) for k in ("lora_a", "lora_b"))
                for i, layer in enumerate(reference.model.layers):
                    getattr(getattr(layer, owner), name).weight += EVERY.scale * (a[i] @ b[i]).T
    tokens, positions = tokens_and_positions(3, vocab=reference.config.vocab_size)
    with torch.no_grad():
        expected = reference(torch.as_tensor(np.asarray(tokens), dtype=torch.long)).logits.numpy()
    ours, _ = jit_forward(lora_graphdef, params, tokens, positions)
    np.testing.assert_allclose(np.asarray(ours), expected, atol=2e-4, rtol=1e-4)

    merged_graphdef, merged = lora.merge(lora_graphdef, params)
    save_pretrained(merged, from_pretrained(folder)[0], None, tmp_path / "merged")
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32).eval()
    with torch.no_grad():
        loaded = exported(torch.as_tensor(np.asarray(tokens), dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(loaded, expected, atol=2e-4, rtol=1e-4)


def test_sampler_with_an_adapter_gives_the_merged_models_tokens(adapted):
    _, _, lora_graphdef, params = adapted
    merged_graphdef, merged = lora.merge(lora_graphdef, params)
    tokens = np.random.default_rng(4).integers(0, 64, (3, 12)).astype(np.int32)
    lengths = np.array([5, 12, 8])
    ours = generate(lora_graphdef, params, tokens, lengths, jax.random.key(0), GREEDY)
    plain = generate(merged_graphdef, merged, tokens, lengths, jax.random.key(0), GREEDY)
    np.testing.assert_array_equal(np.asarray(ours.tokens), np.asarray(plain.tokens))
    assert len(set(np.asarray(ours.tokens).ravel().tolist())) > 3  # not a constant continuation


def test_kv_cache_rollout_with_an_adapter_gives_the_merged_models_tokens(adapted):
    _, _, lora_graphdef, params = adapted
    merged_graphdef, merged = lora.merge(lora_graphdef, params)
    ours, *_ = play(lora_graphdef, params, 2, reference=False)
    plain, *_ = play(merged_graphdef, merged, 2, reference=False)
    for turn, ((a, _, live), (b, _, _)) in enumerate(zip(ours, plain)):
        np.testing.assert_array_equal(a.tokens[live], b.tokens[live], err_msg=f"turn {turn}")
        np.testing.assert_allclose(a.logprobs[live], b.logprobs[live], atol=1e-4)


def test_a_population_of_adapters_samples_as_each_merged_member(adapted):
    """P = 2 adapters stacked over one unstacked base: generate_population and the population KV cache give
    each member's merged model's tokens (sampled at temperature 1: member p draws with fold_in(key, p))."""
    _, _, lora_graphdef, params = adapted
    population = lora.LoRAParams(params.base, stack_population([params.adapter,
                                                                trained_like(params.adapter, 9)]))
    config = SamplingConfig(temperature=1.0, max_new_tokens=8, pad_token_id=0)
    tokens = np.random.default_rng(5).integers(0, 64, (2, 3, 12)).astype(np.int32)
    lengths = np.array([[5, 12, 8], [9, 3, 12]])
    key = jax.random.key(1)
    out = generate_population(lora_graphdef, population, tokens, lengths, key, config)
    cache = kv_cache.create(lora_graphdef, population, 3, groups=1, population=True)
    views = [[list(t[:n]) for t, n in zip(member, member_lengths)] for member, member_lengths in zip(tokens, lengths)]
    cached, _ = kv_cache.generate(lora_graphdef, population, cache, views, key, config)
    for p in range(2):
        merged_graphdef, merged = lora.merge(lora_graphdef, population_member(population, p))
        alone = generate(merged_graphdef, merged, tokens[p], lengths[p], jax.random.fold_in(key, p), config)
        np.testing.assert_array_equal(np.asarray(out.tokens[p]), np.asarray(alone.tokens))
        np.testing.assert_array_equal(cached.tokens[p], np.asarray(alone.tokens))
    assert not np.array_equal(np.asarray(out.tokens[0]), np.asarray(out.tokens[1]))


def test_an_adapter_saves_and_loads_on_its_own(adapted, tmp_path):
    graphdef, base, _, params = adapted
    lora.save_adapter(tmp_path, params.adapter, EVERY)
    assert sorted(p.name for p in tmp_path.iterdir()) == [lora.ADAPTER_FILE, lora.CONFIG_FILE]
    assert json.loads((tmp_path / lora.CONFIG_FILE).read_text()) == {
        "rank": 4, "alpha": 8.0, "targets": list(EVERY.targets)}
    adapter_bytes = sum(x.nbytes for x in jax.tree.leaves(params.adapter))
    assert (tmp_path / lora.ADAPTER_FILE).stat().st_size < adapter_bytes + 4096  # the adapter, not the base
    _, loaded = lora.load(tmp_path, graphdef, base)
    jax.tree.map(np.testing.assert_array_equal, loaded.adapter, params.adapter)
    assert loaded.base is base
    with pytest.raises(FileNotFoundError, match="is not an adapter folder"):
        lora.load(tmp_path / "missing", graphdef, base)
    with pytest.raises(ValueError, match="does not fit this model"):
        lora.load(tmp_path, *init(dataclasses.replace(CONFIG, hidden_size=32, head_dim=8)))


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="rank must be >= 1"):
        lora.LoRAConfig(rank=0)
    with pytest.raises(ValueError, match="distinct names among"):
        lora.LoRAConfig(targets=("q_proj", "qkv"))
    with pytest.raises(ValueError, match="distinct names among"):
        lora.LoRAConfig(targets=("q_proj", "q_proj"))


def test_a_model_spec_base_plus_adapter_folder_loads_the_saved_adapter_on_the_base(tmp_path):
    """"BASE+FOLDER" (a player's model spec, e.g. the P4G human proxy) is BASE with FOLDER's adapter, in the
    base's dtype."""
    from scope_jax.training.players import load_model

    graphdef, base, _ = load_model("tiny:0")
    _, fresh = lora.init(graphdef, base, EVERY, seed=1)
    adapter = trained_like(fresh.adapter, 3)
    lora.save_adapter(tmp_path, adapter, EVERY)
    lora_graphdef, params, tokenizer = load_model(f"tiny:0+{tmp_path}")
    assert isinstance(params, lora.LoRAParams) and tokenizer is not None
    jax.tree.map(np.testing.assert_array_equal, params.adapter, adapter)
    tokens, positions = tokens_and_positions(4, vocab=8)
    expected, _ = jit_forward(*lora.merge(lora_graphdef, params._replace(base=base)), tokens, positions)
    got, _ = jit_forward(lora_graphdef, params, tokens, positions)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=1e-5)
    _, half, _ = load_model(f"tiny:0+{tmp_path}", dtype="bfloat16")
    assert {x.dtype for x in jax.tree.leaves(half.adapter)} == {jnp.dtype(jnp.bfloat16)}
