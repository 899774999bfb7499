"""Plane shapes: each knows its area and perimeter."""

from shapes.base import Shape
from shapes.circle import Circle
from shapes.rectangle import Rectangle

__all__ = [
    "Circle",
    "Rectangle",
    "Shape",
]
