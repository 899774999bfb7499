"""Walking a jaxpr: the dot_general equations of a program, those of its nested jaxprs included."""

from collections.abc import Iterator
from typing import Any


def dot_generals(jaxpr) -> Iterator[Any]:
    """Every dot_general equation of `jaxpr` and of the jaxprs nested in its equations (scan, cond and
    custom-derivative bodies)."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            yield eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from dot_generals(inner)
