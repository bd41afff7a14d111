"""Applying one sited edit (``edit L.K MUTATION [ARG]``) to a source.

:func:`apply_edit` accepts exactly the edits :func:`bugfix_gym.edits.sites.legal_edits` lists (the legal set
is the only gate, so "legal" and "applies" never disagree), rewrites the site's node in a fresh parse of the
source and returns the result normalised. Anything else is an :class:`EditError` whose one-line message says
what the site takes.
"""

from __future__ import annotations

import ast
from typing import Any

from .sites import (CONSTANT_WORDS, MAX_EXPRS, MAX_LINES, MUTATIONS, Edit, EditError, Names, Slot, analysis,
                    constant_node, is_legal, normalise, op_node, site_table, unwrap_children)

__all__ = ("EditError", "apply_edit", "describe_site", "swap_pair")


def _argument_node(arg: str, names: Names) -> ast.expr:
    """The expression an argument word stands for: a constant, or a read of the identifier it names."""
    if arg in CONSTANT_WORDS:
        return constant_node(arg)
    return ast.Name(id=names.identifier(arg), ctx=ast.Load())


def _put(slot: Slot, new: ast.AST) -> None:
    """Put ``new`` where the slot's node was."""
    assert slot.parent is not None and slot.field is not None
    if slot.index is None:
        setattr(slot.parent, slot.field, new)
    else:
        getattr(slot.parent, slot.field)[slot.index] = new


def swap_pair(node: Any, position: int) -> None:
    """Exchange the neighbouring pair ``position`` of :func:`~bugfix_gym.edits.sites.swap_children`."""
    i = position
    if isinstance(node, ast.BinOp):
        node.left, node.right = node.right, node.left
    elif isinstance(node, ast.Compare):
        node.left, node.comparators[0] = node.comparators[0], node.left
    elif isinstance(node, ast.Slice):
        node.lower, node.upper = node.upper, node.lower
    elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Subscript):
        node.slice, node.value.slice = node.value.slice, node.slice
    else:
        items = node.values if isinstance(node, ast.BoolOp) else node.args if isinstance(node, ast.Call) \
            else node.elts
        items[i], items[i + 1] = items[i + 1], items[i]


def _mutated(slot: Slot, edit: Edit, names: Names) -> ast.AST:
    """The node that replaces the site's node (the node itself when it was changed in place)."""
    node: Any = slot.node
    mutation, arg = edit.mutation, edit.arg
    if mutation == "op":
        assert arg is not None
        if isinstance(node, ast.AugAssign) and arg == "=":
            return ast.Assign(targets=[node.target], value=node.value, lineno=node.lineno)
        if isinstance(node, ast.Assign):
            target: Any = node.targets[0]  # a Name, Attribute or Subscript: legal_edits checked
            return ast.AugAssign(target=target, op=op_node(arg), value=node.value, lineno=node.lineno)
        if isinstance(node, ast.Compare):
            node.ops[0] = op_node(arg)
        else:
            node.op = op_node(arg)
        return node
    if mutation == "swap":
        swap_pair(node, 0 if arg is None else int(arg[1:]))
        return node
    if mutation == "name":
        assert arg is not None
        if isinstance(node, ast.Constant):  # True / False / None -> a name
            return ast.Name(id=names.identifier(arg), ctx=ast.Load())
        assert isinstance(node, ast.Name)
        node.id = names.identifier(arg)
        return node
    if mutation == "attr":
        assert isinstance(node, ast.Attribute) and arg is not None
        node.attr = names.identifier(arg)
        return node
    if mutation == "const":
        assert arg is not None
        return constant_node(arg)
    if mutation in ("plus1", "minus1"):
        return ast.BinOp(left=node, op=ast.Add() if mutation == "plus1" else ast.Sub(), right=ast.Constant(1))
    if mutation == "unwrap":
        assert arg is not None
        child = unwrap_children(node)[int(arg[1:])]
        assert child is not None
        return child
    if mutation == "negate":
        return ast.UnaryOp(op=ast.Not(), operand=node)
    if mutation == "wrap":
        assert arg is not None
        return ast.Call(func=ast.Name(id=arg, ctx=ast.Load()), args=[node], keywords=[])
    if mutation == "listify":
        return ast.List(elts=[node], ctx=ast.Load())
    assert arg is not None
    extra = _argument_node(arg, names)
    if mutation in ("extend_and", "extend_or"):
        op = ast.And() if mutation == "extend_and" else ast.Or()
        if isinstance(node, ast.BoolOp) and type(node.op) is type(op):
            node.values.append(extra)  # a and b -> a and b and x, as Python parses it
            return node
        return ast.BoolOp(op=op, values=[node, extra])
    if mutation in ("extend_add", "extend_sub", "extend_mul"):
        binop = {"extend_add": ast.Add, "extend_sub": ast.Sub, "extend_mul": ast.Mult}[mutation]()
        return ast.BinOp(left=node, op=binop, right=extra)
    assert mutation in ("slice_from", "slice_to"), mutation
    bound = ast.Slice(lower=extra) if mutation == "slice_from" else ast.Slice(upper=extra)
    return ast.Subscript(value=node, slice=bound, ctx=ast.Load())


def describe_site(node: ast.AST) -> str:
    """A site's node in a word or two, for messages (``'a Name'``, ``'the statement Assign'``)."""
    kind = type(node).__name__
    return f"the statement {kind}" if isinstance(node, ast.stmt) else f"a {kind}"


def _words(args: tuple[str | None, ...], limit: int = 8) -> str:
    shown = " ".join("(none)" if a is None else a for a in args[:limit])
    return shown if len(args) <= limit else f"{shown} ... ({len(args)} in all)"


def _refusal(source: str, edit: Edit) -> str:
    """The one-line message for an edit that is not legal."""
    where = f"{edit.line}.{edit.expr}"
    sites = analysis(source).sites.slots
    n_lines = len(source.splitlines())
    if edit.line > n_lines:
        return f"line {edit.line} is past the end of the source ({n_lines} lines) : read it and pick a line with code"
    if edit.line > MAX_LINES or edit.expr >= MAX_EXPRS:
        return f"site {where} is past the editable sites (lines 1-{MAX_LINES}, expressions 0-{MAX_EXPRS - 1}) : " \
               f"use patch on that line"
    if (edit.line, edit.expr) not in sites:
        count = sum(1 for (line, _) in sites if line == edit.line)
        if count == 0:
            return f"line {edit.line} has no site : read the source and pick a line with code"
        return f"line {edit.line} has sites {edit.line}.0-{edit.line}.{count - 1}, not {where}"
    node = sites[(edit.line, edit.expr)].node
    here = analysis(source).legal_at(edit.line, edit.expr)
    if not here:
        return f"no mutation applies at {where} ({describe_site(node)}) : try another site"
    if edit.mutation not in here:
        return f"{edit.mutation} does not apply at {where} ({describe_site(node)}) : here {' '.join(here)}"
    args = here[edit.mutation]
    if args == (None,):
        return f"{edit.mutation} takes no argument : write edit {where} {edit.mutation}"
    if edit.arg is None:
        return f"{edit.mutation} at {where} needs an argument : one of {_words(args)}"
    return f"{edit.mutation} at {where} does not take {edit.arg} (no change, or not writable there) : " \
           f"one of {_words(args)}"


def apply_edit(source: str, edit: Edit) -> str:
    """The source with one sited edit applied, normalised.

    :param source: the current source (normally normalised: its lines are what the agent reads)
    :param edit: the edit; legal iff :func:`~bugfix_gym.edits.sites.legal_edits` lists it
    :raises EditError: the edit is not legal here, or the source does not parse (a one-line message that says
        what the site takes)
    :raises TypeError: ``edit`` is not an :class:`~bugfix_gym.edits.sites.Edit`
    """
    if not isinstance(edit, Edit):
        raise TypeError(f"apply_edit takes an Edit, not {type(edit).__name__} (Edit.from_call parses call text)")
    if edit.mutation not in MUTATIONS:
        raise EditError(f"unknown mutation {edit.mutation!r} : one of {' '.join(MUTATIONS)}")
    if not is_legal(source, edit):
        raise EditError(_refusal(source, edit))
    tree = ast.parse(source)
    slot = site_table(tree).slots[(edit.line, edit.expr)]
    new = _mutated(slot, edit, analysis(source).names)
    if new is not slot.node:
        _put(slot, new)
    return normalise(ast.unparse(tree))
