"""Players from the config: remat reaches the models, parameters sit on the mesh, and generation on the
mesh (rows over data x fsdp) plays the same episodes as on one device."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.configs.target_word import get_config
from scope_jax import sampling, sharding
from scope_jax.logprobs import token_logprobs
from scope_jax.models import PARTITION_RULES, init, save_pretrained
from scope_jax.models.tiny import tiny_config
from scope_jax.training import rl_step
from scope_jax.training.players import load_model
from scope_jax.training.setup import build

WORDS = ("say", "apple", "yes")


def test_remat_keys_reach_the_models():
    config = get_config("population")
    config.agent.remat = True
    config.sim.remat = True
    setup = build(config)
    remat = lambda graphdef, params: nnx.merge(graphdef, params).remat
    sims = setup.sims.members
    first_member = jax.tree.map(lambda x: x[0], sims.params)
    assert remat(setup.agent.graphdef, setup.agent.params) and remat(sims.graphdef, first_member)
    assert not remat(setup.eval_sims[0].graphdef, setup.eval_sims[0].params)  # never trained

    config.agent.remat = False
    plain = build(config)
    assert not remat(plain.agent.graphdef, plain.agent.params)
    assert remat(plain.sims.members.graphdef, first_member)


def test_gradients_with_and_without_remat_agree():
    plain, params = init(tiny_config(32), seed=0)
    remat, _ = init(tiny_config(32), seed=0, remat=True)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, 32, (3, 20)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(20), tokens.shape)
    loss = lambda graphdef: lambda p: token_logprobs(graphdef, p, tokens, positions).logprobs.sum()
    jaxpr = lambda graphdef: str(jax.make_jaxpr(jax.grad(loss(graphdef)))(params))
    assert jaxpr(remat).count("remat") > jaxpr(plain).count("remat")  # the layers are recomputed
    with_remat, without = jax.jit(jax.grad(loss(remat)))(params), jax.jit(jax.grad(loss(plain)))(params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), with_remat, without)


def test_load_model_places_parameters_on_the_mesh_and_needs_a_tokenizer(tmp_path):
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    _, params, _ = load_model("tiny:0", words=WORDS, mesh=mesh)
    expected = sharding.named_shardings(params, PARTITION_RULES, mesh)
    jax.tree.map(lambda x, s: np.testing.assert_equal(x.sharding.is_equivalent_to(s, x.ndim), True),
                 params, expected)
    model_config = tiny_config(16)
    save_pretrained(init(model_config, seed=0)[1], model_config, None, tmp_path)
    with pytest.raises(ValueError, match="has no tokenizer"):
        load_model(str(tmp_path))


def _episodes(mode: str, **mesh) -> list:
    config = get_config(mode)
    config.env.max_turns = 1
    config.sampling.max_new_tokens = 6
    config.mesh.update(mesh)
    setup = build(config)
    return rl_step.play_episodes(setup, setup.state, 0)


@pytest.mark.parametrize("mode", ["frozen", "population"])
def test_rollout_on_a_mesh_samples_what_one_device_samples(mode, monkeypatch):
    """16 dialogues, one turn per role: the rows of each generate call are spread over data x fsdp = 4
    devices (tensor = 2 shards the parameters), and every sampled token and log-prob is as on one device."""
    row_shardings = []

    def spy(decode):
        def call(graphdef, params, tokens, *args):
            row_shardings.append(tokens.sharding)
            return decode(graphdef, params, tokens, *args)
        return call

    for name in ("_decode_jit", "_decode_population_jit"):
        monkeypatch.setattr(sampling, name, spy(getattr(sampling, name)))
    alone = _episodes(mode)
    assert {s.num_devices for s in row_shardings} == {1}
    row_shardings.clear()
    sharded = _episodes(mode, data=2, fsdp=2, tensor=2)
    assert len(row_shardings) == 2 and all(sharding.BATCH_AXES in s.spec for s in row_shardings)
    for a, b in zip(alone, sharded):
        assert [m.sampled_ids for m in a.messages] == [m.sampled_ids for m in b.messages]
        for x, y in zip(a.messages, b.messages):
            np.testing.assert_allclose(x.logprobs or (), y.logprobs or (), atol=1e-5)
    assert sum(m.sampled_ids is not None for e in alone for m in e.messages) == 16 * 2
