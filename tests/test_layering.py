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


@pytest.mark.parametrize("package", ["bugfix_gym"])
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


# ---------------------------------------------------------------------- the layers of agents/
#: agents' sub-packages, lowest first: a module may import its own layer and the layers before it
LAYERS = ("model", "decoding", "rollout", "files", "algorithms", "bugfix", "cli")
#: what the layers below ``bugfix`` may take from bugfix_gym: the token contract (owner codes, the
#: tokenizer class, the text spaces), never the env, the tasks or BugFix's own vocabulary
TOKEN_CONTRACT = {"bugfix_gym.tokens", "bugfix_gym.tokenizer", "bugfix_gym.spaces",
                  "bugfix_gym.text_safety"}  # a leaf that knows nothing of BugFix: text made safe to show
BUGFIX_VOCABULARY = {"build_tokenizer", "fixed_tokenizer"}
AGENTS = ROOT / "agents"


def _layer_of(path: Path) -> str:
    relative = path.relative_to(AGENTS)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def _agents_imports(path: Path) -> list[tuple[str, str]]:
    """Every import of a module in agents/ (lazy and ``TYPE_CHECKING`` ones too), resolved to an
    absolute dotted name, with the imported name: ``(module, name)``."""
    package = ["agents", *path.relative_to(AGENTS).parts[:-1]]
    out = []
    for level, dotted in _imports(path):
        if level:
            base = package[: len(package) - level + 1]
            dotted = ".".join([*base, dotted])
        module, _, name = dotted.rpartition(".")
        out.append((module, name) if module else (dotted, ""))
    return out


def _violations(path: Path) -> list[str]:
    layer = _layer_of(path)
    rank = LAYERS.index(layer)
    found = []
    for module, name in _agents_imports(path):
        full = f"{module}.{name}" if name else module
        parts = full.split(".")
        if parts[0] == "agents":
            if len(parts) == 2 or parts[1] not in LAYERS:  # `from agents import X` hides the real edge
                found.append(f"{layer}: {full} (import from the layer's module, not the package's lazy names)")
            elif LAYERS.index(parts[1]) > rank:
                found.append(f"{layer} -> {parts[1]}: {full}")
        elif parts[0] == "bugfix_gym" and rank < LAYERS.index("bugfix"):
            if not any(full.startswith(m + ".") or full == m for m in TOKEN_CONTRACT) or name in BUGFIX_VOCABULARY:
                found.append(f"{layer} -> bugfix_gym: {full}")
    return found


def test_agents_modules_all_live_in_a_layer():
    loose = sorted(p.name for p in AGENTS.glob("*.py") if p.stem != "__init__")
    assert loose == [], f"modules outside a layer: {loose}"
    assert sorted(p.name for p in AGENTS.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(LAYERS)


def test_each_layer_imports_only_the_layers_before_it():
    found = {v for path in sorted(AGENTS.rglob("*.py")) if path != AGENTS / "__init__.py" for v in _violations(path)}
    assert sorted(found) == [], "imports against the layer order"


def test_the_layer_check_sees_lazy_type_checking_and_relative_imports(tmp_path, monkeypatch):
    fake = tmp_path / "agents" / "rollout"
    fake.mkdir(parents=True)
    source = fake / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                      "    from agents.algorithms.ppo import TokenPPO\n"
                      "def f():\n    from ..bugfix import recipes\n    from bugfix_gym.env import BugFixEnv\n"
                      "    from bugfix_gym.tokenizer import build_tokenizer\n"
                      "    from ..model.tinyagent import TinyAgent\n    from agents import TokenPPO\n")
    monkeypatch.setattr(sys.modules[__name__], "AGENTS", tmp_path / "agents")
    assert sorted(_violations(source)) == sorted([
        "rollout -> algorithms: agents.algorithms.ppo.TokenPPO", "rollout -> bugfix: agents.bugfix.recipes",
        "rollout -> bugfix_gym: bugfix_gym.env.BugFixEnv",
        "rollout -> bugfix_gym: bugfix_gym.tokenizer.build_tokenizer",
        "rollout: agents.TokenPPO (import from the layer's module, not the package's lazy names)"])


def test_no_agents_layer_has_an_import_cycle():
    """Within a layer, and down the layers (an edge up the layers is the order test's to catch)."""
    graph: dict[str, set[str]] = {}
    for path in AGENTS.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        graph[name] = {m if (ROOT / (m.replace(".", "/") + ".py")).exists() else f"{m}.{n}"
                       for m, n in _agents_imports(path) if m.startswith("agents")}
    rank = {k: LAYERS.index(_layer_of(ROOT / (k.replace(".", "/") + ".py")))
            for k in graph if k != "agents.__init__"}
    graph = {k: {e for e in v if e in rank and e != k and rank[e] <= rank[k]}
             for k, v in graph.items() if k in rank}
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        assert module not in path, f"import cycle: {' -> '.join(path[path.index(module):] + [module])}"
        if module not in done:
            for dependency in sorted(graph[module]):
                visit(dependency, [*path, module])
            done.add(module)

    for module in sorted(graph):
        visit(module, [])
