"""The training loop around `rl_step`: evaluation, logging, checkpoints, resuming.

Every `train.eval_every` steps (and at step 0 with `train.eval_first`: the untrained agent's baseline),
before the step's update and with the parameters its episodes are sampled with, the agent plays held-out
simulators on the eval split and the collapse monitor runs its costly estimates; the held-out dialogues
are written to samples/eval-step-S.jsonl and a few of the step's to samples/step-S.jsonl. Every
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
from scope_jax.training.run_dir import ADAPTERS, RunDir
from scope_jax.training.config import Checked
from scope_jax.training.setup import Setup, build


class TrainingStopped(RuntimeError):
    """The run stopped on purpose (too many non-finite steps); the last good checkpoint is intact."""


def train(config: ml_collections.ConfigDict, run_dir: RunDir,
          checked: Checked | None = None) -> tuple[joint.JointState, dict[str, float]]:
    """Run (or resume) training into `run_dir`; returns the final state and the last logged metrics.
    `checked`: what `training.config.check(config)` returned (checked here when not given)."""
    setup = build(config, checked)
    run_dir.pin(ADAPTERS, setup.adapters)
    loop = CheckpointedLoop(config, run_dir, setup.state, setup.mesh, config.train.steps,
                            config.train.checkpoint_every, consecutive_skips=0)
    probes = monitor.Monitor(setup.env, config.monitor, setup.agent, config.seed, shards(setup))
    metrics: dict[str, float] = {}
    for step in loop.progress("train"):
        evaluated = (bool(config.train.eval_every) and (step + 1) % config.train.eval_every == 0
                     or config.train.eval_first and step == 0)
        extra = evaluation(setup, probes, loop.state, step, run_dir) if evaluated else {}
        loop.state, metrics, episodes = rl_step(setup, loop.state, step)
        if evaluated:
            firsts = episodes[::config.rollout.group_size]  # one episode per scenario
            write_samples(run_dir, setup, f"step-{step}", firsts[:config.train.samples])
        metrics.update(extra)
        skips = loop.host["consecutive_skips"] + 1 if metrics["skipped"] else 0
        loop.host["consecutive_skips"] = skips
        run_dir.log(step, metrics)
        if skips > config.train.max_consecutive_skips:
            raise TrainingStopped(f"{skips} non-finite steps in a row at step {step}; the last good "
                                  f"checkpoint (step {loop.checkpointer.latest_step()}) is intact")
        loop.step_done(step)
    loop.close()
    return loop.state, metrics


class CheckpointedLoop:
    """The resumable frame of a training loop (RL's `train`, `training.sft.train_sft`): the state, resumed
    from the run directory's latest checkpoint (the run's metrics cut back to its step) or placed on its
    shardings, and the host counters saved with it (`host`, "step" included); `step_done(step)` saves a
    checkpoint every `checkpoint_every` steps and at the last. A checkpoint written under another config
    is refused (`config_fingerprint`)."""

    def __init__(self, config: ml_collections.ConfigDict, run_dir: RunDir, state: joint.JointState, mesh,
                 steps: int, checkpoint_every: int, **host):
        self.run_dir, self.steps, self.checkpoint_every = run_dir, steps, checkpoint_every
        self.checkpointer = Checkpointer(run_dir.path / "checkpoints", config_fingerprint(config.to_dict()))
        self.state, restored = resume_or_place(state, mesh, self.checkpointer, run_dir)
        self.host = {"step": 0, **host} if restored is None else restored

    def progress(self, desc: str):
        """The steps still to run, as the run directory's progress bar."""
        start = self.host["step"]
        return self.run_dir.progress(range(start, self.steps), desc=desc, total=self.steps - start)

    def step_done(self, step: int) -> None:
        self.host["step"] = step + 1
        if (step + 1) % self.checkpoint_every == 0 or step + 1 == self.steps:
            self.checkpointer.save(step + 1, self.state, self.host)

    def close(self) -> None:
        self.checkpointer.close()


def resume_or_place(state: joint.JointState, mesh, ckpt: Checkpointer,
                    run_dir: RunDir) -> tuple[joint.JointState, dict | None]:
    """The latest checkpoint's state and host counters (the run's metrics cut back to its step), or, with
    no checkpoint, `state` placed on its shardings and None (the metrics of a run killed before its first
    checkpoint dropped)."""
    shardings = joint.state_shardings(state, mesh)
    if ckpt.latest_step() is None:
        run_dir.keep_metrics(lambda record: False)
        return sharding.place(state, shardings), None
    abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings)
    state, host = ckpt.restore(abstract)
    run_dir.keep_metrics(lambda record: record["step"] < host["step"])
    print(f"resumed from step {host['step']}")
    return state, host


def evaluation(setup: Setup, probes: monitor.Monitor, state: joint.JointState, step: int,
               run_dir: RunDir) -> dict[str, float]:
    """Held-out rewards (their dialogues to samples/eval-step-S.jsonl) and the monitor's costly estimates,
    with the state's current players."""
    key = rollout_key(state, step)
    results, episodes = evaluate(setup, state.params, jax.random.fold_in(key, 1), step)
    write_samples(run_dir, setup, f"eval-step-{step}", episodes)
    return {**results, **probes.costly(speakers(setup, state.params),
                                       setup.mode.probe(setup.sims, setup.rollout_params(state.params)),
                                       jax.random.fold_in(key, 2))}


def evaluate(setup: Setup, params, key: jax.Array, step: int) -> tuple[dict[str, float], list[Episode]]:
    """Mean agent reward against each held-out simulator on the eval split (heldout/i is
    config.eval.sim_models[i]), over every process's shards; and those episodes (info["heldout"]: i)."""
    agent = speakers(setup, params)[AGENT]
    results, played = {}, []
    for i, sim in enumerate(setup.eval_sims):
        episodes = make_episodes(setup, step, "eval", setup.config.train.eval_groups)
        players = {AGENT: agent, SIM: ModelSpeaker(sim)}
        mine = distributed.concatenated(play_shards(setup, episodes, players, jax.random.fold_in(key, i)))
        for episode in mine:
            episode.info["heldout"] = i
        played += mine
        results[f"heldout/{i}"] = float(np.mean([e.rewards["agent"] for e in mine]))
    results["heldout_reward"] = float(np.mean(list(results.values())))
    return results, played


def write_samples(run_dir: RunDir, setup: Setup, name: str, episodes: list[Episode]) -> None:
    """Transcripts of `episodes` to samples/NAME.jsonl, with the index of the held-out simulator that played
    an evaluation episode ("heldout"); rewritten when a resumed run repeats the step."""
    records = [{**transcript(setup.env, e), **{k: e.info[k] for k in ("heldout",) if k in e.info}}
               for e in episodes]
    run_dir.write_text(f"samples/{name}.jsonl", "".join(json.dumps(r) + "\n" for r in records))
