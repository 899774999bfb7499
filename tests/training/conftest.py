"""Tiny models and batches shared by the training tests (built once per session), and a tensorboard reader."""

import pathlib
import struct

import jax.numpy as jnp
import numpy as np
import pytest

from tensorboardX.proto import event_pb2

from scope_jax.models import ModelConfig, init
from scope_jax.training.batch import RoleBatch

TINY = ModelConfig(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                   num_heads=4, num_kv_heads=2, head_dim=8)


def random_role_batch(seed: int, lead: tuple[int, ...], length: int = 12, vocab: int = 64) -> RoleBatch:
    """Random sequences with a loss mask on a random suffix of each row and some right padding."""
    rng = np.random.default_rng(seed)
    shape = lead + (length,)
    tokens = rng.integers(0, vocab, shape).astype(np.int32)
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), shape).copy()
    start = rng.integers(1, length // 2, lead)[..., None]
    stop = rng.integers(length // 2 + 1, length + 1, lead)[..., None]
    idx = np.arange(length)
    mask = ((idx >= start) & (idx < stop)).astype(np.float32)
    old = (-rng.uniform(0.5, 5.0, shape) * mask).astype(np.float32)
    adv = rng.normal(size=lead).astype(np.float32)
    return RoleBatch(*map(jnp.asarray, (tokens, positions, mask, old, adv)))


@pytest.fixture(scope="session")
def tiny_models():
    """(graphdef, agent params, [3 simulator params]) of one tiny architecture."""
    graphdef, agent = init(TINY, seed=0)
    sims = [init(TINY, seed=s)[1] for s in (1, 2, 3)]
    return graphdef, agent, sims


def tensorboard_scalars(folder: pathlib.Path) -> list[tuple[str, int]]:
    """(tag, step) of every scalar in the tensorboard event files under `folder` (TFRecord framing: length,
    its CRC, the Event proto, its CRC)."""
    scalars = []
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data, i = path.read_bytes(), 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            event = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
            scalars += [(value.tag, event.step) for value in event.summary.value]
            i += 12 + n + 4
    return scalars
