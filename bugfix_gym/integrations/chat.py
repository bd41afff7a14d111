"""BugFix episodes as OpenAI chat conversations, and back: the mapping ``bugfix-gym serve`` uses
(docs/serve.md) and that a chat-client adapter (verifiers, any OpenAI-client harness) can reuse.

An episode's transcript is a list of ``(owner, text)`` segments (``bugfix_gym.contract.tokens``): the prompt
(the env's reset observation), then each call the agent made and the tool output it got. As a chat:

* ``system`` (or ``developer``) messages are instructions for chat models; the TinyAgent was never
  shown any, so they are skipped;
* the first ``user`` message is the prompt;
* each ``assistant`` message is one call: its ``content`` text (``edit fix_init``), or its one
  ``tool_calls`` entry (function ``edit``, arguments ``{"op": "fix_init"}``) turned back into that text;
* each ``tool`` message, or a ``user`` message after an assistant turn, is the tool output of the call
  before it.

The five tools (:func:`tool_schemas`) are the env's calls: ``read``, ``test``, ``edit(op)``,
``revert``, ``submit``. Standard library only.
"""

from __future__ import annotations

import json
import re
import reprlib
from typing import Any, Sequence

from bugfix_gym.edits.ops import FIX_OPS
from bugfix_gym.contract.tokens import OWNER_POLICY, OWNER_PROMPT, OWNER_TOOL
from bugfix_gym.core.tools import parse_call

#: what each tool does, as the env's tool docstrings say it (bugfix_gym.integrations.trl.BugFixToolEnv)
TOOL_DESCRIPTIONS: dict[str, str] = {
    "read": "Show the function's current source code.",
    "test": "Run the visible tests on the current source: how many passed, and the first failure.",
    "edit": "Apply one edit operation to the current source: the line it changed, or no change.",
    "revert": "Restore the original source.",
    "submit": "Run the hidden tests on the current source; this ends the episode.",
}
#: roles a chat message may have
ROLES = ("system", "developer", "user", "assistant", "tool")


class ChatError(ValueError):
    """A request the mapping cannot read: one line saying what to send instead."""


#: the shapes of chat templates' control tokens: ChatML / Llama 3 / Phi (``<|im_end|>``), DeepSeek's full-width
#: bars, Llama 2 / Mistral (``</s>``, ``[INST]``), Gemma (``<end_of_turn>``), and bare ``<eos>``-style names
CONTROL_TOKEN = re.compile(r"<\|[^<>|\s]{1,64}\|>|<\uff5c[^<>\uff5c]{1,64}\uff5c>|</?s>|\[/?INST\]|<</?SYS>>"
                           r"|<(?:start|end)_of_turn>|<(?:eos|bos|pad|unk|eot|sep|cls|mask)>")


def escape_control_tokens(text: str) -> str:
    """``text`` with every substring shaped like a chat template's control token (:data:`CONTROL_TOKEN`) broken
    by a zero-width space after its first character, so a tokenizer encodes it as plain text: env text (a task
    statement, a tool's output) cannot end the turn it sits in and forge the next one. For a loop that renders
    the env's text with a tokenizer it does not know (TRL's ``environment_factory``); where the tokenizer is
    known, :func:`bugfix_gym.integrations.chat_template.apply_chat_template` encodes its own control tokens as
    text instead.

    :param text: env text
    """
    return CONTROL_TOKEN.sub(lambda m: m.group(0)[0] + "\u200b" + m.group(0)[1:], text)


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 40
_SHORT.maxlevel = 2


def _shown(value: Any) -> str:
    """A client's value, short, whatever its size or depth (``str`` of 900 nested lists would recurse)."""
    return _SHORT.repr(value)


def tool_schemas() -> list[dict[str, Any]]:
    """The OpenAI ``tools`` list of the five BugFix calls (``edit`` takes ``op``, one of ``FIX_OPS``)."""
    schemas = []
    for name, description in TOOL_DESCRIPTIONS.items():
        params: dict[str, Any] = {"type": "object", "properties": {}, "required": [], "additionalProperties": False}
        if name == "edit":
            params["properties"]["op"] = {"type": "string", "enum": list(FIX_OPS),
                                          "description": "the edit operation: " + ", ".join(FIX_OPS)}
            params["required"] = ["op"]
        schemas.append({"type": "function", "function": {"name": name, "description": description,
                                                         "parameters": params}})
    return schemas


def tool_call_of(call: str) -> dict[str, Any] | None:
    """A call's text -> the ``function`` part of an OpenAI tool call (``{"name", "arguments"}``, the
    arguments a JSON string); None for text that is not one of the env's calls.

    :param call: a call as the env reads it, e.g. ``"edit fix_init"``
    """
    parsed = parse_call(call)
    if parsed is None:
        return None
    name, op = parsed
    return {"name": name, "arguments": json.dumps({"op": op} if op is not None else {})}


def call_of_tool_call(tool_call: Any) -> str:
    """An OpenAI tool call (``{"function": {"name", "arguments"}}``, arguments a JSON string or an object)
    -> the call's text as the env reads it (``edit fix_init``). A call the env would not accept keeps
    what it says (its name, and ``op`` if it has one), so it reads as the invalid call it was: arguments
    that are not JSON (or a JSON number of 5,000 digits, or nesting 20,000 deep) read as none, and an ``op``
    that is not a string as its type (``edit <dict>``).

    :param tool_call: one entry of an assistant message's ``tool_calls``
    """
    name, arguments = tool_call_parts(tool_call)
    op = arguments.get("op") if isinstance(arguments, dict) else None
    if op is not None and not isinstance(op, str):
        op = f"<{type(op).__name__}>"
    return name if op is None else f"{name} {op}"


def tool_call_parts(tool_call: Any) -> tuple[str, Any]:
    """An OpenAI tool call's function name and its arguments as a JSON value (``{}`` where they are absent or
    not JSON: a JSON number of 5,000 digits, or nesting 20,000 deep, reads as no arguments).

    :param tool_call: one entry of an assistant message's ``tool_calls``
    :raises ChatError: the entry has no function name (one line)
    """
    function = tool_call.get("function") if isinstance(tool_call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ChatError("each tool_calls entry needs {\"type\": \"function\", \"function\": {\"name\": ..., "
                        "\"arguments\": ...}}")
    arguments = function.get("arguments") or {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):  # JSONDecodeError, an int past 4300 digits, nesting past the stack
            arguments = {}
    return function["name"], arguments


def message_text(message: dict[str, Any]) -> str:
    """A message's ``content`` as text: a string, null (empty), or a list of ``{"type": "text", "text"}`` parts.

    :param message: one chat message
    """
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("text", ""), str)
                                         for p in content):
        return "".join(p.get("text", "") for p in content if p.get("type", "text") == "text")
    raise ChatError("a message's content must be a string, null, or a list of {\"type\": \"text\", \"text\": ...} "
                    "parts")


def assistant_call(message: dict[str, Any]) -> str:
    """The call an assistant message made: its one tool call, else its content text.

    :param message: an ``assistant`` message
    """
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise ChatError("an assistant message's tool_calls must be a list")
    if len(calls) > 1:
        raise ChatError(f"an assistant message has {len(calls)} tool_calls; a BugFix turn is one call: send one "
                        "per assistant message")
    return call_of_tool_call(calls[0]) if calls else message_text(message)


def transcript_of(messages: Sequence[Any]) -> list[tuple[int, str]]:
    """A chat -> the episode's ``(owner, text)`` segments (see the module docstring). The chat must end
    with the prompt or a tool output: the agent writes next.

    :param messages: the request's ``messages``
    """
    if not isinstance(messages, list) or not messages:
        raise ChatError("messages must be a non-empty list of {\"role\": ..., \"content\": ...} objects")
    segments: list[tuple[int, str]] = []
    for index, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ROLES:
            raise ChatError(f"messages[{index}] has role {_shown(role)}; roles are {', '.join(ROLES)}")
        if role in ("system", "developer"):
            continue
        last = segments[-1][0] if segments else None
        if role == "assistant":
            if last is None or last == OWNER_POLICY:
                raise ChatError(f"messages[{index}] is an assistant turn with no prompt or tool output before it; "
                                "start with the user's prompt and answer each call with its tool output")
            segments.append((OWNER_POLICY, assistant_call(message)))
        elif last is None:
            if role == "tool":
                raise ChatError(f"messages[{index}] is a tool output before any prompt; start with a user message "
                                "holding the env's prompt")
            segments.append((OWNER_PROMPT, message_text(message)))
        elif last == OWNER_POLICY:
            segments.append((OWNER_TOOL, message_text(message)))
        else:
            raise ChatError(f"messages[{index}] ({role}) follows another prompt or tool output; each needs an "
                            "assistant call between them")
    if not segments or segments[-1][0] == OWNER_POLICY:
        raise ChatError("the chat must end with the prompt or a tool output (the agent writes next), not with "
                        "an assistant turn")
    return segments
