import pytest

from markup import style


def test_bold_and_italic():
    assert style("hi", "bold") == "**hi**"
    assert style("hi", "italic") == "*hi*"


def test_empty_text_has_no_delimiters():
    assert style("", "bold") == ""


def test_unknown_style():
    with pytest.raises(ValueError, match="blink"):
        style("hi", "blink")
