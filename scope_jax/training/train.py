"""The training loop around `rl_step`: evaluation, logging, checkpoints, resuming.

Every `train.eval_every` steps, before the step's update and with the parameters its episodes are
sampled with, the agent plays held-out simulators on the eval split and the collapse monitor runs its
costly estimates; a few of the step's dialogues are written to samples/step-S.jsonl. Every
`train.checkpoint_every` steps (and at the last) the whole state is saved. A run directory with a
checkpoint resumes from its latest one and logs exactly what an uninterrupted run would have logged.
"""

from __future__ import annotations

import json

import jax
import ml_collections
import numpy as np

from scope_jax import distributed, sharding
from scope_jax.dialogue.episode import AGENT, SIM, Episode
from scope_jax.dialogue.speakers import ModelSpeaker
from scope_jax.dialogue.transcript import transcript
from scope_jax.training import monitor
from scope_jax.training import state as joint
from scope_jax.training.checkpoint import Checkpointer, config_fingerprint
from scope_jax.training.rl_step import make_episodes, play_shards, rl_step, rollout_key, shards, speakers
from scope_jax.training.run_dir import RunDir
from scope_jax.training.setup import Setup, build


class TrainingStopped(RuntimeError):
    """The run stopped on purpose (too many non-finite steps); the last good checkpoint is intact."""


def train(config: ml_collections.ConfigDict, run_dir: RunDir) -> tuple[joint.JointState, dict[str, float]]:
    """Run (or resume) training into `run_dir`; returns the final state and the last logged metrics."""
    setup = build(config)
    ckpt = Checkpointer(run_dir.path / "checkpoints", config_fingerprint(config.to_dict()))
    state, start, skips = _start(setup, ckpt, run_dir)
    probes = monitor.Monitor(setup.env, config.monitor, setup.agent, config.seed, shards(setup))
    metrics: dict[str, float] = {}
    for step in run_dir.progress(range(start, config.train.steps), desc="train",
                                 total=config.train.steps - start):
        evaluated = bool(config.train.eval_every) and (step + 1) % config.train.eval_every == 0
        extra = evaluation(setup, probes, state, step) if evaluated else {}
        state, metrics, episodes = rl_step(setup, state, step)
        if evaluated:
            firsts = episodes[::config.rollout.group_size]  # one episode per scenario
            write_samples(run_dir, setup, step, firsts[:config.train.samples])
        metrics.update(extra)
        skips = skips + 1 if metrics["skipped"] else 0
        run_dir.log(step, metrics)
        if skips > config.train.max_consecutive_skips:
            raise TrainingStopped(f"{skips} non-finite steps in a row at step {step}; the last good "
                                  f"checkpoint (step {ckpt.latest_step()}) is intact")
        if (step + 1) % config.train.checkpoint_every == 0 or step + 1 == config.train.steps:
            ckpt.save(step + 1, state, {"step": step + 1, "consecutive_skips": skips})
    ckpt.close()
    return state, metrics


def resume_or_place(state: joint.JointState, mesh, ckpt: Checkpointer,
                    run_dir: RunDir) -> tuple[joint.JointState, dict | None]:
    """The latest checkpoint's state and host counters (the run's metrics cut back to its step), or, with
    no checkpoint, `state` placed on its shardings and None."""
    shardings = joint.state_shardings(state, mesh)
    if ckpt.latest_step() is None:
        return sharding.place(state, shardings), None
    abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings)
    state, host = ckpt.restore(abstract)
    run_dir.truncate_metrics(host["step"])
    print(f"resumed from step {host['step']}")
    return state, host


def _start(setup: Setup, ckpt: Checkpointer, run_dir: RunDir) -> tuple[joint.JointState, int, int]:
    """(state, first step, consecutive skipped steps): the latest checkpoint's, or the initial state's."""
    state, host = resume_or_place(setup.state, setup.mesh, ckpt, run_dir)
    return (state, 0, 0) if host is None else (state, host["step"], host["consecutive_skips"])


def evaluation(setup: Setup, probes: monitor.Monitor, state: joint.JointState, step: int) -> dict[str, float]:
    """Held-out rewards and the monitor's costly estimates, with the state's current players."""
    key = rollout_key(state, step)
    return {**evaluate(setup, state.params, jax.random.fold_in(key, 1), step),
            **probes.costly(speakers(setup, state.params),
                            setup.mode.probe(setup.sims, setup.rollout_params(state.params)),
                            jax.random.fold_in(key, 2))}


def evaluate(setup: Setup, params, key: jax.Array, step: int) -> dict[str, float]:
    """Mean agent reward against each held-out simulator on the eval split (heldout/i is
    config.eval.sim_models[i]), over every process's shards."""
    agent = speakers(setup, params)[AGENT]
    results = {}
    for i, sim in enumerate(setup.eval_sims):
        episodes = make_episodes(setup, step, "eval", setup.config.train.eval_groups)
        players = {AGENT: agent, SIM: ModelSpeaker(sim)}
        mine = play_shards(setup, episodes, players, jax.random.fold_in(key, i))
        results[f"heldout/{i}"] = float(np.mean(distributed.concatenated([e.rewards["agent"] for e in mine])))
    results["heldout_reward"] = float(np.mean(list(results.values())))
    return results


def write_samples(run_dir: RunDir, setup: Setup, step: int, episodes: list[Episode]) -> None:
    """Transcripts of `episodes` to samples/step-STEP.jsonl (rewritten when a resumed run repeats the
    step)."""
    run_dir.write_text(f"samples/step-{step}.jsonl", "".join(json.dumps(transcript(setup.env, e)) + "\n"
                                                             for e in episodes))
