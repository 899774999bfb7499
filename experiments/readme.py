"""Write the README's testbed numbers from the committed artifacts: python -m experiments.readme.

The block between the markers in README.md (`report.README_BEGIN` / `README_END`) is replaced by
`readme_text()`: the default run's table and findings (docs/results/summary.json), the sweep's verdict
on the objectives that do not see the users (sweep.json) and the data curve (data.json), each where
committed; tests/testbed/test_readme.py fails when they differ.
"""

from __future__ import annotations

import json
import pathlib

from scope_jax.testbed import data_report, report

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RESULTS = ROOT / "docs" / "results"
SUMMARY = RESULTS / "summary.json"
SWEEP = RESULTS / "sweep.json"
DATA = RESULTS / "data.json"


def readme_text() -> str:
    block = [report.readme_block(json.loads(SUMMARY.read_text()))]
    if SWEEP.exists() and (null := report.sweep_null_sentence(json.loads(SWEEP.read_text()))):
        block.append(f"- {null}")
    if DATA.exists() and "data_curve" in (data := json.loads(DATA.read_text())):
        block += ["", *data_report.readme_lines(data["data_curve"])]
    return "\n".join(block)


def main() -> None:
    README.write_text(report.replace_readme_block(README.read_text(), readme_text()))
    print(f"README.md: testbed numbers written from {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
