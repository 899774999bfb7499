import pytest

from settings import render_list, resolve


def test_render_wraps_and_aligns():
    assert render_list(["one two three"], width=9, bullet="-") == "- one two\n  three"


def test_indent():
    assert render_list(["a", "b"], indent=2, bullet="-") == "  - a\n  - b"


def test_unknown_setting():
    with pytest.raises(KeyError, match="colour"):
        resolve({"colour": "red"})
