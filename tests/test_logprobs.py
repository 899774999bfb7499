"""The output head's log-probs and entropies against a float64 numpy softmax, and `metric_entropy_stats`'
gradients against autodiff of a plain jnp log-softmax, with the head weight frozen and trained."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax.logprobs import head_stats, metric_entropy_stats, token_logprobs
from scope_jax.models import ModelConfig, init
from tests.jaxprs import dot_generals

VOCAB, DIM = 11, 8
ALLOWED = (1, 3, 4, 7)


def case(allowed, seed=0):
    rng = np.random.default_rng(seed)
    hidden = jnp.asarray(rng.normal(size=(2, 5, DIM)), jnp.float32)
    weight = jnp.asarray(rng.normal(size=(DIM, VOCAB)), jnp.float32)
    choices = np.arange(VOCAB) if allowed is None else np.array(allowed)
    targets = jnp.asarray(choices[rng.integers(0, len(choices), (2, 5))])
    cotangent = jnp.asarray(rng.normal(size=(2, 5)), jnp.float32)
    return hidden, weight, targets, cotangent


def plain_logprobs(hidden, weight, targets, temperature, allowed):
    logits = hidden @ weight / temperature
    if allowed is not None:
        logits = jnp.where(jnp.isin(jnp.arange(VOCAB), jnp.asarray(allowed)), logits, -jnp.inf)
    return jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)[..., 0]


@pytest.mark.parametrize("allowed", [None, ALLOWED], ids=["full", "allowed"])
def test_head_stats_match_numpy(allowed):
    hidden, weight, targets, _ = case(allowed)
    logits = np.asarray(hidden, np.float64) @ np.asarray(weight, np.float64) / 0.7
    if allowed is not None:
        logits = np.where(np.isin(np.arange(VOCAB), allowed), logits, -np.inf)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    entropy = -np.sum(np.where(np.isfinite(logp), np.exp(logp) * logp, 0.0), -1)
    mask = None if allowed is None else jnp.isin(jnp.arange(VOCAB), jnp.asarray(allowed))
    for stats in (head_stats(hidden, weight, targets, 0.7, mask),
                  metric_entropy_stats(hidden, weight, targets, 0.7, allowed)):
        np.testing.assert_allclose(stats.logprobs, np.take_along_axis(logp, np.asarray(targets)[..., None],
                                                                      -1)[..., 0], atol=3e-6)
        np.testing.assert_allclose(stats.entropy, entropy, atol=3e-6)


@pytest.mark.parametrize("allowed", [None, ALLOWED], ids=["full", "allowed"])
@pytest.mark.parametrize("frozen", [True, False], ids=["frozen-weight", "trained-weight"])
def test_metric_entropy_gradients_equal_autodiff(allowed, frozen):
    hidden, weight, targets, cotangent = case(allowed, seed=1)
    freeze = jax.lax.stop_gradient if frozen else (lambda w: w)

    def loss(fn):
        return lambda h, w: jnp.sum(fn(h, freeze(w), targets, 0.7, allowed) * cotangent)

    ours = jax.grad(loss(lambda *a: metric_entropy_stats(*a).logprobs), argnums=(0, 1))(hidden, weight)
    theirs = jax.grad(loss(plain_logprobs), argnums=(0, 1))(hidden, weight)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-6)
    assert frozen == (not np.any(np.asarray(ours[1])))


def test_differentiating_a_metric_entropy_is_refused():
    hidden, weight, targets, _ = case(None)
    with pytest.raises(ValueError, match="entropy is a metric"):
        jax.grad(lambda h: jnp.sum(metric_entropy_stats(h, weight, targets, 1.0, None).entropy))(hidden)


def test_a_frozen_head_with_a_metric_entropy_runs_one_matmul_less():
    """The gradient of a tied-embedding model's log-probs with its embedding frozen (as under LoRA): with
    the entropy a metric, the head's backward pass runs no matmul (the hidden gradient comes from the
    forward pass) where checkpointed autodiff runs the logits again and then the hidden gradient."""
    config = ModelConfig(model_type="llama", vocab_size=64, hidden_size=16, intermediate_size=32,
                         num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8, tie_word_embeddings=True)
    graphdef, params = init(config, seed=0)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 9)))
    positions = jnp.broadcast_to(jnp.arange(9), tokens.shape)

    def dots(entropy_gradient):
        def loss(p):
            p = {**p, "embed_tokens": jax.lax.stop_gradient(p["embed_tokens"])}
            return jnp.sum(token_logprobs(graphdef, p, tokens, positions, chunk_size=4,
                                          entropy_gradient=entropy_gradient).logprobs)
        return len(list(dot_generals(jax.make_jaxpr(jax.grad(loss))(params).jaxpr)))

    assert dots(True) - dots(False) == 1
