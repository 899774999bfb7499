"""Rectangles."""

from shapes.base import Shape, positive


class Rectangle(Shape):
    def __init__(self, width: float, height: float):
        self.width = positive("width", width)
        self.height = positive("height", height)

    def area(self) -> float:
        return self.width * self.height

    def perimeter(self) -> float:
        return 2 * (self.width + self.height)
