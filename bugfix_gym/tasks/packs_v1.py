"""BugFix-v1 task packs: your own buggy functions (real bugs, with no fix op), or correct functions to inject
bugs into, loaded from a JSON or TOML file and validated.

A v1 pack says so at its top level, beside its ``tasks`` list: ``"format": "bugfix-gym/v1"`` in a JSON
object, ``format = "bugfix-gym/v1"`` in TOML. A file without ``format`` (or with ``"bugfix-gym/v0"``) is a
v0 pack (:mod:`bugfix_gym.tasks.packs`). :func:`bugfix_gym.tasks.packs.load_task_pack` reads both.

A task has these keys::

    name            an ASCII identifier of at most 40 characters, unique in the pack
    statement       one line of printable ASCII saying what the function should do
    source          the BUGGY module source (a real bug), or
    correct_source  a CORRECT module source, into which the engine injects bugs
    visible         cases the ``test`` and ``locate`` tools run (each one also in hidden)
    hidden          cases ``submit`` runs; at least one that visible does not show
    fixed_source    optional, with source: the repaired source (validated, never shown)
    entry           optional: the function the cases call (default: name)
    support         optional: constants the assert cases share, ``NAME = <literal>`` lines only

A case is ``{"args": [...], "expected": value}`` (or the pair ``[[...args], expected]``) or
``{"assert": "assert candidate(...) == ..."}``: one ``assert`` statement on one line that calls
``candidate`` (the entry function). A plain ``assert candidate(<literal args>) == <literal>`` is the same
as the first form (literals may use tuples there). Any other assert is judged by record and replay
(:mod:`bugfix_gym.execution.repair_cases`), which runs the statement in this process too, so it may use
only: literals, ``candidate(...)``, the support's names, the operators ``+ - / //`` (not ``*``, ``**``
or ``%``, which could build huge values here), comparisons (``== != < <= > >= is is not in not in``),
``and or not``, subscripts and slices, and the calls ``abs all any bool dict float frozenset int
isinstance len list max min set sorted str sum tuple type`` (``sum`` with one argument). So pack code runs
only in the contained worker: the sources there, the asserts there and, replayed on recorded values, here.

Each task's sources are normalised (:func:`~bugfix_gym.tasks.problems.normalise_source`, the entry's
docstring removed). Validation runs the code in the worker: a buggy ``source`` must fail at least one hidden
case, a ``fixed_source`` or a ``correct_source`` must pass every hidden case. The limits are v0's
(:mod:`bugfix_gym.tasks.pack_files`): file size, name length, printable ASCII, source size and nesting,
case count and value depth; an assert is at most :data:`MAX_ASSERT_CHARS` characters. Every problem is a
:class:`~bugfix_gym.tasks.pack_files.TaskPackError` with one line naming the file, the task and what to
change.

A buggy task becomes a :class:`~bugfix_gym.tasks.problems.RepairTask` (origin ``"pack"``, split ``"pack"``,
no injected bugs), a correct one a :class:`~bugfix_gym.tasks.problems.Problem` (pid
``"pack/<file stem>/<name>"``, origin ``"pack"``) for the bug-injection engine to turn into tasks.
"""

from __future__ import annotations

import ast
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..execution.repair_cases import AssertCase, CallCase
from ..execution.repair_runner import run_repair_tests
from .literal_cases import NotLiteral, literal_value, plain_call_case
from .pack_files import (
    MAX_CASES, MAX_NAME_CHARS, MAX_SOURCE_CHARS, MAX_STATEMENT_CHARS, SOURCE_CHARS, TaskPackError, check_defines,
    parse_case, parse_source, short, text_field,
)
from .problems import Problem, RepairCase, RepairTask, normalise_source

FORMAT_V0, FORMAT_V1 = "bugfix-gym/v0", "bugfix-gym/v1"
FORMATS = (FORMAT_V0, FORMAT_V1)
REQUIRED = ("name", "statement", "visible", "hidden")
SOURCES = ("source", "correct_source")  # exactly one of them
OPTIONAL = ("fixed_source", "entry", "support")
V1_ONLY = ("correct_source", "fixed_source", "entry", "support")
V0_ONLY = ("fix_op", "defect")
MAX_ASSERT_CHARS = 400
VALIDATION_BUDGET_S = 120.0  # wall-clock seconds to validate a whole pack (each run also has its own deadline)
SAFE_CALLS = frozenset({"abs", "all", "any", "bool", "dict", "float", "frozenset", "int", "isinstance", "len",
                        "list", "max", "min", "set", "sorted", "str", "sum", "tuple", "type"})
_SAFE_NODES = (ast.Constant, ast.Name, ast.Load, ast.Tuple, ast.List, ast.Set, ast.Dict, ast.Compare, ast.BoolOp,
               ast.UnaryOp, ast.BinOp, ast.Call, ast.Subscript, ast.Slice, ast.keyword, ast.cmpop, ast.boolop,
               ast.Not, ast.USub, ast.UAdd, ast.Add, ast.Sub, ast.Div, ast.FloorDiv)


@dataclass(frozen=True)
class PackTaskV1:
    """One v1 pack entry, parsed and checked but not yet run.

    :param name: the task's name
    :param entry: the function the cases call
    :param statement: one line
    :param source: the normalised buggy source, or the correct one (``correct``)
    :param correct: the entry gave ``correct_source``: a function to inject bugs into
    :param fixed_source: the normalised repaired source, or None
    :param support: the normalised constants the asserts share
    :param visible: the visible cases
    :param hidden: the hidden cases (every visible case among them)
    """

    name: str
    entry: str
    statement: str
    source: str
    correct: bool
    fixed_source: str | None
    support: str
    visible: tuple[RepairCase, ...]
    hidden: tuple[RepairCase, ...]


# ---------------------------------------------------------------------------------------------- which format
def file_format(data: Any, path: Path) -> str:
    """The format a parsed pack file declares: :data:`FORMAT_V1`, or :data:`FORMAT_V0` (no ``format`` key, or
    ``"bugfix-gym/v0"``); raises :class:`TaskPackError` for any other value."""
    if not isinstance(data, dict) or "format" not in data:
        return FORMAT_V0
    value = data["format"]
    if value not in FORMATS:
        raise TaskPackError(f"{path}: unknown format {short(value)}; use \"format\": \"{FORMAT_V1}\" for a v1 pack "
                            f"(or leave the key out for a v0 pack)")
    return str(value)


def v1_key_in_v0_pack(raw: Any, where: str) -> None:
    """Raise the one-line hint for a task written in v1's keys inside a file that does not declare v1."""
    if not isinstance(raw, dict):
        return
    found = [k for k in V1_ONLY if k in raw]
    if not found:
        for key in ("visible", "hidden"):
            if isinstance(raw.get(key), list) and any(isinstance(c, dict) and "assert" in c for c in raw[key]):
                found = [f"{key} case with 'assert'"]
                break
    if found:
        name = raw.get("name")
        label = f" ({name})" if isinstance(name, str) and name.isidentifier() and len(name) <= MAX_NAME_CHARS else ""
        raise TaskPackError(f"{where}{label}: {found[0]!r} is v1 task syntax; add \"format\": \"{FORMAT_V1}\" at the "
                            f"top of the file (a JSON object or TOML table beside 'tasks') to load it as a v1 pack")


# ---------------------------------------------------------------------------------------------- cases
def _assert_case(text: Any, where: str, names: frozenset[str]) -> RepairCase:
    """``{"assert": text}`` -> a CallCase when it is a plain literal comparison, else a checked AssertCase."""
    if not isinstance(text, str) or not text.strip():
        raise TaskPackError(f"{where}: 'assert' must be a non-empty string: one assert statement")
    text = text.strip()
    if len(text) > MAX_ASSERT_CHARS:
        raise TaskPackError(f"{where}: the assert is {len(text)} characters; keep it to at most {MAX_ASSERT_CHARS}")
    for i, char in enumerate(text):
        if not " " <= char <= "~":
            raise TaskPackError(f"{where}: the assert must be one line of printable ASCII; character {i} is "
                                f"{ascii(char)}")
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise TaskPackError(f"{where}: the assert does not parse ({exc.msg}); write one 'assert candidate(...) == "
                            f"...' statement") from None
    except (RecursionError, MemoryError, ValueError):
        raise TaskPackError(f"{where}: the assert is nested too deeply; simplify it") from None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        raise TaskPackError(f"{where}: the 'assert' text must be one assert statement, e.g. "
                            f"\"assert candidate(2, 3) == 5\"")
    stmt = tree.body[0]
    if not any(isinstance(n, ast.Name) and n.id == "candidate" for n in ast.walk(stmt.test)):
        raise TaskPackError(f"{where}: the assert never calls candidate (the function under test); test it")
    case = plain_call_case(stmt.test, "candidate")
    if case is not None:
        return case
    if stmt.msg is not None and not (isinstance(stmt.msg, ast.Constant) and isinstance(stmt.msg.value, str)):
        raise TaskPackError(f"{where}: an assert's message must be a string literal")
    _check_safe(stmt.test, where, names)
    return AssertCase(ast.unparse(ast.Assert(test=stmt.test, msg=None)))


def _check_safe(node: ast.expr, where: str, names: frozenset[str]) -> None:
    """The assert uses only what its replay in this process may run (see the module docstring)."""
    for sub in ast.walk(node):
        if not isinstance(sub, _SAFE_NODES):
            what = {ast.Mult: "'*'", ast.Pow: "'**'", ast.Mod: "'%'", ast.Attribute: "attribute access ('.')",
                    ast.Lambda: "a lambda", ast.NamedExpr: "':='"}.get(type(sub), f"{type(sub).__name__} syntax")
            raise TaskPackError(f"{where}: the assert uses {what}, which a pack's assert may not; use literals, "
                                "candidate(...), comparisons, + - / //, and, or, not, subscripts and simple "
                                "built-ins (see bugfix_gym.tasks.packs_v1)")
        if isinstance(sub, ast.Name) and sub.id not in names | SAFE_CALLS | {"candidate"}:
            raise TaskPackError(f"{where}: the assert uses the name {sub.id!r}; it may use candidate, the support's "
                                f"names and the built-ins {', '.join(sorted(SAFE_CALLS))}")
        if isinstance(sub, ast.Call):
            if not isinstance(sub.func, ast.Name) or sub.func.id not in SAFE_CALLS | {"candidate"}:
                raise TaskPackError(f"{where}: the assert may call only candidate and the built-ins "
                                    f"{', '.join(sorted(SAFE_CALLS))}")
            if any(isinstance(a, ast.Starred) for a in sub.args) or (sub.keywords and sub.func.id != "candidate"):
                raise TaskPackError(f"{where}: call {sub.func.id} with plain arguments (no *args, and keywords only "
                                    "for candidate)")
            if sub.func.id == "sum" and len(sub.args) != 1:
                raise TaskPackError(f"{where}: call sum with one argument")
        if isinstance(sub, ast.Dict) and any(k is None for k in sub.keys):
            raise TaskPackError(f"{where}: the assert may not use ** in a dict")
        if isinstance(sub, ast.Constant) and isinstance(sub.value, (bytes, complex)):
            raise TaskPackError(f"{where}: the assert's constants are None, booleans, numbers and strings")


def _case(raw: Any, where: str, names: frozenset[str]) -> RepairCase:
    if isinstance(raw, dict) and "assert" in raw:
        if set(raw) != {"assert"}:
            raise TaskPackError(f"{where}: an assert case is {{\"assert\": \"assert candidate(...) == ...\"}} alone, "
                                f"got keys {sorted(raw)}")
        return _assert_case(raw["assert"], where, names)
    args, expected = parse_case(raw, where)
    return CallCase(args, expected)


def _cases(raw: Any, where: str, key: str, names: frozenset[str]) -> tuple[RepairCase, ...]:
    if not isinstance(raw, list) or not raw:
        raise TaskPackError(f"{where}: {key!r} must be a non-empty list of test cases")
    if len(raw) > MAX_CASES:
        raise TaskPackError(f"{where}: {key!r} has {len(raw)} test cases; keep it to at most {MAX_CASES} "
                            "(split the task)")
    return tuple(_case(c, f"{where} {key}[{i}]", names) for i, c in enumerate(raw))


def _support(raw: Any, where: str) -> tuple[str, frozenset[str]]:
    """The support code (``NAME = <literal>`` lines only), normalised, and the names it defines."""
    if raw is None:
        return "", frozenset()
    text = text_field(raw, "support", where, MAX_SOURCE_CHARS, SOURCE_CHARS)
    tree = parse_source(text, where, "support")
    names = set()
    for stmt in tree.body:
        ok = isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
        if ok:
            try:
                literal_value(stmt.value)  # type: ignore[attr-defined]
            except NotLiteral:
                ok = False
        if not ok:
            raise TaskPackError(f"{where}: support line {stmt.lineno} is not 'NAME = <literal>'; support holds only "
                                "constants the asserts share (pack code runs only in the sandbox)")
        name = stmt.targets[0].id  # type: ignore[attr-defined]
        if name in SAFE_CALLS or name == "candidate":
            raise TaskPackError(f"{where}: support may not rebind {name!r}; rename the constant")
        names.add(name)
    return normalise_source(text), frozenset(names)


# ---------------------------------------------------------------------------------------------- one task
def _identifier(value: Any, key: str, where: str) -> str:
    if not isinstance(value, str) or not value.isidentifier() or not value.isascii() or len(value) > MAX_NAME_CHARS:
        raise TaskPackError(f"{where}: {key!r} must be an ASCII Python identifier of at most {MAX_NAME_CHARS} "
                            f"characters, got {short(value)}")
    return value


def _source(raw: Any, key: str, entry: str, where: str) -> str:
    if isinstance(raw, str):
        raw = raw.replace("\r\n", "\n").replace("\r", "\n").strip("\n") + "\n"
    text = text_field(raw, key, where, MAX_SOURCE_CHARS, SOURCE_CHARS)
    check_defines(text, entry, where, key)
    return normalise_source(text, strip_docstring_of=entry)


def parse_task(raw: Any, where: str) -> PackTaskV1:
    """One v1 pack entry -> a :class:`PackTaskV1`, checking everything but the code's behaviour."""
    keys = ", ".join(REQUIRED + SOURCES + OPTIONAL)
    if not isinstance(raw, dict):
        raise TaskPackError(f"{where}: a task is a table/object with keys {keys}")
    for key in V0_ONLY:
        if key in raw:
            raise TaskPackError(f"{where}: {key!r} is a v0 key; a v1 task gives 'source' (the buggy function, with "
                                "an optional 'fixed_source') or 'correct_source'; drop it, or drop \"format\" to "
                                "load the file as a v0 pack")
    missing = [k for k in REQUIRED if k not in raw]
    if missing:
        raise TaskPackError(f"{where}: missing key{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}")
    unknown = sorted(set(raw) - set(REQUIRED) - set(SOURCES) - set(OPTIONAL))
    if unknown:
        raise TaskPackError(f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                            f"keys are {keys}")
    name = _identifier(raw["name"], "name", where)
    where = f"{where} ({name})"
    given = [k for k in SOURCES if k in raw]
    if len(given) != 1:
        raise TaskPackError(f"{where}: give exactly one of 'source' (the buggy function) and 'correct_source' (a "
                            f"correct one to inject bugs into), got {' and '.join(map(repr, given)) or 'neither'}")
    correct = given[0] == "correct_source"
    if correct and "fixed_source" in raw:
        raise TaskPackError(f"{where}: 'fixed_source' goes with a buggy 'source'; a 'correct_source' needs none")
    statement = raw["statement"]
    if isinstance(statement, str):
        statement = statement.strip()
        if "\n" in statement:
            raise TaskPackError(f"{where}: 'statement' must be one line")
    statement = text_field(statement, "statement", where, MAX_STATEMENT_CHARS)
    entry = _identifier(raw.get("entry", name), "entry", where)
    source = _source(raw[given[0]], given[0], entry, where)
    fixed = _source(raw["fixed_source"], "fixed_source", entry, where) if "fixed_source" in raw else None
    if fixed is not None and fixed == source:
        raise TaskPackError(f"{where}: 'fixed_source' is the same code as 'source'; give the buggy function in "
                            "'source'")
    support, names = _support(raw.get("support"), where)
    visible = _cases(raw["visible"], where, "visible", names)
    hidden = _cases(raw["hidden"], where, "hidden", names)
    hidden_keys = [repr(c) for c in hidden]
    for i, case in enumerate(visible):
        if repr(case) not in hidden_keys:
            raise TaskPackError(f"{where}: visible[{i}] is not among the hidden cases; add it to 'hidden' (every "
                                "visible case is also hidden)")
    if set(hidden_keys) <= {repr(c) for c in visible}:
        raise TaskPackError(f"{where}: every hidden case is visible; add a hidden case the visible ones do not show")
    return PackTaskV1(name, entry, statement, source, correct, fixed, support, visible, hidden)


def validate(task: PackTaskV1, where: str) -> None:
    """Run the task's code in the worker: a buggy source fails a hidden case, a fixed or correct source passes
    them all; raises :class:`TaskPackError`."""
    where = f"{where} ({task.name})"
    report = run_repair_tests(task.entry, task.support, task.hidden, task.source)
    if task.correct:
        if not report.ok:
            raise TaskPackError(f"{where}: correct_source fails {report.total - report.passed} of {report.total} "
                                f"hidden cases (first: {report.first_failure}); fix the function or the case")
        return
    if report.ok:
        raise TaskPackError(f"{where}: the buggy source passes all {report.total} hidden cases; add a case that "
                            "exposes the bug")
    if task.fixed_source is not None:
        fixed = run_repair_tests(task.entry, task.support, task.hidden, task.fixed_source)
        if not fixed.ok:
            raise TaskPackError(f"{where}: fixed_source fails {fixed.total - fixed.passed} of {fixed.total} hidden "
                                f"cases (first: {fixed.first_failure}); fix it or the case")


def to_task(task: PackTaskV1, stem: str) -> RepairTask | Problem:
    """A parsed task as what the env plays (a buggy one) or what the engine injects bugs into (a correct one)."""
    pid = f"pack/{stem}/{task.name}"
    if task.correct:
        return Problem(pid=pid, entry=task.entry, statement=task.statement, source=task.source, support=task.support,
                       visible=task.visible, hidden=task.hidden, split="pack", origin="pack")
    return RepairTask(name=task.name, entry=task.entry, statement=task.statement, source=task.source,
                      support=task.support, visible=task.visible, hidden=task.hidden, split="pack", origin="pack",
                      problem=pid, fixed_source=task.fixed_source, bugs=())


def load_v1(data: Any, path: Path) -> list[RepairTask | Problem]:
    """The tasks of a parsed v1 pack file (a dict with ``format`` and ``tasks``), validated in the worker.

    :param data: the file's parsed content
    :param path: the file (for messages and the pids' stem)
    :raises TaskPackError: with a one-line message on any problem
    """
    if not isinstance(data, dict) or "tasks" not in data:
        raise TaskPackError(f"{path}: a v1 pack needs a 'tasks' list beside \"format\"")
    unknown = sorted(set(data) - {"format", "tasks"})
    if unknown:
        raise TaskPackError(f"{path}: unknown top-level key{'s' if len(unknown) > 1 else ''} "
                            f"{', '.join(map(repr, unknown))}; a v1 pack has 'format' and 'tasks'")
    raw_tasks = data["tasks"]
    if not isinstance(raw_tasks, list) or not raw_tasks:
        raise TaskPackError(f"{path}: 'tasks' must be a non-empty list of tasks")
    tasks = [parse_task(raw, f"{path}: task {i}") for i, raw in enumerate(raw_tasks)]
    for i, task in enumerate(tasks):  # names first: no code runs for a pack that cannot be used anyway
        if any(t.name == task.name for t in tasks[:i]):
            raise TaskPackError(f"{path}: task {i} ({task.name}): the name is used twice in the pack")
    started = time.monotonic()
    for i, task in enumerate(tasks):
        if i and time.monotonic() - started > VALIDATION_BUDGET_S:
            raise TaskPackError(f"{path}: validating the pack took over {VALIDATION_BUDGET_S:g} s (at task {i} of "
                                f"{len(tasks)}); split it into smaller packs or make its code faster")
        validate(task, f"{path}: task {i}")
    return [to_task(task, path.stem) for task in tasks]
