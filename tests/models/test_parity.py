"""Parity with transformers (PyTorch): tiny random Llama / Qwen2 / Qwen3 folders loaded by from_pretrained."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax.logprobs import token_logprobs
from scope_jax.models import KVCache, forward, from_pretrained
from scope_jax.models.hf import hf_state_dict

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

NAMES = ["llama", "llama-tied-llama3", "qwen2", "qwen3"]
NEW_TOKENS = 32
PROMPT_LENGTHS = (5, 9)
LENGTH = max(PROMPT_LENGTHS) + NEW_TOKENS  # one padded length for every no-cache forward (one compile)
jit_forward = jax.jit(forward, static_argnums=0)


@pytest.fixture(scope="module", params=NAMES)
def pair(request, tiny_hf):
    """(torch model, config, graphdef, params) of one tiny family member."""
    folder, model = tiny_hf(request.param)
    config, (graphdef, params), tokenizer = from_pretrained(folder)
    assert tokenizer is None
    return model, config, graphdef, params


@pytest.fixture(scope="module")
def greedy_case(pair):
    """Prompts of different lengths, right-padded into a [2, LENGTH] buffer, and HF's greedy continuations."""
    model, config, _, _ = pair
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, config.vocab_size, (n,)) for n in PROMPT_LENGTHS]
    buffer = np.zeros((len(prompts), LENGTH), np.int64)
    for row, prompt in enumerate(prompts):
        buffer[row, :len(prompt)] = prompt
    expected = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.as_tensor(prompt[None])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=NEW_TOKENS)
            expected.append(out[0, len(prompt):].numpy())
    return buffer, np.array(PROMPT_LENGTHS), np.stack(expected)


def positions_like(tokens) -> jnp.ndarray:
    return jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)


def test_logits_match_transformers(pair):
    model, config, graphdef, params = pair
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, (2, LENGTH))
    ours, _ = jit_forward(graphdef, params, jnp.asarray(tokens), positions_like(tokens))
    with torch.no_grad():
        ref = model(torch.as_tensor(tokens)).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours), ref, atol=1e-4, rtol=0)


def test_gradients_match_torch(pair, matmul_path):
    """Every parameter's gradient of a masked token log-prob loss equals torch's (the decoder has
    hand-written backward passes, so the forward parity above does not cover them)."""
    model, config, graphdef, params = pair
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, config.vocab_size, (2, 12))
    mask = (rng.random((2, 11)) < 0.7).astype(np.float32)

    def loss(params):
        logprobs = token_logprobs(graphdef, params, jnp.asarray(tokens), positions_like(tokens),
                                  chunk_size=4).logprobs[:, 1:]
        return -jnp.sum(logprobs * mask)

    ours = hf_state_dict(jax.grad(loss)(params), config)
    model.zero_grad()
    logits = model(torch.as_tensor(tokens)).logits[:, :-1]
    logprobs = torch.log_softmax(logits, -1).gather(-1, torch.as_tensor(tokens[:, 1:, None]))[..., 0]
    (-(logprobs * torch.as_tensor(mask)).sum()).backward()
    theirs = {name: param.grad.numpy() for name, param in model.named_parameters()}
    assert ours.keys() == theirs.keys()
    for name, grad in theirs.items():
        np.testing.assert_allclose(ours[name], grad, atol=1e-4, rtol=1e-4, err_msg=name)


def test_greedy_without_cache_matches_generate(pair, greedy_case):
    """A full forward over the padded buffer per step; causal masking keeps each row's tail irrelevant."""
    _, _, graphdef, params = pair
    buffer, lengths, expected = greedy_case
    buffer, rows = buffer.copy(), np.arange(len(lengths))
    for step in range(NEW_TOKENS):
        logits, _ = jit_forward(graphdef, params, jnp.asarray(buffer), positions_like(buffer))
        buffer[rows, lengths + step] = np.asarray(jnp.argmax(logits[rows, lengths + step - 1], axis=-1))
    np.testing.assert_array_equal(buffer[rows[:, None], lengths[:, None] + np.arange(NEW_TOKENS)], expected)


def test_greedy_with_kv_cache_matches_generate(pair, greedy_case):
    """One prefill of the right-padded prompts, then one cached step per token at each row's own position."""
    _, config, graphdef, params = pair
    buffer, lengths, expected = greedy_case
    prompts = buffer[:, :lengths.max()]
    cache = KVCache.zeros(config, len(lengths), LENGTH)
    logits, cache = jit_forward(graphdef, params, jnp.asarray(prompts), positions_like(prompts), cache)
    token = jnp.argmax(logits[np.arange(len(lengths)), lengths - 1], axis=-1)
    generated = [token]
    for step in range(NEW_TOKENS - 1):
        positions = jnp.asarray(lengths + step)[:, None]
        logits, cache = jit_forward(graphdef, params, token[:, None], positions, cache)
        token = jnp.argmax(logits[:, 0], axis=-1)
        generated.append(token)
    np.testing.assert_array_equal(np.stack(generated, axis=1), expected)


def test_bfloat16_load(tiny_hf):
    folder, _ = tiny_hf("qwen3")
    _, (graphdef, params), _ = from_pretrained(folder, dtype=jnp.bfloat16)
    _, (graphdef32, params32), _ = from_pretrained(folder)
    assert {leaf.dtype for leaf in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}
    tokens = np.random.default_rng(3).integers(0, 128, (2, LENGTH))
    logits, _ = jit_forward(graphdef, params, jnp.asarray(tokens), positions_like(tokens))
    logits32, _ = jit_forward(graphdef32, params32, jnp.asarray(tokens), positions_like(tokens))
    assert logits.dtype == jnp.float32 and bool(jnp.isfinite(logits).all())
    np.testing.assert_allclose(np.asarray(logits), np.asarray(logits32), atol=0.25)


def test_bfloat16_checkpoint_reads_exactly(tiny_hf):
    """A folder transformers wrote in bfloat16 (read through ml_dtypes) gives exactly its weights."""
    folder, model = tiny_hf("qwen2", "bfloat16")
    config, (_, params), _ = from_pretrained(folder)
    ours = hf_state_dict(params, config)
    theirs = {name: tensor.numpy() for name, tensor in model.state_dict().items()}
    assert ours.keys() == theirs.keys()
    for name in ours:
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
