"""Test cases written as Python: literal values and the plain ``f(<literal args>) == <literal>`` comparison.

A HumanEval ``check`` and a v1 pack's ``{"assert": ...}`` case are Python text. Where that text is a plain
comparison of one call with literal arguments against a literal, it becomes a
:class:`~bugfix_gym.execution.repair_cases.CallCase`: judged in the env process on the value alone, the
expected value never sent to the sandbox. Nothing here runs the text: literals are folded from the syntax tree.
"""

from __future__ import annotations

import ast
from typing import Any

from ..execution.repair_cases import CallCase, contains_unsent, decode_value, encode_value

MAX_LITERAL_ITEMS = 10_000  # the largest string / container a folded literal (``'ab' * 3``) may make


class NotLiteral(ValueError):
    """An expression that is not a literal this module folds."""


def literal_value(node: ast.expr) -> Any:
    """The value of a literal expression: constants, tuples, lists, sets and dicts of literals, signs, and
    arithmetic on literals (``3 * 19``, ``'abc' + 'de'``, ``0 ** 0``), bounded in size; raises
    :class:`NotLiteral` for anything else (names, calls, values the case codec cannot carry)."""
    try:
        value = _fold(node)
    except (TypeError, ArithmeticError, RecursionError) as exc:  # {[1]}, 1 / 0, nesting too deep
        raise NotLiteral(type(exc).__name__) from None
    try:
        plain = contains_unsent(decode_value(encode_value(value))) is None
    except ValueError:
        plain = False
    if not plain:
        raise NotLiteral("a value the case codec cannot carry")
    return value


_BINARY = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b,
           ast.Pow: lambda a, b: a ** b}


def _fold(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, (complex, bytes)) or node.value is Ellipsis:
            raise NotLiteral("a constant the case codec cannot carry")
        return node.value
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        if any(isinstance(e, ast.Starred) for e in node.elts):
            raise NotLiteral("a starred item")
        items = [_fold(e) for e in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else (items if isinstance(node, ast.List) else set(items))
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise NotLiteral("a ** in a dict")
        return {_fold(k): _fold(v) for k, v in zip(node.keys, node.values)}  # type: ignore[arg-type]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _fold(node.operand)
        if type(operand) not in (int, float):
            raise NotLiteral("a sign on something other than a number")
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _fold(node.left), _fold(node.right)
        _check_bounded(node.op, left, right)
        return _BINARY[type(node.op)](left, right)
    raise NotLiteral(type(node).__name__)


def _check_bounded(op: ast.operator, left: Any, right: Any) -> None:
    """Refuse folds that would make a huge value or run long (a pack's text is nobody's reviewed code)."""
    if isinstance(op, ast.Pow) and not (type(right) in (int, float) and abs(right) <= 64
                                        and type(left) in (int, float) and abs(left) <= 10 ** 6):
        raise NotLiteral("a power too large to fold")
    if isinstance(op, ast.Mod) and not (type(left) in (int, float) and type(right) in (int, float)):
        raise NotLiteral("% on something other than numbers (string formatting)")
    if isinstance(op, ast.Mult):
        for seq, times in ((left, right), (right, left)):
            if isinstance(seq, (str, list, tuple)) and type(times) is int and len(seq) * times > MAX_LITERAL_ITEMS:
                raise NotLiteral("a repetition too large to fold")


def plain_call_case(test: ast.expr, callee: str) -> CallCase | None:
    """``callee(<literal args>) == <literal>`` as a :class:`CallCase`, or None for any other expression."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return None
    call, expected = test.left, test.comparators[0]
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == callee
            and not call.keywords):
        return None
    if any(isinstance(a, ast.Starred) for a in call.args):
        return None
    try:
        return CallCase(tuple(literal_value(a) for a in call.args), literal_value(expected))
    except NotLiteral:
        return None
