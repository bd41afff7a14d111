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

``python -m bugfix_gym.tasks.packs FILE`` checks a pack and lists its tasks.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import stat
import string
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from ..execution.cases import MAX_VALUE_DEPTH, is_plain
from ..edits.ops import DEFECTS, FIX_OPS
from .library import Task, name_taken, register, task_problems

REQUIRED = ("name", "statement", "source", "fix_op", "visible", "hidden")
OPTIONAL = ("defect",)
MAX_PACK_BYTES = 4 * 1024 * 1024
MAX_NAME_CHARS = 40
MAX_STATEMENT_CHARS = 200
MAX_SOURCE_CHARS = 4000
MAX_CASES = 4096  # hidden cases of one task: every outcome must fit the sandbox's 1 MiB report
VALIDATION_BUDGET_S = 120.0  # wall-clock seconds to validate a whole pack (each test run also has its own deadline)
_SOURCE_CHARS = frozenset(string.printable) - frozenset("\x0b\x0c")


class TaskPackError(ValueError):
    """A task pack that cannot be used; the message is one line saying where and why."""


def _read(path: Path) -> Any:
    suffix = path.suffix.lower()
    if suffix not in (".json", ".toml"):
        raise TaskPackError(f"{path}: task packs are .json or .toml files, got {suffix or 'no extension'!r}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens without blocking, and is refused below
        with os.fdopen(fd, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise TaskPackError(f"{path}: not a regular file (a FIFO, a device or a folder); give a pack file")
            raw = file.read(MAX_PACK_BYTES + 1)
    except OSError as exc:
        raise TaskPackError(f"{path}: cannot read the file ({exc.strerror or type(exc).__name__})") from None
    if len(raw) > MAX_PACK_BYTES:
        raise TaskPackError(f"{path}: the file is over {MAX_PACK_BYTES >> 20} MiB; split it into smaller packs")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise TaskPackError(f"{path}: the file is not UTF-8 text") from None
    kind = "JSON" if suffix == ".json" else "TOML"
    parse = json.loads if suffix == ".json" else _toml().loads
    try:
        return parse(text)
    except json.JSONDecodeError as exc:
        raise TaskPackError(f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise TaskPackError(f"{path}: invalid {kind}: lists or tables are nested too deeply") from None
    except ValueError as exc:  # tomllib.TOMLDecodeError, or an integer over Python's digit limit in either format
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "integer string conversion" in reason:
            reason = f"an integer has more than {sys.get_int_max_str_digits()} digits"
        raise TaskPackError(f"{path}: invalid {kind}: {reason}") from None


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
    for value in (*args, expected):
        if not is_plain(value, MAX_VALUE_DEPTH):
            raise TaskPackError(f"{where}: test values are JSON values (null, booleans, numbers, strings, lists, "
                                f"objects) nested at most {MAX_VALUE_DEPTH} deep, got {_short(value)}")
    return tuple(args), expected


def _cases(raw: Any, where: str, key: str) -> tuple[tuple[tuple, Any], ...]:
    if not isinstance(raw, list) or not raw:
        raise TaskPackError(f"{where}: {key!r} must be a non-empty list of test cases")
    if len(raw) > MAX_CASES:
        raise TaskPackError(f"{where}: {key!r} has {len(raw)} test cases; keep it to at most {MAX_CASES} "
                            "(split the task)")
    return tuple(_case(c, f"{where} {key}[{i}]") for i, c in enumerate(raw))


def _short(value: Any, limit: int = 40) -> str:
    text = ascii(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


MAX_SOURCE_DEPTH = 100  # syntax-tree levels a pack's source may nest (the edit ops and the sandbox recurse)


def _depth(tree: ast.AST) -> int:
    """How deep the syntax tree nests, counted without recursion."""
    deepest, todo = 0, [(tree, 1)]
    while todo:
        node, depth = todo.pop()
        deepest = max(deepest, depth)
        todo += [(child, depth + 1) for child in ast.iter_child_nodes(node)]
    return deepest


def _defines(source: str, name: str, where: str) -> None:
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise TaskPackError(f"{where}: source does not parse (line {exc.lineno}: {exc.msg})") from None
    except ValueError as exc:  # null bytes
        raise TaskPackError(f"{where}: source does not parse ({exc})") from None
    except (RecursionError, MemoryError):
        raise TaskPackError(f"{where}: source is nested too deeply to parse; keep expressions under "
                            f"{MAX_SOURCE_DEPTH} levels") from None
    if _depth(tree) > MAX_SOURCE_DEPTH:
        raise TaskPackError(f"{where}: source is nested more than {MAX_SOURCE_DEPTH} levels deep; simplify it")
    if not any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body):
        raise TaskPackError(f"{where}: source does not define a top-level function 'def {name}(...)'")


def _text(value: Any, key: str, where: str, limit: int, allowed: frozenset[str] | None = None) -> str:
    """A string field: non-empty, at most ``limit`` characters, only ``allowed`` ones (default: printable ASCII)."""
    if not isinstance(value, str) or not value.strip():
        raise TaskPackError(f"{where}: {key!r} must be a non-empty string")
    if len(value) > limit:
        raise TaskPackError(f"{where}: {key!r} is {len(value)} characters; keep it to at most {limit}")
    for i, char in enumerate(value):
        if (char not in allowed) if allowed is not None else not (" " <= char <= "~"):
            what = "one line of printable ASCII" if allowed is None else "printable ASCII (newlines and tabs allowed)"
            raise TaskPackError(f"{where}: {key!r} must be {what}; character {i} is {ascii(char)}")
    return value


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
    tasks = [_parse(raw, f"{path}: task {i}") for i, raw in enumerate(data)]
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

    parser = argparse.ArgumentParser(prog="python -m bugfix_gym.tasks.packs", description="Check BugFix task packs.")
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
