"""The call grammar and the words the tools answer with.

Nine legal calls: ``read``, ``test``, ``edit <fix_op>`` (five ops), ``revert``, ``submit``.
Anything else is an invalid call; :func:`parse_call` never raises. A call is legal only if it
lies inside the action space (at most ``MAX_ACTION_CHARS`` characters of ``CHARSET``) and
parses; both functions look at no more than a bounded prefix of the text, so a huge action
costs no more than a short one.
"""

from __future__ import annotations

import string

from ..edits.ops import FIX_OPS

CHARSET = string.printable  # explicit: gymnasium's Text default is alphanumeric only
MAX_ACTION_CHARS = 64
_CHARS = frozenset(CHARSET)

CALLS: tuple[str, ...] = ("read", "test", *(f"edit {op}" for op in FIX_OPS), "revert", "submit")
CALL_INDEX = {call: i for i, call in enumerate(CALLS)}
REVERT = CALL_INDEX["revert"]
MENU = " | ".join(CALLS)
HIDEABLE = ("read", "test")  # tools whose output bugfix_gym.views.text_wrappers.HideOutputs can blank
HIDDEN_OUTPUT = "output hidden"  # what a hidden tool answers

# Words the tools can say, so the tokenizer knows them even before any task is seen.
VOCABULARY_TEXT = (
    "fix the function : . calls : " + MENU + " | "
    "visible tests passed , first failure expected got raised Timeout the code does not load "
    "changed line no change reverted to the original source nothing to revert hidden tests failed "
    "invalid call unknown edit op is not a call empty turn budget exhausted True False None [ ] ( ) "
    "ZeroDivisionError IndexError TypeError NameError SyntaxError ValueError RecursionError "
    "AttributeError KeyError UnboundLocalError IndentationError ... - '"
)


def in_action_space(text: str) -> bool:
    """At most ``MAX_ACTION_CHARS`` characters, all from ``CHARSET`` (the length is checked first)."""
    return len(text) <= MAX_ACTION_CHARS and _CHARS.issuperset(text)


def parse_call(text: str) -> tuple[str, str | None] | None:
    """``' edit fix_init '`` -> ``('edit', 'fix_init')``; ``'read'`` -> ``('read', None)``; else None.

    Text outside the action space (too long, or a character outside ``CHARSET`` such as a
    unicode space) is never a call.
    """
    if not in_action_space(text):
        return None
    words = text.split()
    if len(words) == 1 and words[0] in ("read", "test", "revert", "submit"):
        return words[0], None
    if len(words) == 2 and words[0] == "edit" and words[1] in FIX_OPS:
        return "edit", words[1]
    return None


def why_invalid(text: str) -> str:
    """One line telling the agent what was wrong with an invalid call."""
    if not in_action_space(text):  # never split a huge text; unicode separators are not separators
        return f"invalid call : {_echo(text)} is not a call"
    words = text.split()
    if not words:
        return "invalid call : empty turn . calls : " + MENU
    if words[0] == "edit" and len(words) == 2:
        return f"invalid call : unknown edit op {_echo(words[1])} . ops : {' | '.join(FIX_OPS)}"
    return f"invalid call : {_echo(text.strip())} is not a call"


def _echo(text: str, limit: int = 40) -> str:
    """Quote a piece of the agent's text safely: printable ASCII only, at most ``limit`` chars."""
    clean = "".join(c if 32 <= ord(c) < 127 else "?" for c in text[: limit + 1])
    return "'" + (clean if len(clean) <= limit else clean[: limit - 3] + "...") + "'"


def prompt(task, statement: str | None = None) -> str:
    """The prompt the agent sees at reset: statement (the task's, unless given) plus call menu."""
    return f"fix the function {task.name} : {task.statement if statement is None else statement} . calls : {MENU}"
