"""Rendering a list of items as text lines."""

import textwrap

from settings.defaults import resolve


def render_list(items: list[str], **overrides) -> str:
    """One entry per item, wrapped to the width, continuation lines aligned with the item's text."""
    settings = resolve(overrides)
    lines = []
    for item in items:
        marker = " " * settings["indent"] + settings["bullet"] + " "
        lines += textwrap.wrap(item, settings["width"], initial_indent=marker,
                               subsequent_indent=" " * len(marker)) or [marker.rstrip()]
    return "\n".join(lines)
