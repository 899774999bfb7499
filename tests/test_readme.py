"""The README's result blocks are their committed artifacts' (python -m experiments.readme writes them)."""

import pytest

from experiments import readme


@pytest.mark.parametrize("block", readme.BLOCKS, ids=[b.name for b in readme.BLOCKS])
def test_readme_numbers_equal_the_committed_artifact(block):
    text = readme.README.read_text()
    assert block.begin in text and block.end in text, f"README.md lacks the {block.name} markers"
    if not block.artifact.exists():
        assert not block.section(text), f"README.md shows {block.name} numbers but {block.artifact} is absent"
        pytest.skip(f"{block.artifact} is not committed yet (and README.md shows no {block.name} numbers)")
    assert block.section(text) == block.text(), (
        f"README.md's {block.name} numbers differ from {block.artifact}: run python -m experiments.readme")
