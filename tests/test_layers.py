"""The packages form layers (docs/architecture.md#the-package): a module imports only packages
of a lower layer or its own, at module level or inside a function, in any import form; and the
files of one package import each other without a loop (type-only imports aside)."""

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


def run_time_imports(tree: ast.AST, package: str):
    """Modules of `package` (dotted, e.g. `models.lora`) a module imports when it runs: at module
    level or inside a function, any import form, not under `if TYPE_CHECKING:`."""
    typing_only = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(node.test) for inner in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            modules = []
        for module in modules:
            parts = module.split(".")
            if parts[:2] == ["ragen_jax", package] and len(parts) > 2 and (ROOT / package / f"{parts[2]}.py").exists():
                yield f"{package}.{parts[2]}"


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (or a module importing itself)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1 or node in graph.get(node, ()):
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_file_of_a_package_imports_back_what_imports_it():
    """Within a package, run-time imports between files form no loop (type-only imports aside)."""
    graph = {}
    for package in LAYERS:
        for path in sorted((ROOT / package).glob("*.py")):
            name = f"{package}.{path.stem}"
            graph[name] = set(run_time_imports(ast.parse(path.read_text()), package)) - {name}
    assert loops(graph) == []


def test_the_loop_check_sees_a_loop_inside_a_function_and_not_a_type_only_one():
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ragen_jax.models.cache import KVCache\n"
              "def f():\n    from ragen_jax.models.lora import merged\n    from ragen_jax.models import hf\n")
    assert set(run_time_imports(ast.parse(source), "models")) == {"models.hf", "models.lora"}
    assert loops({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert loops({"a": {"b"}, "b": set()}) == []
