"""A product catalogue."""

from catalog.store import Catalog

__all__ = ("Catalog",)
