"""BugFix-v1's task types: a :class:`Problem` (a correct function and its tests, what bugs are injected
into) and a :class:`RepairTask` (a buggy function and its tests: one episode's task).

Both carry their tests as :mod:`bugfix_gym.execution.repair_cases` cases (``CallCase`` and
``AssertCase``) and the trusted ``support`` code an ``AssertCase`` may use; every run of their code goes
through :func:`bugfix_gym.execution.repair_runner.run_repair_tests`. Sources are normalised
(:func:`normalise_source`), so the text an agent reads is the same whatever the original's formatting.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

from ..execution.repair_cases import AssertCase, CallCase

RepairCase = CallCase | AssertCase
"""A v1 test case: a call with its expected value, or a statement of the tests run as itself."""


@dataclass(frozen=True)
class Problem:
    """A correct function and its tests: what the bug-injection engine mutates.

    :param pid: the problem's id, unique across sources: ``"HumanEval/12"``, ``"book/clamp"``,
        ``"template/<name>"``, ``"pack/<file stem>/<name>"``; splits are made by it
    :param entry: the function the tests call
    :param statement: what the function should do, in a sentence or two (bounded)
    :param source: the correct module source, normalised (imports, helpers, the entry function without
        its docstring)
    :param support: trusted code the ``AssertCase`` s may use (helpers and constants the tests need); never
        the candidate's
    :param visible: the cases the ``test`` and ``locate`` tools run
    :param hidden: the cases ``submit`` runs (every visible case is one of them)
    :param split: ``"train"``, ``"heldout"``, ``"test"``, ``"pack"``, ...
    :param origin: where it comes from: ``"humaneval"``, ``"book"``, ``"template"``, ``"pack"``
    """

    pid: str
    entry: str
    statement: str
    source: str
    support: str
    visible: tuple[RepairCase, ...]
    hidden: tuple[RepairCase, ...]
    split: str
    origin: str


@dataclass(frozen=True)
class RepairTask:
    """One BugFix-v1 episode's task: a buggy function, its statement and its tests.

    :param name: unique among the tasks an env plays (``reset(options={"task": name})``): an injected
        task is named after its entry function and mutant (``"longest~3f2a"``), a pack task by its pack
    :param entry: the function the tests call
    :param statement: what the function should do
    :param source: the *buggy* module source, normalised: what ``read`` shows at the start
    :param support: trusted code the ``AssertCase`` s may use
    :param visible: the cases ``test`` and ``locate`` run
    :param hidden: the cases ``submit`` runs; they decide the reward
    :param split: the split of the problem it comes from
    :param origin: ``"humaneval"``, ``"book"``, ``"template"``, ``"pack"``
    :param problem: the :attr:`Problem.pid` it comes from (a pack task of real bugs: its own id)
    :param fixed_source: the correct source when known; never shown to an agent
    :param bugs: the injected bugs (``bugfix_gym.edits.inject.Injection``), never shown to an agent; empty
        for a real bug
    """

    name: str
    entry: str
    statement: str
    source: str
    support: str
    visible: tuple[RepairCase, ...]
    hidden: tuple[RepairCase, ...]
    split: str
    origin: str
    problem: str
    fixed_source: str | None = None
    bugs: tuple[Any, ...] = field(default=(), compare=False)


def normalise_source(source: str, strip_docstring_of: str | None = None) -> str:
    """``source`` as ``ast.unparse`` writes it (one simple statement or compound header a line, comments
    gone), ending in a newline; with ``strip_docstring_of``, that function's docstring removed (a body
    left empty becomes ``pass``).

    :param source: Python source that parses
    :param strip_docstring_of: the name of a top-level function whose docstring to drop
    :raises SyntaxError: the source does not parse
    """
    tree = ast.parse(source)
    if strip_docstring_of is not None:
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == strip_docstring_of:
                first = node.body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                        and isinstance(first.value.value, str):
                    node.body = node.body[1:] or [ast.Pass()]
    return ast.unparse(tree) + "\n"
