"""BugFix-v1's calls as OpenAI tools: the schemas (shared by TRL's tool env, verifiers and any chat client) and the
mapping between a tool call and the call text the env reads.

The tools are the nine call kinds of :data:`bugfix_gym.core.calls_v1.CALL_KINDS`, each with typed arguments:
``read``, ``test``, ``locate``, ``edit(line, expr, mutation, arg)``, ``patch(line, code)``, ``insert(line, code)``,
``delete(line)``, ``revert``, ``submit``. ``edit``'s ``mutation`` is an enum of ``MUTATIONS``; its ``arg`` is
a word of ``ARGS`` (left out, or empty, for a mutation that takes none). A tool call the env would not accept
keeps what it says, so it reads as the invalid call it is (one line from the env, a lost turn), never raises.
Standard library only.
"""

from __future__ import annotations

import json
from typing import Any

from ..core.calls_v1 import CALL_KINDS, CallError, parse_call_v1
from ..edits.sites import MUTATIONS
from .chat import tool_call_parts

TOOL_DESCRIPTIONS_V1: dict[str, str] = {
    "read": "Show the current source with line numbers, and the names table (nK is entry K).",
    "test": "Run the visible tests on the current source: how many passed, and the first failure.",
    "locate": "Rank the lines by suspiciousness (Ochiai over the visible tests' line coverage).",
    "edit": "Apply a sited mutation at expression K of line L, e.g. line 3, expr 1, mutation op, arg <=.",
    "patch": "Replace line L by a new line of code (its indentation kept).",
    "insert": "Insert a new line of code before line L (with line L's indentation).",
    "delete": "Delete line L.",
    "revert": "Restore the task's original source.",
    "submit": "Run the hidden tests on the current source; this ends the episode.",
}
"""What each tool does (the tool methods of :class:`bugfix_gym.integrations.trl_v1.BugFixToolEnvV1` say the same)."""

_LINE = {"type": "integer", "minimum": 1, "description": "the line number L, as read shows it"}
_CODE = {"type": "string", "description": "one line of Python, without its indentation"}
ARGUMENTS_V1: dict[str, dict[str, Any]] = {
    "edit": {"line": _LINE,
             "expr": {"type": "integer", "minimum": 0,
                      "description": "the site K on the line: 0 the statement, 1.. its expressions in order"},
             "mutation": {"type": "string", "enum": list(MUTATIONS), "description": "the mutation"},
             "arg": {"type": "string", "description": "the mutation's argument (a names-table slot nK, an operator, "
                                                      "builtin, method or constant word, a position cI); "
                                                      "empty for a mutation that takes none"}},
    "patch": {"line": _LINE, "code": _CODE},
    "insert": {"line": _LINE, "code": _CODE},
    "delete": {"line": _LINE},
}
REQUIRED_V1: dict[str, list[str]] = {"edit": ["line", "expr", "mutation"], "patch": ["line", "code"],
                                     "insert": ["line", "code"], "delete": ["line"]}


def tool_schemas_v1() -> list[dict[str, Any]]:
    """The OpenAI ``tools`` list of BugFix-v1's nine calls."""
    schemas = []
    for name in CALL_KINDS:
        params = {"type": "object", "properties": dict(ARGUMENTS_V1.get(name, {})),
                  "required": list(REQUIRED_V1.get(name, [])), "additionalProperties": False}
        schemas.append({"type": "function", "function": {"name": name, "description": TOOL_DESCRIPTIONS_V1[name],
                                                         "parameters": params}})
    return schemas


def _word(value: Any) -> str:
    """An argument as the word the call text gets: a string as it is, an int as digits, anything else as its
    type in brackets (``<dict>``), which no call accepts."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return f"<{type(value).__name__}>"
    return str(value)


def call_text_v1(name: str, arguments: dict[str, Any]) -> str:
    """A tool's name and arguments -> the call text (``edit``, ``{"line": 3, "expr": 1, "mutation": "op", "arg":
    "<="}`` -> ``edit 3.1 op <=``). Missing arguments are left out, so the call reads as incomplete.

    :param name: the tool's name
    :param arguments: its arguments
    """
    get = arguments.get
    if name == "edit":
        arg = get("arg")
        site = f"{_word(get('line', ''))}.{_word(get('expr', ''))}"
        text = f"edit {site} {_word(get('mutation', ''))}"
        return text if arg in (None, "") else f"{text} {_word(arg)}"
    if name in ("patch", "insert"):
        return f"{name} {_word(get('line', ''))} {_word(get('code', ''))}"
    if name == "delete":
        return f"delete {_word(get('line', ''))}"
    return name


def call_of_tool_call_v1(tool_call: Any) -> str:
    """An OpenAI tool call (``{"function": {"name", "arguments"}}``, arguments a JSON string or an object) -> the
    call text BugFix-v1 reads. Arguments that are not JSON (or are too deep or too long a number) read as none.

    :param tool_call: one entry of an assistant message's ``tool_calls``
    :raises bugfix_gym.integrations.chat.ChatError: the entry has no function name (one line)
    """
    name, arguments = tool_call_parts(tool_call)
    return call_text_v1(name, arguments if isinstance(arguments, dict) else {})


def tool_call_of_v1(call: str) -> dict[str, Any] | None:
    """A call's text -> the ``function`` part of an OpenAI tool call (arguments a JSON string); None for text that
    is not a BugFix-v1 call.

    :param call: e.g. ``"edit 3.1 op <="`` or ``"patch 2 return x"``
    """
    try:
        parsed = parse_call_v1(call)
    except CallError:
        return None
    arguments: dict[str, Any] = {}
    if parsed.edit is not None:
        arguments = {"line": parsed.edit.line, "expr": parsed.edit.expr, "mutation": parsed.edit.mutation}
        if parsed.edit.arg is not None:
            arguments["arg"] = parsed.edit.arg
    elif parsed.kind in ("patch", "insert"):
        arguments = {"line": parsed.line, "code": parsed.code}
    elif parsed.kind == "delete":
        arguments = {"line": parsed.line}
    return {"name": parsed.kind, "arguments": json.dumps(arguments)}
