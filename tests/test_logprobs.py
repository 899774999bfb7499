"""The output head's log-probs and entropies against a float64 numpy softmax, and `head_stats`' written-out
gradients against autodiff of a plain jnp log-softmax and entropy, with the head weight frozen and trained,
the entropy a loss term and a metric."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax.logprobs import (CPU_LOGITS_BYTES, LOGITS_BYTES, head_chunk, head_stats, keeps_logits,
                                token_logprobs)
from scope_jax.models import ModelConfig, init
from tests.jaxprs import dot_generals, equations

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


def plain_stats(hidden, weight, targets, temperature, allowed):
    """(log p(target), entropy) by autodiff-able jnp, the tokens outside `allowed` at a finite -1e9."""
    logits = hidden @ weight / temperature
    if allowed is not None:
        logits = jnp.where(jnp.isin(jnp.arange(VOCAB), jnp.asarray(allowed)), logits, -1e9)
    logp = jax.nn.log_softmax(logits)
    return (jnp.take_along_axis(logp, targets[..., None], -1)[..., 0],
            -jnp.sum(jnp.exp(logp) * logp, -1))


@pytest.mark.parametrize("allowed", [None, ALLOWED], ids=["full", "allowed"])
def test_head_stats_match_numpy(allowed):
    hidden, weight, targets, _ = case(allowed)
    logits = np.asarray(hidden, np.float64) @ np.asarray(weight, np.float64) / 0.7
    if allowed is not None:
        logits = np.where(np.isin(np.arange(VOCAB), allowed), logits, -np.inf)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    entropy = -np.sum(np.where(np.isfinite(logp), np.exp(logp) * logp, 0.0), -1)
    for entropy_gradient in (True, False):
        stats = head_stats(hidden, weight, targets, 0.7, allowed, entropy_gradient)
        np.testing.assert_allclose(stats.logprobs, np.take_along_axis(logp, np.asarray(targets)[..., None],
                                                                      -1)[..., 0], atol=3e-6)
        np.testing.assert_allclose(stats.entropy, entropy, atol=3e-6)


@pytest.mark.parametrize("allowed", [None, ALLOWED], ids=["full", "allowed"])
@pytest.mark.parametrize("frozen", [True, False], ids=["frozen-weight", "trained-weight"])
@pytest.mark.parametrize("entropy_gradient", [True, False], ids=["entropy-loss", "entropy-metric"])
@pytest.mark.parametrize("keep_logits", [True, False], ids=["logits-kept", "logits-again"])
@pytest.mark.parametrize("vocab_major", [False, True], ids=["d-by-vocab", "vocab-major"])
def test_head_stats_gradients_equal_autodiff(allowed, frozen, entropy_gradient, keep_logits, vocab_major,
                                            matmul_path):
    """Through XLA's dot and MKL. A vocab-major weight is passed as weight.T, so its gradient reaches
    `weight` transposed back."""
    hidden, weight, targets, cotangent = case(allowed, seed=1)
    entropy_cotangent = jnp.asarray(np.random.default_rng(2).normal(size=cotangent.shape), jnp.float32)
    entropy_weight = 1.0 if entropy_gradient else 0.0
    freeze = jax.lax.stop_gradient if frozen else (lambda w: w)
    as_passed = (lambda w: w.T) if vocab_major else (lambda w: w)

    def ours(h, w):
        stats = head_stats(h, as_passed(freeze(w)), targets, 0.7, allowed, entropy_gradient, keep_logits,
                           vocab_major)
        entropy = stats.entropy if entropy_gradient else jax.lax.stop_gradient(stats.entropy)
        return jnp.sum(stats.logprobs * cotangent + entropy_weight * entropy * entropy_cotangent)

    def theirs(h, w):
        logprobs, entropy = plain_stats(h, freeze(w), targets, 0.7, allowed)
        return jnp.sum(logprobs * cotangent + entropy_weight * entropy * entropy_cotangent)

    grads = [jax.grad(fn, argnums=(0, 1))(hidden, weight) for fn in (ours, theirs)]
    for a, b in zip(*grads):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-6)
    assert frozen == (not np.any(np.asarray(jax.grad(ours, argnums=1)(hidden, weight))))


@pytest.mark.parametrize("allowed", [None, ALLOWED], ids=["full", "allowed"])
def test_the_entropy_alone_has_the_gradient_of_autodiff(allowed):
    """A loss of the entropy only (the log-probs' cotangent is a symbolic zero)."""
    hidden, weight, targets, cotangent = case(allowed, seed=3)
    ours = lambda h, w: jnp.sum(head_stats(h, w, targets, 0.7, allowed).entropy * cotangent)
    theirs = lambda h, w: jnp.sum(plain_stats(h, w, targets, 0.7, allowed)[1] * cotangent)
    grads = [jax.grad(fn, argnums=(0, 1))(hidden, weight) for fn in (ours, theirs)]
    for a, b in zip(*grads):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-6)


def test_differentiating_a_metric_entropy_is_refused():
    hidden, weight, targets, _ = case(None)
    with pytest.raises(ValueError, match="entropy is a metric"):
        jax.grad(lambda h: jnp.sum(head_stats(h, weight, targets, 1.0, None, False).entropy))(hidden)


def tiny_model():
    """(graphdef, params, tokens [2, 9], positions) of a 1-layer tied-embedding model (random weights)."""
    config = ModelConfig(model_type="llama", vocab_size=64, hidden_size=16, intermediate_size=32,
                         num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8, tie_word_embeddings=True)
    graphdef, params = init(config, seed=0)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 9)))
    return graphdef, params, tokens, jnp.broadcast_to(jnp.arange(9), tokens.shape)


def test_a_frozen_head_with_a_metric_entropy_runs_one_matmul_less():
    """The gradient of a tied-embedding model's log-probs with its embedding frozen (as under LoRA): with
    the entropy a metric, the head's backward pass runs no matmul (the hidden gradient comes from the
    forward pass) where the entropy-loss backward runs the logits again and then the hidden gradient."""
    graphdef, params, tokens, positions = tiny_model()

    def dots(entropy_gradient):
        def loss(p):
            p = {**p, "embed_tokens": jax.lax.stop_gradient(p["embed_tokens"])}
            return jnp.sum(token_logprobs(graphdef, p, tokens, positions, chunk_size=4,
                                          entropy_gradient=entropy_gradient).logprobs)
        return len(list(dot_generals(jax.make_jaxpr(jax.grad(loss))(params).jaxpr)))

    assert dots(True) - dots(False) == 1


def test_a_tied_embedding_reaches_the_head_without_a_transposed_copy(matmul_path):
    """The head's matmuls take the tied embedding [vocab, d] as stored (`cpu_gemm`'s transpose flags):
    with MKL the gradient's jaxpr transposes no [vocab, d] or [d, vocab] array, neither the embedding for
    the logits nor the head's gradient back into the embedding's layout. XLA's dot takes the transposes
    into its dimension numbers instead."""
    graphdef, params, tokens, positions = tiny_model()
    loss = lambda p: jnp.sum(token_logprobs(graphdef, p, tokens, positions).logprobs)
    shapes = {(64, 16), (16, 64)}
    transposed = [eqn for eqn in equations(jax.make_jaxpr(jax.grad(loss))(params).jaxpr)
                  if eqn.primitive.name == "transpose" and tuple(eqn.invars[0].aval.shape) in shapes]
    assert (len(transposed) == 0) == (matmul_path == "1"), transposed


def test_kept_logits_save_the_backward_passs_logits_matmul():
    """With the default chunk the tiny model's logits (2 x 8 x 64 float32) are kept, and the gradient runs
    one matmul less than with an explicit chunk (the same one chunk), whose backward pass computes them
    again; the gradients agree."""
    graphdef, params, tokens, positions = tiny_model()

    def grad(chunk_size):
        return jax.grad(lambda p: jnp.sum(token_logprobs(graphdef, p, tokens, positions,
                                                         chunk_size=chunk_size).logprobs))

    dots = lambda chunk_size: len(list(dot_generals(jax.make_jaxpr(grad(chunk_size))(params).jaxpr)))
    assert dots(8) - dots(None) == 1
    for kept, again in zip(jax.tree.leaves(grad(None)(params)), jax.tree.leaves(grad(8)(params))):
        np.testing.assert_allclose(kept, again, atol=1e-6)


def test_the_logits_are_kept_when_all_of_them_fit_in_the_budget():
    """Hand-counted: float32 logits of batch x positions x vocab against LOGITS_BYTES (512 MiB)."""
    vocab = LOGITS_BYTES // (4 * 8 * 100)  # 8 rows x 100 positions fill it exactly
    assert keeps_logits(8, 100, vocab)
    assert not keeps_logits(8, 101, vocab)
    assert keeps_logits(8, 258, 49152)  # bench train_step's SmolLM2 batch, six chunks of 43: 406 MB
    assert not keeps_logits(16, 258, 49152)  # twice that: 812 MB, computed again


@pytest.mark.parametrize("backend, budget, smollm2_chunk", [("cpu", CPU_LOGITS_BYTES, 43),
                                                            ("gpu", LOGITS_BYTES, 255)])
def test_the_default_head_chunk_keeps_each_chunks_logits_within_the_backends_budget(monkeypatch, backend,
                                                                                     budget, smollm2_chunk):
    """The fewest equal chunks whose float32 logits fit in the backend's budget (hand-counted cases)."""
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    vocab = budget // (4 * 8 * 100)  # 8 rows x 100 positions of logits fill the budget exactly
    assert head_chunk(8, 100, vocab) == 100
    assert head_chunk(8, 101, vocab) == 51  # two chunks
    assert head_chunk(8, 255, vocab) == 85  # three
    assert head_chunk(1000, 1, 10**9) == 1  # never below one position
    # `bench train_step`'s 8 x 255 SmolLM2 logits, 401 MB: one chunk of 512 MiB, or six of 64 MiB
    assert head_chunk(8, 255, 49152) == smollm2_chunk


def test_token_logprobs_do_not_depend_on_the_head_chunk():
    graphdef, params, tokens, positions = tiny_model()

    def loss_and_grad(chunk_size):
        def loss(p):
            return jnp.sum(token_logprobs(graphdef, p, tokens, positions, chunk_size=chunk_size).logprobs)
        return jax.value_and_grad(loss)(params)

    (one, one_grad), (three, three_grad) = loss_and_grad(None), loss_and_grad(3)
    np.testing.assert_allclose(one, three, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(one_grad), jax.tree.leaves(three_grad)):
        np.testing.assert_allclose(a, b, atol=1e-6)
