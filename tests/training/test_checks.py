"""The dialogue RL configurations that would run but be wrong: each is refused in one line naming its key."""

import pytest

from experiments.configs.target_word import get_config
from scope_jax.algorithms import ADVANTAGES
from scope_jax.config import ConfigError
from scope_jax.training.config import check

# (label, mode of experiments/configs/target_word.py, changes, the key the error names)
BAD = [
    ("top-k truncates a trained role's sampling", "frozen", {"sampling.top_k": 5}, "sampling.top_k"),
    ("top-p truncates a trained role's sampling", "cotrain", {"sampling.top_p": 0.9}, "sampling.top_p"),
    ("greedy decoding of a trained role", "frozen", {"sampling.temperature": 0.0}, "sampling.temperature"),
    ("one rollout per (scenario, member) group", "population", {"rollout.group_size": 2},
     "rollout.group_size"),
    ("rollouts per scenario not a multiple of P", "population", {"rollout.group_size": 5},
     "rollout.group_size"),
    ("checkpoint_every = 0", "frozen", {"train.checkpoint_every": 0}, "train.checkpoint_every"),
    ("a population of one", "population", {"sim.population": 1}, "sim.population"),
    ("a population outside mode population", "cotrain", {"sim.population": 2}, "sim.population"),
    ("sim.model in rotation", "rotation", {"sim.model": "tiny:1"}, "sim.model"),
    ("sim.model in mixture", "mixture", {"sim.model": "tiny:1"}, "sim.model"),
    ("sim.model in self-play", "selfplay", {"sim.model": "tiny:1"}, "sim.model"),
    ("sim.models in a single-model mode", "frozen", {"sim.models": ("tiny:2",)}, "sim.models"),
    ("rotation over one model", "rotation", {"sim.models": ("tiny:1",)}, "sim.models"),
    ("agent rows do not split over the mesh", "frozen", {"rollout.groups": 3, "rollout.group_size": 2,
                                                         "mesh.data": 4}, "rollout.groups"),
    ("agent rows do not split into micro-batches", "frozen", {"train.microbatches": 3}, "rollout.groups"),
    ("a member's rows per micro-batch do not split over the mesh", "population",
     {"rollout.groups": 1, "rollout.group_size": 4, "mesh.fsdp": 4}, "rollout.groups"),
    ("an unknown objective", "cotrain", {"sim.objective": "shared"}, "sim.objective"),
    ("the regret objective (it needs a best response)", "cotrain", {"sim.objective": "regret"}, "sim.objective"),
    ("a data anchor without user data", "cotrain", {"sim.data_coef": 0.5}, "sim.data_coef"),
    ("a data anchor on a frozen simulator", "frozen", {"sim.data_coef": 0.5, "sim.data": "p4g"}, "sim.data_coef"),
    ("an unknown mode", "frozen", {"sim.mode": "alternating"}, "sim.mode"),
    ("a data anchor on the judge's people", "cotrain", {"sim.data_coef": 0.5, "sim.data": "p4g_human:judge"},
     "sim.data"),
    ("a data anchor on judge and simulator people", "cotrain",
     {"sim.data_coef": 0.5, "sim.data": "p4g_human:train"}, "sim.data"),
    ("a data anchor on held-out people", "cotrain", {"sim.data_coef": 0.5, "sim.data": "p4g_human:eval"},
     "sim.data"),
]


@pytest.mark.parametrize("mode,changes,key", [row[1:] for row in BAD], ids=[row[0] for row in BAD])
def test_bad_configurations_are_refused_in_one_line_naming_the_key(mode, changes, key):
    config = get_config(mode)
    check(config)  # the mode's own config is fine
    for name, value in changes.items():
        group, field = name.split(".")
        config[group][field] = value
    with pytest.raises(ConfigError) as error:
        check(config)
    message = str(error.value)
    assert f"'{key}'" in message and "\n" not in message, message


def test_regret_is_refused_by_the_rl_step_too_saying_it_needs_a_best_response():
    """role_advantages reads the objective through the same check (a config that skipped `check`)."""
    from types import SimpleNamespace

    from scope_jax.training.rl_step import role_advantages

    config = get_config("cotrain")
    config.sim.objective = "regret"
    setup = SimpleNamespace(config=config, mode=SimpleNamespace(sim_trains=True, members=1))
    episode = SimpleNamespace(group=0, sim_index=0, rewards={"agent": 1.0, "sim": 0.0})
    with pytest.raises(ConfigError, match="best response") as error:
        role_advantages(setup, [episode, episode])
    assert "\n" not in str(error.value)


@pytest.fixture
def fitted(tmp_path):
    """Adapter folders that record what they were fitted on, as the SFT loop writes them (no weights: the
    check reads only the record)."""
    from scope_jax.envs.user_dialogues import record_fit

    def folder(purpose: str) -> str:
        path = tmp_path / purpose
        path.mkdir()
        record_fit(path, f"p4g_human:{purpose}", purpose)
        return f"tiny:1+{path}"

    return folder


def test_a_simulator_fitted_on_judge_data_or_a_judge_on_simulator_data_is_refused(fitted):
    judge, simulator = fitted("judge"), fitted("simulator")
    config = get_config("frozen")
    config.sim.model, config.eval.sim_models = simulator, (judge,)
    check(config)  # each fitted on its own split
    for key, changes in [("sim.model", {"sim.model": judge}),
                         ("eval.sim_models", {"eval.sim_models": (simulator,)})]:
        bad = get_config("frozen")
        bad.sim.model, bad.eval.sim_models = simulator, (judge,)
        for name, value in changes.items():
            group, field = name.split(".")
            bad[group][field] = value
        with pytest.raises(ConfigError, match="fitted as the") as error:
            check(bad)
        assert f"'{key}'" in str(error.value) and "\n" not in str(error.value)


def test_training_against_the_judge_itself_is_refused(tmp_path):
    """A saved adapter that records nothing (not fitted by the SFT loop) may be a judge or a simulator,
    but not both in one run."""
    config = get_config("rotation")
    config.sim.models = ("tiny:1", f"tiny:2+{tmp_path}")
    config.eval.sim_models = (f"tiny:2+{tmp_path}",)
    with pytest.raises(ConfigError, match="train against the model that evaluates it") as error:
        check(config)
    assert "'sim.models'" in str(error.value)


NAN, INF = float("nan"), float("inf")
# (label, changes to experiments/configs/target_word.py's frozen config, the start of the one-line error)
NONSENSE = [
    ("no micro-batches", {"train.microbatches": 0},
     "config key 'train.microbatches' is 0; it must be at least 1"),
    ("no shards", {"rollout.shards": 0}, "config key 'rollout.shards' is 0; it must be at least 1"),
    ("no steps", {"train.steps": 0}, "config key 'train.steps' is 0"),
    ("negative steps", {"train.steps": -1}, "config key 'train.steps' is -1"),
    ("no scenario groups", {"rollout.groups": 0}, "config key 'rollout.groups' is 0"),
    ("negative scenario groups", {"rollout.groups": -4}, "config key 'rollout.groups' is -4"),
    ("empty groups", {"rollout.group_size": 0}, "config key 'rollout.group_size' is 0"),
    ("no evaluation groups, evaluating", {"train.eval_groups": 0}, "config key 'train.eval_groups' is 0"),
    ("no evaluation groups, evaluating first",
     {"train.eval_every": 0, "train.eval_first": True, "train.eval_groups": 0}, "config key 'train.eval_gr"),
    ("negative eval_every", {"train.eval_every": -1}, "config key 'train.eval_every' is -1"),
    ("an unknown optimizer", {"optimizer.name": "adam"}, "config key 'optimizer.name' is 'adam'"),
    ("an unknown advantage", {"algo.advantage": "ppo"}, "config key 'algo.advantage' is 'ppo'; it must be"),
    ("an unknown aggregation", {"algo.aggregation": "foo"}, "config key 'algo.aggregation' is 'foo'"),
    ("an unknown KL estimator", {"algo.kl_estimator": "k4"}, "config key 'algo.kl_estimator' is 'k4'"),
    ("an unknown dtype", {"agent.dtype": "float99"}, "config key 'agent.dtype' is 'float99'"),
    ("top-p above 1", {"sampling.top_p": 2.0}, "config key 'sampling.top_p' is 2.0; it must be in (0, 1]"),
    ("NaN temperature", {"sampling.temperature": NAN}, "config key 'sampling.temperature' is nan"),
    ("infinite temperature", {"sampling.temperature": INF}, "config key 'sampling.temperature' is inf"),
    ("NaN learning rate", {"optimizer.learning_rate": NAN},
     "config key 'optimizer.learning_rate' is nan; it must be finite and at least 0"),
    ("infinite learning rate", {"optimizer.learning_rate": INF},
     "config key 'optimizer.learning_rate' is inf"),
    ("negative learning rate", {"optimizer.learning_rate": -1e-3}, "config key 'optimizer.learning_rate' is"),
    ("NaN simulator learning rate", {"optimizer.sim_learning_rate": NAN}, "config key 'optimizer.sim_lea"),
    ("negative KL weight", {"algo.kl_coef": -0.1}, "config key 'algo.kl_coef' is -0.1"),
    ("NaN simulator KL weight", {"algo.sim_kl_coef": NAN}, "config key 'algo.sim_kl_coef' is nan"),
    ("NaN entropy bonus", {"algo.entropy_coef": NAN}, "config key 'algo.entropy_coef' is nan"),
    ("no target words", {"env.targets": ()}, "config group 'env': target_word targets is empty"),
    ("no turns", {"env.max_turns": 0}, "config group 'env': target_word max_turns is 0"),
    ("a missing agent model", {"agent.model": "nosuch"}, "config key 'agent.model' is 'nosuch'; 'nosuch' is"),
    ("a missing simulator model", {"sim.model": "/nonexistent/model"}, "config key 'sim.model' is '/nonex"),
    ("a missing judge", {"eval.sim_models": ("nosuch",)}, "config key 'eval.sim_models' is 'nosuch'"),
] + [(f"one rollout per scenario under {name}", {"algo.advantage": name, "rollout.group_size": 1},
      "config key 'rollout.group_size' is 1; it must be at least 2") for name in ADVANTAGES]


def _changed(mode: str, changes: dict):
    config = get_config(mode)
    for name, value in changes.items():
        group, field = name.split(".")
        config[group][field] = value
    return config


@pytest.mark.parametrize("changes,start", [row[1:] for row in NONSENSE], ids=[row[0] for row in NONSENSE])
def test_nonsensical_values_are_refused_in_one_line_before_any_work(changes, start):
    with pytest.raises(ConfigError) as error:
        check(_changed("frozen", changes))
    message = str(error.value)
    assert message.startswith(start) and "\n" not in message, message


def test_evaluation_groups_may_be_0_when_nothing_is_evaluated():
    check(_changed("frozen", {"train.eval_every": 0, "train.eval_groups": 0}))


def test_an_environment_that_cannot_be_built_here_is_a_config_error():
    """CooperBench's sandbox refuses an unknown isolation level with its own error (a RuntimeError)."""
    from scope_jax.training.config import env_settings, make_env

    settings = env_settings("cooperbench")
    settings.isolation = "bogus"
    with pytest.raises(ConfigError, match="^config group 'env': sandbox isolation 'bogus' is unknown"):
        make_env(settings)
