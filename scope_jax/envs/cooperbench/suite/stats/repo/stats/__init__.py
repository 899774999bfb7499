"""Summary statistics of measurements."""

from stats.summary import mean, spread

__all__ = ("mean", "spread")
