"""The five edit ops: deterministic source transformations that compose.

Each op looks for one syntactic site in the *current* source and rewrites it; where the
site is missing the source is returned unchanged (the tool then says ``no change``).
``swap_minmax``, ``fix_comparison`` and ``fix_init`` are involutions (applying one twice
undoes it), which is what lets an unskilled policy stack edits and still pass.

``inject_defect`` is the inverse of each op on a correct function: the task library and
the procedural generator write *correct* functions and derive the buggy ones from them,
so ``apply_op(inject_defect(src, op), op) == src`` holds by construction (and is tested).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from functools import lru_cache

FIX_OPS: tuple[str, ...] = ("fix_comparison", "add_zero_guard", "swap_minmax", "fix_range_end", "fix_init")
DEFECTS: dict[str, str] = {  # fix_op -> the defect kind it repairs
    "fix_comparison": "comparison",
    "add_zero_guard": "zero_guard",
    "swap_minmax": "minmax",
    "fix_range_end": "range_end",
    "fix_init": "init",
}

_TOGGLE_STRICT = {"<": "<=", "<=": "<", ">": ">=", ">=": ">"}
_SWAP_MINMAX = {"min": "max", "max": "min"}


def _tokens(source: str) -> list[tokenize.TokenInfo] | None:
    try:
        return list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None


_LINE_END = re.compile(r"\r\n|\r|\n")


def _lines(source: str) -> list[str]:
    """Lines with their ends, split where Python's tokenizer and ``ast`` split them (not at ``\u2028`` etc.)."""
    out, at = [], 0
    for m in _LINE_END.finditer(source):
        out.append(source[at:m.end()])
        at = m.end()
    if at < len(source):
        out.append(source[at:])
    return out


def _offset(source: str, line: int, col: int, byte_col: bool) -> int:
    """(1-based line, 0-based column) -> string offset; ``ast`` columns count UTF-8 bytes, tokenize's characters."""
    lines = _lines(source)
    if byte_col and line - 1 < len(lines):
        col = len(lines[line - 1].encode("utf-8")[:col].decode("utf-8", errors="ignore"))
    return sum(len(x) for x in lines[: line - 1]) + col


def _replace_span(source: str, start: tuple[int, int], end: tuple[int, int], text: str,
                  byte_col: bool = False) -> str:
    a, b = _offset(source, *start, byte_col), _offset(source, *end, byte_col)
    return source[:a] + text + source[b:]


def _node_span(node: ast.expr) -> tuple[tuple[int, int], tuple[int, int]]:
    assert node.end_lineno is not None and node.end_col_offset is not None  # set by ast.parse
    return (node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset)


def _segment(source: str, node: ast.expr) -> str:
    """The source text of a node that ``ast.parse`` made from ``source`` (so it has positions)."""
    text = ast.get_source_segment(source, node)
    assert text is not None
    return text


def _replace_node(source: str, node: ast.expr, text: str) -> str:
    """Replace an ``ast`` node's source text (its columns are UTF-8 byte offsets)."""
    return _replace_span(source, *_node_span(node), text, byte_col=True)


def _parse(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # deep nesting: no site, no change
        return None


def _first(nodes):
    """The node that starts first in the source."""
    nodes = list(nodes)
    return min(nodes, key=lambda n: (n.lineno, n.col_offset)) if nodes else None


def fix_comparison(source: str) -> str:
    """Toggle the strictness of the first ordering comparison: ``<`` <-> ``<=``, ``>`` <-> ``>=``."""
    toks = _tokens(source)
    if toks is None:
        return source
    for tok in toks:
        if tok.type == tokenize.OP and tok.string in _TOGGLE_STRICT:
            return _replace_span(source, tok.start, tok.end, _TOGGLE_STRICT[tok.string])
    return source


def swap_minmax(source: str) -> str:
    """Exchange every ``min`` and ``max`` name."""
    toks = _tokens(source)
    if toks is None:
        return source
    out = source
    # right to left so earlier offsets stay valid
    for tok in reversed(toks):
        if tok.type == tokenize.NAME and tok.string in _SWAP_MINMAX:
            out = _replace_span(out, tok.start, tok.end, _SWAP_MINMAX[tok.string])
    return out


def _range_stop(tree: ast.Module) -> ast.expr | None:
    calls = [n for n in ast.walk(tree)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "range" and n.args]
    call = _first(calls)
    if call is None:
        return None
    return call.args[0] if len(call.args) == 1 else call.args[1]


def _is_plus_minus_one(node: ast.expr) -> bool:
    return (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub))
            and isinstance(node.right, ast.Constant) and node.right.value == 1)


def fix_range_end(source: str) -> str:
    """Move the end of the first ``range`` by one: drop a trailing ``+ 1`` / ``- 1``, else add ``+ 1``."""
    tree = _parse(source)
    stop = _range_stop(tree) if tree else None
    if stop is None:
        return source
    if isinstance(stop, ast.BinOp) and _is_plus_minus_one(stop):
        return _replace_node(source, stop, _segment(source, stop.left))
    return _replace_node(source, stop, _segment(source, stop) + " + 1")


def _first_literal_init(tree: ast.Module) -> ast.Constant | None:
    assigns = [n for n in ast.walk(tree)
               if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
               and isinstance(n.value, ast.Constant) and type(n.value.value) is int and n.value.value in (0, 1)]
    first = _first(assigns)
    return first.value if first else None


def fix_init(source: str) -> str:
    """Toggle the first accumulator initialised to a literal ``0`` or ``1`` (``total = 1`` -> ``total = 0``)."""
    tree = _parse(source)
    const = _first_literal_init(tree) if tree else None
    if const is None:
        return source
    return _replace_node(source, const, "0" if const.value == 1 else "1")


def _guard_target(func: ast.FunctionDef, source: str) -> str | None:
    """What a zero guard protects: the first divisor, else the first sequence indexed at 0 / -1."""
    divisions = [n for n in ast.walk(func)
                 if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Div, ast.FloorDiv, ast.Mod))]
    for div in sorted(divisions, key=lambda n: (n.lineno, n.col_offset)):
        right = div.right
        if isinstance(right, ast.Name):
            return right.id
        if (isinstance(right, ast.Call) and isinstance(right.func, ast.Name) and right.func.id == "len"
                and len(right.args) == 1 and isinstance(right.args[0], ast.Name)):
            return right.args[0].id
    subscripts = [n for n in ast.walk(func)
                  if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name)
                  and isinstance(n.slice, (ast.Constant, ast.UnaryOp))]
    for sub in sorted(subscripts, key=lambda n: (n.lineno, n.col_offset)):
        index = ast.get_source_segment(source, sub.slice)
        if index in ("0", "-1") and isinstance(sub.value, ast.Name):
            return sub.value.id
    return None


def _guard_lines(name: str, indent: str) -> str:
    return f"{indent}if not {name}:\n{indent}    return 0\n"


def _body_indent(func: ast.FunctionDef, source: str) -> str:
    line = _lines(source)[func.body[0].lineno - 1]
    return line[: len(line) - len(line.lstrip())]


def add_zero_guard(source: str) -> str:
    """Insert ``if not <x>: return 0`` at the top of the function, for its first divisor or ``x[0]``."""
    tree = _parse(source)
    func = _first(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)) if tree else None
    if func is None:
        return source
    name = _guard_target(func, source)
    if name is None:
        return source
    indent = _body_indent(func, source)
    guard = _guard_lines(name, indent)
    lines = _lines(source)
    at = func.body[0].lineno - 1
    if "".join(lines[at:at + 2]) == guard:  # already guarded: idempotent
        return source
    return "".join(lines[:at]) + guard + "".join(lines[at:])


_OPS = {
    "fix_comparison": fix_comparison,
    "add_zero_guard": add_zero_guard,
    "swap_minmax": swap_minmax,
    "fix_range_end": fix_range_end,
    "fix_init": fix_init,
}


@lru_cache(maxsize=65536)
def apply_op(source: str, op: str) -> str:
    """Apply edit op ``op`` to ``source`` (cached: the set of reachable sources is small)."""
    try:
        return _OPS[op](source)
    except KeyError:
        raise ValueError(f"unknown edit op {op!r}; ops are {', '.join(FIX_OPS)}") from None


def inject_defect(correct: str, fix_op: str) -> str:
    """The buggy source that ``fix_op`` repairs back into ``correct`` (inverse of ``apply_op``)."""
    if fix_op in ("fix_comparison", "swap_minmax", "fix_init"):
        return apply_op(correct, fix_op)  # involutions
    if fix_op == "fix_range_end":
        tree = _parse(correct)
        stop = _range_stop(tree) if tree else None
        if stop is None:
            return correct
        if isinstance(stop, ast.BinOp) and isinstance(stop.op, ast.Add) and _is_plus_minus_one(stop):
            return _replace_node(correct, stop, _segment(correct, stop.left))  # n + 1 -> n
        return _replace_node(correct, stop, _segment(correct, stop) + " - 1")  # n -> n - 1
    if fix_op == "add_zero_guard":
        tree = _parse(correct)
        func = _first(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)) if tree else None
        if func is None or len(func.body) < 2:
            return correct
        lines = _lines(correct)
        at = func.body[0].lineno - 1
        name = _guard_target(func, correct)
        if name is None or "".join(lines[at:at + 2]) != _guard_lines(name, _body_indent(func, correct)):
            return correct
        return "".join(lines[:at]) + "".join(lines[at + 2:])
    raise ValueError(f"unknown edit op {fix_op!r}; ops are {', '.join(FIX_OPS)}")


def describe_change(before: str, after: str) -> str:
    """One line saying what an edit changed: the first differing line of the new source."""
    if before == after:
        return "no change"
    old, new = before.splitlines(), after.splitlines()
    for i, (a, b) in enumerate(zip(old, new)):
        if a != b:
            return f"changed line {i + 1} : {b.strip()}"
    i = min(len(old), len(new))
    return f"changed line {i + 1} : {(new[i] if i < len(new) else '').strip()}"
