"""String helpers for fixed-width columns."""


def truncate(text: str, width: int) -> str:
    """`text` cut to at most `width` characters."""
    if width < 0:
        raise ValueError("width must not be negative")
    return text[:width]


def center(text: str, width: int) -> str:
    """`text` centred in `width` characters (an odd leftover space goes to the right)."""
    return text.center(width)


def pad(text: str, width: int) -> str:
    """`text` padded on the right with spaces to `width` characters (longer text is kept whole)."""
    return text.ljust(width)
