"""Reading an env state back (:meth:`bugfix_gym.core.env.BugFixEnv.set_state`): a saved state is data, never orders.

A run folder's ``resume.json`` is as shareable as a model file, so nothing in it decides where code
runs. A restored task is the registered task of the same uid when the saved copy equals it (so it
keeps its own ``sandbox`` flag); any other task is rebuilt from the data with ``sandbox`` forced on,
whatever the file says. The current source of an episode on a task that runs in this process must
be what the episode's own actions make from the task's source (edit ops are deterministic), so a
file cannot put other code in front of the ``test`` tool. Every field is type-checked, the
transcript is made printable, and anything wrong is one ``ValueError`` line.
"""

from __future__ import annotations

import ast
import dataclasses
from typing import Any

from . import tools
from ..edits.ops import apply_op
from ..tasks.library import REGISTRY, Task

MAX_SAVED_CHARS = 1_000_000  # the longest text field a saved episode may hold
_TASK_TEXT = ("name", "statement", "source", "defect", "fix_op", "visible", "hidden", "split", "uid")
_EPISODE_FIELDS = {"task": dict, "source": str, "turn": int, "actions": list, "ops": list, "n_invalid": int,
                   "valid": bool, "submitted": bool, "hidden_pass": bool, "done": bool, "transcript": list}


def _text(data: dict[str, Any], key: str, where: str) -> str:
    value = data.get(key)
    if type(value) is not str or len(value) > MAX_SAVED_CHARS:
        raise ValueError(f"the saved {where} has no valid {key!r} (text of at most {MAX_SAVED_CHARS} characters); "
                         "the state is damaged: start a new run")
    return value


def restore_task(data: Any) -> Task:
    """The task a saved episode was on: the registered one when the saved copy equals it, else the saved
    copy with ``sandbox`` forced on. Cases are parsed with ``ast.literal_eval`` (no code runs).

    :param data: what :func:`bugfix_gym.tasks.library.task_to_data` wrote
    """
    if type(data) is not dict:
        raise ValueError("the saved episode's task is not an object; the state is damaged: start a new run")
    text = {key: _text(data, key, "task") for key in _TASK_TEXT}
    try:
        cases = {k: tuple(ast.literal_eval(text.pop(k))) for k in ("visible", "hidden")}
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise ValueError("the saved task's test cases are not Python literals; the state is damaged: "
                         "start a new run") from None
    if not all(type(c) is tuple and len(c) == 2 and type(c[0]) is tuple for c in cases["visible"] + cases["hidden"]):
        raise ValueError("the saved task's test cases are not (args, expected) pairs; the state is damaged: "
                         "start a new run")
    template = data.get("template", "")
    task = Task(name=text["name"], statement=text["statement"], source=text["source"], defect=text["defect"],
                fix_op=text["fix_op"], visible=cases["visible"], hidden=cases["hidden"], split=text["split"],
                sandbox=True, uid=text["uid"], template=template if type(template) is str else "")
    known = REGISTRY.get(task.uid)
    if known is not None and dataclasses.replace(task, sandbox=known.sandbox) == known:
        return known
    return task


def replayed_source(task: Task, actions: list[str]) -> str:
    """The source an episode's actions make from ``task.source`` (edits and reverts; other calls change nothing)."""
    source = task.source
    for action in actions:
        call = tools.parse_call(action) if type(action) is str else None
        if call is not None and call[0] == "edit":
            source = apply_op(source, str(call[1]))
        elif call is not None and call[0] == "revert":
            source = task.source
    return source


def check_episode(episode: Any) -> Task:
    """Type-check a saved episode (what :meth:`BugFixEnv.get_state` wrote) and return its task.

    :param episode: the ``"episode"`` entry of a saved state
    :raises ValueError: one line, for anything damaged or inconsistent
    """
    if type(episode) is not dict:
        raise ValueError("the saved episode is not an object; the state is damaged: start a new run")
    for key, kind in _EPISODE_FIELDS.items():
        if type(episode.get(key)) is not kind:
            raise ValueError(f"the saved episode has no valid {key!r} ({kind.__name__}); the state is damaged: "
                             "start a new run")
    if not all(type(a) is str for a in episode["actions"] + episode["ops"]):
        raise ValueError("the saved episode's actions are not all text; the state is damaged: start a new run")
    if not all(type(s) is list and len(s) == 2 and type(s[0]) is int and type(s[1]) is str
               for s in episode["transcript"]):
        raise ValueError("the saved transcript is not [owner, text] pairs; the state is damaged: start a new run")
    edits, failed = episode.get("edits", []), episode.get("failed", [])
    if type(edits) is not list or not all(type(e) is list and len(e) == 3 and all(type(s) is str for s in e)
                                          for e in edits) or type(failed) is not list:
        raise ValueError("the saved episode's edits are not [source, op, source] triples; the state is damaged: "
                         "start a new run")
    task = restore_task(episode["task"])
    if len(episode["source"]) > MAX_SAVED_CHARS:
        raise ValueError("the saved source is too long; the state is damaged: start a new run")
    if not task.sandbox and replayed_source(task, episode["actions"]) != episode["source"]:
        raise ValueError("the saved source is not what the episode's actions make from its task; "
                         "the state was changed by hand: start a new run")
    return task
