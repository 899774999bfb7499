"""Circles."""

import math

from shapes.base import Shape, positive


class Circle(Shape):
    def __init__(self, radius: float):
        self.radius = positive("radius", radius)

    def area(self) -> float:
        return math.pi * self.radius**2

    def perimeter(self) -> float:
        return 2 * math.pi * self.radius
