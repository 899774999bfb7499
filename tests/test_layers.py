"""No import points up the package's layers (docs/architecture.md): a module imports only from its own layer
or the ones below."""

import ast
import pathlib

import scope_jax

PACKAGE = pathlib.Path(scope_jax.__file__).parent
LAYERS = (  # bottom first: the top-level modules and subpackages of scope_jax
    ("config", "sharding", "distributed", "diagnostics"),
    ("models",),
    ("algorithms", "logprobs", "sampling", "kv_cache"),
    ("dialogue",),
    ("envs", "simulators"),
    ("training",),
    ("testbed",),
)
LAYER = {name: level for level, names in enumerate(LAYERS) for name in names}


def imported_parts(tree: ast.AST) -> set[str]:
    """The top-level parts of scope_jax a module imports (`from scope_jax import x` imports part x)."""
    parts = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            path = node.module.split(".")
            if path[0] == "scope_jax":
                parts.update([path[1]] if len(path) > 1 else [a.name for a in node.names])
        elif isinstance(node, ast.Import):
            parts.update(a.name.split(".")[1] for a in node.names if a.name.startswith("scope_jax."))
    return parts


def upward_imports(package: pathlib.Path = PACKAGE) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        part = path.relative_to(package).parts[0].removesuffix(".py")
        if part == "__init__":
            continue
        for other in sorted(imported_parts(ast.parse(path.read_text()))):
            if LAYER.get(other, -1) > LAYER[part]:
                found.append(f"{path.relative_to(package)} imports scope_jax.{other}")
    return found


def test_every_part_of_the_package_has_a_layer():
    parts = {p.name.removesuffix(".py") for p in PACKAGE.iterdir()
             if p.suffix == ".py" or (p / "__init__.py").exists()}
    assert parts - {"__init__"} == set(LAYER)


def test_no_import_points_up_the_layers():
    assert upward_imports() == []


def test_an_upward_import_is_found(tmp_path):
    (tmp_path / "dialogue").mkdir()
    (tmp_path / "dialogue" / "loop.py").write_text("from scope_jax.envs.base import Environment\n"
                                                   "from scope_jax import training, models\n")
    assert upward_imports(tmp_path) == ["dialogue/loop.py imports scope_jax.envs",
                                        "dialogue/loop.py imports scope_jax.training"]
