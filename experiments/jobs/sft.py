"""Supervised fine-tuning of one role of written dialogues: the P4G human dialogues (persuadee or persuader).

Data: the human dialogues of `data.data_dir` as episodes of the P4G environment (`scope_jax.envs.p4g_human`:
the environment's opening, the first `data.max_turns` human turns per role, the closing question and the
answer with the participant's real donation). The imitated `role` ("sim": the persuadee, "agent": the
persuader) sees each one through its token view, grown as a rollout grows it (`training.sft_data`), so
SFT trains on the tokens RL would. Train rows come from `data.train_split` and the held-out NLL from
`data.eval_split` (the environment's hash split of the participants: "train", "eval", or "all");
`data.train_dialogues` / `data.eval_dialogues` take that many of them (0: all), drawn by the seed. A view
longer than `data.max_length` tokens is left out, counted (`dropped_too_long`).

Training: `training.sft_step` (the masked next-token NLL of the role's replies, micro-batches, shardings,
donation) on length buckets of `train.batch_size` rows, one bucket per step (`sft_data.Buckets`). The
held-out NLL (token mean over the eval views) is logged before the updates of steps 0, eval_every, ...
and after the last. Checkpoints every `train.checkpoint_every` steps and at the last; a run directory
with a checkpoint resumes from it and logs what an uninterrupted run would have. metrics.jsonl and
tensorboard get loss, grad norm, trained tokens and tokens/s per step; the progress bar shows tokens/s
and the ETA. The trained parameters are params["agent"] of the joint state (one model): the whole model,
or with `lora.rank` > 0 a LoRA adapter (`scope_jax.models.lora`: rank, alpha, target projections) beside
the frozen base, saved on its own at the end (adapter/: safetensors and its settings).
"""

from __future__ import annotations

import dataclasses
import time

import jax
import ml_collections
import numpy as np

from scope_jax import sharding
from scope_jax.config import ConfigError
from scope_jax.dialogue.episode import ROLES, Episode
from scope_jax.dialogue.views import RoleView
from scope_jax.envs.p4g import P4GEnv
from scope_jax.envs.p4g_human import HumanDialogues
from scope_jax.models import lora
from scope_jax.training import state as joint
from scope_jax.training.checkpoint import Checkpointer, config_fingerprint
from scope_jax.training.loss import LossConfig, nll_loss
from scope_jax.training.optimizer import OptimizerConfig, make_optimizer
from scope_jax.training.players import load_model
from scope_jax.training.run_dir import RunDir
from scope_jax.training.sft_data import Buckets, dialogue_view, token_batch
from scope_jax.training.sft_step import SFTStepConfig, compile_sft_step, make_sft_step
from scope_jax.training.train import resume_or_place

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
        "data_dir": "../shared/data/p4g", "max_turns": 10, "max_length": 1024, "train_split": "train",
        "eval_split": "eval", "train_dialogues": 0, "eval_dialogues": 0})
    c.train = ml_collections.ConfigDict({"steps": 100, "batch_size": 8, "microbatches": 1, "eval_every": 25,
                                         "checkpoint_every": 25, "chunk_size": 128})
    c.optimizer = ml_collections.ConfigDict(dict(dataclasses.asdict(OptimizerConfig()), learning_rate=2e-5))
    # rank 0: no adapter, every parameter trains
    c.lora = ml_collections.ConfigDict({"rank": 0, "alpha": 16.0, "targets": ("q_proj", "v_proj")})
    c.mesh = ml_collections.ConfigDict({"data": 1, "fsdp": 1, "tensor": 1})
    return c


def check(config: ml_collections.ConfigDict) -> None:
    if config.role not in ROLES:
        raise ConfigError(f"config key 'role' is {config.role!r}; one of {', '.join(ROLES)}")
    for key in ("steps", "batch_size", "microbatches", "eval_every", "checkpoint_every"):
        if config.train[key] < 1:
            raise ConfigError(f"config key 'train.{key}' is {config.train[key]}; it must be at least 1")
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
        except ValueError as e:
            raise ConfigError(f"config group 'lora': {e}") from None
    dialogues(config)  # a missing data file or an unknown split stops the run here, in one line


def lora_config(config) -> lora.LoRAConfig:
    return lora.LoRAConfig(rank=config.lora.rank, alpha=config.lora.alpha, targets=tuple(config.lora.targets))


def dialogues(config) -> tuple[P4GEnv, dict[str, list[Episode]], dict[str, dict[str, int]]]:
    """(environment, {"train", "eval"}: the episodes used, skipped personas per split); ConfigError for a
    missing or malformed data file or an unknown split."""
    data = config.data
    try:
        env = P4GEnv(data_dir=data.data_dir, max_turns=data.max_turns)
        chosen, skipped = {}, {}
        for use, split, count in (("train", data.train_split, data.train_dialogues),
                                  ("eval", data.eval_split, data.eval_dialogues)):
            if split not in env.splits:
                raise ValueError(f"data.{use}_split is {split!r}; one of {', '.join(env.splits)}")
            loaded = HumanDialogues.load(env, split, data.max_turns)
            order = np.random.default_rng([config.seed, use == "eval"]).permutation(len(loaded.episodes))
            chosen[use] = [loaded.episodes[i] for i in (order[:count] if count else order)]
            skipped[use] = loaded.skipped
    except ValueError as e:  # P4GDataError included
        raise ConfigError(f"config group 'data': {e}") from None
    return env, chosen, skipped


@dataclasses.dataclass
class SFTData:
    """The role's token views of the train and eval dialogues that fit `data.max_length`."""

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


def train_sft(config, run_dir: RunDir) -> Trained:
    """Run (or resume) the SFT steps into `run_dir`."""
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
    graphdef, params, tokenizer = load_model(config.model, dtype=config.dtype, remat=config.remat, mesh=mesh)
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

    ckpt = Checkpointer(run_dir.path / "checkpoints", config_fingerprint(config.to_dict()))
    state, host = resume_or_place(joint.create({PARAMS: params}, optimizer, seed=config.seed), mesh, ckpt,
                                  run_dir)
    start = 0 if host is None else host["step"]
    compiled, last = None, {}
    bar = run_dir.progress(range(start, train.steps), desc="sft", total=train.steps - start)
    for step in bar:
        batch = token_batch([data.train[i] for i in buckets.at_step(step, config.seed)], pad_id)
        record = evaluate(state) if step % train.eval_every == 0 else {}
        compiled = compiled or compile_sft_step(step_fn, state, batch, mesh, PARAMS)
        began = time.perf_counter()
        state, metrics = compiled(state, batch)
        metrics = jax.device_get(metrics)
        seconds = time.perf_counter() - began
        tokens = float(batch.loss_mask.sum())
        last = {"loss": float(metrics["loss"]), "grad_norm": float(metrics["grad_norm"]),
                "skipped": float(metrics["skipped"]), "tokens": tokens,
                "padded_tokens": float(batch.tokens.size),
                "tokens_per_s": batch.tokens.size / seconds, "time/step": seconds,
                "epoch": step / len(buckets.buckets)}
        run_dir.log(step, {**last, **record})
        bar.set_postfix_str(f"loss {last['loss']:.3f}, {last['tokens_per_s']:.0f} tok/s")
        if (step + 1) % train.checkpoint_every == 0 or step + 1 == train.steps:
            ckpt.save(step + 1, state, {"step": step + 1})
    final = evaluate(state)
    run_dir.log(train.steps, final)
    ckpt.close()
    if config.lora.rank:
        lora.save_adapter(run_dir.path / ADAPTER, state.params[PARAMS].adapter, lora_config(config))
    return Trained(graphdef, state.params[PARAMS], tokenizer, data, {**last, **final})


def summary_lines(config, trained: Trained, run_dir: RunDir) -> list[str]:
    records = run_dir.read_metrics()
    evals = [(r["step"], r["heldout_nll"]) for r in records if "heldout_nll" in r]
    steps = [r for r in records if "tokens_per_s" in r]
    data = trained.data
    lines = [f"# SFT of the {config.role} role", "",
             f"model `{config.model}`, {config.train.steps} steps of {config.train.batch_size} dialogues "
             f"(length buckets), {len(data.train)} train and {len(data.eval)} held-out dialogues "
             f"(splits {config.data.train_split} / {config.data.eval_split}, at most {config.data.max_turns} "
             f"turns per role, views up to {config.data.max_length} tokens; left out as too long: "
             f"{data.dropped_too_long}; personas without a dialogue: {data.skipped}).", "",
             "| step | held-out NLL |", "|---|---|"]
    lines += [f"| {step} | {nll:.4f} |" for step, nll in evals]
    if steps:
        lines += ["", f"Median tokens/s (padded rows): {np.median([r['tokens_per_s'] for r in steps]):.0f}; "
                  f"median seconds per step: {np.median([r['time/step'] for r in steps]):.2f}."]
    return lines


def run(config, run_dir: RunDir) -> None:
    trained = train_sft(config, run_dir)
    run_dir.write_summary("\n".join(summary_lines(config, trained, run_dir)))
