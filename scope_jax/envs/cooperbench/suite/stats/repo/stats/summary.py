"""Summary statistics of a list of measurements, some of which may be missing."""


def _clean(values) -> list[float]:
    """The measurements as floats, with the missing ones (None) left out."""
    kept = []
    for value in values:
        if value is None:
            continue
        kept.append(float(value))
    return kept


def mean(values) -> float:
    """The arithmetic mean; ValueError when no measurement is left."""
    kept = _clean(values)
    if not kept:
        raise ValueError("no measurements")
    return sum(kept) / len(kept)


def spread(values) -> float:
    """The largest minus the smallest measurement; ValueError when none is left."""
    kept = _clean(values)
    if not kept:
        raise ValueError("no measurements")
    return max(kept) - min(kept)
