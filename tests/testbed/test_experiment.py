"""How the collapse experiment spreads its arms over threads, and that the numbers do not depend on it."""

from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np

from scope_jax.testbed import arm_store, experiment
from scope_jax.testbed.arms import ARMS, sweep_arm
from scope_jax.training.run_dir import RunDir
from tests.testbed.conftest import QUICK, RL

DEFAULT = tuple(ARMS[a] for a in ("untrained", "frozen", "frozen_base", "verbalized", "cotrain", "population",
                                  "rotation", "selfplay"))


def test_the_first_arm_of_every_program_goes_first_then_the_arms_without_rl_then_the_rest():
    order = [arm.name for arm in experiment.arm_order(DEFAULT, RL)]
    # programs by their number of arms: P = 1 (frozen, frozen_base, verbalized, cotrain), P = 4 (population,
    # rotation), self-play; then untrained; then the others as given
    assert order == ["frozen", "population", "selfplay", "untrained", "frozen_base", "verbalized", "cotrain",
                     "rotation"]
    sweep = tuple(sweep_arm(kl, lr) for kl in (0.0, 1.0, 2.0) for lr in (1e-4, 5e-4))
    assert [(arm.sim_kl_coef, arm.sim_learning_rate) for arm in experiment.arm_order(sweep, RL)] == [
        (0.0, 1e-4), (1.0, 1e-4), (2.0, 1e-4), (0.0, 5e-4), (1.0, 5e-4), (2.0, 5e-4)]


def test_a_program_is_compiled_once_however_many_threads_ask_for_it():
    compiles = []

    class Counted:
        """A jitted function whose compilations are counted."""

        def __init__(self):
            self.jitted = jax.jit(lambda x: 2 * x)

        def lower(self, *args):
            compiles.append(args[0].shape)
            return self.jitted.lower(*args)

    fn, compile_once = Counted(), experiment.CompileOnce()
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda i: compile_once(fn, jnp.full((3,), float(i))), range(8)))
    assert compiles == [(3,)]
    np.testing.assert_array_equal(np.stack(outs), 2 * np.arange(8.0)[:, None] * np.ones(3))
    compile_once(fn, jnp.ones((2,)))
    assert compiles == [(3,), (2,)]


def test_two_threads_give_the_numbers_of_one(tmp_path, pretrained):
    arms = tuple(ARMS[a] for a in ("untrained", "frozen", "cotrain"))
    results = {}
    for workers in (1, 2):
        settings = experiment.Settings(seeds=(0,), arms=arms, pretrain=QUICK, rl=RL, heldout_seeds=(101,),
                                       vs_samples=1, workers=workers)
        path = tmp_path / str(workers)
        run_dir = RunDir.create(path, {"test": "workers"})
        arm_store.save_tree(path / experiment.PRETRAINED, pretrained._asdict())
        results[workers] = experiment.run(settings, run_dir, lambda message: None)
    for name, one in results[1].arms.items():
        two = results[2].arms[name]
        for curves in ("step_curves", "evals"):
            for key, value in getattr(one, curves).items():
                np.testing.assert_array_equal(getattr(two, curves)[key], value, err_msg=f"{name} {key}")
