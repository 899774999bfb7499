"""Progress lines for the testbed's long phases: what runs, how far it is, and about how long is left."""

from __future__ import annotations

import time
from collections.abc import Callable


class Ticker:
    """Call with the number of finished units (of `total`); prints at most one line every `every`
    seconds, and one at the end: "label: done/total, elapsed, about T left". The time left extrapolates
    the pace since the first unit (which holds the compilation), or the first unit's time before that."""

    def __init__(self, label: str, total: int, say: Callable[[str], None] = print, every: float = 5.0):
        self.label, self.total, self.say, self.every = label, total, say, every
        self.start = self.last = time.perf_counter()
        self.first: tuple[int, float] | None = None  # (units, time) when the first call came

    def __call__(self, done: int) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = (done, now)
        if done < self.total and now - self.last < self.every:
            return
        self.last = now
        elapsed = now - self.start
        units, since = self.first
        pace = (now - since) / (done - units) if done > units else elapsed / max(done, 1)
        left = pace * (self.total - done)
        tail = "done" if done >= self.total else f"about {left:.0f}s left"
        self.say(f"{self.label}: {done}/{self.total}, {elapsed:.0f}s, {tail}")
