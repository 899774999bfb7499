"""Progress lines: at most one every few seconds, with the pace measured after the first (compiling) unit."""

from scope_jax.testbed import progress


def test_lines_are_rate_limited_and_extrapolate_the_pace_after_the_first_unit(monkeypatch):
    clock = iter([0.0, 30.0, 31.0, 36.0, 37.0, 40.0])  # start; units 1..5 done at these times
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    lines = []
    ticker = progress.Ticker("fit", 5, lines.append, every=5.0)
    for done in range(1, 6):
        ticker(done)
    # unit 1 at 30 s (printed: 30 s after the start); unit 2 at 31 s (1 s later: quiet); unit 3 at 36 s:
    # 3 s per unit since the first, 2 units left; unit 4 quiet; unit 5: the end is always printed
    assert lines == ["fit: 1/5, 30s, about 120s left", "fit: 3/5, 36s, about 6s left", "fit: 5/5, 40s, done"]
