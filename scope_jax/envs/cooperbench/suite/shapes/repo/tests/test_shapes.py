import math

import pytest

import shapes


def test_circle():
    assert shapes.Circle(1).area() == pytest.approx(math.pi)


def test_rectangle_describe():
    assert shapes.Rectangle(2, 3).describe() == "rectangle with area 6.00 and perimeter 10.00"


def test_sizes_must_be_positive():
    with pytest.raises(ValueError, match="radius"):
        shapes.Circle(0)
