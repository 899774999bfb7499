"""Benchmark helpers that compute something: the rl_step log-prob recomputation, the decode-step breakdown."""

import dataclasses
import functools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.bench.dialogues import (RolloutShape, SyntheticDialogue, reprefilled_reply,
                                         reprefilling_compiles)
from experiments.bench.profiler import (ProfiledOp, compiled_ops, dot_instructions, idle_seconds,
                                       instruction_ops, op_kind, op_time_breakdown)
from experiments.bench.rl_step import recompute_logprobs
from experiments.bench.rollout import full_dialogue_seconds
from experiments.bench.sampler import decode_step_matrices
from experiments.configs.target_word import get_config
from scope_jax import sampling
from scope_jax.models import decoder
from scope_jax.models.tiny import tiny_config
from scope_jax.training import rl_step
from scope_jax.training.setup import build


def test_recomputed_logprobs_match_the_samplers_on_every_trained_token():
    config = get_config("selfplay")  # one model plays and trains both roles: both batches are recomputed
    setup = build(config)
    episodes = rl_step.play_episodes(setup, setup.state, 0)
    batch = rl_step.make_batch(setup, episodes, rl_step.role_advantages(setup, episodes), 0)
    recomputed = jax.jit(functools.partial(recompute_logprobs, setup))(setup.state.params, batch)
    assert set(recomputed) == {"agent", "sims"}
    for role, role_batch in (("agent", batch.agent), ("sims", batch.sims)):
        mask = np.asarray(role_batch.loss_mask) > 0
        assert mask.sum() > 0
        old = np.asarray(role_batch.old_logprobs)[mask]
        np.testing.assert_allclose(np.asarray(recomputed[role])[mask], old, atol=1e-4, err_msg=role)


def test_the_decode_breakdown_counts_the_decode_loops_output_head_as_the_head():
    """The loop runs the head feature-major (another einsum than the prefill's); a pattern that misses it
    files the head's time under layer matmuls."""
    graphdef, params = decoder.init(tiny_config(64), seed=0)
    args = (graphdef, params, jnp.ones((2, 4), jnp.int32), jnp.full(2, 4, jnp.int32), jax.random.key(0),
            sampling.SamplingConfig(temperature=0.0, max_new_tokens=3))
    ops = compiled_ops(sampling._decode_jit, *args)
    loop_kinds = {op_kind(name, op) for name, op in ops.items() if "/while/body/" in op}
    assert {"output head", "layer matmuls", "attention"} <= loop_kinds, loop_kinds


HLO = """
%inner (p0: f32[4,8], p1: f32[8,2]) -> f32[4,2] {
  %p0 = f32[4,8]{1,0} parameter(0)
  %p1 = f32[8,2]{1,0} parameter(1)
  ROOT %dot.1 = f32[4,2]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
%outer (q0: f32[4,8], q1: f32[8,2]) -> f32[4] {
  %q0 = f32[4,8]{1,0} parameter(0)
  %q1 = f32[8,2]{1,0} parameter(1)
  %call.1 = f32[4,2]{1,0} call(%q0, %q1), to_apply=%inner
  %fusion.1 = f32[4,2]{1,0} fusion(%q0, %q1), kind=kCustom, calls=%inner
  ROOT %reduce.1 = f32[4]{0} reduce(%fusion.1, %q0), dimensions={1}, to_apply=%inner
}
%add (a: f32[4]) -> f32[4] {
  %a = f32[4]{0} parameter(0)
  ROOT %add.1 = f32[4]{0} add(%a, %a)
}
ENTRY %main (x: f32[4,8], w: f32[8,2]) -> (f32[4], f32[4]) {
  %x = f32[4,8]{1,0} parameter(0)
  %w = f32[8,2]{1,0} parameter(1)
  %fusion.2 = f32[4]{0} fusion(%x, %w), kind=kLoop, calls=%outer
  %fusion.3 = f32[4]{0} fusion(%fusion.2), kind=kLoop, calls=%add
  ROOT %tuple.1 = (f32[4]{0}, f32[4]{0}) tuple(%fusion.2, %fusion.3)
}
"""


def test_dot_instructions_are_dots_and_fusions_calling_a_computation_that_holds_one():
    assert dot_instructions(HLO) == {"dot.1", "fusion.1", "fusion.2"}


def test_the_step_breakdown_counts_a_matmul_fused_with_a_reduction_as_matmul_time():
    """XLA:CPU fuses the head's matmul with the max after it and names the fusion reduce_max."""
    breakdown = op_time_breakdown(jax.jit(lambda x, w: jnp.max(x @ w, axis=-1)), jnp.ones((64, 32)),
                                  jnp.ones((32, 256)))
    assert set(breakdown.seconds) == {("forward", "matmul")}, breakdown


NAMED_HLO = """
%body (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %fusion.7 = f32[4]{0} fusion(%p), kind=kCustom, calls=%inner
}
%inner (q: f32[4]) -> f32[4] {
  %q = f32[4]{0} parameter(0)
  ROOT %exp.1 = f32[4]{0} exponential(%q), metadata={op_name="jit(f)/exp"}
}
ENTRY %main (x: f32[4]) -> f32[4] {
  %x = f32[4]{0} parameter(0)
  %wrapped_broadcast.1 = f32[4]{0} fusion(%x), kind=kLoop, calls=%inner
  ROOT %while.1 = f32[4] while(%x), condition=%inner, body=%body, metadata={op_name="jit(f)/transpose(jvp())"}
}
"""


def test_an_instruction_without_an_op_name_takes_its_callers_and_one_in_the_entry_gets_none():
    """XLA drops the op names of the fusions it makes inside loops (the attention's matmuls among them):
    without the caller's name they fell out of the breakdown."""
    ops = instruction_ops(NAMED_HLO)
    assert ops["exp.1"] == "jit(f)/exp"  # its own name wins over its caller's
    assert ops["fusion.7"] == ops["p"] == "jit(f)/transpose(jvp())"  # in the body the while calls
    assert ops["wrapped_broadcast.1"] == "" and ops["x"] == ""


def test_idle_time_is_the_span_less_the_union_of_the_ops():
    op = lambda start, seconds: ProfiledOp("i", "o", False, start, seconds)
    # [0, 2] and [1, 3] overlap (busy 3 s), [5, 6] after a 2 s gap, [5.5, 5.7] inside it
    assert idle_seconds([op(5.0, 1.0), op(0.0, 2.0), op(5.5, 0.2), op(1.0, 2.0)]) == (6.0, 2.0)
    assert idle_seconds([op(0.0, 4.0), op(1.0, 1.0)]) == (4.0, 0.0)


def test_decode_step_matrices_are_the_steps_projections_feature_major():
    for tied in (True, False):
        config = dataclasses.replace(tiny_config(96), tie_word_embeddings=tied)
        _, params = decoder.init(config, seed=0)
        matrices = decode_step_matrices(params, config)
        d, f, hd = config.hidden_size, config.intermediate_size, config.head_dim
        q, kv = config.num_heads * hd, config.num_kv_heads * hd
        layer = [(q + 2 * kv, d), (d, q), (2 * f, d), (d, f)]
        assert [w.shape for w in matrices] == layer * config.num_layers + [(config.vocab_size, d)]
        x = np.random.RandomState(0).standard_normal(d).astype(np.float32)
        attn, mlp = params["layers"]["self_attn"], params["layers"]["mlp"]
        last = config.num_layers - 1
        per_layer = lambda part: np.asarray(part["kernel"])[last]
        expected_qkv = np.concatenate([x @ per_layer(attn[name]) for name in ("q_proj", "k_proj", "v_proj")])
        np.testing.assert_allclose(matrices[4 * last] @ x, expected_qkv, rtol=1e-5, atol=1e-5)
        expected_gate_up = np.concatenate([x @ per_layer(mlp[name]) for name in ("gate_proj", "up_proj")])
        np.testing.assert_allclose(matrices[4 * last + 2] @ x, expected_gate_up, rtol=1e-5, atol=1e-5)
        head = (np.asarray(params["embed_tokens"]["embedding"]).T if tied
                else np.asarray(params["lm_head"]["kernel"]))  # [d, vocab]
        np.testing.assert_allclose(matrices[-1] @ x, x @ head, rtol=1e-5, atol=1e-5)


def test_history_lengths_are_the_lengths_play_replies_to():
    shape = RolloutShape(turns=5, message=3, prompt=7)
    dialogue = SyntheticDialogue.make(shape, shape.turns, rows=2, vocab=50)
    seen = []
    reply = lambda history: seen.append(history.shape[1]) or np.ones((2, 3), np.int32)
    played = dialogue.play(reply, turns=4)
    assert seen == dialogue.history_lengths()[:4]
    assert len(played.replies) == len(played.seconds) == 4


def test_reprefilling_compiles_at_exactly_the_turns_generate_compiles():
    """Counted against jit's own cache: the warm-up must compile every program the timed run needs."""
    graphdef, params = decoder.init(tiny_config(64), seed=0)
    shape = RolloutShape(turns=6, message=5, prompt=9)  # histories 22, 40, 58, 76: buckets 32, 64, 64, 128
    dialogue = SyntheticDialogue.make(shape, shape.turns, rows=2, vocab=64)
    config = sampling.SamplingConfig(temperature=0.0, max_new_tokens=shape.message, pad_token_id=63)
    compiled_at = []
    for turn, length in enumerate(dialogue.history_lengths()):
        before = sampling._decode_jit._cache_size()
        reprefilled_reply(graphdef, params, np.ones((2, length), np.int32), config)
        if sampling._decode_jit._cache_size() > before:
            compiled_at.append(turn)
    assert compiled_at == reprefilling_compiles(dialogue, shape.turns) == [0, 1, 3]


def test_the_full_dialogue_bound_adds_each_unmeasured_turn_at_the_fastest_measured_time():
    assert full_dialogue_seconds([3.0, 2.0, 4.0], turns=5) == 3.0 + 2.0 + 4.0 + 2 * 2.0
    assert full_dialogue_seconds([3.0, 2.0], turns=2) == 5.0


def test_every_benchmark_is_a_subcommand_that_takes_its_documented_flags():
    from experiments.bench.__main__ import BENCHMARKS, parser

    command_lines = {  # as docs/ and README.md quote them
        "rollout": ["--models", "smollm2", "--shapes", "tau2", "--turns", "2", "--full"],
        "collapse": ["--collapse-configs", "data", "--collapse-keep", "/tmp/x"],
        "sampler": ["--models", "5m", "smollm2", "--batches", "16", "64"],
        "train_step": ["--models", "5m", "--dtypes", "float32"],
        "sft": ["--models", "5m", "--repeats", "3"],
        "distributed": ["--groups", "8"],
        "rl_step": ["--mode", "frozen"],
    }
    assert set(command_lines) == set(BENCHMARKS)
    for name, flags in command_lines.items():
        args = parser().parse_args([name, *flags])
        assert args.run.__module__ == f"experiments.bench.{name}"
    defaults = {name: parser().parse_args([name]) for name in BENCHMARKS}
    assert defaults["rollout"].repeats == 1 and defaults["sft"].repeats == 2
    assert (defaults["sampler"].models, defaults["sampler"].batches) == (["smollm2"], [16])  # within 10 min
    assert defaults["train_step"].dtypes == defaults["sft"].dtypes == ["float32", "bfloat16"]


def test_best_runs_alternate_the_functions_in_rows_and_keep_each_places_best(monkeypatch):
    """Two steps, each slower on the first run of its row (after the other step) than on the second; a
    fake clock that each call advances by its scheduled seconds."""
    from experiments.bench import harness

    clock, calls = [0.0], []
    seconds = {"a": iter([5.0, 2.0, 4.0, 3.0]), "b": iter([7.0, 1.0, 6.0, 1.5])}

    def step(name):
        calls.append(name)
        clock[0] += next(seconds[name])

    monkeypatch.setattr(harness.time, "perf_counter", lambda: clock[0])
    fns = {name: functools.partial(step, name) for name in seconds}
    assert harness.best_runs(fns, repeats=2, in_a_row=2) == [{"a": 4.0, "b": 6.0}, {"a": 2.0, "b": 1.0}]
    assert calls == ["a", "a", "b", "b", "a", "a", "b", "b"]
    seconds["a"] = iter([3.0, 1.0])
    assert harness.best_of({"a": fns["a"]}, repeats=2) == {"a": 1.0}  # one run a round


def test_the_header_says_where_and_when_a_run_was_made(monkeypatch):
    from experiments.bench.harness import TIMING_ENVIRONMENT, header

    for name in TIMING_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    lines = header()
    for field in ("command:", "date:", "commit:", "machine:", "cpu flags:", "environment:",
                  "load average before the run"):
        assert sum(line.startswith(field) for line in lines) == 1, (field, lines)
    assert ("environment: none of XLA_FLAGS, GLIBC_TUNABLES, MALLOC_ARENA_MAX, MALLOC_MMAP_MAX_, "
            "MALLOC_TRIM_THRESHOLD_, OMP_NUM_THREADS, OMP_WAIT_POLICY, JAX_PLATFORMS") in lines
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setenv("MALLOC_ARENA_MAX", "1")
    assert ("environment: GLIBC_TUNABLES=glibc.malloc.hugetlb=1 MALLOC_ARENA_MAX=1 OMP_WAIT_POLICY=PASSIVE"
            in header())


def test_the_torch_threads_probe_alternates_the_counts_and_keeps_the_faster():
    import torch

    from experiments.bench.references import torch_threads

    counts, seen = list(dict.fromkeys((os.cpu_count(), 1))), []
    before = torch.get_num_threads()

    def probe():  # one thread is the fast one here, by 20 ms a call
        seen.append(torch.get_num_threads())
        time.sleep(0.02 if torch.get_num_threads() > 1 else 0.0)

    try:
        assert torch_threads(probe, rounds=2) == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert seen[1:] == counts * 2  # after the warm-up call, all cores then 1, twice


@pytest.mark.parametrize("flags, dtypes, noted", [
    ("fpu avx2 fma", ["float32", "bfloat16"], True),  # the AVX2 AMD EPYC: PyTorch's bfloat16 on one core
    ("fpu avx2 avx512f avx512_bf16", ["float32", "bfloat16"], False),
    ("fpu avx2 amx_bf16 amx_tile", ["bfloat16"], False),
    ("fpu avx2 fma", ["float32"], False),  # no bfloat16 column
    (None, ["bfloat16"], False),  # lscpu gave no flags: nothing is known
])
def test_a_bfloat16_run_on_a_cpu_without_bfloat16_matmuls_is_told_it_may_be_slow(monkeypatch, flags, dtypes,
                                                                                   noted):
    from experiments.bench import harness

    monkeypatch.setattr(harness, "_lscpu", lambda: {} if flags is None else {"Flags": f"   {flags}"})
    note = harness.bfloat16_note(dtypes)
    assert (note is not None) == noted
    assert note is None or "--dtypes float32" in note
