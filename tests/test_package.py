"""The public surface: every exported name resolves, and the agents -> bugfix_gym direction holds."""

import ast
import pathlib

import agents
import bugfix_gym

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_exported_name_resolves():
    for package in (agents, bugfix_gym):
        for name in package.__all__:
            assert getattr(package, name) is not None, f"{package.__name__}.{name}"


def test_environment_package_never_imports_agents():
    for path in (ROOT / "bugfix_gym").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n == "agents" or n.startswith("agents.") for n in names), path.name
