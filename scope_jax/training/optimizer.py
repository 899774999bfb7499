"""One optax optimizer over the joint {"agent", "sims"} tree, frozen parts by label."""

from __future__ import annotations

import dataclasses

import optax

from scope_jax.models.lora import trainable_labels

FROZEN = "frozen"


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """AdamW (or plain SGD) with global-norm clipping and linear warm-up, per role.

    name: "adamw" or "sgd".
    learning_rate: the agent's peak learning rate; sim_learning_rate: the simulators' (co-training).
    max_grad_norm: clip each role's gradient to this global norm (0 disables clipping).
    """

    name: str = "adamw"
    learning_rate: float = 1e-5
    sim_learning_rate: float = 1e-5
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    warmup_steps: int = 0


NAMES = ("adamw", "sgd")  # the optimizers `_role_optimizer` builds


def _role_optimizer(config: OptimizerConfig, peak_lr: float) -> optax.GradientTransformation:
    lr = optax.linear_schedule(0.0, peak_lr, config.warmup_steps) if config.warmup_steps else peak_lr
    parts = [optax.clip_by_global_norm(config.max_grad_norm)] if config.max_grad_norm else []
    if config.name == "adamw":
        parts.append(optax.adamw(lr, b1=config.b1, b2=config.b2, eps=config.eps,
                                 weight_decay=config.weight_decay))
    elif config.name == "sgd":
        parts.append(optax.sgd(lr))
    else:
        raise ValueError(f"optimizer name {config.name!r} is not one of {', '.join(map(repr, NAMES))}")
    return optax.chain(*parts)


def make_optimizer(config: OptimizerConfig, roles: dict[str, bool]) -> optax.GradientTransformation:
    """`roles` maps each top-level params key ("agent", "sims") to whether it trains.

    A frozen role, and the frozen base of a LoRA role (`scope_jax.models.lora`), are labelled `frozen`
    and get `optax.set_to_zero()`: no optimizer state, zero updates.
    """
    lrs = {"agent": config.learning_rate, "sims": config.sim_learning_rate}
    transforms = {role: _role_optimizer(config, lrs[role]) for role, trains in roles.items() if trains}
    transforms[FROZEN] = optax.set_to_zero()

    def labels(params):
        return {role: trainable_labels(params[role], role if roles[role] else FROZEN, FROZEN) for role in roles}

    return optax.multi_transform(transforms, labels)
