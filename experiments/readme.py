"""Write the README's result blocks from the committed artifacts: python -m experiments.readme.

Each block of README.md between its two markers is replaced by its text:
- testbed: the default run's table and findings (docs/results/summary.json), the verdicts on the
  objectives that do not see the users of the sweep (sweep.json) and of the tabular study
  (tabular.json), the data curve (data.json), and the scarce-data verdicts (scarce.json, and its tabular
  counterpart tabular_scarce.json), each where committed;
- p4g_proxy: the P4G human proxy's fidelity table (docs/results/p4g_proxy/fidelity.json);
- p4g_proxy_levers: what each lever of the proxy's recipe did (docs/results/p4g_proxy/levers/levers.json).
tests/test_readme.py fails when a block differs from its artifact.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Callable

from experiments import p4g_proxy_levers, tabular_objectives, tabular_scarce
from experiments.jobs import p4g_proxy
from scope_jax.testbed import data_report, prose, scarce_report

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RESULTS = ROOT / "docs" / "results"
SUMMARY = RESULTS / "summary.json"
SWEEP = RESULTS / "sweep.json"
DATA = RESULTS / "data.json"
TABULAR = RESULTS / "tabular.json"
SCARCE = RESULTS / "scarce.json"
TABULAR_SCARCE = RESULTS / "tabular_scarce.json"
PROXY = RESULTS / "p4g_proxy" / "fidelity.json"
LEVERS = RESULTS / "p4g_proxy" / "levers" / "levers.json"


def testbed_text() -> str:
    block = [prose.readme_block(json.loads(SUMMARY.read_text()))]
    if SWEEP.exists() and (null := prose.sweep_null_sentence(json.loads(SWEEP.read_text()))):
        block.append(f"- {null}")
    if TABULAR.exists():
        block.append(f"- {tabular_objectives.tabular_null_sentence(json.loads(TABULAR.read_text()))}")
    if DATA.exists() and "data_curve" in (data := json.loads(DATA.read_text())):
        block += ["", *data_report.readme_lines(data["data_curve"])]
    if SCARCE.exists():
        block += ["", *scarce_report.readme_lines(json.loads(SCARCE.read_text())["scarce_curve"])]
    if TABULAR_SCARCE.exists():
        block += ["", *tabular_scarce.readme_lines(json.loads(TABULAR_SCARCE.read_text()))]
    return "\n".join(block)


def proxy_text() -> str:
    results = json.loads(PROXY.read_text())
    goals = "\n\nThe judge's goals (issue 32), read from the same file:\n\n" + p4g_proxy.goals_table(results)
    return p4g_proxy.fidelity_table(results) + goals


@dataclasses.dataclass(frozen=True)
class Block:
    name: str
    artifact: pathlib.Path
    text: Callable[[], str]

    @property
    def begin(self) -> str:
        return f"<!-- {self.name} results: python -m experiments.readme writes them from " \
               f"{self.artifact.relative_to(ROOT)} -->"

    @property
    def end(self) -> str:
        return f"<!-- end of {self.name} results -->"

    def section(self, readme: str) -> str:
        """The text between the markers."""
        return readme.partition(self.begin)[2].partition(self.end)[0].strip("\n")

    def replace(self, readme: str) -> str:
        """`readme` with the text between the markers replaced by the block's text (nothing while its
        artifact is not committed)."""
        head, begin, rest = readme.partition(self.begin)
        _, end, tail = rest.partition(self.end)
        if not begin or not end:
            raise ValueError(f"README.md lacks the markers {self.begin!r} ... {self.end!r}")
        text = f"{self.text()}\n" if self.artifact.exists() else ""
        return f"{head}{begin}\n{text}{end}{tail}"


BLOCKS = (Block("testbed", SUMMARY, testbed_text), Block("p4g_proxy", PROXY, proxy_text),
          Block("p4g_proxy_levers", LEVERS, lambda: p4g_proxy_levers.table(json.loads(LEVERS.read_text()))))


def main() -> None:
    readme = README.read_text()
    for block in BLOCKS:
        readme = block.replace(readme)
    README.write_text(readme)
    print(f"README.md: {', '.join(b.name for b in BLOCKS)} results written from {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
