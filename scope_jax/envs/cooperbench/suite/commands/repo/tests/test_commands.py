import pytest

from linetools import COMMANDS, run


def test_count_and_upper():
    assert run("count", ["a", "b"]) == ["2"]
    assert run("upper", ["a", "Bc"]) == ["A", "BC"]


def test_unknown_command():
    with pytest.raises(ValueError, match="frobnicate"):
        run("frobnicate", [])


def test_registry():
    assert {"count", "upper"} <= set(COMMANDS)
