"""rl_step: one RL step of the target-word example config (experiments/configs/target_word.py, tiny random
agent and simulator; --mode picks the simulator mode), run through the host loop's own functions: time
split into rollout (reward timed on its own), advantages, batch building, log-prob recomputation and
update, compile time apart; the update's GFLOP/s against this machine's float32 matmul peak. Its
reference is the peak: ratio=<achieved/peak>. The phases and the peak's matmul alternate in the same warm
rounds (the update donates the state, so the rollout samples with a copy of the initial parameters).
Where the loop has no separate log-prob recomputation (behaviour log-probs come from the sampler; the
reference forward of a KL term runs inside the update), its row is the forward pass such a recompute
would cost, marked as not part of the step."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from experiments.bench.harness import best_of, matmul_fns, train_flops
from scope_jax.logprobs import token_logprobs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", default="frozen",
                        help="the simulator mode of experiments/configs/target_word.py")


def recompute_logprobs(setup, params: Any, batch: Any) -> dict[str, jax.Array]:
    """Forward token log-probs of each trained role over its training batch, with the loss's settings:
    what recomputing the old policy's (or the reference's) log-probs for the update costs."""
    from scope_jax.training.loss import LossConfig

    def role(graphdef, role_params, role_batch, config: LossConfig) -> jax.Array:
        return token_logprobs(graphdef, role_params, role_batch.tokens, role_batch.positions,
                              chunk_size=config.chunk_size, temperature=config.temperature,
                              allowed=config.allowed_tokens).logprobs

    step_config, agent_graphdef = setup.step_config, setup.agent.graphdef
    out = {"agent": role(agent_graphdef, params["agent"], batch.agent, step_config.agent)}
    if batch.sims is not None:
        if step_config.self_play:  # one set of weights plays both roles
            out["sims"] = jax.vmap(lambda b: role(agent_graphdef, params["agent"], b, step_config.sims))(
                batch.sims)
        else:
            sim_graphdef = setup.mode.sim_player(setup.sims).graphdef
            out["sims"] = jax.vmap(lambda p, b: role(sim_graphdef, p, b, step_config.sims))(
                params["sims"], batch.sims)
    return out


def run(args: argparse.Namespace) -> float:
    """One RL step of the target-word example config (`experiments/configs/target_word.py:MODE`, tiny
    random agent and simulator) through the host loop's own functions, split into rollout (its reward part
    timed on its own), advantages, batch, log-prob recomputation and update; the update's GFLOP/s against
    the measured matmul peak (headline)."""
    from flax import nnx

    from experiments.configs.target_word import get_config
    from scope_jax.training import rl_step as rl
    from scope_jax.training import state as joint
    from scope_jax.training.setup import build
    from scope_jax.training.train_step import compile_train_step

    config = get_config(args.mode)
    setup = build(config)
    mesh = setup.mesh
    state = jax.device_put(setup.state, joint.state_shardings(setup.state, mesh))
    # (model config, parameter count) of each role's model, read before the update donates the params.
    models_by_role = {"agent": (nnx.merge(setup.agent.graphdef, setup.agent.params).config,
                                sum(x.size for x in jax.tree.leaves(setup.agent.params)))}
    sim = setup.mode.sim_player(setup.sims)
    if sim is not None and sim is setup.sims.members:  # a stacked population's first member
        member = jax.tree.map(lambda x: x[0], sim.params)
        models_by_role["sims"] = (nnx.merge(sim.graphdef, member).config,
                                  sum(x.size for x in jax.tree.leaves(member)))
    else:  # self-play: the agent's model plays the simulator (or no simulator trains)
        models_by_role["sims"] = models_by_role["agent"]
    # The rollout samples with a copy of the parameters: the update donates (and replaces) the state.
    sample_state = jax.tree.map(jnp.copy, state)
    step, first = 0, {}

    def first_call(name: str, fn: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        out = fn()
        first[name] = time.perf_counter() - start
        return out

    def update():
        nonlocal state
        state, metrics = step_fn(state, batch)
        return jax.device_get(metrics)

    # name: (what it runs, how it stands to the loop's step: one of its phases, a part of the rollout
    # phase timed on its own, or extra work the loop does not do)
    phases = {
        "rollout": (lambda: rl.play_episodes(setup, sample_state, step), "phase"),
        "reward": (lambda: [setup.env.rewards(episode) for episode in episodes], "in rollout"),
        "advantage": (lambda: rl.role_advantages(setup, episodes), "phase"),
        "batch": (lambda: rl.make_batch(setup, episodes, advantages, step), "phase"),
        "logprobs": (lambda: jax.block_until_ready(recompute(state.params, batch)), "extra"),
        "update": (update, "phase"),
    }
    episodes = first_call("rollout", phases["rollout"][0])
    first_call("reward", phases["reward"][0])
    advantages = first_call("advantage", phases["advantage"][0])
    batch = first_call("batch", phases["batch"][0])
    step_fn = compile_train_step(setup.train_step, state, batch, mesh)
    recompute = jax.jit(lambda params, batch: recompute_logprobs(setup, params, batch))
    first_call("logprobs", phases["logprobs"][0])
    first_call("update", update)
    # The matmul peak is measured in the same alternating rounds, under the same load as the phases.
    matmul_flops, matmul = matmul_fns()
    best = best_of({**{name: fn for name, (fn, _) in phases.items()},
                    **{f"peak {name}": fn for name, fn in matmul.items()}}, args.repeats)
    jax_peak, numpy_peak = (matmul_flops / best[f"peak {name}"] / 1e9 for name in ("jax", "numpy"))

    flops, forward_flops, shapes = 0.0, 0.0, []
    for role, role_batch in (("agent", batch.agent), ("sims", batch.sims)):
        if role_batch is None:
            continue
        model_config, count = models_by_role[role]
        rows, length = int(np.prod(role_batch.tokens.shape[:-1])), role_batch.tokens.shape[-1]
        role_flops = train_flops(model_config, rows, length)
        loss_config = getattr(setup.step_config, role)
        flops += role_flops * (4 / 3 if loss_config.kl_coef else 1)  # + the reference's forward (1/3)
        forward_flops += role_flops / 3
        shapes.append(f"{role} {'x'.join(map(str, role_batch.tokens.shape))} tokens "
                      f"({int(role_batch.loss_mask.sum())} trained), {count:,} parameters "
                      f"(hidden {model_config.hidden_size}, {model_config.num_layers} layers, "
                      f"vocab {model_config.vocab_size})")
    loop_step = sum(best[name] for name, (_, kind) in phases.items() if kind == "phase")
    achieved = flops / best["update"] / 1e9
    print(f"\nrl_step: experiments/configs/target_word.py:{args.mode}, {config.rollout.groups} groups x "
          f"{config.rollout.group_size} episodes, {config.env.max_turns} turns per role, "
          f"{config.sampling.max_new_tokens} new tokens per turn; best of {args.repeats} alternating warm "
          "rounds")
    for line in shapes:
        print(f"  trained batch: {line}")
    print(f"{'phase':<10}{'seconds':>9}{'of step':>9}{'compile s':>11}  what")
    what = {
        "rollout": "rl_step.play_episodes: scenarios, batched turns (jitted generate), env.rewards at end",
        "reward": "env.rewards on every episode: the end of the rollout, timed on its own",
        "advantage": "rl_step.role_advantages: group advantages from the rewards",
        "batch": "rl_step.make_batch: each role's grown token views -> padded arrays",
        "logprobs": "NOT a loop phase here*: forward token_logprobs over the trained batch",
        "update": "the jitted train step (compile_train_step), state donated",
    }
    for name, (_, kind) in phases.items():
        share = {"phase": "{:.0%}", "in rollout": "({:.0%})", "extra": "+{:.0%}"}[kind].format(
            best[name] / loop_step)
        compile_s = max(first[name] - best[name], 0.0)
        print(f"{name:<10}{best[name]:>9.4f}{share:>9}{compile_s:>11.2f}  {what[name]}")
    print(f"{'step':<10}{loop_step:>9.4f}{'100%':>9}{'':>11}  rollout + advantage + batch + update")
    kl = ", ".join(f"{role} kl_coef {getattr(setup.step_config, role).kl_coef}"
                   for role in ("agent", "sims") if getattr(setup.step_config, role) is not None)
    print(f"* old log-probs come from the sampler and the reference is kept only for kl_coef > 0 ({kl}); "
          "with kl_coef > 0 the reference forward runs inside the update. The row is what a separate "
          "recompute would add (+ share of the step).")
    print(f"update: {flops / 1e9:.3f} GFLOP (train_flops of each trained role over its padded batch, plus "
          f"the reference forward where kl_coef > 0) in {best['update'] * 1e3:.1f} ms = {achieved:.1f} "
          f"GFLOP/s; "
          f"log-prob forward {forward_flops / best['logprobs'] / 1e9:.1f} GFLOP/s")
    print(f"float32 matmul peak, 4096^3, measured in the same rounds: jax {jax_peak:.0f} GFLOP/s, numpy "
          f"{numpy_peak:.0f} GFLOP/s; update at {achieved / jax_peak:.1%} of the jax peak")
    return achieved / jax_peak
