"""The book-style task library: 20 train + 10 held-out tasks, each a well-formed repair task."""

from __future__ import annotations

import dataclasses

import pytest

from bugfix_gym import BugFixEnv, DEFECTS, FIX_OPS, apply_op, get_task, make_tasks
from bugfix_gym.execution.runner import run_tests
from bugfix_gym.tasks.library import correct_source, task_problems

ALL = make_tasks("all")


def test_split_sizes_and_every_defect_kind_in_both_splits():
    train, heldout = make_tasks("train"), make_tasks("heldout")
    assert (len(train), len(heldout), len(ALL)) == (20, 10, 30)
    assert {t.fix_op for t in train} == set(FIX_OPS) == {t.fix_op for t in heldout}
    assert not {t.name for t in train} & {t.name for t in heldout}  # held-out functions never seen in training
    assert len({t.name for t in ALL}) == 30
    assert all(t.defect == DEFECTS[t.fix_op] for t in ALL)


@pytest.mark.parametrize("task", ALL, ids=lambda t: t.uid)
def test_oracle_fixes_buggy_fails_and_visible_is_a_strict_subset_of_hidden(task):
    assert run_tests(task, apply_op(task.source, task.fix_op), "hidden").ok  # the oracle's edit passes
    assert not run_tests(task, task.source, "hidden").ok  # the untouched buggy source fails
    hidden = list(task.hidden)
    assert task.visible and all(case in hidden for case in task.visible)
    assert any(case not in task.visible for case in hidden)  # strict: hidden checks more
    assert task_problems(task) == []
    assert "\n" not in task.statement and task.source.startswith(f"def {task.name}(")


@pytest.mark.parametrize("task", ALL, ids=lambda t: t.uid)
def test_scripted_oracle_episode_passes_every_task(task):
    env = BugFixEnv(tasks=[task])
    _, info = env.reset(seed=0)
    for call in ("read", f"edit {task.fix_op}", "submit"):
        _, reward, terminated, _, info = env.step(call)
    assert terminated and reward == 1.0 and info["hidden_pass"]


def test_make_tasks_rejects_unknown_split_and_get_task_unknown_name():
    with pytest.raises(ValueError, match="unknown split 'tests'"):
        make_tasks("tests")
    with pytest.raises(KeyError, match="no task named"):
        get_task("nope")
    assert get_task("train/clamp") is get_task("clamp")


def test_correct_source_is_the_fix_applied_and_differs_from_the_buggy_source():
    for task in ALL:
        assert correct_source(task) != task.source


def test_task_problems_catches_each_kind_of_broken_task():
    task = get_task("clamp")
    fixed = correct_source(task)
    assert any("passes all" in p for p in task_problems(dataclasses.replace(task, source=fixed, uid="x/1")))
    wrong_op = dataclasses.replace(task, fix_op="fix_init", uid="x/2")
    assert any("does not repair" in p for p in task_problems(wrong_op))
    not_subset = dataclasses.replace(task, visible=(((99, 0, 1), 1),), uid="x/3")
    assert any("strict subset" in p for p in task_problems(not_subset))
    same = dataclasses.replace(task, visible=task.hidden, uid="x/4")
    assert any("strict subset" in p for p in task_problems(same))
    assert "unknown fix_op" in task_problems(dataclasses.replace(task, fix_op="fix_all", uid="x/5"))[0]
