"""User task packs: your own buggy functions, loaded from a JSON or TOML file and validated.

:func:`load_task_pack` reads both formats: this module's (v0, below) and BugFix-v1's, which a file declares
with a top-level ``"format": "bugfix-gym/v1"`` (:mod:`bugfix_gym.tasks.packs_v1`: real bugs with no fix op,
or correct functions to inject bugs into). A file without ``format`` (or ``"bugfix-gym/v0"``) is v0.

A v0 pack is a list of tasks, either the whole file (JSON list) or under a ``tasks`` key
(JSON object or TOML ``[[tasks]]`` tables). Each task has exactly these keys::

    name       the function's name (a Python identifier), unique in the pack
    statement  one line saying what the function should do
    source     the *buggy* source defining ``def <name>(...)``
    fix_op     the edit op that repairs it: fix_comparison | add_zero_guard | swap_minmax |
               fix_range_end | fix_init
    visible    test cases the ``test`` tool runs (a strict subset of hidden)
    hidden     test cases ``submit`` runs; they decide the reward

and optionally ``defect`` (must match ``fix_op``). A test case is
``{"args": [...], "expected": value}`` or the pair ``[[...args], expected]``. JSON and TOML
have no tuples: write (and return) lists.

Limits, so that everything a pack puts in front of an agent or a terminal stays small and
plain: the file is at most ``MAX_PACK_BYTES``; ``name`` is an ASCII identifier of at most
``MAX_NAME_CHARS`` characters, not used by a built-in or generated task and not shaped like a
generated name (``..._3f2a91``); ``statement`` is one line of printable ASCII of at most
``MAX_STATEMENT_CHARS``; ``source`` is printable ASCII (newlines and tabs allowed) of at most
``MAX_SOURCE_CHARS``; test values are JSON values nested at most ``MAX_VALUE_DEPTH`` deep. A
pack that breaks one is refused with a message saying what to change, never silently
rewritten: the pack's author sees exactly what the agent will see.

Validation runs the code (in the sandbox, :mod:`bugfix_gym.execution.sandbox`): the buggy source
must fail the hidden tests and ``fix_op`` must make it pass them. Names are checked before
any code runs. Every problem raises :class:`TaskPackError` with one line naming the file,
the task and what to change. Pack tasks get ``split="pack"`` and ``sandbox=True`` (their
code always runs in a contained child process) and are registered so the scripted oracle
finds them.

``python -m bugfix_gym.tasks.packs FILE`` checks a pack (either format) and lists its tasks.
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from ..edits.ops import DEFECTS, FIX_OPS
from . import packs_v1
from .library import Task, name_taken, register, task_problems
from .pack_files import (  # noqa: F401 (the limits and the error stay importable from here)
    MAX_CASES, MAX_NAME_CHARS, MAX_PACK_BYTES, MAX_SOURCE_CHARS, MAX_SOURCE_DEPTH, MAX_STATEMENT_CHARS,
    SOURCE_CHARS as _SOURCE_CHARS, TaskPackError, check_defines as _defines, parse_cases as _cases,
    read_pack_file as _read, short as _short, text_field as _text,
)
from .problems import Problem

REQUIRED = ("name", "statement", "source", "fix_op", "visible", "hidden")
OPTIONAL = ("defect",)
VALIDATION_BUDGET_S = 120.0  # wall-clock seconds to validate a whole pack (each test run also has its own deadline)


def _parse(raw: Any, where: str) -> Task:
    """One pack entry -> a :class:`Task`, checking everything but the names in use and the code's behaviour."""
    if not isinstance(raw, dict):
        raise TaskPackError(f"{where}: a task is a table/object with keys {', '.join(REQUIRED)}")
    missing = [k for k in REQUIRED if k not in raw]
    if missing:
        raise TaskPackError(f"{where}: missing key{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}")
    unknown = sorted(set(raw) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise TaskPackError(f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                            f"keys are {', '.join(REQUIRED + OPTIONAL)}")
    name = raw["name"]
    if not isinstance(name, str) or not name.isidentifier() or not name.isascii() or len(name) > MAX_NAME_CHARS:
        raise TaskPackError(f"{where}: 'name' must be an ASCII Python identifier of at most {MAX_NAME_CHARS} "
                            f"characters, got {_short(name)}")
    where = f"{where} ({name})"
    statement, source = raw["statement"], raw["source"]
    if isinstance(statement, str):
        statement = statement.strip()
        if "\n" in statement:
            raise TaskPackError(f"{where}: 'statement' must be one line")
    statement = _text(statement, "statement", where, MAX_STATEMENT_CHARS)
    if isinstance(source, str):
        source = source.replace("\r\n", "\n").replace("\r", "\n").strip("\n") + "\n"
    source = _text(source, "source", where, MAX_SOURCE_CHARS, _SOURCE_CHARS)
    fix_op = raw["fix_op"]
    if not isinstance(fix_op, str) or fix_op not in FIX_OPS:
        raise TaskPackError(f"{where}: unknown fix_op {_short(fix_op)}; ops are {', '.join(FIX_OPS)}")
    if "defect" in raw and raw["defect"] != DEFECTS[fix_op]:
        raise TaskPackError(f"{where}: defect {_short(raw['defect'])} does not match fix_op {fix_op!r} "
                            f"(its defect is {DEFECTS[fix_op]!r}); drop the key or fix it")
    _defines(source, name, where)
    visible, hidden = _cases(raw["visible"], where, "visible"), _cases(raw["hidden"], where, "hidden")
    digest = hashlib.sha1(repr((statement, source, fix_op, visible, hidden)).encode()).hexdigest()[:10]
    return Task(name=name, statement=statement, source=source, defect=DEFECTS[fix_op], fix_op=fix_op,
                visible=visible, hidden=hidden, split="pack", sandbox=True,
                uid=f"pack/{name}/{digest}")  # content in the uid: an edited pack is a different task


def _parse_v0(raw: Any, where: str) -> Task:
    """:func:`_parse`, after saying so when the entry is written in v1's keys in a file that does not declare v1."""
    packs_v1.v1_key_in_v0_pack(raw, where)
    return _parse(raw, where)


def _check_name(task: Task, where: str) -> None:
    reason = name_taken(task.name)
    if reason is not None:
        raise TaskPackError(f"{where} ({task.name}): {reason}; rename the function")


def _validate(task: Task, where: str) -> None:
    problems = task_problems(task)  # runs the code, in the sandbox
    if problems:
        raise TaskPackError(f"{where} ({task.name}): {problems[0]}")


def task_from_dict(raw: Any, where: str = "task") -> Task:
    """One pack entry -> a validated :class:`Task` (``sandbox=True``); raises :class:`TaskPackError`."""
    task = _parse(raw, where)
    _check_name(task, where)
    _validate(task, where)
    return task


def load_task_pack(path: str | Path) -> list[Any]:
    """Load and validate the tasks of a ``.json`` / ``.toml`` pack, v0 or v1 (:mod:`bugfix_gym.tasks.packs_v1`:
    a file that says ``"format": "bugfix-gym/v1"``).

    :param path: the pack file
    :return: a v0 pack's :class:`Task` s, registered and ready for ``BugFixEnv(tasks=...)``; a v1 pack's
        :class:`~bugfix_gym.tasks.problems.RepairTask` s (buggy functions) and
        :class:`~bugfix_gym.tasks.problems.Problem` s (correct functions to inject bugs into), in file order
    :raises TaskPackError: (a ``ValueError``) with a one-line message on any problem
    """
    path = Path(path)
    data = _read(path)
    if packs_v1.file_format(data, path) == packs_v1.FORMAT_V1:
        return list(packs_v1.load_v1(data, path))
    if isinstance(data, dict):
        if "tasks" not in data:
            raise TaskPackError(f"{path}: a pack needs a 'tasks' list (or a JSON list of tasks at the top level)")
        data = data["tasks"]
    if not isinstance(data, list) or not data:
        raise TaskPackError(f"{path}: 'tasks' must be a non-empty list of tasks")
    tasks = [_parse_v0(raw, f"{path}: task {i}") for i, raw in enumerate(data)]
    for i, task in enumerate(tasks):  # names first: no code runs for a pack that cannot be used anyway
        if any(t.name == task.name for t in tasks[:i]):
            raise TaskPackError(f"{path}: task {i} ({task.name}): the name is used twice in the pack")
        _check_name(task, f"{path}: task {i}")
    started = time.monotonic()
    for i, task in enumerate(tasks):
        if i and time.monotonic() - started > VALIDATION_BUDGET_S:
            raise TaskPackError(f"{path}: validating the pack took over {VALIDATION_BUDGET_S:g} s (at task {i} of "
                                f"{len(tasks)}); split it into smaller packs or make its code faster")
        _validate(task, f"{path}: task {i}")
    return register(tasks)  # a reloaded (possibly edited) pack replaces its earlier version


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bugfix_gym.tasks.packs FILE...``: validate packs, list their tasks."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bugfix_gym.tasks.packs",
                                     description="Check BugFix task packs (v0, or v1: \"format\": \"bugfix-gym/v1\").")
    parser.add_argument("files", nargs="+", help=".json or .toml task pack")
    args = parser.parse_args(argv)
    status = 0
    for file in args.files:
        try:
            tasks = load_task_pack(file)
        except TaskPackError as exc:
            print(f"error: {exc}", file=sys.stderr)
            status = 1
            continue
        print(f"{file}: {len(tasks)} task{'s' if len(tasks) != 1 else ''} ok")
        for task in tasks:
            if isinstance(task, Task):
                name, kind = task.name, task.fix_op
            else:  # v1: a buggy function (a RepairTask) or a correct one to inject bugs into (a Problem)
                name = task.pid.rpartition("/")[2] if isinstance(task, Problem) else task.name
                kind = "correct" if isinstance(task, Problem) else ("buggy+fixed" if task.fixed_source else "buggy")
            print(f"  {name:24s} {kind:15s} {len(task.visible)} visible / {len(task.hidden)} hidden")
    return status


if __name__ == "__main__":
    sys.exit(main())
