"""The pack of human-written bugs (examples/real_bugs_v1.json) loads, builds a BugFix-v1 env, and every task shows its
bug in a visible case while its fix passes every hidden case."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from bugfix_gym import load_task_pack
from bugfix_gym.core.env_v1 import BugFixEnvV1
from bugfix_gym.execution.repair_runner import run_repair_tests
from bugfix_gym.tasks.problems import RepairTask

ROOT = Path(__file__).resolve().parent.parent
PACK = ROOT / "examples" / "real_bugs_v1.json"
BENCHMARKS = ROOT / "benchmarks"


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


def test_the_benchmark_counts_one_call_repairs_and_plays_the_baselines(tmp_path, capsys):
    """On a two-task pack: `// 3` is repaired by one sited edit (`const 2` among others), a missing line is not;
    the baselines play both tasks."""
    spec = importlib.util.spec_from_file_location("benchmark_real_bugs_v1", BENCHMARKS / "real_bugs_v1.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    pack = {"format": "bugfix-gym/v1", "tasks": [
        {"name": "halve", "statement": "return half of n, rounded down",
         "source": "def halve(n):\n    return n // 3\n", "visible": [[[4], 2]], "hidden": [[[4], 2], [[9], 4]]},
        {"name": "first_or_none", "statement": "return the first item, or None for an empty list",
         "source": "def first_or_none(items):\n    return items[0]\n",
         "visible": [[[[]], None]], "hidden": [[[[]], None], [[[5, 6]], 5]]}]}
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(pack))
    out = bench.main(["--pack", str(path)])
    assert "edit 2.3 const 2" in out["writable"]["halve"] and out["writable"]["first_or_none"] == []
    assert set(out["baselines"]) == {"debugger", "brute_force"}
    assert "writable as one sited edit or delete: 1 / 2 = 0.500" in capsys.readouterr().out
