"""What every shape provides."""


class Shape:
    """A plane shape. Subclasses define `area` and `perimeter`."""

    def area(self) -> float:
        raise NotImplementedError

    def perimeter(self) -> float:
        raise NotImplementedError

    def describe(self) -> str:
        """"<name> with area A and perimeter P", both to two decimals."""
        name = type(self).__name__.lower()
        return f"{name} with area {self.area():.2f} and perimeter {self.perimeter():.2f}"


def positive(name: str, value: float) -> float:
    """`value` if it is above zero, else ValueError naming it."""
    if not value > 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return float(value)
