import pytest

from stats import mean, spread


def test_mean_and_spread():
    assert mean([1, 2, 6]) == 3
    assert spread([1, 2, 6]) == 5


def test_missing_values_are_skipped():
    assert mean([None, 4, None, 2]) == 3


def test_no_measurements():
    with pytest.raises(ValueError):
        mean([None])
    with pytest.raises(ValueError):
        spread([])
