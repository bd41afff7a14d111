"""BugFix-v1's sited edits: the fixed vocabularies, site numbering, the names table and the legal set.

An edit is written ``edit L.K MUTATION [ARG]``: line ``L`` (1-based, over the whole module), expression ``K``
of that line, one word of :data:`MUTATIONS` and, where the mutation takes one, one word of :data:`ARGS`. Every
source is read in its normalised form (:func:`normalise`: what ``ast.unparse`` writes), so a line holds one
simple statement or one compound header.

Sites
    ``K = 0`` is the statement that starts on line ``L``; ``K = 1, 2, ...`` are the expression nodes that start
    on line ``L``, in source order (a node before the nodes inside it, siblings left to right), not descending
    into nested statements, annotations (a parameter's, a return's, an annotated assignment's), the inside of
    an f-string or a ``match`` pattern. Lines past :data:`MAX_LINES` and expressions past ``MAX_EXPRS - 1`` are
    not editable (the policy's line and expression heads have those sizes).

The names table
    ``names_table(source)``: the identifiers of the source (variables, parameters, attribute names; not those
    only in imports or annotations, not the fixed words of :data:`ARGS`) in order of first appearance, at most
    :data:`MAX_NAMES`. ``nK`` in an argument means the table's entry ``K``; a fixed word (``len``, ``append``)
    is written as itself. So an unseen function's identifiers never make an edit unwritable.

Legality
    An edit is legal iff it applies at its site, the result compiles and it changes the source; this is decided
    structurally (node kinds, contexts, which children differ), never by trying candidates, and
    :func:`legal_edits` computes the whole set once per source text (cached). What each mutation does and where
    it applies is the table :data:`MUTATION_DOC`; ``docs/v1_edits.md`` has an example of each.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Iterator, Mapping

MAX_LINES = 64
"""Lines 1..MAX_LINES are editable by a sited edit (the line head's size)."""
MAX_EXPRS = 32
"""Sites K = 0..MAX_EXPRS-1 of a line are editable (the expression head's size)."""
MAX_NAMES = 40
"""Entries of the names table (``n0`` .. ``n39``)."""


class EditError(ValueError):
    """An edit that does not apply: its message is one line that says why and what to do."""


# ---------------------------------------------------------------------------------------------- vocabularies
MUTATIONS: tuple[str, ...] = (
    "op", "swap", "name", "attr", "const", "plus1", "minus1", "unwrap", "negate", "wrap",
    "extend_and", "extend_or", "extend_add", "extend_sub", "extend_mul", "slice_from", "slice_to", "listify",
)
"""The mutation head's vocabulary (fixed; :data:`MUTATION_DOC` says what each does)."""

MUTATION_DOC: Mapping[str, str] = MappingProxyType({
    "op": "replace the operator of a BinOp / BoolOp / Compare (its first) / AugAssign, or Assign <-> AugAssign "
          "(at K = 0), within its family; ARG = the new operator word",
    "swap": "swap two neighbouring operands / arguments / elements / slice bounds / subscripts; no ARG where "
            "there are two, else ARG = cI (swap I and I + 1)",
    "name": "replace a Name (read or assigned), or a True / False / None, by another identifier; ARG = nK or a "
            "fixed word the source uses as a variable (any builtin word where the name is called)",
    "attr": "replace an attribute or method name; ARG = a method word or nK of a name used as an attribute",
    "const": "replace a literal (number, string, True / False / None, a negative number, an empty [] {} ()); "
             "ARG = a constant word",
    "plus1": "e -> e + 1 (a number-like value: name, number, call, subscript, attribute, arithmetic)",
    "minus1": "e -> e - 1 (where plus1 applies)",
    "unwrap": "replace an expression by one of its children; ARG = cI (the operands of an operation, a call's "
              "receiver then positional arguments, an if-expression's two values, a subscript's value then "
              "index, the element of a one-element list / tuple / set)",
    "negate": "c -> not c (a condition: a test of if / while / assert / an if-expression / a comprehension, an "
              "operand of and / or, any comparison or and / or)",
    "wrap": "e -> f(e), f a builtin word of WRAP_WORDS (a value: name, call, subscript, attribute, "
            "arithmetic, display, comprehension)",
    "extend_and": "c -> c and x (where negate applies, and on not c); ARG = nK, a fixed word the source uses as a "
                  "variable, or a constant word",
    "extend_or": "c -> c or x (as extend_and)",
    "extend_add": "e -> e + x (where plus1 applies); ARG as extend_and",
    "extend_sub": "e -> e - x (as extend_add)",
    "extend_mul": "e -> e * x (as extend_add)",
    "slice_from": "e -> e[x:] (a name, call, subscript or attribute value); ARG as extend_and",
    "slice_to": "e -> e[:x] (as slice_from)",
    "listify": "e -> [e] (a value: name, call, subscript, attribute, arithmetic, literal, display)",
})

NAME_SLOTS: tuple[str, ...] = tuple(f"n{k}" for k in range(MAX_NAMES))
ARITH_OPS: tuple[str, ...] = ("+", "-", "*", "/", "//", "%", "**")
BIT_OPS: tuple[str, ...] = ("&", "|", "^", "<<", ">>")
COMPARE_OPS: tuple[str, ...] = ("<", "<=", ">", ">=", "==", "!=")
IDENTITY_OPS: tuple[str, ...] = ("is", "is_not")
MEMBER_OPS: tuple[str, ...] = ("in", "not_in")
BOOL_OPS: tuple[str, ...] = ("and", "or")
ASSIGN_OPS: tuple[str, ...] = ("=", "+=", "-=", "*=", "/=", "//=", "%=", "**=")
BIT_ASSIGN_OPS: tuple[str, ...] = ("&=", "|=", "^=", "<<=", ">>=")
OPERATOR_WORDS: tuple[str, ...] = (ARITH_OPS + BIT_OPS + COMPARE_OPS + IDENTITY_OPS + MEMBER_OPS + BOOL_OPS
                                   + ASSIGN_OPS + BIT_ASSIGN_OPS)
BUILTIN_WORDS: tuple[str, ...] = (
    "len", "abs", "min", "max", "sum", "sorted", "reversed", "int", "str", "float", "list", "set", "tuple",
    "dict", "bool", "range", "enumerate", "zip", "any", "all", "round", "ord", "chr", "bin", "isinstance",
    "map", "filter",
)
WRAP_WORDS: tuple[str, ...] = tuple(w for w in BUILTIN_WORDS if w not in ("isinstance", "map", "filter"))
"""The builtins ``wrap`` may call on one argument."""
METHOD_WORDS: tuple[str, ...] = (
    "append", "extend", "insert", "remove", "pop", "index", "count", "sort", "reverse", "copy", "clear",
    "keys", "values", "items", "get", "add", "update", "lower", "upper", "swapcase", "title", "capitalize",
    "split", "join", "strip", "lstrip", "rstrip", "replace", "find", "startswith", "endswith", "isdigit",
    "isalpha", "isupper", "islower", "isspace",
)
CONSTANT_WORDS: tuple[str, ...] = ("0", "1", "2", "3", "-1", "True", "False", "None", "''", "[]", "{}", "()")
POSITIONS: tuple[str, ...] = ("c0", "c1", "c2", "c3")
ARGS: tuple[str, ...] = NAME_SLOTS + OPERATOR_WORDS + BUILTIN_WORDS + METHOD_WORDS + CONSTANT_WORDS + POSITIONS
"""The argument head's vocabulary: the names table's slots, operator, builtin, method and constant words, positions."""

MUTATION_INDEX: Mapping[str, int] = MappingProxyType({w: i for i, w in enumerate(MUTATIONS)})
"""A mutation word's index in the mutation head."""
ARG_INDEX: Mapping[str, int] = MappingProxyType({w: i for i, w in enumerate(ARGS)})
"""An argument word's index in the argument head (``None``, no argument, has none: the env decides its slot)."""

IDENT_WORDS: frozenset[str] = frozenset(BUILTIN_WORDS + METHOD_WORDS)
"""The fixed words that are identifiers: never in a names table, written as themselves."""

_BINOPS: dict[str, type[ast.operator]] = {
    "+": ast.Add, "-": ast.Sub, "*": ast.Mult, "/": ast.Div, "//": ast.FloorDiv, "%": ast.Mod, "**": ast.Pow,
    "&": ast.BitAnd, "|": ast.BitOr, "^": ast.BitXor, "<<": ast.LShift, ">>": ast.RShift,
}
_CMPOPS: dict[str, type[ast.cmpop]] = {
    "<": ast.Lt, "<=": ast.LtE, ">": ast.Gt, ">=": ast.GtE, "==": ast.Eq, "!=": ast.NotEq,
    "is": ast.Is, "is_not": ast.IsNot, "in": ast.In, "not_in": ast.NotIn,
}
_BOOLOPS: dict[str, type[ast.boolop]] = {"and": ast.And, "or": ast.Or}
_WORD_OF: dict[type, str] = {cls: word for table in (_BINOPS, _CMPOPS, _BOOLOPS) for word, cls in table.items()}
_ASSIGN_WORD = {cls: word + "=" for word, cls in _BINOPS.items()}
_CONST_NODES: dict[str, str] = {w: ast.dump(ast.parse(w, mode="eval").body) for w in CONSTANT_WORDS}
_INT_WORDS = ("0", "1", "2", "3", "-1")


def op_node(word: str) -> Any:
    """The ``ast`` operator object of an operator word (``'<='`` -> ``ast.LtE()``); assignment words give the
    BinOp operator of their augmented form (``'+='`` -> ``ast.Add()``)."""
    word = word[:-1] if word in ASSIGN_OPS[1:] + BIT_ASSIGN_OPS else word
    for table in (_BINOPS, _CMPOPS, _BOOLOPS):
        if word in table:
            return table[word]()
    raise KeyError(word)


def op_word(op: ast.AST) -> str:
    """The word of an ``ast`` operator (``ast.NotIn()`` -> ``'not_in'``); KeyError for one with no word (``@``)."""
    return _WORD_OF[type(op)]


def constant_node(word: str) -> ast.expr:
    """A fresh node for a constant word (``'-1'`` -> ``UnaryOp(USub, Constant(1))``)."""
    return ast.parse(word, mode="eval").body


def normalise(source: str) -> str:
    """``source`` as ``ast.unparse`` writes it, ending in a newline: what the agent reads and edits."""
    return ast.unparse(ast.parse(source)) + "\n"


# ---------------------------------------------------------------------------------------------- the edit
@dataclass(frozen=True, order=True)
class Edit:
    """One sited edit: ``edit L.K MUTATION [ARG]``.

    :param line: the line ``L``, 1-based over the whole module
    :param expr: the site ``K`` on that line (0: the statement; 1..: its expressions starting on the line)
    :param mutation: a word of :data:`MUTATIONS`
    :param arg: a word of :data:`ARGS`, or None for a mutation that takes none
    """

    line: int
    expr: int
    mutation: str
    arg: str | None = None

    @property
    def call(self) -> str:
        """The call text: ``edit 3.2 op <=``, ``edit 5.0 swap``."""
        head = f"edit {self.line}.{self.expr} {self.mutation}"
        return head if self.arg is None else f"{head} {self.arg}"

    def __str__(self) -> str:
        return self.call

    @classmethod
    def from_call(cls, text: str) -> Edit:
        """Parse ``edit L.K MUTATION [ARG]`` (words separated by spaces; the words of this module only).

        :raises EditError: the text is not such a call (a one-line message saying the form)
        """
        parts = text.split()
        form = "write edit L.K MUTATION [ARG], e.g. edit 3.1 op <="
        if len(parts) not in (3, 4) or parts[0] != "edit":
            raise EditError(f"not an edit call : {form}")
        line, dot, expr = parts[1].partition(".")
        if not (dot and line.isdigit() and expr.isdigit() and line.isascii() and expr.isascii()):
            raise EditError(f"the site {clip_text(parts[1])} is not L.K (two numbers) : {form}")
        if parts[2] not in MUTATIONS:
            raise EditError(f"unknown mutation {clip_text(parts[2])} : one of {' '.join(MUTATIONS)}")
        arg = parts[3] if len(parts) == 4 else None
        if arg is not None and arg not in ARGS:
            raise EditError(f"unknown argument {clip_text(arg)} : a names-table slot nK, an operator, builtin, "
                            f"method or constant word, or a position cI")
        return cls(int(line), int(expr), parts[2], arg)


def clip_text(text: str, limit: int = 24) -> str:
    """``text`` in ASCII (other characters escaped), cut to ``limit`` characters and ``...``."""
    text = ascii(text)[1:-1]
    return text if len(text) <= limit else text[:limit] + "..."


# ---------------------------------------------------------------------------------------------- the sites
@dataclass(frozen=True)
class Slot:
    """A site's node and where it sits: ``parent.field`` (``[index]`` in a list field)."""

    node: ast.AST
    parent: ast.AST | None
    field: str | None
    index: int | None


_SKIPPED_FIELDS = frozenset({"annotation", "returns", "type_comment", "type_params"})


_INNER = (ast.comprehension, ast.keyword, ast.arguments, ast.excepthandler, ast.withitem, ast.match_case)
"""Nodes that are neither statements nor expressions but hold expressions (visited, not sites)."""
_BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")


def _expr_slots(stmt: ast.stmt) -> list[Slot]:
    """The expression nodes of one statement in pre-order, not inside nested statements, annotations,
    f-strings or match patterns."""
    out: list[Slot] = []

    def visit(node: ast.AST) -> None:
        for field in node._fields:
            if field in _SKIPPED_FIELDS or (field == "pattern" and isinstance(node, ast.match_case)):
                continue
            value = getattr(node, field, None)
            if isinstance(value, list):
                for index, item in enumerate(value):
                    if isinstance(item, ast.expr):
                        out.append(Slot(item, node, field, index))
                        if not isinstance(item, ast.JoinedStr):
                            visit(item)
                    elif isinstance(item, _INNER):
                        visit(item)
            elif isinstance(value, ast.expr):
                out.append(Slot(value, node, field, None))
                if not isinstance(value, ast.JoinedStr):
                    visit(value)
            elif isinstance(value, _INNER):
                visit(value)

    visit(stmt)
    return out


@dataclass(frozen=True)
class SiteTable:
    """A parsed source's sites: ``slots[(L, K)]`` (K = 0 the statement), the statements by line."""

    tree: ast.Module
    slots: Mapping[tuple[int, int], Slot]
    statements: Mapping[int, Slot]


def site_table(tree: ast.Module) -> SiteTable:
    """Number the sites of a parsed module (every site, past MAX_LINES / MAX_EXPRS too)."""
    slots: dict[tuple[int, int], Slot] = {}
    statements: dict[int, Slot] = {}
    by_line: dict[int, list[Slot]] = {}
    todo: list[tuple[ast.AST, str | None, int | None, ast.AST | None]] = [(tree, None, None, None)]
    while todo:
        node, field, index, parent = todo.pop()
        for name in reversed(_BLOCKS):
            block = getattr(node, name, None)
            if isinstance(block, list):
                todo += [(block[i], name, i, node) for i in reversed(range(len(block)))]
        if isinstance(node, ast.stmt):
            statements.setdefault(node.lineno, Slot(node, parent, field, index))
            for slot in _expr_slots(node):
                by_line.setdefault(slot.node.lineno, []).append(slot)  # type: ignore[attr-defined]
    for line, stmt_slot in statements.items():
        slots[(line, 0)] = stmt_slot
    for line, found in by_line.items():
        found.sort(key=lambda s: s.node.col_offset)  # type: ignore[attr-defined]  # stable: parent first
        for k, slot in enumerate(found, start=1):
            slots[(line, k)] = slot
    return SiteTable(tree, slots, statements)


# ---------------------------------------------------------------------------------------------- names
def _named_nodes(tree: ast.AST) -> Iterator[tuple[int, int, str, str]]:
    """``(line, col, identifier, kind)`` of every Name, parameter and attribute outside imports and annotations;
    kind is ``'name'`` (a Name read), ``'var'`` (a Name assigned, or a parameter), ``'attr'`` or ``'declared'`` (in a
    global / nonlocal statement)."""
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            yield from ((node.lineno, node.col_offset, ident, "declared") for ident in node.names)
        if isinstance(node, ast.Name):
            yield node.lineno, node.col_offset, node.id, "name" if isinstance(node.ctx, ast.Load) else "var"
        elif isinstance(node, ast.arg):
            yield node.lineno, node.col_offset, node.arg, "var"
        elif isinstance(node, ast.Attribute):
            yield node.end_lineno or node.lineno, node.end_col_offset or 0, node.attr, "attr"
        for field, value in ast.iter_fields(node):
            if field in _SKIPPED_FIELDS:
                continue
            if isinstance(value, list):
                todo.extend(v for v in value if isinstance(v, ast.AST))
            elif isinstance(value, ast.AST):
                todo.append(value)


@dataclass(frozen=True)
class Names:
    """The names of a source: the table (``nK`` -> identifier) and what the argument sets draw on."""

    table: tuple[str, ...]
    name_words: tuple[str, ...]  # fixed identifier words the source uses as variables, in ARGS order
    attr_slots: tuple[str, ...]  # the nK whose identifier is used as an attribute
    declared: frozenset[str]     # identifiers of global / nonlocal statements (never an argument)

    def slot_of(self, identifier: str) -> str | None:
        """How an identifier is written as an argument (``'n3'``, ``'len'``), or None if it cannot be."""
        if identifier in IDENT_WORDS:
            return identifier
        return f"n{self.table.index(identifier)}" if identifier in self.table else None

    def identifier(self, arg: str) -> str:
        """The identifier an argument word stands for (``'n3'`` -> the table's entry 3)."""
        return self.table[int(arg[1:])] if arg in NAME_SLOTS else arg


def _names(tree: ast.Module) -> Names:
    found = sorted(_named_nodes(tree), key=lambda t: (t[0], t[1]))
    table: list[str] = []
    attrs: set[str] = set()
    words: set[str] = set()
    for _, _, ident, kind in found:
        if kind == "declared":
            continue
        if kind == "attr":
            attrs.add(ident)
        elif kind == "var" and ident in IDENT_WORDS:
            words.add(ident)
        if ident not in IDENT_WORDS and ident not in table and len(table) < MAX_NAMES:
            table.append(ident)
    declared = frozenset(ident for _, _, ident, kind in found if kind == "declared")
    return Names(tuple(table), tuple(w for w in ARGS if w in words),
                 tuple(f"n{k}" for k, ident in enumerate(table) if ident in attrs), declared)


def names_table(source: str) -> tuple[str, ...]:
    """The source's names table: ``names_table(src)[K]`` is what ``nK`` stands for.

    :param source: Python source that parses
    """
    return _analysis(source).names.table


def names_line(table: tuple[str, ...]) -> str:
    """The table as ``read`` shows it: ``n0 = numbers , n1 = threshold``."""
    return " , ".join(f"n{k} = {ident}" for k, ident in enumerate(table))


# ---------------------------------------------------------------------------------------------- legality
_NUMBER_KINDS = (ast.Name, ast.Call, ast.Subscript, ast.Attribute, ast.BinOp)
_WRAP_KINDS = (ast.Name, ast.Call, ast.Subscript, ast.Attribute, ast.BinOp, ast.List, ast.Tuple, ast.Set, ast.Dict,
               ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
_LISTIFY_KINDS = (ast.Name, ast.Call, ast.Subscript, ast.Attribute, ast.BinOp, ast.List, ast.Tuple, ast.Set,
                  ast.Dict, ast.Constant)
_SLICE_KINDS = (ast.Name, ast.Call, ast.Subscript, ast.Attribute)
_BOOL_PARENTS = (ast.If, ast.While, ast.IfExp, ast.Assert)


def _is_number(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) in (int, float)


def _is_negative_number(node: ast.AST) -> bool:
    return isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and _is_number(node.operand)


def _is_load(node: ast.AST) -> bool:
    return isinstance(getattr(node, "ctx", ast.Load()), ast.Load)


def _has_slice(node: ast.AST) -> bool:
    return isinstance(node, ast.Tuple) and any(isinstance(e, ast.Slice) for e in node.elts)


def is_value(slot: Slot) -> bool:
    """A value any expression may replace: read (not assigned), not a starred item or slice, not a called name
    or an attribute's receiver, not the inner number of a negative number."""
    node, parent = slot.node, slot.parent
    return (isinstance(node, ast.expr) and not isinstance(node, (ast.Starred, ast.Slice)) and _is_load(node)
            and not _has_slice(node)
            and not (isinstance(parent, ast.Call) and slot.field == "func")
            and not (isinstance(parent, ast.Attribute) and slot.field == "value")
            and not (_is_number(node) and parent is not None and _is_negative_number(parent)))


def is_condition(slot: Slot, value: bool | None = None) -> bool:
    """A condition ``negate`` applies to: a test of if / while / assert / an if-expression / a comprehension,
    an operand of and / or, or any read comparison or and / or; never a literal or a ``not``.

    :param value: :func:`is_value` of the slot when known
    """
    node, parent = slot.node, slot.parent
    if not (is_value(slot) if value is None else value) or isinstance(node, ast.Constant) or \
            (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)):
        return False
    return (isinstance(node, (ast.Compare, ast.BoolOp))
            or (isinstance(parent, _BOOL_PARENTS) and slot.field == "test")
            or (isinstance(parent, ast.comprehension) and slot.field == "ifs")
            or isinstance(parent, ast.BoolOp))


def swap_children(node: ast.AST) -> list[tuple[ast.AST, ast.AST]]:
    """The neighbouring pairs ``swap`` exchanges, position I = the pair (I, I + 1)."""
    items: list[Any] = []
    if isinstance(node, ast.BinOp):
        items = [node.left, node.right]
    elif isinstance(node, ast.Compare) and len(node.ops) == 1:
        items = [node.left, node.comparators[0]]
    elif isinstance(node, ast.BoolOp):
        items = list(node.values)
    elif isinstance(node, ast.Call):
        items = list(node.args)
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = list(node.elts)
    elif isinstance(node, ast.Slice) and node.lower is not None and node.upper is not None:
        items = [node.lower, node.upper]
    elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Subscript):
        items = [node.value.slice, node.slice]
    return [(items[i], items[i + 1]) for i in range(min(len(items) - 1, len(POSITIONS)))]


def unwrap_children(node: ast.AST) -> list[ast.AST | None]:
    """The children ``unwrap`` may keep, position I = entry I (None: that position may not be kept)."""
    out: list[Any]
    if isinstance(node, ast.BinOp):
        out = [node.left, node.right]
    elif isinstance(node, ast.BoolOp):
        out = list(node.values)
    elif isinstance(node, ast.UnaryOp):
        out = [node.operand]
    elif isinstance(node, ast.Call):
        out = ([node.func.value] if isinstance(node.func, ast.Attribute) else []) + list(node.args)
    elif isinstance(node, ast.IfExp):
        out = [node.body, node.orelse]
    elif isinstance(node, ast.Subscript):
        out = [node.value] + ([] if isinstance(node.slice, ast.Slice) or _has_slice(node.slice) else [node.slice])
    elif isinstance(node, (ast.List, ast.Tuple, ast.Set)) and len(node.elts) == 1:
        out = [node.elts[0]]
    else:
        out = []
    return [None if isinstance(c, (ast.Starred, ast.Slice)) else c for c in out[: len(POSITIONS)]]


def const_dump(node: ast.AST) -> str | None:
    """The dump a ``const`` site compares constant words with, or None if the node is not a ``const`` site."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float, str, bool, type(None)):
        return ast.dump(node)
    if _is_negative_number(node):
        return ast.dump(node)
    if isinstance(node, (ast.List, ast.Tuple)) and not node.elts and _is_load(node):
        return ast.dump(ast.List(elts=[], ctx=ast.Load())) if isinstance(node, ast.List) else \
            ast.dump(ast.Tuple(elts=[], ctx=ast.Load()))
    if isinstance(node, ast.Dict) and not node.keys:
        return ast.dump(node)
    return None


def _op_args(node: ast.AST, is_statement: bool) -> tuple[str, ...]:
    if isinstance(node, ast.BinOp) and type(node.op) in _WORD_OF:
        word = op_word(node.op)
        family = ARITH_OPS if word in ARITH_OPS else BIT_OPS
        return tuple(w for w in family if w != word)
    if isinstance(node, ast.BoolOp):
        return tuple(w for w in BOOL_OPS if w != op_word(node.op))
    if isinstance(node, ast.Compare):
        word = op_word(node.ops[0])
        family = next(f for f in (COMPARE_OPS, IDENTITY_OPS, MEMBER_OPS) if word in f)
        return tuple(w for w in family if w != word)
    if is_statement and isinstance(node, ast.AugAssign) and type(node.op) in _ASSIGN_WORD:
        word = _ASSIGN_WORD[type(node.op)]
        family = ASSIGN_OPS if word in ASSIGN_OPS else ("=",) + BIT_ASSIGN_OPS
        return tuple(w for w in family if w != word)
    if is_statement and isinstance(node, ast.Assign) and len(node.targets) == 1 and \
            isinstance(node.targets[0], (ast.Name, ast.Attribute, ast.Subscript)):
        return ASSIGN_OPS[1:]
    return ()


@dataclass(frozen=True)
class _ArgSets:
    """The argument sets of one source, in ARGS order, and the identifier each word stands for."""

    names: tuple[str, ...]    # name: nK and the name words the source uses
    called: tuple[str, ...]   # name, at a called name: also every builtin word
    attrs: tuple[str, ...]    # attr: the method words and the nK used as attributes
    values: tuple[str, ...]   # extend_*, slice_*: names and constant words
    identifier: Mapping[str, str]


def _arg_sets(names: Names) -> _ArgSets:
    usable = {w for w in NAME_SLOTS[: len(names.table)] + names.name_words if names.identifier(w) not in names.declared}
    called = usable | set(BUILTIN_WORDS)
    attrs = set(METHOD_WORDS) | set(names.attr_slots)
    return _ArgSets(tuple(w for w in ARGS if w in usable), tuple(w for w in ARGS if w in called),
                    tuple(w for w in ARGS if w in attrs),
                    tuple(w for w in ARGS if w in usable or w in CONSTANT_WORDS),
                    {w: names.identifier(w) for w in usable | called | attrs})


def _site_legal(slot: Slot, is_statement: bool, sets: _ArgSets) -> dict[str, tuple[str | None, ...]]:
    """The legal mutations and their arguments at one site, in MUTATIONS and ARGS order."""
    node = slot.node
    legal: dict[str, tuple[str | None, ...]] = {}
    ops = _op_args(node, is_statement)
    if ops:
        legal["op"] = ops
    if is_statement:
        return legal
    pairs = swap_children(node)
    swappable = tuple(POSITIONS[i] for i, (a, b) in enumerate(pairs) if ast.dump(a) != ast.dump(b))
    if swappable:
        legal["swap"] = (None,) if len(pairs) == 1 else swappable
    ident = sets.identifier
    if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Del):
        called = isinstance(slot.parent, ast.Call) and slot.field == "func" and isinstance(node.ctx, ast.Load)
        args = tuple(w for w in (sets.called if called else sets.names) if ident[w] != node.id)
        if args:
            legal["name"] = args
    elif isinstance(node, ast.Constant) and type(node.value) in (bool, type(None)) and is_value(slot) and sets.names:
        legal["name"] = sets.names
    if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Del):
        args = tuple(w for w in sets.attrs if ident[w] != node.attr)
        if args:
            legal["attr"] = args
    value = is_value(slot)
    if not value:
        return legal
    dump = const_dump(node)
    if dump is not None:
        args = tuple(w for w in CONSTANT_WORDS if _CONST_NODES[w] != dump)
        if args:
            legal["const"] = args
    number = isinstance(node, _NUMBER_KINDS) or _is_number(node) or _is_negative_number(node)
    if number:
        legal["plus1"] = legal["minus1"] = (None,)
    kept = tuple(POSITIONS[i] for i, child in enumerate(unwrap_children(node)) if child is not None)
    if kept:
        legal["unwrap"] = kept
    condition = is_condition(slot, value)
    if condition:
        legal["negate"] = (None,)
    if isinstance(node, _WRAP_KINDS):
        legal["wrap"] = WRAP_WORDS
    if condition or (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)):
        legal["extend_and"] = legal["extend_or"] = sets.values
    if number:
        legal["extend_add"] = legal["extend_sub"] = legal["extend_mul"] = sets.values
    if isinstance(node, _SLICE_KINDS):
        legal["slice_from"] = legal["slice_to"] = sets.values
    if isinstance(node, _LISTIFY_KINDS) and (not isinstance(node, ast.Constant) or dump is not None):
        legal["listify"] = (None,)
    return legal


_NO_EDITS: Mapping[str, tuple[str | None, ...]] = MappingProxyType({})


class Analysis:
    """What legality needs of one source, computed once per text: its sites, its names, and (on first use) its
    legal set, whole or one site at a time.

    :param source: Python source that parses (SyntaxError otherwise)
    """

    def __init__(self, source: str) -> None:
        tree = ast.parse(source)
        self.sites = site_table(tree)
        self.names = _names(tree)
        self._sets = _arg_sets(self.names)
        self._legal: Mapping[tuple[int, int], Mapping[str, tuple[str | None, ...]]] | None = None
        self._at: dict[tuple[int, int], Mapping[str, tuple[str | None, ...]]] = {}

    def legal_at(self, line: int, expr: int) -> Mapping[str, tuple[str | None, ...]]:
        """The legal mutations at one site (empty where none, or past MAX_LINES / MAX_EXPRS)."""
        if self._legal is not None:
            return self._legal.get((line, expr), _NO_EDITS)
        found = self._at.get((line, expr))
        if found is None:
            slot = self.sites.slots.get((line, expr))
            if slot is None or line > MAX_LINES or expr >= MAX_EXPRS:
                return _NO_EDITS
            found = self._at[(line, expr)] = MappingProxyType(_site_legal(slot, expr == 0, self._sets))
        return found

    @property
    def legal(self) -> Mapping[tuple[int, int], Mapping[str, tuple[str | None, ...]]]:
        """``{(L, K): {mutation: (arg, ...)}}`` over every editable site with a legal mutation."""
        if self._legal is None:
            legal = {}
            for (line, k) in sorted(self.sites.slots):
                found = self.legal_at(line, k)
                if found:
                    legal[(line, k)] = found
            self._legal = MappingProxyType(legal)
        return self._legal


@lru_cache(maxsize=4096)
def _analysis(source: str) -> Analysis:
    return Analysis(source)


def analysis(source: str) -> Analysis:
    """The cached analysis of a source (sites, names, legal set); SyntaxError if it does not parse."""
    return _analysis(source)


def legal_edits(source: str) -> Mapping[tuple[int, int], Mapping[str, tuple[str | None, ...]]]:
    """Every legal sited edit of a source: ``{(L, K): {mutation: (arg, ...)}}``, sites in order, mutations in
    :data:`MUTATIONS` order, arguments in :data:`ARGS` order, ``(None,)`` for a mutation that takes none.

    Cached by source text (the mappings are read-only and shared). Every edit listed applies, compiles and changes
    the source; no other edit applies (:func:`bugfix_gym.edits.mutations.apply_edit`).

    :param source: Python source (normally a normalised one, so its lines are the ones the agent reads)
    :raises EditError: the source does not parse
    """
    try:
        return _analysis(source).legal
    except SyntaxError as exc:
        raise EditError(f"the source does not parse (line {exc.lineno}) : fix it with patch, insert or delete") \
            from None


def edit_list(source: str) -> tuple[Edit, ...]:
    """:func:`legal_edits` flattened to :class:`Edit` s, in site, mutation and argument order."""
    return tuple(Edit(line, k, mutation, arg) for (line, k), muts in legal_edits(source).items()
                 for mutation, args in muts.items() for arg in args)


def is_legal(source: str, edit: Edit) -> bool:
    """Whether ``edit`` is in :func:`legal_edits` of ``source`` (computing only its site's part).

    :raises EditError: the source does not parse
    """
    try:
        found = _analysis(source).legal_at(edit.line, edit.expr)
    except SyntaxError as exc:
        raise EditError(f"the source does not parse (line {exc.lineno}) : fix it with patch, insert or delete") \
            from None
    return edit.arg in found.get(edit.mutation, ())


__all__: tuple[str, ...] = (
    "ARGS", "ARG_INDEX", "ARITH_OPS", "ASSIGN_OPS", "BIT_ASSIGN_OPS", "BIT_OPS", "BOOL_OPS", "BUILTIN_WORDS",
    "COMPARE_OPS", "CONSTANT_WORDS", "Analysis", "Edit", "EditError", "IDENTITY_OPS", "IDENT_WORDS", "MAX_EXPRS",
    "MAX_LINES", "MAX_NAMES", "MEMBER_OPS", "METHOD_WORDS", "MUTATIONS", "MUTATION_DOC", "MUTATION_INDEX", "NAME_SLOTS",
    "Names", "OPERATOR_WORDS", "POSITIONS", "SiteTable", "Slot", "WRAP_WORDS", "analysis", "constant_node",
    "clip_text", "edit_list", "is_legal", "legal_edits", "names_line", "names_table", "normalise", "op_node", "op_word",
    "site_table",
)
