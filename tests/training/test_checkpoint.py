"""Checkpointer: bit-exact round trips (also onto a mesh), retention, and refusal of bad checkpoints."""

import gc
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax import sharding
from scope_jax.training import state as joint
from scope_jax.training.batch import Batch
from scope_jax.training.checkpoint import CheckpointError, Checkpointer, config_fingerprint
from scope_jax.training.optimizer import OptimizerConfig, make_optimizer
from scope_jax.training.run_dir import RunDir
from scope_jax.training.train import resume_or_place
from scope_jax.training.train_step import TrainStepConfig, make_train_step

from .conftest import random_role_batch

FINGERPRINT = config_fingerprint({"model": "tiny", "lr": 1e-3})


def make_state(tiny_models, name: str) -> joint.JointState:
    """Agent trains (with a KL reference), one frozen simulator: multi_transform with a set_to_zero part."""
    _, agent, sims = tiny_models
    optimizer = make_optimizer(OptimizerConfig(name=name, learning_rate=1e-3), {"agent": True, "sims": False})
    params = {"agent": agent, "sims": joint.stack_population(sims[:1])}
    return joint.create(params, optimizer, seed=3, ref_roles=("agent",)), optimizer


@pytest.fixture(scope="module")
def trained_state(tiny_models):
    """A state one AdamW step in, so the optimizer moments and the step counter are non-trivial."""
    state, optimizer = make_state(tiny_models, "adamw")
    step = make_train_step(tiny_models[0], tiny_models[0], optimizer, TrainStepConfig())
    state, _ = jax.jit(step)(state, Batch(agent=random_role_batch(0, (4,)), sims=None))
    return state


def abstract(state: joint.JointState, mesh: jax.sharding.Mesh | None = None) -> joint.JointState:
    """ShapeDtypeStructs of `state` on `mesh`'s state shardings, or on the state's own shardings."""
    shapes = jax.eval_shape(lambda s: s, state)
    shardings = joint.state_shardings(shapes, mesh) if mesh else jax.tree.map(lambda x: x.sharding, state)
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)


def host_state() -> dict:
    rng = np.random.default_rng(11)
    rng.random(5)
    return {"data_position": 17, "numpy_rng": rng.bit_generator.state, "consecutive_skips": 2}


def assert_bit_identical(a, b) -> None:
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape
        assert x.tobytes() == y.tobytes()


def saved(tmp_path, state, steps=(1,), keep: int = 2) -> Checkpointer:
    ckpt = Checkpointer(tmp_path / "checkpoints", FINGERPRINT, keep=keep)
    for step in steps:
        ckpt.save(step, state, host_state())
    return ckpt


def test_round_trip_is_bit_identical(tmp_path, trained_state):
    assert int(trained_state.step) == 1 and trained_state.ref_params
    with saved(tmp_path, trained_state, steps=(1,)) as ckpt:
        assert ckpt.latest_step() == 1
    # A fresh Checkpointer, as after a restart.
    with Checkpointer(tmp_path / "checkpoints", FINGERPRINT) as ckpt:
        state, host = ckpt.restore(abstract(trained_state))
    assert_bit_identical(state, trained_state)
    assert host == host_state()
    restored_rng = np.random.default_rng()
    restored_rng.bit_generator.state = host["numpy_rng"]
    original = np.random.default_rng(11)
    original.random(5)
    np.testing.assert_array_equal(restored_rng.random(3), original.random(3))


def test_restore_onto_an_8_device_mesh(tmp_path, trained_state):
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    target = abstract(trained_state, mesh)
    with saved(tmp_path, trained_state) as ckpt:
        state, _ = ckpt.restore(target)
    for leaf, want in zip(jax.tree.leaves(state), jax.tree.leaves(target)):
        assert leaf.sharding.is_equivalent_to(want.sharding, leaf.ndim), (leaf.sharding, want.sharding)
    q_kernel = state.params["agent"]["layers"]["self_attn"]["q_proj"]["kernel"]
    assert q_kernel.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
    assert_bit_identical(state, trained_state)


def test_keeps_the_newest_checkpoints(tmp_path, trained_state):
    with saved(tmp_path, trained_state, steps=(1, 2, 3, 4), keep=2) as ckpt:
        assert ckpt.latest_step() == 4
        assert sorted(os.listdir(tmp_path / "checkpoints")) == ["3", "4"]
        with pytest.raises(CheckpointError, match="already holds step 4"):
            ckpt.save(4, trained_state, host_state())
        _, host = ckpt.restore(abstract(trained_state), step=3)
        assert host == host_state()
        with pytest.raises(CheckpointError, match=r"no checkpoint at step 1 .*\[3, 4\]"):
            ckpt.restore(abstract(trained_state), step=1)


def test_no_checkpoint_and_bad_host_state(tmp_path, trained_state):
    with Checkpointer(tmp_path / "checkpoints", FINGERPRINT) as ckpt:
        assert ckpt.latest_step() is None
        with pytest.raises(CheckpointError, match="no checkpoint in"):
            ckpt.restore(abstract(trained_state))
        with pytest.raises(CheckpointError, match="not JSON-serialisable"):
            ckpt.save(1, trained_state, {"position": np.int64(3)})
        assert ckpt.latest_step() is None


def test_fingerprint_is_stable_and_another_config_is_refused(tmp_path, trained_state):
    assert config_fingerprint({"a": 1, "b": [1, 2]}) == config_fingerprint({"b": [1, 2], "a": 1})
    assert config_fingerprint({"a": 1}) != config_fingerprint({"a": 2})
    saved(tmp_path, trained_state).close()
    other = config_fingerprint({"model": "tiny", "lr": 2e-3})
    with Checkpointer(tmp_path / "checkpoints", other) as ckpt:
        with pytest.raises(CheckpointError,
                           match=f"another config \\(fingerprint {FINGERPRINT} != {other}\\)"):
            ckpt.restore(abstract(trained_state))


def test_another_tree_is_refused(tmp_path, tiny_models, trained_state):
    with saved(tmp_path, trained_state) as ckpt:
        sgd_state, _ = make_state(tiny_models, "sgd")  # no Adam moments
        extra_moments = r"does not match the state: it has opt_state/\S+, the state does not \(and \d+ more"
        with pytest.raises(CheckpointError, match=extra_moments):
            ckpt.restore(abstract(sgd_state))
        target = abstract(trained_state)
        target = target.replace(step=jax.ShapeDtypeStruct((), jnp.float32, sharding=target.step.sharding))
        with pytest.raises(CheckpointError, match=r"step is int32\(\), the state wants float32\(\)"):
            ckpt.restore(target)


def _largest_data_file(step_dir):
    files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
    return max(files, key=lambda p: p.stat().st_size)


def _flip_bytes(path):
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        f.write(b"\xa5" * 16)


CORRUPTIONS = {
    "truncated data file": lambda step_dir: os.truncate(_largest_data_file(step_dir), 64),
    "deleted data file": lambda step_dir: _largest_data_file(step_dir).unlink(),
    "flipped bytes": lambda step_dir: _flip_bytes(_largest_data_file(step_dir)),
    "garbled meta": lambda step_dir: (step_dir / "meta" / "metadata").write_text("{not json"),
    "deleted host item": lambda step_dir: shutil.rmtree(step_dir / "host"),
}


# When one array read fails, orbax drops its sibling read coroutines unawaited; collect them here, where
# their "exception ignored" reports are expected, rather than in whichever test runs next.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_corrupt_checkpoint_is_refused(tmp_path, trained_state, corruption):
    saved(tmp_path, trained_state).close()
    CORRUPTIONS[corruption](tmp_path / "checkpoints" / "1")
    with Checkpointer(tmp_path / "checkpoints", FINGERPRINT) as ckpt:
        with pytest.raises(CheckpointError, match="at step 1 .* is unreadable or corrupt") as error:
            ckpt.restore(abstract(trained_state))
    assert "\n" not in str(error.value)
    gc.collect()


def test_half_written_checkpoint_is_ignored(tmp_path, trained_state):
    saved(tmp_path, trained_state, steps=(1, 2)).close()
    # What a run killed while saving step 3 leaves: orbax's temporary directory, never renamed.
    partial = tmp_path / "checkpoints" / "3.orbax-checkpoint-tmp"
    shutil.copytree(tmp_path / "checkpoints" / "2", partial)
    shutil.rmtree(partial / "host")
    _largest_data_file(partial).unlink()
    with Checkpointer(tmp_path / "checkpoints", FINGERPRINT) as ckpt:
        assert ckpt.latest_step() == 2
        _, host = ckpt.restore(abstract(trained_state))
        assert host == host_state()
        ckpt.save(3, trained_state, host_state())  # the resumed run saves step 3 for real
        assert ckpt.latest_step() == 3
    assert json.loads((tmp_path / "checkpoints" / "3" / "host" / "metadata").read_text()) == host_state()
    assert not partial.exists()


def test_a_resumed_run_drops_the_records_it_logs_again_with_a_checkpoint_or_none(tmp_path, trained_state):
    run_dir = RunDir.create(tmp_path / "run", {"a": 1})
    for step in range(3):  # a run killed before its first checkpoint
        run_dir.log(step, {"x": float(step)})
    ckpt = Checkpointer(tmp_path / "checkpoints", FINGERPRINT)
    mesh = sharding.make_mesh()
    assert resume_or_place(trained_state, mesh, ckpt, run_dir)[1] is None
    assert run_dir.read_metrics() == []
    for step in range(3):
        run_dir.log(step, {"x": float(step)})
    ckpt.save(2, trained_state, {"step": 2})
    assert resume_or_place(trained_state, mesh, ckpt, run_dir)[1] == {"step": 2}
    assert [record["step"] for record in run_dir.read_metrics()] == [0, 1]
    ckpt.close()
