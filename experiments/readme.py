"""Write the README's testbed numbers from the committed artifact: python -m experiments.readme.

The block between the markers in README.md (`report.README_BEGIN` / `README_END`) is replaced by
`report.readme_block(docs/results/summary.json)`; tests/testbed/test_readme.py fails when they differ.
"""

from __future__ import annotations

import json
import pathlib

from scope_jax.testbed import report

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SUMMARY = ROOT / "docs" / "results" / "summary.json"


def main() -> None:
    block = report.readme_block(json.loads(SUMMARY.read_text()))
    README.write_text(report.replace_readme_block(README.read_text(), block))
    print(f"README.md: testbed numbers written from {SUMMARY.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
