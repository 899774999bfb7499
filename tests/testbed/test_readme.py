"""The README's testbed numbers are the committed artifact's (python -m experiments.readme writes them)."""

import json

from experiments import readme
from scope_jax.testbed import report


def test_readme_numbers_equal_the_committed_summary():
    summary = json.loads(readme.SUMMARY.read_text())
    assert report.readme_section(readme.README.read_text()) == report.readme_block(summary), (
        "README.md's testbed numbers differ from docs/results/summary.json: run python -m experiments.readme")
