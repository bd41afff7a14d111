"""Bug injection: every candidate one-site bug of a correct function, each with the call that repairs it.

:func:`injections` walks the sites of the entry function (and the code nested in it) in order and, at each,
tries the injection families in :data:`FAMILY_ORDER` order, each with its variants in a fixed order (small
tables in the style of mutation-testing tools: ``<`` becomes ``<=`` or ``>``, ``min`` becomes ``max``, ...). A
candidate is kept only if its bug is undone by one call the action space can write: the repair is computed on
the buggy source (its site renumbered, its identifiers written through the *buggy* source's names table),
checked to be legal there, and checked to give back the original source exactly (normalised text, so the
same AST). Everything here is pure AST work: no code runs (validity against tests is
:mod:`bugfix_gym.tasks.mutants`).

Every raw candidate has a key (``op_compare@4.1:<=``: family, site, variant), unique in its source; the kept
ones are :class:`Injection` s carrying it, so a list of keys identifies a validated set of mutants
(:func:`injection` rebuilds one from its key alone, :func:`candidates_digest` tells when the enumeration
changed).

Repairs: a ``line_drop`` (missing line) is repaired by ``insert L CODE``, the free-text path; ``line_dup`` by
``delete L``; every other family by one sited ``edit``. Two-bug mutants (:func:`second_injection`) put a second
bug on an earlier line of a one-bug mutant; their repair is the two calls in order (the later line's first).
"""

from __future__ import annotations

import ast
import hashlib
import warnings
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Iterator

from .defect_classes import classes_of
from .mutations import apply_edit, swap_pair
from .patches import delete_line, insert_line, patch_line
from .sites import (CONSTANT_WORDS, WRAP_WORDS, Edit, EditError, Slot, analysis, constant_node, is_condition,
                    is_value, normalise, op_node, op_word, site_table, swap_children)

__all__ = ("FAMILY_ORDER", "Candidate", "Injection", "InjectionError", "apply_repair", "candidate", "candidates",
           "candidates_digest", "injection", "injections", "second_injection")

FAMILY_ORDER: tuple[str, ...] = (
    "op_assign", "line_drop", "line_dup",                                       # statements (K = 0)
    "op_arith", "op_compare", "op_bool", "var_replace", "operand_swap", "prepend", "plus1_added", "plus1_missing",
    "const_change", "listify_drop", "listify_add", "slice_drop", "slice_add", "method_replace", "field_replace",
    "arith_drop", "call_drop", "call_add", "call_replace", "cond_drop", "cond_true", "cond_add", "negate_add",
    "negate_drop",
)
"""Every injection family, in the order they are tried at a site."""


class InjectionError(ValueError):
    """An injection request that cannot be met (no such entry function, an index that is not a candidate)."""


@dataclass(frozen=True)
class Injection:
    """One injected bug and its repair.

    :param family: the injection family (:data:`FAMILY_ORDER`)
    :param classes: the defect classes it stands for (:mod:`bugfix_gym.edits.defect_classes`)
    :param site: ``(L, K)`` of the injected site in the source it was injected into (K = 0: the statement)
    :param buggy_source: the source with the bug, normalised
    :param repair: the call that, applied to ``buggy_source``, gives back the source it was injected into
    :param key: the candidate's key, ``family@L.K:variant``: its stable id among :func:`candidates`
    """

    family: str
    classes: tuple[str, ...]
    site: tuple[int, int]
    buggy_source: str
    repair: str
    key: str


# ------------------------------------------------------------------------------ repairs
def apply_repair(source: str, call: str) -> str:
    """Apply one repair call (``edit L.K MUTATION [ARG]``, ``insert L CODE``, ``patch L CODE``, ``delete L``).

    :raises EditError: the call does not apply
    """
    verb, _, rest = call.partition(" ")
    if verb == "edit":
        return apply_edit(source, Edit.from_call(call))
    number, _, code = rest.partition(" ")
    if verb not in ("insert", "patch", "delete") or not number.isdigit() or not number.isascii():
        raise EditError(f"not a repair call : {call[:40]!r}")
    if verb == "delete":
        return delete_line(source, int(number))
    return (insert_line if verb == "insert" else patch_line)(source, int(number), code)


@dataclass
class _Plan:
    """What a recipe did: the node the repair edits (in the mutated tree), the repair's mutation and argument
    (a word, or an identifier / a node to write through the buggy source's names), or a line call."""

    target: ast.AST | None = None
    mutation: str = ""
    arg: str | None = None
    arg_ident: str | None = None
    arg_node: ast.AST | None = None
    line_call: str | None = None


Recipe = Callable[[Slot], "_Plan"]


@dataclass(frozen=True)
class Candidate:
    """A raw candidate: a family's recipe at a site (data only; :func:`injection` materialises it)."""

    family: str
    site: tuple[int, int]
    variant: str
    recipe: Recipe

    @property
    def key(self) -> str:
        return f"{self.family}@{self.site[0]}.{self.site[1]}:{self.variant}"


def _put(slot: Slot, new: ast.AST) -> None:
    assert slot.parent is not None and slot.field is not None
    if slot.index is None:
        setattr(slot.parent, slot.field, new)
    else:
        getattr(slot.parent, slot.field)[slot.index] = new


def _arg_word(node: ast.AST, names_slot: Callable[[str], str | None]) -> str | None:
    """How a node is written as an argument (a name through the names table, or a constant word)."""
    if isinstance(node, ast.Name):
        return names_slot(node.id)
    return _WORD_OF_DUMP.get(ast.dump(node))


# ------------------------------------------------------------------------------ variant tables
ARITH_VARIANTS = {"+": ("-", "*"), "-": ("+",), "*": ("+", "/"), "/": ("*", "//"), "//": ("/", "%"),
                  "%": ("//",), "**": ("*",), "&": ("|",), "|": ("&",), "^": ("|",), "<<": (">>",), ">>": ("<<",)}
COMPARE_VARIANTS = {"<": ("<=", ">"), "<=": ("<", ">="), ">": (">=", "<"), ">=": (">", "<="), "==": ("!=",),
                    "!=": ("==",), "is": ("is_not",), "is_not": ("is",), "in": ("not_in",), "not_in": ("in",)}
ASSIGN_VARIANTS = {"+=": ("-=", "="), "-=": ("+=", "="), "*=": ("+=", "="), "/=": ("*=",), "//=": ("/=",),
                   "%=": ("//=",), "**=": ("*=",), "&=": ("=",), "|=": ("=",), "^=": ("=",), "<<=": ("=",),
                   ">>=": ("=",)}
CONST_VARIANTS: dict[str, tuple[object, ...]] = {
    "0": (1,), "1": (0, 2), "2": (1, 3), "3": (2,), "-1": (0, 1), "True": (False,), "False": (True,),
    "None": (0,), "''": (" ",), "[]": ("{}",), "{}": ("[]",), "()": ("[]",)}
METHOD_VARIANTS = {"lower": ("upper",), "upper": ("lower",), "startswith": ("endswith",),
                   "endswith": ("startswith",), "isupper": ("islower",), "islower": ("isupper",),
                   "isdigit": ("isalpha",), "isalpha": ("isdigit",), "isspace": ("isdigit",), "keys": ("values",),
                   "values": ("keys",), "items": ("values",), "append": ("extend",), "extend": ("append",),
                   "index": ("find", "count"), "find": ("index",), "count": ("index",), "strip": ("lstrip", "rstrip"),
                   "lstrip": ("strip",), "rstrip": ("strip",), "sort": ("reverse",), "reverse": ("sort",),
                   "remove": ("pop",), "swapcase": ("upper",), "title": ("capitalize",), "capitalize": ("title",)}
CALL_VARIANTS = {"min": ("max",), "max": ("min",), "sorted": ("reversed",), "reversed": ("sorted",),
                 "any": ("all",), "all": ("any",), "int": ("float", "round"), "float": ("int",), "round": ("int",),
                 "list": ("set",), "set": ("list",), "tuple": ("list",), "sum": ("max", "len"), "len": ("sum",),
                 "abs": ("int",), "ord": ("len",), "chr": ("str",), "bin": ("str",), "range": ("enumerate",)}
_COMMUTATIVE = (ast.Mult, ast.BitAnd, ast.BitOr, ast.BitXor)
_TEST_PARENTS = (ast.If, ast.While, ast.IfExp, ast.Assert)
_ITERABLE_CALLS = frozenset({"len", "sorted", "sum", "max", "min", "set", "list", "enumerate", "reversed", "zip"})


# ------------------------------------------------------------------------------ recipes
def _edit_in_place(change: Callable[[Any], None], mutation: str, arg: str | None = None,
                   arg_ident: str | None = None) -> Recipe:
    def recipe(slot: Slot) -> _Plan:
        change(slot.node)
        return _Plan(slot.node, mutation, arg, arg_ident)
    return recipe


def _replace_with(build: Callable[[Any], tuple[Any, Any]], mutation: str, arg: str | None = None,
                  arg_from: Callable[[Any], Any] | None = None) -> Recipe:
    """``build(node) -> (new node, repair target)``; the repair writes ``arg`` or the node ``arg_from(old)``."""
    def recipe(slot: Slot) -> _Plan:
        old = slot.node
        new, target = build(old)
        _put(slot, new)
        return _Plan(target, mutation, arg, arg_node=arg_from(old) if arg_from else None)
    return recipe


def _set_op(word: str) -> Callable[[Any], None]:
    def change(node: Any) -> None:
        if isinstance(node, ast.Compare):
            node.ops[0] = op_node(word)
        else:
            node.op = op_node(word)
    return change


def _op_variants(slot: Slot, ctx: _Context) -> Iterator[tuple[str, str, Recipe]]:
    node = slot.node
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS_WITH_WORDS:
        word = op_word(node.op)
        for new in ARITH_VARIANTS.get(word, ()):
            yield "op_arith", new, _edit_in_place(_set_op(new), "op", word)
    elif isinstance(node, ast.Compare):
        word = op_word(node.ops[0])
        for new in COMPARE_VARIANTS.get(word, ()):
            yield "op_compare", new, _edit_in_place(_set_op(new), "op", word)
    elif isinstance(node, ast.BoolOp):
        word = op_word(node.op)
        new = "or" if word == "and" else "and"
        yield "op_bool", new, _edit_in_place(_set_op(new), "op", word)


_OPS_WITH_WORDS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.BitAnd, ast.BitOr,
                   ast.BitXor, ast.LShift, ast.RShift)
_AUG_WORD = {ast.Add: "+=", ast.Sub: "-=", ast.Mult: "*=", ast.Div: "/=", ast.FloorDiv: "//=", ast.Mod: "%=",
             ast.Pow: "**=", ast.BitAnd: "&=", ast.BitOr: "|=", ast.BitXor: "^=", ast.LShift: "<<=",
             ast.RShift: ">>="}


def _statement_variants(slot: Slot, ctx: _Context) -> Iterator[tuple[str, str, Recipe]]:
    node: Any = slot.node
    if isinstance(node, ast.AugAssign) and type(node.op) in _AUG_WORD:
        word = _AUG_WORD[type(node.op)]
        for new in ASSIGN_VARIANTS[word]:
            if new == "=":
                def to_assign(n: Any) -> tuple[ast.AST, ast.AST]:
                    a = ast.Assign(targets=[n.target], value=n.value, lineno=0)
                    return a, a
                yield "op_assign", new, _replace_with(to_assign, "op", word)
            else:
                yield "op_assign", new, _edit_in_place(_set_op(new), "op", word)
    elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        def to_aug(n: Any) -> tuple[ast.AST, ast.AST]:
            a = ast.AugAssign(target=n.targets[0], op=ast.Add(), value=n.value, lineno=0)
            return a, a
        yield "op_assign", "+=", _replace_with(to_aug, "op", "=")
    simple = not hasattr(node, "body") and node.lineno == node.end_lineno
    block = getattr(slot.parent, slot.field or "", None)
    if not simple or not isinstance(block, list) or slot.index is None:
        return
    if len(block) >= 2 and isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Return,
                                             ast.Break, ast.Continue, ast.Raise)):
        code = ast.unparse(node)
        line = node.lineno

        def drop(s: Slot) -> _Plan:
            del getattr(s.parent, s.field or "")[s.index or 0]
            return _Plan(line_call=f"insert {line} {code}")
        yield "line_drop", "", drop
    if isinstance(node, ast.AugAssign) or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
        line = node.lineno

        def dup(s: Slot) -> _Plan:
            getattr(s.parent, s.field or "").insert((s.index or 0) + 1, ast.parse(ast.unparse(s.node)).body[0])
            return _Plan(line_call=f"delete {line + 1}")
        yield "line_dup", "", dup


def _var_variants(slot: Slot, ctx: _Context) -> Iterator[tuple[str, str, Recipe]]:
    node = slot.node
    if not (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in ctx.variables
            and not (isinstance(slot.parent, ast.Call) and slot.field == "func")):
        return
    others = [v for v in ctx.variables if v != node.id][:3]
    for other in others:
        def change(n: Any, other: str = other) -> None:
            n.id = other
        yield "var_replace", other, _edit_in_place(change, "name", arg_ident=node.id)


def _swap_variants(slot: Slot, ctx: _Context) -> Iterator[tuple[str, str, Recipe]]:
    node = slot.node
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and isinstance(slot.parent, ast.Assign) \
            and len(slot.parent.targets) == 1 and isinstance(slot.parent.targets[0], ast.Name) \
            and any(isinstance(s, ast.Name) and s.id == slot.parent.targets[0].id for s in (node.left, node.right)) \
            and ast.dump(node.left) != ast.dump(node.right):
        yield "prepend", "", _edit_in_place(_swapper(0), "swap")
        return
    if isinstance(node, ast.BinOp) and isinstance(node.op, _COMMUTATIVE):
        return
    if isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)):
        return
    if isinstance(node, ast.BoolOp):
        return
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("min", "max", "zip"):
        return
    pairs = swap_children(node)
    for i, (a, b) in enumerate(pairs):
        if ast.dump(a) == ast.dump(b):
            continue
        yield "operand_swap", f"c{i}", _edit_in_place(_swapper(i), "swap", None if len(pairs) == 1 else f"c{i}")


def _swapper(position: int) -> Callable[[Any], None]:
    return lambda node: swap_pair(node, position)


def _is_number_like(node: ast.AST) -> bool:
    return isinstance(node, (ast.Name, ast.Call, ast.Subscript, ast.Attribute, ast.BinOp)) or \
        (isinstance(node, ast.Constant) and type(node.value) is int)


def _is_plus_minus_one(node: ast.AST) -> bool:
    return isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)) and \
        isinstance(node.right, ast.Constant) and node.right.value == 1 and type(node.right.value) is int


def _plus1_variants(slot: Slot, ctx: _Context) -> Iterator[tuple[str, str, Recipe]]:
    node, parent = slot.node, slot.parent
    if is_value(slot) and _is_number_like(node) and not _is_plus_minus_one(node) and (
            (isinstance(parent, ast.Subscript) and slot.field == "slice") or isinstance(parent, ast.Slice)
            or (isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id == "range")
            or isinstance(parent, ast.Compare) or isinstance(parent, ast.Return)):
        for op, word in ((ast.Add, "+1"), (ast.Sub, "-1")):
            def build(n: Any, op: type = op) -> tuple[ast.AST, ast.AST]:
                new = ast.BinOp(left=n, op=op(), right=ast.Constant(1))
                return new, new
            yield "plus1_added", word, _replace_with(build, "unwrap", "c0")
    if is_value(slot) and _is_plus_minus_one(node):
        assert isinstance(node, ast.BinOp)
        mutation = "plus1" if isinstance(node.op, ast.Add) else "minus1"

        def drop(n: Any) -> tuple[ast.AST, ast.AST]:
            return n.left, n.left
        yield "plus1_missing", "", _replace_with(drop, mutation)


def _const_variants(slot: Slot, ctx: _Context) -> Iterator[tuple[str, str, Recipe]]:
    node = slot.node
    if not is_value(slot):
        return
    literal = isinstance(node, (ast.Constant, ast.UnaryOp, ast.List, ast.Tuple, ast.Dict))
    word = _WORD_OF_DUMP.get(ast.dump(node)) if literal else None
    if word is None:
        return
    for new in CONST_VARIANTS[word]:
        def build(n: Any, new: Any = new) -> tuple[ast.AST, ast.AST]:
            made = constant_node(new) if isinstance(new, str) and new in CONSTANT_WORDS else ast.Constant(new)
            return made, made
        yield "const_change", repr(new), _replace_with(build, "const", word)


def _listify_variants(slot: Slot, ctx: _Context) -> Iterator[tuple[str, str, Recipe]]:
    node = slot.node
    if not is_value(slot):
        return
    if isinstance(node, ast.List) and len(node.elts) == 1 and not isinstance(node.elts[0], ast.Starred):
        yield "listify_drop", "", _replace_with(lambda n: (n.elts[0], n.elts[0]), "listify")
    if (isinstance(node, (ast.List, ast.Tuple, ast.Dict)) and not getattr(node, "elts", getattr(node, "keys", [])))\
            or (isinstance(node, ast.Name) and isinstance(slot.parent, ast.Return)):
        def build(n: Any) -> tuple[ast.AST, ast.AST]:
            new = ast.List(elts=[n], ctx=ast.Load())
            return new, new
        yield "listify_add", "", _replace_with(build, "unwrap", "c0")


def _slice_variants(slot: Slot, ctx: _Context) -> Iterator[tuple[str, str, Recipe]]:
    node, parent = slot.node, slot.parent
    if isinstance(node, ast.Subscript) and is_value(slot) and isinstance(node.slice, ast.Slice) \
            and node.slice.step is None and (node.slice.lower is None) != (node.slice.upper is None):
        lower = node.slice.lower is not None
        mutation = "slice_from" if lower else "slice_to"

        def bound(n: Any) -> ast.AST:
            s = n.slice
            return s.lower if s.lower is not None else s.upper
        yield "slice_drop", "", _replace_with(lambda n: (n.value, n.value), mutation,
                                              arg_from=bound)
    if is_value(slot) and isinstance(node, (ast.Name, ast.Attribute, ast.Call)) and \
            isinstance(parent, (ast.For, ast.comprehension)) and slot.field == "iter":
        for variant, bounds in (("[1:]", {"lower": ast.Constant(1)}),
                                ("[:-1]", {"upper": ast.UnaryOp(op=ast.USub(), operand=ast.Constant(1))})):
            def build(n: Any, bounds: dict = bounds) -> tuple[ast.AST, ast.AST]:
                new = ast.Subscript(value=n, slice=ast.Slice(**bounds), ctx=ast.Load())
                return new, new
            yield "slice_add", variant, _replace_with(build, "unwrap", "c0")


def _attr_variants(slot: Slot, ctx: _Context) -> Iterator[tuple[str, str, Recipe]]:
    node = slot.node
    if not isinstance(node, ast.Attribute) or not isinstance(node.ctx, ast.Load):
        return
    called = isinstance(slot.parent, ast.Call) and slot.field == "func"
    if called:
        for new in METHOD_VARIANTS.get(node.attr, ()):
            def change(n: Any, new: str = new) -> None:
                n.attr = new
            yield "method_replace", new, _edit_in_place(change, "attr", arg_ident=node.attr)
    else:
        for new in ctx.fields:
            if new != node.attr:
                def change(n: Any, new: str = new) -> None:
                    n.attr = new
                yield "field_replace", new, _edit_in_place(change, "attr", arg_ident=node.attr)


def _arith_variants(slot: Slot, ctx: _Context) -> Iterator[tuple[str, str, Recipe]]:
    node = slot.node
    if is_value(slot) and isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)) \
            and not _is_plus_minus_one(node) and (isinstance(node.right, ast.Name) or ast.dump(node.right) in
                                                  ctx.constant_dumps) and _is_number_like(node.left):
        mutation = {ast.Add: "extend_add", ast.Sub: "extend_sub", ast.Mult: "extend_mul"}[type(node.op)]
        yield "arith_drop", "", _replace_with(lambda n: (n.left, n.left), mutation,
                                              arg_from=lambda n: n.right)


def _call_variants(slot: Slot, ctx: _Context) -> Iterator[tuple[str, str, Recipe]]:
    node, parent = slot.node, slot.parent
    if isinstance(node, ast.Call) and is_value(slot) and isinstance(node.func, ast.Name) \
            and node.func.id in WRAP_WORDS and len(node.args) == 1 and not node.keywords \
            and not isinstance(node.args[0], ast.Starred):
        yield "call_drop", "", _replace_with(lambda n: (n.args[0], n.args[0]), "wrap",
                                             node.func.id)
    add = None
    if is_value(slot) and isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
        add = "abs"
    elif is_value(slot) and isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        add = "int"
    elif is_value(slot) and isinstance(node, (ast.Name, ast.Call)) and \
            isinstance(parent, (ast.For, ast.comprehension)) and slot.field == "iter" and \
            not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                 and node.func.id in ("sorted", "range")):
        add = "sorted"
    if add is not None:
        def build(n: Any, add: str = add) -> tuple[ast.AST, ast.AST]:
            new = ast.Call(func=ast.Name(id=add, ctx=ast.Load()), args=[n], keywords=[])
            return new, new
        yield "call_add", add, _replace_with(build, "unwrap", "c0")
    if isinstance(node, ast.Name) and isinstance(parent, ast.Call) and slot.field == "func" \
            and isinstance(node.ctx, ast.Load):
        for new in CALL_VARIANTS.get(node.id, ()):
            def change(n: Any, new: str = new) -> None:
                n.id = new
            yield "call_replace", new, _edit_in_place(change, "name", node.id)


def _cond_variants(slot: Slot, ctx: _Context) -> Iterator[tuple[str, str, Recipe]]:
    node, parent = slot.node, slot.parent
    if isinstance(node, ast.BoolOp) and is_value(slot) and \
            (isinstance(node.values[-1], ast.Name) or ast.dump(node.values[-1]) in ctx.constant_dumps):
        mutation = "extend_and" if isinstance(node.op, ast.And) else "extend_or"

        def drop(n: Any) -> tuple[ast.AST, ast.AST]:
            values = n.values[:-1]
            kept = values[0] if len(values) == 1 else ast.BoolOp(op=n.op, values=values)
            return kept, kept
        yield "cond_drop", "", _replace_with(drop, mutation, arg_from=lambda n: n.values[-1])
    test = is_value(slot) and ((isinstance(parent, _TEST_PARENTS) and slot.field == "test")
                               or (isinstance(parent, ast.comprehension) and slot.field == "ifs"))
    if test and isinstance(node, ast.Name) and isinstance(parent, (ast.If, ast.While, ast.IfExp)):
        yield "cond_true", "", _true_recipe(node.id)
    if test and not isinstance(node, ast.Constant) and ctx.params:
        for op, word in ((ast.And, "and"), (ast.Or, "or")):
            def build(n: Any, op: type = op) -> tuple[ast.AST, ast.AST]:
                new = ast.BoolOp(op=op(), values=[n, ast.Name(id=ctx.params[0], ctx=ast.Load())])
                return new, new
            yield "cond_add", word, _replace_with(build, "unwrap", "c0")
    if is_condition(slot) and (test or isinstance(node, ast.Compare)):
        def negate(n: Any) -> tuple[ast.AST, ast.AST]:
            new = ast.UnaryOp(op=ast.Not(), operand=n)
            return new, new
        yield "negate_add", "", _replace_with(negate, "unwrap", "c0")
    if is_value(slot) and isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        yield "negate_drop", "", _replace_with(lambda n: (n.operand, n.operand), "negate")


def _true_recipe(identifier: str) -> Recipe:
    def recipe(slot: Slot) -> _Plan:
        new = ast.Constant(True)
        _put(slot, new)
        return _Plan(new, "name", arg_ident=identifier)
    return recipe


_EXPRESSION_FAMILIES = (_op_variants, _var_variants, _swap_variants, _plus1_variants, _const_variants,
                        _listify_variants, _slice_variants, _attr_variants, _arith_variants, _call_variants,
                        _cond_variants)


@dataclass(frozen=True)
class _Context:
    """What the families need to know of the entry function."""

    variables: tuple[str, ...]        # parameters and assigned names, in order of appearance
    params: tuple[str, ...]
    fields: tuple[str, ...]           # attribute names read but never called
    constant_dumps: frozenset[str]    # dumps of the constant words


_WORD_OF_DUMP = {ast.dump(constant_node(w)): w for w in CONSTANT_WORDS}
_CONSTANT_DUMPS = frozenset(_WORD_OF_DUMP)


def _entry(tree: ast.Module, entry: str) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == entry:
            return node
    raise InjectionError(f"no top-level function {entry!r} in the source : give the name the tests call")


def _context(function: ast.FunctionDef) -> _Context:
    params = [a.arg for a in function.args.posonlyargs + function.args.args + function.args.kwonlyargs]
    variables = list(params)
    called: set[str] = set()
    fields: list[str] = []
    located: list[Any] = [n for n in ast.walk(function) if hasattr(n, "lineno")]
    for node in sorted(located, key=lambda n: (n.lineno, n.col_offset)):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id not in variables:
            variables.append(node.id)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            called.add(node.func.attr)
        if isinstance(node, ast.Attribute) and node.attr not in fields:
            fields.append(node.attr)
    return _Context(tuple(variables), tuple(params), tuple(f for f in fields if f not in called),
                    _CONSTANT_DUMPS)


@lru_cache(maxsize=512)
def candidates(source: str, entry: str) -> tuple[Candidate, ...]:
    """Every raw candidate of the entry function, in order (site, then :data:`FAMILY_ORDER`, then variant).

    :param source: a normalised source
    :param entry: the name of the top-level function to inject into
    :raises InjectionError: no such function
    """
    tree = analysis(source).sites.tree
    function = _entry(tree, entry)
    ctx = _context(function)
    first, last = function.lineno, function.end_lineno or function.lineno
    found: list[Candidate] = []
    for (line, k), slot in sorted(analysis(source).sites.slots.items()):
        if not first <= line <= last or (line, k) == (first, 0):
            continue
        produced: list[tuple[str, str, Recipe]] = []
        if k == 0:
            produced += _statement_variants(slot, ctx)
        else:
            for family_fn in _EXPRESSION_FAMILIES:
                produced += family_fn(slot, ctx)
        produced.sort(key=lambda p: FAMILY_ORDER.index(p[0]))  # stable: variants keep their order
        found += [Candidate(family, (line, k), variant, recipe) for family, variant, recipe in produced]
    return tuple(found)


def candidates_digest(source: str, entry: str) -> str:
    """A short digest of the candidate keys: stored indices are valid only while it is unchanged."""
    keys = "\n".join(c.key for c in candidates(source, entry))
    return hashlib.sha256(keys.encode()).hexdigest()[:12]


def _path_to(tree: ast.AST, target: ast.AST) -> list[tuple[str, int | None]] | None:
    """The (field, index) steps from ``tree`` to ``target`` (by identity), or None."""
    todo: list[tuple[ast.AST, list[tuple[str, int | None]]]] = [(tree, [])]
    while todo:
        node, path = todo.pop()
        if node is target:
            return path
        for field, value in ast.iter_fields(node):
            if isinstance(value, list):
                todo += [(v, path + [(field, i)]) for i, v in enumerate(value) if isinstance(v, ast.AST)]
            elif isinstance(value, ast.AST):
                todo.append((value, path + [(field, None)]))
    return None


def _follow(tree: ast.AST, path: list[tuple[str, int | None]]) -> ast.AST | None:
    node: ast.AST = tree
    for field, index in path:
        value = getattr(node, field, None)
        if index is not None:
            value = value[index] if isinstance(value, list) and index < len(value) else None
        if not isinstance(value, ast.AST):
            return None
        node = value
    return node


def _materialise(source: str, candidate: Candidate) -> Injection | None:
    """Apply a candidate's recipe to a fresh parse of ``source``; the Injection if its repair is writable and
    gives back ``source`` exactly, else None."""
    tree = ast.parse(source)
    slot = site_table(tree).slots.get(candidate.site)
    if slot is None:
        return None
    plan = candidate.recipe(slot)
    path = _path_to(tree, plan.target) if plan.target is not None else None
    try:
        buggy = normalise(ast.unparse(tree))
    except (SyntaxError, ValueError, RecursionError):
        return None
    if buggy == source:
        return None
    if plan.line_call is not None:
        call = plan.line_call
    else:
        if path is None:
            return None
        buggy_analysis = analysis(buggy)
        target = _follow(buggy_analysis.sites.tree, path)
        site = next((s for s, sl in buggy_analysis.sites.slots.items() if sl.node is target), None)
        if site is None:
            return None
        arg = plan.arg
        if plan.arg_ident is not None:
            arg = buggy_analysis.names.slot_of(plan.arg_ident)
        elif plan.arg_node is not None:
            arg = _arg_word(plan.arg_node, buggy_analysis.names.slot_of)
        if arg is None and (plan.arg_ident is not None or plan.arg_node is not None):
            return None
        call = Edit(site[0], site[1], plan.mutation, arg).call
    try:
        with warnings.catch_warnings():  # "is" with a literal, after const_change on `x is None`
            warnings.simplefilter("ignore")
            compile(buggy, "<mutant>", "exec", dont_inherit=True)
        if apply_repair(buggy, call) != source:
            return None
    except (EditError, SyntaxError, ValueError):
        return None
    return Injection(candidate.family, classes_of(candidate.family), candidate.site, buggy, call, candidate.key)


def candidate(source: str, entry: str, key: str) -> Candidate:
    """The raw candidate with this key.

    :raises InjectionError: no such candidate
    """
    found = _by_key(source, entry).get(key)
    if found is None:
        raise InjectionError(f"no candidate {key} in {entry} : the stored mutants are stale, regenerate them")
    return found


@lru_cache(maxsize=512)
def _by_key(source: str, entry: str) -> dict[str, Candidate]:
    return {c.key: c for c in candidates(source, entry)}


def injection(source: str, entry: str, key: str) -> Injection:
    """The injection of the raw candidate with this key, built alone and checked.

    :raises InjectionError: no such candidate, or its repair is not writable
    """
    made = _materialise(source, candidate(source, entry, key))
    if made is None:
        raise InjectionError(f"candidate {key} has no writable repair : regenerate the stored mutants")
    return made


@lru_cache(maxsize=256)
def injections(source: str, entry: str) -> tuple[Injection, ...]:
    """Every injection of the entry function whose repair is writable, in candidate order, distinct buggy
    sources only (the first candidate giving a text keeps it).

    :param source: a normalised source (:func:`~bugfix_gym.edits.sites.normalise`)
    :param entry: the top-level function to inject into
    :raises InjectionError: no such function
    """
    out: list[Injection] = []
    seen: set[str] = {source}
    for found in candidates(source, entry):
        made = _materialise(source, found)
        if made is not None and made.buggy_source not in seen:
            seen.add(made.buggy_source)
            out.append(made)
    return tuple(out)


def second_injection(first: Injection, original: str, entry: str, key: str) -> Injection | None:
    """A second bug on top of ``first``: the raw candidate ``key`` of ``original``, applied to
    ``first.buggy_source``. It must sit on an earlier line than ``first`` (so its site is the same in both
    sources); its repair gives back ``first.buggy_source``, whose own repair gives back ``original``.

    :returns: the second injection (``buggy_source`` the two-bug source), or None where it does not apply
    """
    second = _by_key(original, entry).get(key)
    if second is None or second.site[0] >= first.site[0]:
        return None
    return _materialise(first.buggy_source, second)
