"""The larger-model configs keep running: one training step of the Qwen3 sizes whose shapes differ (`STEPPED`)
on a tiny random checkpoint of the same architecture (the real GQA ratio and head_dim / (hidden / heads)
ratio, tiny sizes) with Qwen3's chat template, saved as an HF folder like the released ones and loaded
through the config's own model keys (with remat, thinking off). The 4B-shaped run also evaluates,
monitors and writes its transcripts."""

import dataclasses
import json

import numpy as np
import pytest

from experiments.configs import p4g_qwen3
from experiments.run import prepare
from scope_jax.models import init, save_pretrained
from scope_jax.models.tiny import word_tokenizer
from scope_jax.models.tokenizer import THINKING_OFF
from scope_jax.training.players import load_model
from scope_jax.training.run_dir import RunDir
from scope_jax.training.train import train
from tests.dialogue.test_qwen3_template import QWEN3_TEMPLATE, THINK
from tests.envs.test_p4g import _row, write_info


def tiny_like(arch, vocab_size: int):
    """`arch` with 2 layers and every width divided (hidden / 32, heads / 4, head_dim / 8): ratios stay."""
    return dataclasses.replace(arch, vocab_size=vocab_size, num_layers=2, hidden_size=arch.hidden_size // 32,
                               intermediate_size=arch.intermediate_size // 32, num_heads=arch.num_heads // 4,
                               num_kv_heads=arch.num_kv_heads // 4, head_dim=arch.head_dim // 8)


def test_memory_estimate_counts_the_state():
    arch = p4g_qwen3.ARCHITECTURES["0.6b"]
    assert arch.num_params == pytest.approx(0.596e9, rel=1e-3)  # Qwen3-0.6B as released
    one = p4g_qwen3.memory_per_device(arch, trained=1, frozen=0)
    assert one.state == arch.num_params * 2 * 4  # bf16 params, gradient, two AdamW moments
    sharded = p4g_qwen3.memory_per_device(arch, trained=1, frozen=0, shards=8)
    assert sharded.state == one.state / 8 and sharded.activations == one.activations
    assert one.activations_remat < one.activations


EVALUATED = "4b"  # the one size whose step also runs the held-out evaluation, the monitor and the transcripts
# 1.7B's tiny twin is the plain case (heads x head_dim = hidden, 2 query heads per KV head) that 0.6B's
# (heads x head_dim = 2 hidden) and 4B's (1.6 hidden, 4 query heads per KV head) generalise; its config
# differs from theirs only in the architecture, which test_memory_estimate_counts_the_state and the
# config checks cover.
STEPPED = ("0.6b", "4b")


def test_the_stepped_sizes_cover_every_head_ratio_but_the_plain_one():
    ratios = {size: tiny_like(arch, 8) for size, arch in p4g_qwen3.ARCHITECTURES.items()}
    plain = {s for s, c in ratios.items() if c.num_heads * c.head_dim == c.hidden_size and
             c.num_heads // c.num_kv_heads == 2}
    assert plain == {"1.7b"} and set(STEPPED) == set(p4g_qwen3.ARCHITECTURES) - plain


@pytest.mark.slow
@pytest.mark.parametrize("size", STEPPED)
def test_one_training_step_on_a_tiny_checkpoint(tmp_path, size):
    arch = p4g_qwen3.ARCHITECTURES[size]
    tokenizer = word_tokenizer(THINK + ("I", "will", "donate", "$1", "no", "thanks", "hello"),
                               chat_template=QWEN3_TEMPLATE)
    tiny = tiny_like(arch, len(tokenizer))
    assert tiny.num_heads // tiny.num_kv_heads == arch.num_heads // arch.num_kv_heads
    ratio = lambda c: c.head_dim * c.num_heads / c.hidden_size  # head_dim / (hidden / heads)
    assert ratio(tiny) == ratio(arch)
    _, params = init(tiny, seed=0)
    save_pretrained(params, tiny, tokenizer, tmp_path / "model")

    config = p4g_qwen3.get_config(str(tmp_path / "model"))
    assert config.agent.remat and config.sim.remat
    assert load_model(config.agent.model)[2].chat_template == THINKING_OFF + QWEN3_TEMPLATE
    config.env.update(data_dir=str(write_info(tmp_path / "data", [_row(f"u{i}") for i in range(8)])),
                      max_turns=1)
    config.sampling.max_new_tokens = 4
    config.rollout.update(groups=2, group_size=2)
    evaluated = size == EVALUATED  # evaluation compiles its own programs per shape; the step is what varies
    config.train.update(steps=1, eval_every=int(evaluated), eval_first=False, eval_groups=1,
                        checkpoint_every=1, microbatches=2)
    config.monitor.update(probe_contexts=1, probe_samples=2, fork_contexts=1, forks=2, branches=2)
    _, checked = prepare(config)
    with RunDir.create(tmp_path / "run", config) as run_dir:
        state, metrics = train(config, run_dir, checked)
    assert int(state.step) == 1 and metrics["skipped"] == 0.0 and np.isfinite(metrics["loss"])
    assert np.isfinite(metrics["agent/entropy"]) and ("heldout_reward" in metrics) == evaluated
    if not evaluated:
        return
    lines = (tmp_path / "run" / "samples" / "step-0.jsonl").read_text().splitlines()
    samples = [json.loads(line) for line in lines]
    assert len(samples) == 2
    for sample in samples:  # a persuadee that named no amount was asked the closing question and answered
        roles = [m["role"] for m in sample["messages"]]
        assert not sample["rewards"]["unreadable"] or roles[-2:] == ["env", "sim"]
