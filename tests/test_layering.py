"""Layering: ``bugfix_gym``'s sub-packages and ``agents``' layers import only what lies below them; the execution
leaves and the contained children (the pack sandbox's, the v1 worker's) are standard library only; no module takes
part in an import cycle. Lazy imports, ``TYPE_CHECKING`` ones and module paths written in strings (entry points,
``"pkg.mod:attr"``) all count; each kind has a toy case below."""

from __future__ import annotations

import ast
import re
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


#: a module path written in a string, an entry point loaded later: ``"agents.bugfix.recipes:default_base_agent"``
ENTRY_POINT = re.compile(r"(agents|bugfix_gym)(\.[A-Za-z_]\w*)+:[A-Za-z_][\w.]*")


def _imports(path: Path, skip_type_checking: bool = False) -> list[tuple[int, str]]:
    """Every import in a file, anywhere in it (also inside functions), as ``(level, module)``, and every
    entry point written as a string (``"pkg.mod:attr"`` counts as importing ``pkg.mod.attr``); with
    ``skip_type_checking``, not those under ``if TYPE_CHECKING:`` (its ``else`` still counts)."""
    found = []
    todo: list[ast.AST] = [ast.parse(path.read_text())]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and ENTRY_POINT.fullmatch(node.value):
            found.append((0, node.value.replace(":", ".")))
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


@pytest.mark.parametrize("leaf, allowed", [("cases.py", set()), ("sandbox_child.py", {"cases"}),
                                           ("repair_cases.py", {"cases"}),
                                           ("worker_child.py", {"cases", "repair_cases", "sandbox_child"})])
def test_leaf_modules_import_only_the_standard_library(leaf, allowed):
    for level, module in _imports(PACKAGE / "execution" / leaf):
        top = module.split(".")[0]
        assert top in allowed or (level == 0 and (top in sys.stdlib_module_names or top == "__future__")), \
            f"{leaf} imports {'.' * level}{module}"


def test_execution_loads_alone_in_an_isolated_interpreter():
    probe = ("import sys; sys.path.append(sys.argv[1]); import cases; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] not in {*sys.stdlib_module_names, '__main__'}))")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", probe, str(PACKAGE / "execution")], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "['cases']", out.stderr


@pytest.mark.parametrize("modules", [("cases", "sandbox_child"),
                                     ("cases", "repair_cases", "sandbox_child", "worker_child")])
def test_the_children_s_modules_load_from_stdin_alone_in_an_isolated_interpreter(modules):
    """What the pack child and the worker child get: their modules' sources on stdin, run by the bootstrap under
    ``python -I -S`` from ``/``; a probe module last, in place of the child's ``main``, lists what got imported."""
    import json

    from bugfix_gym.execution import sandbox

    probe = ("import sys\ndef main(argv):\n    print(sorted(m for m in sys.modules if m.split('.')[0] not in "
             "{*sys.stdlib_module_names, '__main__'}))\n")
    body = json.dumps({"modules": [[name, (PACKAGE / "execution" / f"{name}.py").read_text()] for name in modules]
                       + [["probe", probe]], "main": "probe"}).encode()
    out = subprocess.run([sys.executable, "-I", "-S", "-c", sandbox.BOOT], input=b"%d\n" % len(body) + body,
                         capture_output=True, timeout=60, cwd="/", env={})
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode().strip() == repr(sorted([*modules, "probe"]))


# ---------------------------------------------------------------------- the layers of bugfix_gym/
#: bugfix_gym's sub-packages, lowest first: a module may import its own sub-package and those before it
#: (the package's ``__init__`` is above them all: it registers the envs and re-exports the public names)
PACKAGE_LAYERS = ("contract", "execution", "edits", "tasks", "core", "views", "integrations")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolved_imports(path: Path, skip_type_checking: bool = False) -> list[str]:
    """Every import of a file as an absolute dotted name (``from . import x`` -> ``package.x``)."""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    out = []
    for level, dotted in _imports(path, skip_type_checking):
        if level:
            dotted = ".".join([*package[: len(package) - level + 1], dotted])
        out.append(dotted)
    return out


def _sub_package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "bugfix_gym" and len(parts) > 1 and parts[1] in PACKAGE_LAYERS else None


#: the one name of agents bugfix_gym writes (a string, never imported by bugfix_gym): BugFix-v0 advertises its
#: agents' base agent, a behaviour-cloned TinyAgent that bugfix_gym cannot build, for the agent that asks for it
#: (``base_agent="auto"``) to load
NAMED_AGENTS = {"bugfix_gym.core.env": {"agents.bugfix.recipes.default_base_agent"}}


def _package_violations(path: Path) -> list[str]:
    layer = _sub_package(_module_name(path))
    if layer is None:  # the package's own __init__: above every layer
        return []
    rank = PACKAGE_LAYERS.index(layer)
    found = []
    for dotted in _resolved_imports(path):
        parts = dotted.split(".")
        if dotted in NAMED_AGENTS.get(_module_name(path), ()):
            continue
        if parts[0] == "agents":
            found.append(f"{layer} -> agents: {dotted} (bugfix_gym never imports agents)")
        elif parts[0] == "bugfix_gym":
            other = parts[1] if len(parts) > 1 else None
            if other not in PACKAGE_LAYERS:
                found.append(f"{layer}: {dotted} (import from the sub-package's module, not the package's names)")
            elif PACKAGE_LAYERS.index(other) > rank:
                found.append(f"{layer} -> {other}: {dotted}")
    return found


def test_bugfix_gym_modules_all_live_in_a_sub_package():
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    assert loose == [], f"modules outside a sub-package: {loose}"
    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders == sorted(PACKAGE_LAYERS)


def test_each_bugfix_gym_sub_package_imports_only_those_before_it():
    found = {v for path in sorted(PACKAGE.rglob("*.py")) for v in _package_violations(path)}
    assert sorted(found) == [], "imports against the sub-package order"


def test_the_sub_package_check_sees_lazy_type_checking_and_relative_imports(tmp_path, monkeypatch):
    fake = tmp_path / "bugfix_gym" / "tasks"
    fake.mkdir(parents=True)
    source = fake / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..core.env import BugFixEnv\n"
                      "def f():\n    from ..views import wrappers\n    from bugfix_gym.integrations.trl import x\n"
                      "    from ..edits.ops import FIX_OPS\n    from . import generator\n"
                      "    from bugfix_gym import Task\n"
                      "    import agents.algorithms.ppo\n"
                      "SUMMARY = {'episode_summary': 'bugfix_gym.views.wrappers:summary'}\n"
                      "AGENT = 'agents.bugfix.recipes:default_base_agent'\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert sorted(_package_violations(source)) == sorted([
        "tasks -> core: bugfix_gym.core.env.BugFixEnv", "tasks -> views: bugfix_gym.views.wrappers",
        "tasks -> integrations: bugfix_gym.integrations.trl.x",
        "tasks: bugfix_gym.Task (import from the sub-package's module, not the package's names)",
        "tasks -> agents: agents.algorithms.ppo (bugfix_gym never imports agents)",
        "tasks -> views: bugfix_gym.views.wrappers.summary",  # module paths written in strings count too
        "tasks -> agents: agents.bugfix.recipes.default_base_agent (bugfix_gym never imports agents)"])


def _module_graph(folder: Path) -> dict[str, set[str]]:
    """Module -> the modules below ``folder`` it imports at run time (``if TYPE_CHECKING:`` skipped), sub-packages
    included; ``from pkg import name`` counts as an edge to ``pkg.name`` when that is a module, else to ``pkg``."""
    modules = {_module_name(path): path for path in folder.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        edges = set()
        for dotted in _resolved_imports(path, skip_type_checking=True):
            while dotted and dotted not in modules:
                dotted = dotted.rpartition(".")[0]
            if dotted and dotted != name:
                edges.add(dotted)
        graph[name] = edges
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return path[path.index(module):] + [module]
        if module in done:
            return None
        for dependency in sorted(graph.get(module, ())):
            found = visit(dependency, [*path, module])
            if found:
                return found
        done.add(module)
        return None

    for module in sorted(graph):
        found = visit(module, [])
        if found:
            return found
    return None


@pytest.mark.heavy
def test_bugfix_gym_has_no_import_cycle():
    """Module by module, sub-packages included; a package's ``__init__`` that re-exports a module of its own counts
    (the package imports it), while a module importing its own package's ``__init__`` is the normal way in."""
    graph = _module_graph(PACKAGE)
    # importing bugfix_gym.x.y runs bugfix_gym/__init__ and bugfix_gym/x/__init__ first: those are not edges
    graph = {k: {e for e in v if not k.startswith(e + ".")} for k, v in graph.items()}
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph) or [])}"
    assert graph["bugfix_gym.execution.cases"] == set()
    assert graph["bugfix_gym.execution.sandbox"] == {"bugfix_gym.execution.cases"}
    assert graph["bugfix_gym.execution.repair_cases"] == {"bugfix_gym.execution.cases"}
    assert graph["bugfix_gym.execution.worker_child"] == {f"bugfix_gym.execution.{m}" for m in
                                                          ("cases", "repair_cases", "sandbox_child")}


def test_the_cycle_check_sees_a_cycle_through_a_lazy_import(tmp_path, monkeypatch):
    (tmp_path / "bugfix_gym" / "contract").mkdir(parents=True)
    (tmp_path / "bugfix_gym" / "integrations").mkdir()
    (tmp_path / "bugfix_gym" / "contract" / "tokens.py").write_text(
        "def load():\n    from ..integrations.hf_tokenizer import ChatTemplateTokenizer\n")
    (tmp_path / "bugfix_gym" / "integrations" / "hf_tokenizer.py").write_text("from ..contract.tokens import load\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _cycle(_module_graph(tmp_path / "bugfix_gym")) == [
        "bugfix_gym.contract.tokens", "bugfix_gym.integrations.hf_tokenizer", "bugfix_gym.contract.tokens"]


def test_the_cycle_check_sees_a_cycle_through_an_entry_point_written_in_a_string(tmp_path, monkeypatch):
    """An env naming its episode summary as ``"module:name"`` in a module that imports the env is a cycle."""
    (tmp_path / "bugfix_gym" / "core").mkdir(parents=True)
    (tmp_path / "bugfix_gym" / "core" / "env.py").write_text(
        "metadata = {'episode_summary': 'bugfix_gym.core.evaluation:episode_stats'}\n")
    (tmp_path / "bugfix_gym" / "core" / "evaluation.py").write_text("from .env import metadata\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _cycle(_module_graph(tmp_path / "bugfix_gym")) == [
        "bugfix_gym.core.env", "bugfix_gym.core.evaluation", "bugfix_gym.core.env"]


def test_type_checking_imports_are_skipped_and_the_rest_counted(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("import typing\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\n"
                      "else:\n    from .b import B\nif typing.TYPE_CHECKING:\n    import c\n"
                      "def f():\n    from . import d\n")
    kept = sorted(_imports(source, skip_type_checking=True))
    assert kept == [(0, "typing"), (0, "typing.TYPE_CHECKING"), (1, "b.B"), (1, "d")]
    assert (1, "a.A") in _imports(source) and (0, "c") in _imports(source)


def test_owner_codes_live_in_the_contract_and_every_old_import_path_still_gives_them():
    import bugfix_gym
    import bugfix_gym.core.env
    import bugfix_gym.contract.tokens

    defined_in = {str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
                  for node in ast.walk(ast.parse(path.read_text()))
                  if isinstance(node, ast.Assign) and any(isinstance(n, ast.Name) and n.id.startswith("OWNER_")
                                                          for t in node.targets for n in ast.walk(t))}
    assert defined_in == {"contract/tokens.py"}
    names = ("OWNER_PAD", "OWNER_PROMPT", "OWNER_POLICY", "OWNER_TOOL")
    codes = tuple(getattr(bugfix_gym.contract.tokens, name) for name in names)
    assert codes == (0, 1, 2, 3)
    assert tuple(getattr(bugfix_gym, name) for name in names) == codes
    assert tuple(getattr(bugfix_gym.core.env, name) for name in names) == codes


def test_the_flat_layout_s_module_paths_are_the_moved_modules_themselves():
    import importlib

    import bugfix_gym

    for old, new in bugfix_gym.MOVED.items():
        assert importlib.import_module(f"bugfix_gym.{old}") is importlib.import_module(f"bugfix_gym.{new}"), old
    assert bugfix_gym.sandbox.ALLOW_ROOT_PLAIN is bugfix_gym.execution.sandbox.ALLOW_ROOT_PLAIN
    from bugfix_gym.tokenizer import Tokenizer, build_tokenizer  # noqa: F401 (the old module had both)
    from bugfix_gym.execution import run_cases  # noqa: F401 (bugfix_gym.execution was a module)
    from bugfix_gym.tasks import Task, make_tasks  # noqa: F401 (so was bugfix_gym.tasks)
    out = subprocess.run([sys.executable, "-m", "bugfix_gym.play", "--help"], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0 and "--task" in out.stdout, out.stderr


# ---------------------------------------------------------------------- the layers of agents/
#: agents' sub-packages, lowest first: a module may import its own layer and the layers before it
LAYERS = ("model", "decoding", "rollout", "files", "algorithms", "bugfix", "cli")
#: what the layers below ``bugfix`` may take from bugfix_gym: the token contract (owner codes, the
#: tokenizer class, the text spaces), never the env, the tasks or BugFix's own vocabulary
TOKEN_CONTRACT = "bugfix_gym.contract"
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
            if not full.startswith(TOKEN_CONTRACT + "."):
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
                      "def f():\n    from ..bugfix import recipes\n    from bugfix_gym.core.env import BugFixEnv\n"
                      "    from bugfix_gym.core.vocabulary import build_tokenizer\n"
                      "    from bugfix_gym.contract.text import printable\n"
                      "    from ..model.tinyagent import TinyAgent\n    from agents import TokenPPO\n"
                      "LEGACY = 'agents.bugfix.aux_losses:aux_losses_from_settings'\n")
    monkeypatch.setattr(sys.modules[__name__], "AGENTS", tmp_path / "agents")
    assert sorted(_violations(source)) == sorted([
        "rollout -> algorithms: agents.algorithms.ppo.TokenPPO", "rollout -> bugfix: agents.bugfix.recipes",
        "rollout -> bugfix_gym: bugfix_gym.core.env.BugFixEnv",
        "rollout -> bugfix_gym: bugfix_gym.core.vocabulary.build_tokenizer",
        "rollout: agents.TokenPPO (import from the layer's module, not the package's lazy names)",
        "rollout -> bugfix: agents.bugfix.aux_losses.aux_losses_from_settings"])  # an entry point in a string


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
