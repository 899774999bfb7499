"""Unit conversion for lengths."""

from units.convert import FACTORS, convert

__all__ = ("FACTORS", "convert")
