"""The SFT step's loss and gradient against transformers (PyTorch) on the same tiny random Llama, tokens and
mask: HF's own causal-LM loss (labels -100 off the mask, token mean) and its backward pass."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax.models import from_pretrained
from scope_jax.models.hf import hf_state_dict
from scope_jax.training import state as joint
from scope_jax.training.batch import TokenBatch
from scope_jax.training.loss import LossConfig
from scope_jax.training.optimizer import OptimizerConfig, make_optimizer
from scope_jax.training.sft_step import SFTStepConfig, make_sft_step
from tests.models.conftest import build_tiny_hf

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

# SGD at learning rate 1 without clipping: the update is minus the gradient.
SGD = OptimizerConfig(name="sgd", learning_rate=1.0, max_grad_norm=0.0)


def test_sft_loss_and_gradient_match_transformers(tmp_path, matmul_path):
    model = build_tiny_hf("llama", tmp_path)
    config, (graphdef, params), _ = from_pretrained(tmp_path)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, config.vocab_size, (4, 16))
    mask = np.zeros(tokens.shape, np.float32)
    for row, (start, stop) in enumerate([(3, 9), (5, 16), (1, 4), (8, 13)]):  # a reply span per row
        mask[row, start:stop] = 1
    tokens[1, 14:] = 0  # right padding past a row's end is masked like any other token off the mask
    batch = TokenBatch(jnp.asarray(tokens, jnp.int32), jnp.broadcast_to(jnp.arange(16), tokens.shape),
                       jnp.asarray(mask))
    optimizer = make_optimizer(SGD, {"agent": True})
    step = make_sft_step(graphdef, optimizer, SFTStepConfig(role="agent", loss=LossConfig(chunk_size=5),
                                                             microbatches=2))
    state, metrics = jax.jit(step)(joint.create({"agent": params}, optimizer, seed=0), batch)
    ours = hf_state_dict(jax.tree.map(lambda old, new: old - new, params, state.params["agent"]), config)

    labels = torch.as_tensor(np.where(mask > 0, tokens, -100))
    loss = model(torch.as_tensor(tokens), labels=labels).loss
    model.zero_grad()
    loss.backward()
    np.testing.assert_allclose(metrics["loss"], loss.item(), rtol=1e-5)
    theirs = {name: p.grad.numpy() for name, p in model.named_parameters()}
    assert ours.keys() == theirs.keys()
    for name, grad in theirs.items():
        np.testing.assert_allclose(ours[name], grad, atol=1e-5, rtol=1e-4, err_msg=name)
