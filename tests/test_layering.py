"""Layering: ``execution.py`` (and the sandbox child) are standard-library leaves; no package has an import cycle."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "bugfix_gym"


def _is_type_checking(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:`` or ``if typing.TYPE_CHECKING:`` (imports for annotations only, never run)."""
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path, skip_type_checking: bool = False) -> list[tuple[int, str]]:
    """Every import in a file, anywhere in it (also inside functions), as ``(level, module)``;
    with ``skip_type_checking``, not those under ``if TYPE_CHECKING:`` (its ``else`` still counts)."""
    found = []
    todo: list[ast.AST] = [ast.parse(path.read_text())]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            found += [(0, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found += [(node.level, f"{node.module}.{alias.name}" if node.module else alias.name)
                      for alias in node.names]
        if skip_type_checking and _is_type_checking(node):
            todo += node.orelse  # type: ignore[attr-defined]
        else:
            todo += ast.iter_child_nodes(node)
    return found


@pytest.mark.parametrize("leaf, allowed", [("execution.py", set()), ("sandbox_child.py", {"execution"})])
def test_leaf_modules_import_only_the_standard_library(leaf, allowed):
    for level, module in _imports(PACKAGE / leaf):
        top = module.split(".")[0]
        assert top in allowed or (level == 0 and (top in sys.stdlib_module_names or top == "__future__")), \
            f"{leaf} imports {'.' * level}{module}"


def test_execution_loads_alone_in_an_isolated_interpreter():
    probe = ("import sys; sys.path.append(sys.argv[1]); import execution; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] not in {*sys.stdlib_module_names, '__main__'}))")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", probe, str(PACKAGE)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "['execution']", out.stderr


def _package_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports at run time (``if TYPE_CHECKING:`` skipped)."""
    folder = ROOT / package
    graph = {}
    for path in folder.glob("*.py"):
        edges = set()
        for level, module in _imports(path, skip_type_checking=True):
            parts = module.split(".")
            if level == 1:
                edges.add(parts[0])
            elif parts[0] == package:
                edges.add(parts[1] if len(parts) > 1 else "__init__")
        graph[path.stem] = {e for e in edges if (folder / f"{e}.py").exists()} - {path.stem}
    return graph


@pytest.mark.parametrize("package", ["bugfix_gym", "agents"])
def test_the_package_import_graph_has_no_cycle(package):
    graph, done, path = _package_graph(package), set(), []

    def visit(module: str) -> None:
        assert module not in path, f"import cycle: {' -> '.join(path[path.index(module):] + [module])}"
        if module in done:
            return
        path.append(module)
        for dependency in sorted(graph[module]):
            visit(dependency)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)
    if package == "bugfix_gym":
        assert graph["execution"] == set() and graph["sandbox"] == {"execution"}
    else:  # what the graph must see: plain, relative, absolute and in-function imports; not TYPE_CHECKING ones
        assert {"ppo", "recipes"} <= graph["cli"] and "losses" in graph["advantages"]
        assert "checkpoint" in graph["on_policy"] and "on_policy" not in graph["checkpoint"] | graph["runs"]


def test_type_checking_imports_are_skipped_and_the_rest_counted(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("import typing\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\n"
                      "else:\n    from .b import B\nif typing.TYPE_CHECKING:\n    import c\n"
                      "def f():\n    from . import d\n")
    kept = sorted(_imports(source, skip_type_checking=True))
    assert kept == [(0, "typing"), (0, "typing.TYPE_CHECKING"), (1, "b.B"), (1, "d")]
    assert (1, "a.A") in _imports(source) and (0, "c") in _imports(source)


def test_owner_codes_live_in_tokens_and_every_old_import_path_still_gives_them():
    import bugfix_gym
    import bugfix_gym.env
    import bugfix_gym.tokens

    defined_in = {path.name for path in PACKAGE.glob("*.py") for node in ast.walk(ast.parse(path.read_text()))
                  if isinstance(node, ast.Assign) and any(isinstance(n, ast.Name) and n.id.startswith("OWNER_")
                                                          for t in node.targets for n in ast.walk(t))}
    assert defined_in == {"tokens.py"}
    names = ("OWNER_PAD", "OWNER_PROMPT", "OWNER_POLICY", "OWNER_TOOL")
    codes = tuple(getattr(bugfix_gym.tokens, name) for name in names)
    assert codes == (0, 1, 2, 3)
    assert tuple(getattr(bugfix_gym, name) for name in names) == codes
    assert tuple(getattr(bugfix_gym.env, name) for name in names) == codes
