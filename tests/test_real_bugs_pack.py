"""The pack of human-written bugs (examples/real_bugs_v1.json) loads, builds a BugFix-v1 env, and every task shows its
bug in a visible case while its fix passes every hidden case."""

from __future__ import annotations

from pathlib import Path

from bugfix_gym import load_task_pack
from bugfix_gym.core.env_v1 import BugFixEnvV1
from bugfix_gym.execution.repair_runner import run_repair_tests
from bugfix_gym.tasks.problems import RepairTask

PACK = Path(__file__).resolve().parent.parent / "examples" / "real_bugs_v1.json"


def test_the_real_bugs_pack_loads_with_a_bug_shown_and_a_fix_given_for_every_task():
    tasks = load_task_pack(PACK)
    assert len(tasks) == 24 and len({t.name for t in tasks}) == 24
    env = BugFixEnvV1(tasks=tasks)
    for task in tasks:
        assert isinstance(task, RepairTask) and task.bugs == () and task.fixed_source is not None, task.name
        assert 5 <= len(task.source.splitlines()) <= 15, task.name
        assert len(task.visible) == 2 and 5 <= len(task.hidden) <= 8, task.name
        assert all(case in task.hidden for case in task.visible), task.name
        shown = run_repair_tests(task.entry, task.support, task.visible, task.source)
        assert shown.passed < shown.total, f"{task.name}: the buggy source passes every visible case"
        fixed = run_repair_tests(task.entry, task.support, task.hidden, task.fixed_source)
        assert fixed.ok, f"{task.name}: the fix fails {fixed.total - fixed.passed} hidden cases"
        observation, info = env.reset(seed=0, options={"task": task.name})
        assert info["task"] == task.name and task.name in observation
