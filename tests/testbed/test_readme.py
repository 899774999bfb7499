"""The README's testbed numbers are the committed artifact's (python -m experiments.readme writes them)."""

import pytest

from experiments import readme
from scope_jax.testbed import report


def test_readme_numbers_equal_the_committed_summary():
    section = report.readme_section(readme.README.read_text())
    if not readme.SUMMARY.exists():
        assert not section, "README.md shows testbed numbers but docs/results/summary.json is not committed"
        pytest.skip("docs/results/summary.json is not committed yet (and README.md shows no testbed numbers)")
    assert section == readme.readme_text(), (
        "README.md's testbed numbers differ from docs/results/: run python -m experiments.readme")
