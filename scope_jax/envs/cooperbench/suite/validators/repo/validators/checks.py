"""The checks: each takes one value and answers True or False, never raising."""


def is_even(value: int) -> bool:
    """True for even integers."""
    return isinstance(value, int) and value % 2 == 0


def is_positive(value: float) -> bool:
    """True for numbers above zero."""
    return isinstance(value, (int, float)) and value > 0
