"""Inline styles in a Markdown-like syntax."""

from markup.inline import style

__all__ = ("style",)
