"""Helpers for fixed-width text output."""

from textutils.fixed import center, pad, truncate

__all__ = ("center", "pad", "truncate")
