"""User task packs: your own buggy functions, loaded from a JSON or TOML file and validated.

A pack is a list of tasks, either the whole file (JSON list) or under a ``tasks`` key
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

Validation runs the code (in the sandbox, :mod:`bugfix_gym.sandbox`): the buggy source
must fail the hidden tests and ``fix_op`` must make it pass them. Every problem raises
:class:`TaskPackError` with one line naming the file, the task and what to change.
Pack tasks get ``split="pack"`` and ``sandbox=True`` (their code always runs in a child
process with time and memory limits) and are registered so the scripted oracle finds them.

``python -m bugfix_gym.packs FILE`` checks a pack and lists its tasks.
"""

from __future__ import annotations

import ast
import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from .ops import DEFECTS, FIX_OPS
from .tasks import REGISTRY, Task, register, task_problems

REQUIRED = ("name", "statement", "source", "fix_op", "visible", "hidden")
OPTIONAL = ("defect",)


class TaskPackError(ValueError):
    """A task pack that cannot be used; the message is one line saying where and why."""


def _read(path: Path) -> Any:
    suffix = path.suffix.lower()
    if suffix not in (".json", ".toml"):
        raise TaskPackError(f"{path}: task packs are .json or .toml files, got {suffix or 'no extension'!r}")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TaskPackError(f"{path}: cannot read the file ({exc.strerror or type(exc).__name__})") from None
    parse = json.loads if suffix == ".json" else _toml().loads
    try:
        return parse(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise TaskPackError(f"{path}: the file is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise TaskPackError(f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except ValueError as exc:  # tomllib.TOMLDecodeError
        raise TaskPackError(f"{path}: invalid TOML: {str(exc).splitlines()[0]}") from None


def _toml():
    try:
        import tomllib  # Python >= 3.11
    except ModuleNotFoundError:
        try:
            import tomli as tomllib  # the same parser, for Python 3.10
        except ModuleNotFoundError:
            raise TaskPackError("TOML task packs need Python 3.11+ or `pip install tomli`; "
                                "JSON packs work everywhere") from None
    return tomllib


def _case(raw: Any, where: str) -> tuple[tuple, Any]:
    if isinstance(raw, dict):
        unknown = set(raw) - {"args", "expected"}
        if unknown or "args" not in raw or "expected" not in raw:
            raise TaskPackError(f"{where}: a test case is {{\"args\": [...], \"expected\": value}}, got keys "
                                f"{sorted(raw)}")
        args, expected = raw["args"], raw["expected"]
    elif isinstance(raw, (list, tuple)) and len(raw) == 2:
        args, expected = raw
    else:
        raise TaskPackError(f"{where}: a test case is {{\"args\": [...], \"expected\": value}} or [[...args], "
                            f"expected], got {_short(raw)}")
    if not isinstance(args, list):
        raise TaskPackError(f"{where}: test case args must be a list of arguments, got {_short(args)}")
    return tuple(args), expected


def _cases(raw: Any, where: str, key: str) -> tuple[tuple[tuple, Any], ...]:
    if not isinstance(raw, list) or not raw:
        raise TaskPackError(f"{where}: {key!r} must be a non-empty list of test cases")
    return tuple(_case(c, f"{where} {key}[{i}]") for i, c in enumerate(raw))


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _defines(source: str, name: str, where: str) -> None:
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise TaskPackError(f"{where}: source does not parse (line {exc.lineno}: {exc.msg})") from None
    except ValueError as exc:  # null bytes
        raise TaskPackError(f"{where}: source does not parse ({exc})") from None
    if not any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body):
        raise TaskPackError(f"{where}: source does not define a top-level function 'def {name}(...)'")


def task_from_dict(raw: Any, where: str = "task") -> Task:
    """One pack entry -> a validated :class:`Task` (``sandbox=True``); raises :class:`TaskPackError`."""
    if not isinstance(raw, dict):
        raise TaskPackError(f"{where}: a task is a table/object with keys {', '.join(REQUIRED)}")
    missing = [k for k in REQUIRED if k not in raw]
    if missing:
        raise TaskPackError(f"{where}: missing key{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}")
    unknown = sorted(set(raw) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise TaskPackError(f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                            f"keys are {', '.join(REQUIRED + OPTIONAL)}")
    name, statement, source, fix_op = raw["name"], raw["statement"], raw["source"], raw["fix_op"]
    if not isinstance(name, str) or not name.isidentifier():
        raise TaskPackError(f"{where}: 'name' must be a Python identifier, got {_short(name)}")
    where = f"{where} ({name})"
    for key in ("statement", "source", "fix_op"):
        if not isinstance(raw[key], str) or not raw[key].strip():
            raise TaskPackError(f"{where}: {key!r} must be a non-empty string")
    if "\n" in statement.strip():
        raise TaskPackError(f"{where}: 'statement' must be one line")
    if fix_op not in FIX_OPS:
        raise TaskPackError(f"{where}: unknown fix_op {_short(fix_op)}; ops are {', '.join(FIX_OPS)}")
    if "defect" in raw and raw["defect"] != DEFECTS[fix_op]:
        raise TaskPackError(f"{where}: defect {_short(raw['defect'])} does not match fix_op {fix_op!r} "
                            f"(its defect is {DEFECTS[fix_op]!r}); drop the key or fix it")
    source = source.replace("\r\n", "\n").replace("\r", "\n").strip("\n") + "\n"
    _defines(source, name, where)
    visible, hidden = _cases(raw["visible"], where, "visible"), _cases(raw["hidden"], where, "hidden")
    digest = hashlib.sha1(repr((statement, source, fix_op, visible, hidden)).encode()).hexdigest()[:10]
    task = Task(name=name, statement=statement.strip(), source=source, defect=DEFECTS[fix_op], fix_op=fix_op,
                visible=visible, hidden=hidden, split="pack", sandbox=True,
                uid=f"pack/{name}/{digest}")  # content in the uid: an edited pack never hits stale cached results
    problems = task_problems(task)
    if problems:
        raise TaskPackError(f"{where}: {problems[0]}")
    return task


def load_task_pack(path: str | Path) -> list[Task]:
    """Load, validate and register the tasks of a ``.json`` / ``.toml`` pack.

    :param path: the pack file
    :return: the tasks, ready for ``BugFixEnv(tasks=...)``
    :raises TaskPackError: (a ``ValueError``) with a one-line message on any problem
    """
    path = Path(path)
    data = _read(path)
    if isinstance(data, dict):
        if "tasks" not in data:
            raise TaskPackError(f"{path}: a pack needs a 'tasks' list (or a JSON list of tasks at the top level)")
        data = data["tasks"]
    if not isinstance(data, list) or not data:
        raise TaskPackError(f"{path}: 'tasks' must be a non-empty list of tasks")
    tasks: list[Task] = []
    for i, raw in enumerate(data):
        task = task_from_dict(raw, f"{path}: task {i}")
        if any(t.name == task.name for t in tasks):
            raise TaskPackError(f"{path}: task {i} ({task.name}): the name is used twice in the pack")
        known = REGISTRY.get(task.name)
        if known is not None and known.split != "pack":
            raise TaskPackError(f"{path}: task {i} ({task.name}): the name is taken by a built-in or generated "
                                "task; rename the function")
        tasks.append(task)
    for task in tasks:  # a reloaded (possibly edited) pack replaces its earlier version
        REGISTRY[task.name] = task
    return register(tasks)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bugfix_gym.packs FILE...``: validate packs, list their tasks."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bugfix_gym.packs", description="Check BugFix task packs.")
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
            print(f"  {task.name:24s} {task.fix_op:15s} {len(task.visible)} visible / {len(task.hidden)} hidden")
    return status


if __name__ == "__main__":
    sys.exit(main())
