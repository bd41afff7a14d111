"""A saved env state is data: a crafted ``resume.json`` episode cannot run code outside the sandbox."""

from __future__ import annotations

import json

import pytest

from bugfix_gym import BugFixEnv
from bugfix_gym.execution.runner import run_tests
from bugfix_gym.core.saved_state import restore_task
from bugfix_gym.contract.text import printable
from bugfix_gym.tasks.library import get_task, task_to_data

HOSTILE = "def count_above(xs, t):\n    open({path!r}, 'w').write('ran')\n    return 0\n"


def _saved(env: BugFixEnv) -> dict:
    return json.loads(json.dumps(env.get_state()))


def test_a_task_saved_with_sandbox_false_comes_back_sandboxed(tmp_path):
    marker = tmp_path / "ran"
    env = BugFixEnv()
    env.reset(options={"task": "count_above"})
    state = _saved(env)
    task = state["episode"]["task"]
    task["source"] = HOSTILE.format(path=str(marker))
    task["sandbox"] = False
    state["episode"]["source"] = task["source"]
    copy = BugFixEnv()
    copy.set_state(state)
    assert copy.task is not None and copy.task.sandbox
    copy.step("test")
    assert not marker.exists()  # the sandbox ran it (the worker cannot write there) or it failed; not in-process


def test_a_registered_task_with_a_hand_made_source_is_refused(tmp_path):
    env = BugFixEnv()
    env.reset(options={"task": "count_above"})
    state = _saved(env)
    state["episode"]["source"] = HOSTILE.format(path=str(tmp_path / "ran"))
    with pytest.raises(ValueError, match="actions make"):
        BugFixEnv().set_state(state)


def test_a_registered_task_keeps_its_own_flag_and_replays_its_edits():
    env = BugFixEnv()
    env.reset(options={"task": "count_above"})
    for call in ("edit fix_range_end", "revert", "edit fix_comparison"):
        env.step(call)
    copy = BugFixEnv()
    copy.set_state(_saved(env))
    assert copy.task is get_task("count_above") and not copy.task.sandbox and copy.source == env.source


@pytest.mark.parametrize("damage", [
    lambda s: s.update(episode=[]), lambda s: s.update(np_random="x"), lambda s: s["episode"].update(turn="3"),
    lambda s: s["episode"].update(transcript=[[0]]), lambda s: s["episode"]["task"].update(hidden="__import__('os')"),
    lambda s: s["episode"]["task"].update(name=7), lambda s: s["episode"].update(edits=[["a"]]),
    lambda s: s.pop("episode"),
])
def test_a_damaged_state_is_one_value_error(damage):
    env = BugFixEnv()
    env.reset(options={"task": "clamp"})
    state = _saved(env)
    damage(state)
    with pytest.raises(ValueError, match="damaged"):
        BugFixEnv().set_state(state)


def test_a_restored_transcript_has_no_escape_sequences():
    env = BugFixEnv()
    env.reset(options={"task": "clamp"})
    state = _saved(env)
    state["episode"]["transcript"].append([1, "\x1b]0;owned\x07\x1b[2J"])
    copy = BugFixEnv()
    copy.set_state(state)
    assert "\x1b" not in copy.render_text() and "\x07" not in copy.render_text()


def test_printable_replaces_control_characters():
    assert printable("a\x1b[31mb\r\nc\x00") == "a?[31mb\nc?" and printable("\x1b" * 9, limit=2) == "??"


def test_restore_task_of_an_unknown_task_is_sandboxed_and_judges_in_the_parent():
    data = task_to_data(get_task("clamp"))
    data.update(uid="pack/elsewhere", name="clamp_elsewhere", sandbox=False)
    data["source"] = data["source"].replace("def clamp", "def clamp_elsewhere")
    task = restore_task(data)
    assert task.sandbox and not run_tests(task, task.source, "hidden").ok
