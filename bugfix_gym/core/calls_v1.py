"""BugFix-v1's call grammar: the text of one tool call, parsed, or a one-line reason it is not a call.

Nine kinds (:data:`CALL_KINDS`)::

    read [L]                  the numbered source (from line L)
    test                      the visible tests
    locate                    suspicious lines from the visible tests' coverage (Ochiai)
    edit L.K MUTATION [ARG]   a sited edit (bugfix_gym.edits.sites)
    patch L CODE              line L replaced by CODE, its indentation kept
    insert L CODE             CODE as a new line L, with line L's indentation
    delete L                  line L removed
    revert                    back to the task's source
    submit                    the hidden tests; the episode ends

A call lies inside the action space (at most :data:`MAX_ACTION_CHARS` characters of ``CHARSET``, checked
first, so a huge text costs no more than a short one) and parses; anything else raises :class:`CallError`
with a one-line message. Whether a parsed call applies to the current source (a legal site, code that
compiles) is the env's question.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..edits.sites import Edit, EditError
from .tools import CHARSET, _echo

__all__ = ("CALL_KINDS", "CALL_INDEX", "MAX_ACTION_CHARS", "MENU", "CallError", "ParsedCall", "in_action_space",
           "parse_call_v1")

CALL_KINDS: tuple[str, ...] = ("read", "test", "locate", "edit", "patch", "insert", "delete", "revert", "submit")
CALL_INDEX = {kind: i for i, kind in enumerate(CALL_KINDS)}
MAX_ACTION_CHARS = 256
MENU = ("read | test | locate | edit L.K MUTATION [ARG] | patch L CODE | insert L CODE | delete L | revert | "
        "submit")
_CHARS = frozenset(CHARSET)
_BARE = ("test", "locate", "revert", "submit")


class CallError(ValueError):
    """The text is not a BugFix-v1 call; the message is one line saying why."""


@dataclass(frozen=True)
class ParsedCall:
    """One parsed call.

    :param kind: a word of :data:`CALL_KINDS`
    :param edit: the sited edit of an ``edit`` call, else None
    :param line: the line of ``patch`` / ``insert`` / ``delete`` (and of ``read L``), else None
    :param code: the code of ``patch`` / ``insert`` (its outer blanks dropped), else None
    """

    kind: str
    edit: Edit | None = None
    line: int | None = None
    code: str | None = None


def in_action_space(text: str) -> bool:
    """At most :data:`MAX_ACTION_CHARS` characters, all from ``CHARSET`` (the length is checked first)."""
    return len(text) <= MAX_ACTION_CHARS and _CHARS.issuperset(text)


def _line_number(word: str, verb: str) -> int:
    if not (word.isascii() and word.isdigit()):
        raise CallError(f"{verb} takes a line number, not {_echo(word, 12)} : e.g. {verb} 3"
                        + (" CODE" if verb in ("patch", "insert") else ""))
    return int(word)


def parse_call_v1(text: str) -> ParsedCall:
    """``'edit 4.1 op <='`` -> ``ParsedCall('edit', Edit(4, 1, 'op', '<='))``; ``'patch 3 return x'`` ->
    ``ParsedCall('patch', line=3, code='return x')``; ``'read'`` -> ``ParsedCall('read')``.

    :raises CallError: the text is outside the action space or does not parse (a one-line message)
    """
    if not in_action_space(text):
        what = f"{len(text)} characters, more than {MAX_ACTION_CHARS}" if len(text) > MAX_ACTION_CHARS \
            else "a character outside printable ASCII"
        raise CallError(f"{_echo(text)} is not a call ({what})")
    words = text.split()
    if not words:
        raise CallError(f"empty turn . calls : {MENU}")
    verb = words[0]
    if verb in _BARE:
        if len(words) > 1:
            raise CallError(f"{verb} takes no argument")
        return ParsedCall(verb)
    if verb == "read":
        if len(words) > 2:
            raise CallError("read takes at most a line number : read, or read 12 to start at line 12")
        return ParsedCall("read", line=_line_number(words[1], "read") if len(words) == 2 else None)
    if verb == "edit":
        try:
            return ParsedCall("edit", edit=Edit.from_call(text))
        except EditError as exc:
            raise CallError(str(exc)) from None
    if verb == "delete":
        if len(words) != 2:
            raise CallError("write delete L, e.g. delete 3")
        return ParsedCall("delete", line=_line_number(words[1], "delete"))
    if verb in ("patch", "insert"):
        if len(words) < 3:
            raise CallError(f"write {verb} L CODE, e.g. {verb} 3 return x + 1")
        rest = text.strip()[len(verb):].lstrip()
        number, code = rest[: len(words[1])], rest[len(words[1]):]
        return ParsedCall(verb, line=_line_number(number, verb), code=code.strip())
    raise CallError(f"{_echo(text.strip())} is not a call . calls : {MENU}")
