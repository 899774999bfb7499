"""Inline styles: a piece of text wrapped in the delimiters of its style."""


def style(text: str, kind: str) -> str:
    """`text` with the inline style `kind` applied."""
    if not text:
        return ""
    if kind == "bold":
        return f"**{text}**"
    if kind == "italic":
        return f"*{text}*"
    raise ValueError(f"unknown style {kind!r}")
