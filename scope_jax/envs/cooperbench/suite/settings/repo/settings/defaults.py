"""Default settings of the list renderer, and how a caller's overrides are applied."""

DEFAULTS = {
    "width": 80,
    "indent": 0,
    "bullet": "-",
}


def resolve(overrides: dict | None = None) -> dict:
    """The defaults updated with `overrides`; an unknown key is an error."""
    overrides = overrides or {}
    unknown = sorted(set(overrides) - set(DEFAULTS))
    if unknown:
        raise KeyError(f"unknown settings: {', '.join(unknown)}")
    return {**DEFAULTS, **overrides}
