import pytest

from scope_jax.algorithms import ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, Registry, register


@pytest.mark.parametrize(
    "registry, names",
    [
        (ADVANTAGES, {"grpo", "dr_grpo", "rloo"}),
        (KL_ESTIMATORS, {"k1", "k2", "k3"}),
        (AGGREGATIONS, {"token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"}),
    ],
)
def test_registry_names_and_unknown_name_lists_known(registry, names):
    assert set(registry) == names
    with pytest.raises(KeyError) as info:
        registry["no_such_thing"]
    message = str(info.value)
    assert "no_such_thing" in message
    assert all(name in message for name in names)


def test_register_adds_once_and_refuses_a_taken_name():
    registry = Registry("thing")

    @register(registry, "a")
    def a() -> int:
        return 1

    assert registry["a"] is a
    with pytest.raises(ValueError, match="'a' is already registered"):
        register(registry, "a")(lambda: 2)
    assert registry["a"] is a
