"""Name -> function registries for the algorithm pieces a config picks by name."""

from __future__ import annotations

from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(dict[str, Callable]):
    """A dict of named functions whose lookup of an unknown name raises KeyError listing the known ones."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def __missing__(self, name: str) -> Callable:
        raise KeyError(f"unknown {self.kind} {name!r}; known: {', '.join(sorted(self))}")


def register(registry: Registry, name: str) -> Callable[[F], F]:
    """Decorator that adds a function to `registry` under `name` (a name can be taken only once)."""

    def add(fn: F) -> F:
        if name in registry:
            raise ValueError(f"{registry.kind} {name!r} is already registered")
        registry[name] = fn
        return fn

    return add
