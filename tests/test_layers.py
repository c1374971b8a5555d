"""The packages form layers (docs/architecture.md#the-package): a module imports only packages
of a lower layer or its own, at module level or inside a function, in any import form."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "ragen_jax"
# lowest first; a package may import the packages listed before it
LAYERS = ["core", "text", "envs", "models", "rollout", "rl", "diagnostics", "training", "run", "analysis", "cli"]
TOP = len(LAYERS)  # the `python -m ragen_jax.<command>` modules at the package's root


def imported_packages(tree: ast.AST):
    """(line, package) for every `ragen_jax.<package>` a module imports."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = ([f"ragen_jax.{alias.name}" for alias in node.names] if node.module == "ragen_jax"
                       else [node.module])
        else:
            modules = []
        for module in modules:
            parts = module.split(".")
            if parts[0] == "ragen_jax" and len(parts) > 1 and (ROOT / parts[1]).is_dir():
                yield node.lineno, parts[1]


def test_every_package_has_a_layer():
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages == set(LAYERS)


def test_imports_go_down_the_layers():
    upward = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT).parts
        own = LAYERS.index(relative[0]) if len(relative) > 1 else TOP
        for line, package in imported_packages(ast.parse(path.read_text())):
            if LAYERS.index(package) > own:
                upward.append(f"ragen_jax/{'/'.join(relative)}:{line} imports {package} (layer "
                              f"{LAYERS.index(package)}) from layer {own}")
    assert not upward, "\n".join(upward)


def test_the_check_sees_every_import_form():
    source = ("import ragen_jax.run.config\nfrom ragen_jax import training\nfrom ragen_jax.cli.args import x\n"
              "def f():\n    from ragen_jax.analysis import study\n")
    assert [p for _, p in imported_packages(ast.parse(source))] == ["run", "training", "cli", "analysis"]
