"""Walking a jaxpr: the equations of a program, those of its nested jaxprs included."""

from collections.abc import Iterator
from typing import Any


def equations(jaxpr) -> Iterator[Any]:
    """Every equation of `jaxpr` and of the jaxprs nested in its equations (scan, cond and
    custom-derivative bodies)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from equations(inner)


def dot_generals(jaxpr) -> Iterator[Any]:
    """Every dot_general equation of `jaxpr`, nested ones included."""
    return (eqn for eqn in equations(jaxpr) if eqn.primitive.name == "dot_general")
