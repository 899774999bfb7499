import pytest

from textutils import center, pad, truncate


def test_truncate():
    assert truncate("hello", 3) == "hel"
    assert truncate("hi", 5) == "hi"
    with pytest.raises(ValueError):
        truncate("hi", -1)


def test_center():
    assert center("ab", 6) == "  ab  "


def test_pad():
    assert pad("ab", 4) == "ab  "
    assert pad("abcdef", 4) == "abcdef"
