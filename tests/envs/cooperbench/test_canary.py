"""Canaries: the mutants of the tests a tests patch adds, and how they are planted beside their originals."""

import ast
import re

from scope_jax.envs.cooperbench import canary

BASE = b"def test_old():\n    assert 1 == 1\n"
TESTS = BASE + b'''

@decorated
def test_new():
    # a comment
    assert shout("ann") == "ANN"
    assert flag()


def helper():
    assert 2 == 2
'''


def _asserts(source: str) -> list[str]:
    return [ast.unparse(n) for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Assert)]


def test_mutants_change_one_assertion_of_the_added_tests_only():
    mutants = canary.mutants({"tests/test_x.py": TESTS, "pkg/core.py": b"x = 1\n"}, {"tests/test_x.py": BASE}, 0)
    original = _asserts(TESTS.decode().split("@decorated")[1].split("def helper")[0])
    # the two constants, the flip of ==, the `not` of flag(): all of them, under MUTANTS_PER_FUNCTION
    assert len(mutants) == 4 and {(m.path, m.function) for m in mutants} == {("tests/test_x.py", "test_new")}
    for mutant in mutants:
        changed = [a != b for a, b in zip(_asserts(mutant.source), original)]
        assert sum(changed) == 1 and mutant.source.startswith("@decorated\ndef test_new():")
    asserts = sorted(tuple(_asserts(m.source)) for m in mutants)
    assert ("assert shout('ann') != 'ANN'", "assert flag()") in asserts
    assert ("assert shout('ann') == 'ANN'", "assert not flag()") in asserts
    constants = [a for a, b in asserts if "==" in a and a != "assert shout('ann') == 'ANN'"]
    assert len(constants) == 2 and all(re.fullmatch(r"assert shout\('[a-z]{3}'\) == '[A-Z]{3}'", a) for a in constants)


def test_planted_pairs_are_written_alike():
    [mutant, *_] = canary.mutants({"tests/test_x.py": TESTS}, {"tests/test_x.py": BASE}, 1)
    planted, roles = canary.plant({"tests/test_x.py": TESTS}, [mutant])
    text = planted["tests/test_x.py"].decode()
    functions = {n.name: n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)}
    assert set(roles) == {name for name in functions if name.startswith("test_new_")} and len(roles) == 2
    assert sorted(roles.values(), key=lambda m: m is not None) == [None, mutant]
    for name in roles:  # both renamed the same way, both unparsed (the comment is gone from both)
        assert re.fullmatch(r"test_new_[0-9a-f]{6}", name)
        assert ast.unparse(functions[name].decorator_list[0]) == "decorated"
    assert "# a comment" not in text and "def test_old():" in text and "def helper():" in text
    assert canary.function_name(f"tests/test_x.py::{name}[1-2]") == name
