"""User dialogues by name, "SOURCE:SPLIT": the written dialogues a model is fitted on (SFT) or anchored to
(the dialogue loop's data anchor), and the rule that keeps the held-out judge apart from the simulators.

`SOURCES` is the one registry: a source names the environment whose episodes it writes and loads a split
of them, e.g. "p4g_human:simulator" is the human Persuasion for Good dialogues (`envs.p4g_human`) of the
P4G simulator split. `load(spec, env, max_turns)` returns the episodes and the count of people without one.

A model fitted to user data has a *purpose*: the *judge* (the held-out user that evaluates the agent) or a
training *simulator* (what the agent trains against, a data anchor included). Each purpose is fitted on
its own split only (`FITTED_SPLITS`), so the judge and the simulators never share a person; `check_fit`
refuses any other split in one line. The SFT loop records what an adapter was fitted on in its folder
(`record_fit`, `FIT_FILE`), so a run can refuse a simulator fitted on judge data (`recorded_fit`).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Callable

from scope_jax.dialogue.environment import Environment
from scope_jax.envs import ENVIRONMENTS
from scope_jax.envs.p4g_human import HumanDialogues

FITTED_SPLITS = {"judge": "judge", "simulator": "simulator"}  # purpose -> the one split it is fitted on
FIT_FILE = "fitted_on.json"  # in an adapter folder: {"data": SOURCE:SPLIT, "purpose": ...}


@dataclasses.dataclass(frozen=True)
class Source:
    """environment: the name (envs.ENVIRONMENTS) of the environment the dialogues are episodes of;
    load(env, split, max_turns): the split's episodes, each cut to max_turns turns per role."""

    environment: str
    load: Callable[[Environment, str, int], HumanDialogues]


SOURCES: dict[str, Source] = {"p4g_human": Source("p4g", HumanDialogues.load)}


def parse(spec: str) -> tuple[str, str]:
    """(source, split) of "SOURCE:SPLIT"; ValueError (one line) otherwise."""
    source, _, split = spec.partition(":")
    if source not in SOURCES or not split:
        raise ValueError(f"{spec!r} is not SOURCE:SPLIT with SOURCE one of {', '.join(SOURCES)}")
    return source, split


def load(spec: str, env: Environment, max_turns: int) -> HumanDialogues:
    """The dialogues `spec` names, as episodes of `env` (which must be the source's environment)."""
    source, split = parse(spec)
    wanted = ENVIRONMENTS[SOURCES[source].environment]
    if not isinstance(env, wanted):
        raise ValueError(f"{spec!r} holds episodes of {wanted.__name__}, but the environment is "
                         f"{type(env).__name__}")
    return SOURCES[source].load(env, split, max_turns)


def check_fit(spec: str, purpose: str) -> None:
    """Refuse (ValueError, one line) fitting a model of `purpose` ("judge" or "simulator") on `spec` unless
    it is that purpose's split."""
    _, split = parse(spec)
    if split != FITTED_SPLITS[purpose]:
        others = ", ".join(f"the {p} on {s}" for p, s in FITTED_SPLITS.items())
        raise ValueError(f"{spec!r} would fit the {purpose} on the {split!r} split; the judge and the "
                         f"training simulators never share a person ({others}; docs/p4g.md)")


def record_fit(folder: str | pathlib.Path, spec: str, purpose: str) -> None:
    """Write into `folder` (a fitted model's adapter folder) what it was fitted on and for what."""
    (pathlib.Path(folder) / FIT_FILE).write_text(json.dumps({"data": spec, "purpose": purpose}) + "\n")


def recorded_fit(model_spec: str) -> dict | None:
    """What the adapter of a "BASE+ADAPTER" model spec records it was fitted on (None: no adapter, or one
    that records nothing, i.e. not fitted to user data by the SFT loop)."""
    if "+" not in model_spec:
        return None
    path = pathlib.Path(model_spec.split("+", 1)[1]) / FIT_FILE
    return json.loads(path.read_text()) if path.is_file() else None
