"""tau2 test setup: the data folder (tests skip without it), the fact sheet's reference hashes, and the
environments, each loaded once per session (the retail DB is 2.8 MB; episodes copy it on write)."""

import hashlib
import json
import pathlib

import pytest

from scope_jax.dialogue.episode import AGENT, SIM, Episode
from scope_jax.dialogue.rollout import rollout_scripted
from scope_jax.envs.tau2 import Tau2Env

ROOT = pathlib.Path(__file__).resolve().parents[3]
DATA = ROOT.parent / "shared" / "data" / "tau2"
# Facts from shared/benchmarks/tau2.md (section 3.2 and Appendix A), also read by the replay job.
REFERENCE = json.loads((ROOT / "experiments" / "configs" / "tau2_gold_hashes.json").read_text())


def plain_hash(tables) -> str:
    """The sheet's hash rule written out directly (the reference for Database.hash)."""
    return hashlib.sha256(json.dumps(tables, sort_keys=True, default=str).encode()).hexdigest()


def play(env, task, agent, user) -> Episode:
    """One episode of `task` between a scripted agent and user, through the engine's rollout."""
    return rollout_scripted(env, [Episode(task, group=0)], {AGENT: agent, SIM: user})[0]


def _env(**settings) -> Tau2Env:
    if not DATA.is_dir():
        pytest.skip(f"tau2 data folder {DATA} is absent")
    return Tau2Env(data_dir=str(DATA), **settings)


@pytest.fixture(scope="session")
def retail_env() -> Tau2Env:
    return _env()


@pytest.fixture(scope="session")
def mock_env() -> Tau2Env:
    return _env(domain="mock", train_split="base", eval_split="base")


@pytest.fixture(scope="session")
def make_env():
    """make_env(**settings): a Tau2Env on the data folder (the domain itself is loaded once)."""
    return _env


@pytest.fixture
def retail(retail_env):
    """Fresh retail toolkit (agent side) over a fresh database."""
    return retail_env.domain_data.fresh().agent


@pytest.fixture
def fixed_retail(retail_env):
    """Fresh retail toolkit with the quirk fixes on."""
    return retail_env.domain_data.fresh(fix_quirks=True).agent
