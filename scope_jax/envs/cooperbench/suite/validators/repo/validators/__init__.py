"""Predicates that check one value each."""

from validators.checks import is_even, is_positive

# The public names, one per line.
__all__ = (
    "is_even",
    "is_positive",
)
