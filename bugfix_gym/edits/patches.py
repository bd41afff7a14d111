"""Line edits: ``patch L CODE``, ``insert L CODE``, ``delete L`` (the free-text path an LLM writes).

They act on the lines of a normalised source (one simple statement or one compound header a line):

* ``patch L CODE`` replaces line ``L`` by ``CODE`` with line ``L``'s indentation;
* ``insert L CODE`` puts ``CODE`` on a new line ``L`` with the indentation of the old line ``L`` (which moves
  down with the lines below it); ``insert N+1`` appends with the last line's indentation;
* ``delete L`` removes line ``L``.

``CODE`` is one line; its own leading and trailing blanks are dropped (the line gets the indentation above). The
result is normalised; one that does not compile (a syntax error, ``return`` outside a function, a block left
empty) is an :class:`~bugfix_gym.edits.sites.EditError` with a one-line message, and the source is unchanged.
A result equal to the source is returned as it is: a valid call with no effect.
"""

from __future__ import annotations

import ast
import warnings

from .sites import MAX_LINES, EditError, normalise

__all__ = ("MAX_CODE", "EditError", "deletable_lines", "delete_line", "insert_line", "patch_line")

MAX_CODE = 400
"""Characters of ``CODE`` at most."""


def _lines(source: str) -> list[str]:
    return source.split("\n")[:-1] if source.endswith("\n") else source.split("\n")


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def _code(code: str, verb: str) -> str:
    if not isinstance(code, str):
        raise TypeError(f"{verb} takes the code as a str, not {type(code).__name__}")
    if "\n" in code or "\r" in code:
        raise EditError(f"{verb} takes one line of code : write one statement or header a call")
    code = code.strip()
    if not code:
        hint = " : to remove a line use delete L" if verb == "patch" else ""
        raise EditError(f"{verb} needs code after the line number{hint}")
    if len(code) > MAX_CODE:
        raise EditError(f"the code is {len(code)} characters, more than {MAX_CODE} : shorten it")
    return code


def _line(source_lines: list[str], line: int, verb: str, extra: int = 0) -> None:
    if not isinstance(line, int) or isinstance(line, bool):
        raise TypeError(f"{verb} takes the line as an int, not {type(line).__name__}")
    last = len(source_lines) + extra
    if not 1 <= line <= last:
        raise EditError(f"line {line} is not in the source : {verb} takes a line from 1 to {last}")


def _result(lines: list[str], verb: str) -> str:
    text = "\n".join(lines) + "\n"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(text, "<edit>", "exec", dont_inherit=True)
        return normalise(text)
    except SyntaxError as exc:  # IndentationError too
        why = (exc.msg or type(exc).__name__).split("\n")[0][:80]
        raise EditError(f"after {verb} the code does not compile ({type(exc).__name__}: {why}, line {exc.lineno}) : "
                        f"nothing changed") from None
    except (ValueError, MemoryError, RecursionError) as exc:  # null bytes, absurd nesting
        raise EditError(f"after {verb} the code does not compile ({type(exc).__name__}) : nothing changed") from None


def patch_line(source: str, line: int, code: str) -> str:
    """``patch L CODE``: line ``L`` replaced by ``CODE`` with line ``L``'s indentation, normalised.

    :raises EditError: no such line, empty or multi-line code, or a result that does not compile
    """
    lines = _lines(source)
    _line(lines, line, "patch")
    code = _code(code, "patch")
    lines[line - 1] = _indent(lines[line - 1]) + code
    return _result(lines, "patch")


def insert_line(source: str, line: int, code: str) -> str:
    """``insert L CODE``: a new line ``L`` with the indentation of the old line ``L`` (the last line's for
    ``L = N + 1``), normalised.

    :raises EditError: no such place, empty or multi-line code, or a result that does not compile
    """
    lines = _lines(source)
    _line(lines, line, "insert", extra=1)
    code = _code(code, "insert")
    indent = _indent(lines[line - 1] if line <= len(lines) else lines[-1] if lines else "")
    lines.insert(line - 1, indent + code)
    return _result(lines, "insert")


def delete_line(source: str, line: int) -> str:
    """``delete L``: line ``L`` removed, normalised.

    :raises EditError: no such line, or a result that does not compile (a block left empty, a header without
        its body)
    """
    lines = _lines(source)
    _line(lines, line, "delete")
    del lines[line - 1]
    return _result(lines, "delete")


def deletable_lines(source: str) -> tuple[int, ...]:
    """The lines ``delete L`` removes cleanly, decided structurally: a simple statement on one line, not the only
    statement of its block, at most line :data:`~bugfix_gym.edits.sites.MAX_LINES` (what ``legal_calls`` lists).

    :param source: a normalised source
    :raises EditError: the source does not parse
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise EditError(f"the source does not parse (line {exc.lineno}) : fix it with patch, insert or delete") \
            from None
    out: list[int] = []
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list) or len(block) < 2:
                continue
            out += [s.lineno for s in block if isinstance(s, ast.stmt) and not hasattr(s, "body")
                    and s.lineno == s.end_lineno and s.lineno <= MAX_LINES]
    return tuple(sorted(out))
