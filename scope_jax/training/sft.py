"""Supervised fine-tuning of one role of written user dialogues: its settings (`default_config`, `check`) and
its loop (`train_sft`), beside the RL loop (`training.train`) and on the same checkpoint and resume code.

Data: the dialogues `data.source` names (`envs.user_dialogues`, e.g. "p4g_human": the P4G human dialogues,
each the environment's opening, the first `data.max_turns` human turns per role, the closing question and
the answer with the participant's real donation). The imitated `role` ("sim": the persuadee, "agent": the
persuader) sees each one through its token view, grown as a rollout grows it (`training.sft_data`), so SFT
trains on the tokens RL would. Train rows come from `data.train_split` and the held-out NLL from
`data.eval_split`; a fitted simulator or judge (`purpose`) is fitted on its own split only
(`user_dialogues.check_fit`). `data.train_dialogues` / `data.eval_dialogues` take that many of them (0:
all), drawn by the seed. A view longer than `data.max_length` tokens is left out, counted
(`dropped_too_long`). `train.last_reply_weight` weighs the tokens of each train view's last reply (in P4G the
closing answer with the real donation) that many times in the loss's token mean; the held-out NLL is
unweighted.

Training: `training.sft_step` (the masked next-token NLL of the role's replies, micro-batches, shardings,
donation) on length buckets of `train.batch_size` rows, one bucket per step (`sft_data.Buckets`). The
held-out NLL (token mean over the eval views) is logged before the updates of steps 0, eval_every, ...
and after the last. Checkpoints and resuming are the RL loop's (`train.CheckpointedLoop`). The trained
parameters are params["agent"] of the joint state (one model): the whole model, or with `lora.rank` > 0
a LoRA adapter (`scope_jax.models.lora`) beside the frozen base, saved on its own at the end (adapter/,
with what it was fitted on: `user_dialogues.record_fit`).
"""

from __future__ import annotations

import dataclasses
import time

import jax
import ml_collections
import numpy as np

from scope_jax import envs, sharding
from scope_jax.config import FINITE_AT_LEAST_0, ConfigError, at_least, one_of, require
from scope_jax.dialogue.environment import Environment
from scope_jax.dialogue.episode import ROLES, Episode
from scope_jax.dialogue.views import RoleView
from scope_jax.envs import user_dialogues
from scope_jax.envs.p4g_csv import P4GDataError
from scope_jax.models import lora
from scope_jax.training import players
from scope_jax.training import state as joint
from scope_jax.training.loss import LossConfig, nll_loss
from scope_jax.training.optimizer import NAMES as OPTIMIZERS
from scope_jax.training.optimizer import OptimizerConfig, make_optimizer
from scope_jax.training.run_dir import RunDir
from scope_jax.training.sft_data import Buckets, dialogue_view, token_batch, weight_last_reply
from scope_jax.training.sft_step import SFTStepConfig, compile_sft_step, make_sft_step
from scope_jax.training.train import CheckpointedLoop

PARAMS = "agent"  # the joint state's key of the one trained model
ADAPTER = "adapter"  # the run directory's folder of the trained LoRA adapter


def default_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.experiment = "sft"
    c.seed = 0
    c.model = "smollm2-135m-instruct"
    c.dtype = "float32"
    c.remat = False
    c.role = "sim"  # whose replies are learnt: "sim" (persuadee) or "agent" (persuader)
    c.data = ml_collections.ConfigDict({
        "source": "p4g_human", "data_dir": "../shared/data/p4g", "max_turns": 10, "max_length": 1024,
        "train_split": "simulator", "eval_split": "eval", "train_dialogues": 0, "eval_dialogues": 0})
    c.train = ml_collections.ConfigDict({"steps": 100, "batch_size": 8, "microbatches": 1, "eval_every": 25,
                                         "checkpoint_every": 25,
                                         # None: logprobs.head_chunk (typed, so that a flag can set it)
                                         "chunk_size": ml_collections.config_dict.placeholder(int),
                                         "last_reply_weight": 1.0})
    c.optimizer = ml_collections.ConfigDict(dict(dataclasses.asdict(OptimizerConfig()), learning_rate=2e-5))
    # rank 0: no adapter, every parameter trains; format: the saved adapter's layout (models.lora.LAYOUTS);
    # base_model: peft's base_model_name_or_path in a peft-layout adapter ("": none)
    c.lora = ml_collections.ConfigDict({"rank": 0, "alpha": 16.0, "targets": ("q_proj", "v_proj"),
                                        "format": "scope_jax", "base_model": ""})
    c.mesh = ml_collections.ConfigDict({"data": 1, "fsdp": 1, "tensor": 1})
    return c


RULES = {"role": one_of(ROLES), "dtype": one_of(players.DTYPES), "optimizer.name": one_of(OPTIMIZERS),
         **{f"train.{key}": at_least(1) for key in ("steps", "batch_size", "microbatches", "eval_every",
                                                    "checkpoint_every")},
         "data.max_length": at_least(1), "data.train_dialogues": at_least(0),
         "data.eval_dialogues": at_least(0), "optimizer.learning_rate": FINITE_AT_LEAST_0}


def check(config: ml_collections.ConfigDict, purpose: str | None) -> None:
    """Refuse, in one line naming the key, what would not run or would fit a `purpose` ("judge",
    "simulator"; None: neither, e.g. a persuader) on another purpose's people."""
    require(config, RULES)
    players.check_specs([("model", config.model)])
    if not config.train.last_reply_weight > 0:
        raise ConfigError(f"config key 'train.last_reply_weight' is {config.train.last_reply_weight}; it "
                          "must be positive")
    try:
        mesh = sharding.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
    except ValueError as e:
        raise ConfigError(f"config group 'mesh': {e}") from None
    rows, micro = config.train.batch_size, config.train.microbatches
    if rows % micro or (rows // micro) % sharding.data_parallel_size(mesh):
        raise ConfigError(f"config key 'train.batch_size' is {rows}, which does not split into "
                          f"train.microbatches = {micro} micro-batches of a multiple of mesh.data x "
                          f"mesh.fsdp = {sharding.data_parallel_size(mesh)} rows")
    if config.lora.rank:
        try:
            lora_config(config)
            if config.lora.format not in lora.LAYOUTS:
                raise ValueError(f"format is {config.lora.format!r}; one of {', '.join(lora.LAYOUTS)}")
        except ValueError as e:
            raise ConfigError(f"config group 'lora': {e}") from None
    if purpose is not None:
        try:
            user_dialogues.check_fit(data_spec(config, "train"), purpose)
        except ValueError as e:
            raise ConfigError(f"config key 'data.train_split': {e}") from None
    train = len(dialogues(config)[1]["train"])  # a missing data file or an unknown split stops the run here
    if train < config.train.batch_size:
        raise ConfigError(f"config key 'data.train_dialogues' gives {train} train dialogues, fewer than one "
                          f"batch (train.batch_size = {config.train.batch_size})")


def lora_config(config) -> lora.LoRAConfig:
    return lora.LoRAConfig(rank=config.lora.rank, alpha=config.lora.alpha, targets=tuple(config.lora.targets))


def data_spec(config, use: str) -> str:
    """"SOURCE:SPLIT" of the train or eval dialogues."""
    return f"{config.data.source}:{config.data[f'{use}_split']}"


def dialogues(config) -> tuple[Environment, dict[str, list[Episode]], dict[str, dict[str, int]]]:
    """(environment, {"train", "eval"}: the episodes used, skipped personas per split); ConfigError for a
    missing or malformed data file, an unknown source or an unknown split."""
    data = config.data
    try:
        source, _ = user_dialogues.parse(data_spec(config, "train"))
        env = envs.make(user_dialogues.SOURCES[source].environment, data_dir=data.data_dir,
                        max_turns=data.max_turns)
        chosen, skipped = {}, {}
        for use, count in (("train", data.train_dialogues), ("eval", data.eval_dialogues)):
            split = data[f"{use}_split"]
            if split not in env.splits:
                raise ValueError(f"data.{use}_split is {split!r}; one of {', '.join(env.splits)}")
            loaded = user_dialogues.load(data_spec(config, use), env, data.max_turns)
            order = np.random.default_rng([config.seed, use == "eval"]).permutation(len(loaded.episodes))
            chosen[use] = [loaded.episodes[i] for i in (order[:count] if count else order)]
            skipped[use] = loaded.skipped
    except P4GDataError as e:
        raise ConfigError(f"config key 'data.data_dir': {e}") from None
    except ValueError as e:
        raise ConfigError(f"config group 'data': {e}") from None
    return env, chosen, skipped


@dataclasses.dataclass
class SFTData:
    """The role's token views of the train and eval dialogues that fit `data.max_length`; in the train
    views the last reply's loss mask is `train.last_reply_weight` (`sft_data.weight_last_reply`)."""

    train: list[RoleView]
    eval: list[RoleView]
    dropped_too_long: dict[str, int]
    skipped: dict[str, dict[str, int]]


def prepare_data(config, tokenizer) -> SFTData:
    env, chosen, skipped = dialogues(config)
    views, dropped = {}, {}
    for use, episodes in chosen.items():
        grown = [dialogue_view(env, e, config.role, tokenizer) for e in episodes]
        views[use] = [v for v in grown if len(v) <= config.data.max_length]
        dropped[use] = len(grown) - len(views[use])
    views["train"] = [weight_last_reply(v, config.train.last_reply_weight) for v in views["train"]]
    return SFTData(views["train"], views["eval"], dropped, skipped)


def heldout_nll(graphdef, params, views: list[RoleView], batch_size: int, pad_id: int, loss: LossConfig,
                summed) -> float:
    """Token-mean NLL of the role's replies over `views` (batches of similar length)."""
    order = np.argsort([len(v) for v in views], kind="stable")
    total = tokens = 0.0
    for start in range(0, len(order), batch_size):
        batch = token_batch([views[i] for i in order[start:start + batch_size]], pad_id)
        total += float(summed(params, batch))
        tokens += float(batch.loss_mask.sum())
    return total / tokens


@dataclasses.dataclass
class Trained:
    """What `train_sft` returns: the model, its trained parameters, and the data it saw."""

    graphdef: object
    params: object
    tokenizer: object
    data: SFTData
    last: dict[str, float]


def train_sft(config, run_dir: RunDir, purpose: str | None) -> Trained:
    """Run (or resume) the SFT steps into `run_dir`; a saved adapter records its data and `purpose`."""
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
    graphdef, params, tokenizer = players.load_model(config.model, dtype=config.dtype, remat=config.remat,
                                                     mesh=mesh)
    if config.lora.rank:
        graphdef, params = lora.init(graphdef, params, lora_config(config), seed=config.seed)
    pad_id = tokenizer.pad_token_id or 0
    data = prepare_data(config, tokenizer)
    train = config.train
    buckets = Buckets.by_length([len(v) for v in data.train], train.batch_size)
    optimizer = make_optimizer(OptimizerConfig(**config.optimizer.to_dict()), {PARAMS: True})
    loss = LossConfig(chunk_size=train.chunk_size)
    step_fn = make_sft_step(graphdef, optimizer, SFTStepConfig(role=PARAMS, loss=loss,
                                                               microbatches=train.microbatches))
    summed = jax.jit(lambda p, b: nll_loss(graphdef, p, b, b.loss_mask, loss)[0])
    evaluate = lambda state: {"heldout_nll": heldout_nll(graphdef, state.params[PARAMS], data.eval,
                                                         train.batch_size, pad_id, loss, summed)}

    loop = CheckpointedLoop(config, run_dir, joint.create({PARAMS: params}, optimizer, seed=config.seed),
                            mesh, train.steps, train.checkpoint_every)
    compiled, last = None, {}
    bar = loop.progress("sft")
    for step in bar:
        batch = token_batch([data.train[i] for i in buckets.at_step(step, config.seed)], pad_id)
        record = evaluate(loop.state) if step % train.eval_every == 0 else {}
        compiled = compiled or compile_sft_step(step_fn, loop.state, batch, mesh, PARAMS)
        began = time.perf_counter()
        loop.state, metrics = compiled(loop.state, batch)
        metrics = jax.device_get(metrics)
        seconds = time.perf_counter() - began
        last = {"loss": float(metrics["loss"]), "grad_norm": float(metrics["grad_norm"]),
                "skipped": float(metrics["skipped"]), "tokens": float((batch.loss_mask > 0).sum()),
                "padded_tokens": float(batch.tokens.size),
                "tokens_per_s": batch.tokens.size / seconds, "time/step": seconds,
                "epoch": step / len(buckets.buckets)}
        run_dir.log(step, {**last, **record})
        bar.set_postfix_str(f"loss {last['loss']:.3f}, {last['tokens_per_s']:.0f} tok/s")
        loop.step_done(step)
    loop.close()
    final = evaluate(loop.state)
    run_dir.log(train.steps, final)
    if config.lora.rank:
        lora.save_adapter(run_dir.path / ADAPTER, loop.state.params[PARAMS].adapter, lora_config(config),
                          format=config.lora.format, base_model=config.lora.base_model or None)
        if purpose is not None:
            user_dialogues.record_fit(run_dir.path / ADAPTER, data_spec(config, "train"), purpose)
    return Trained(graphdef, loop.state.params[PARAMS], tokenizer, data, {**last, **final})
