"""Length conversion between metric and imperial units."""

FACTORS = {  # metres per unit
    "mm": 0.001,
    "cm": 0.01,
    "m": 1.0,
    "km": 1000.0,
    "in": 0.0254,
    "ft": 0.3048,
    "mi": 1609.344,
}


def convert(value: float, source: str, target: str) -> float:
    """`value` given in unit `source`, expressed in unit `target`."""
    if source not in FACTORS:
        raise ValueError(f"unknown unit {source!r}")
    if target not in FACTORS:
        raise ValueError(f"unknown unit {target!r}")
    metres = value * FACTORS[source]
    return metres / FACTORS[target]
