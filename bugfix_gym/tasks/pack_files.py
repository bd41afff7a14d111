"""What BugFix's two task-pack formats share: reading the file, the limits, the one-line error, and the checks
of names, text fields, test cases and sources that run no code.

:mod:`bugfix_gym.tasks.packs` (v0, and the one entry point ``load_task_pack``) and
:mod:`bugfix_gym.tasks.packs_v1` (v1) both use these, so a limit means the same in either format.
"""

from __future__ import annotations

import ast
import json
import os
import stat
import string
import sys
from pathlib import Path
from typing import Any

from ..execution.cases import MAX_VALUE_DEPTH, is_plain

MAX_PACK_BYTES = 4 * 1024 * 1024
MAX_NAME_CHARS = 40
MAX_STATEMENT_CHARS = 200
MAX_SOURCE_CHARS = 4000
MAX_CASES = 4096  # hidden cases of one task: every outcome must fit the sandbox's 1 MiB report

SOURCE_CHARS = frozenset(string.printable) - frozenset("\x0b\x0c")


class TaskPackError(ValueError):
    """A task pack that cannot be used; the message is one line saying where and why."""


def read_pack_file(path: Path) -> Any:
    """The parsed content of a ``.json`` / ``.toml`` pack file, read safely (size-capped, regular files only)."""
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
    parse = json.loads if suffix == ".json" else toml_module().loads
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


def toml_module():
    """``tomllib`` (or ``tomli`` on Python 3.10)."""
    try:
        import tomllib  # Python >= 3.11
    except ModuleNotFoundError:
        try:
            import tomli as tomllib  # the same parser, for Python 3.10
        except ModuleNotFoundError:
            raise TaskPackError("TOML task packs need Python 3.11+ or `pip install tomli`; "
                                "JSON packs work everywhere") from None
    return tomllib


def parse_case(raw: Any, where: str) -> tuple[tuple, Any]:
    """``{"args": [...], "expected": v}`` or ``[[...args], expected]`` -> ``(args, expected)``, JSON values only."""
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
                            f"expected], got {short(raw)}")
    if not isinstance(args, list):
        raise TaskPackError(f"{where}: test case args must be a list of arguments, got {short(args)}")
    for value in (*args, expected):
        if not is_plain(value, MAX_VALUE_DEPTH):
            raise TaskPackError(f"{where}: test values are JSON values (null, booleans, numbers, strings, lists, "
                                f"objects) nested at most {MAX_VALUE_DEPTH} deep, got {short(value)}")
    return tuple(args), expected


def parse_cases(raw: Any, where: str, key: str) -> tuple[tuple[tuple, Any], ...]:
    """A non-empty list of at most :data:`MAX_CASES` cases (:func:`parse_case`)."""
    if not isinstance(raw, list) or not raw:
        raise TaskPackError(f"{where}: {key!r} must be a non-empty list of test cases")
    if len(raw) > MAX_CASES:
        raise TaskPackError(f"{where}: {key!r} has {len(raw)} test cases; keep it to at most {MAX_CASES} "
                            "(split the task)")
    return tuple(parse_case(c, f"{where} {key}[{i}]") for i, c in enumerate(raw))


def short(value: Any, limit: int = 40) -> str:
    """``ascii(value)`` cut to ``limit`` characters, for messages."""
    text = ascii(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


MAX_SOURCE_DEPTH = 100  # syntax-tree levels a pack's source may nest (the edit ops and the sandbox recurse)


def tree_depth(tree: ast.AST) -> int:
    """How deep the syntax tree nests, counted without recursion."""
    deepest, todo = 0, [(tree, 1)]
    while todo:
        node, depth = todo.pop()
        deepest = max(deepest, depth)
        todo += [(child, depth + 1) for child in ast.iter_child_nodes(node)]
    return deepest


def parse_source(source: str, where: str, key: str = "source") -> ast.Module:
    """``source`` parsed, and no deeper than :data:`MAX_SOURCE_DEPTH` (the edit ops, ``ast.unparse`` and the
    sandbox recurse); raises :class:`TaskPackError` naming ``key``."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise TaskPackError(f"{where}: {key} does not parse (line {exc.lineno}: {exc.msg})") from None
    except ValueError as exc:  # null bytes
        raise TaskPackError(f"{where}: {key} does not parse ({exc})") from None
    except (RecursionError, MemoryError):
        raise TaskPackError(f"{where}: {key} is nested too deeply to parse; keep expressions under "
                            f"{MAX_SOURCE_DEPTH} levels") from None
    if tree_depth(tree) > MAX_SOURCE_DEPTH:
        raise TaskPackError(f"{where}: {key} is nested more than {MAX_SOURCE_DEPTH} levels deep; simplify it")
    return tree


def check_defines(source: str, name: str, where: str, key: str = "source") -> None:
    """``source`` parses (:func:`parse_source`) and defines a top-level ``def name(...)``."""
    tree = parse_source(source, where, key)
    if not any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body):
        raise TaskPackError(f"{where}: {key} does not define a top-level function 'def {name}(...)'")


def text_field(value: Any, key: str, where: str, limit: int, allowed: frozenset[str] | None = None) -> str:
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
