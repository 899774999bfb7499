import pytest

from units import convert


def test_metric():
    assert convert(1, "km", "m") == 1000
    assert convert(250, "cm", "m") == pytest.approx(2.5)


def test_imperial_to_metric():
    assert convert(1, "in", "mm") == pytest.approx(25.4)


def test_unknown_unit():
    with pytest.raises(ValueError, match="parsec"):
        convert(1, "parsec", "m")
