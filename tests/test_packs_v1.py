"""BugFix-v1 task packs: the format switch, round trips, one-line errors for each broken field, asserts limited to
what the trusted replay may run, and v0 packs read as before."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from bugfix_gym import TaskPackError, load_task_pack
from bugfix_gym.execution.repair_cases import AssertCase, CallCase
from bugfix_gym.execution.repair_runner import run_repair_tests
from bugfix_gym.execution.sandbox import available_isolation
from bugfix_gym.tasks import packs, packs_v1
from bugfix_gym.tasks.library import Task
from bugfix_gym.tasks.problems import Problem, RepairTask, normalise_source

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
BUGGY_PACK = EXAMPLES / "task_pack_v1_example.json"
CORRECT_PACK = EXAMPLES / "task_pack_v1_correct.json"

GOOD = {
    "name": "halve",
    "statement": "return half of n, rounded down",
    "source": "def halve(n):\n    \"\"\"Half of n.\"\"\"\n    return n // 3\n",
    "fixed_source": "def halve(n):\n    return n // 2\n",
    "visible": [{"args": [4], "expected": 2}],
    "hidden": [{"args": [4], "expected": 2}, {"assert": "assert candidate(9) == 4"},
               {"assert": "assert candidate(n=0) == 0"}],
}
CORRECT = {
    "name": "double",
    "statement": "return twice n",
    "correct_source": "def double(n):\n    return n + n\n",
    "visible": [[[1], 2]],
    "hidden": [[[1], 2], {"args": [-3], "expected": -6}],
}


def _write(tmp_path: Path, tasks, fmt: str | None = packs_v1.FORMAT_V1, name: str = "mine.json") -> Path:
    path = tmp_path / name
    data: dict = {"tasks": tasks}
    if fmt is not None:
        data["format"] = fmt
    path.write_text(json.dumps(data))
    return path


def _error(path: Path) -> str:
    with pytest.raises(TaskPackError) as info:
        load_task_pack(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(path)), message
    return message


# ---------------------------------------------------------------------------------------------- loading
def test_the_example_packs_load_as_repair_tasks_and_problems():
    tasks = load_task_pack(BUGGY_PACK)
    assert [t.name for t in tasks] == ["format_price", "last_n_lines", "is_leap_year", "dedupe", "running_max",
                                       "merge_settings", "average_rating", "percent_change"]
    for task in tasks:
        assert isinstance(task, RepairTask) and task.origin == "pack" and task.split == "pack" and task.bugs == ()
        assert task.problem == f"pack/task_pack_v1_example/{task.name}"
        assert normalise_source(task.source) == task.source
        report = run_repair_tests(task.entry, task.support, task.visible, task.source)
        assert 0 < report.total and report.passed < report.total, task.name  # each shows its bug in a visible case
    assert sum(t.fixed_source is None for t in tasks) == 1  # average_rating: a real bug with no known fix given
    problems = load_task_pack(CORRECT_PACK)
    assert [p.pid for p in problems] == [f"pack/task_pack_v1_correct/{n}" for n in
                                         ("chunk", "initials", "count_in_range", "word_lengths")]
    assert all(isinstance(p, Problem) and p.origin == "pack" and p.split == "pack" for p in problems)


def test_a_buggy_task_round_trips_normalised_with_its_cases_built_right(tmp_path):
    (task,) = load_task_pack(_write(tmp_path, [GOOD]))
    assert task == RepairTask(
        name="halve", entry="halve", statement="return half of n, rounded down",
        source="def halve(n):\n    return n // 3\n",  # the entry's docstring is removed, as for every v1 source
        support="", visible=(CallCase((4,), 2),),
        hidden=(CallCase((4,), 2), CallCase((9,), 4), AssertCase("assert candidate(n=0) == 0")),
        split="pack", origin="pack", problem="pack/mine/halve", fixed_source="def halve(n):\n    return n // 2\n")
    (problem,) = load_task_pack(_write(tmp_path, [CORRECT], name="ok.json"))
    assert problem == Problem(pid="pack/ok/double", entry="double", statement="return twice n",
                              source="def double(n):\n    return n + n\n", support="",
                              visible=(CallCase((1,), 2),), hidden=(CallCase((1,), 2), CallCase((-3,), -6)),
                              split="pack", origin="pack")


def test_entry_support_tuples_and_a_mixed_pack(tmp_path):
    task = dict(GOOD, name="halve_task", entry="halve", support="LIMIT = 4\nPAIR = (1, 2)\n",
                visible=[{"assert": "assert candidate((4)) == 2"}],  # a plain comparison: the same as the args form
                hidden=GOOD["hidden"] + [{"assert": "assert candidate(PAIR[1] + 6) == LIMIT"}])
    buggy, correct = load_task_pack(_write(tmp_path, [task, CORRECT]))
    assert buggy.name == "halve_task" and buggy.entry == "halve" and buggy.problem == "pack/mine/halve_task"
    assert buggy.visible == (CallCase((4,), 2),) and buggy.support == "LIMIT = 4\nPAIR = (1, 2)\n"
    assert buggy.hidden[-1] == AssertCase("assert candidate(PAIR[1] + 6) == LIMIT")
    assert isinstance(correct, Problem)
    pair = {"assert": "assert candidate((1, 2)) == (0, 1)"}  # tuples: only the assert form writes them
    parsed = packs_v1.parse_task(dict(GOOD, visible=[pair], hidden=[pair, {"args": [4], "expected": 2}]), "x")
    assert parsed.visible == (CallCase(((1, 2),), (0, 1)),)


def test_toml_v1_pack(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('format = "bugfix-gym/v1"\n[[tasks]]\nname = "halve"\nstatement = "return half of n"\n'
                    'source = """\ndef halve(n):\n    return n // 3\n"""\nvisible = [{args = [4], expected = 2}]\n'
                    'hidden = [{args = [4], expected = 2}, {assert = "assert candidate(9) == 4"}]\n')
    (task,) = load_task_pack(path)
    assert task.hidden == (CallCase((4,), 2), CallCase((9,), 4)) and task.fixed_source is None


def test_the_cli_checks_either_format(tmp_path, capsys):
    assert packs.main([str(BUGGY_PACK), str(CORRECT_PACK), str(EXAMPLES / "task_pack_example.json")]) == 0
    out = capsys.readouterr().out
    assert "8 tasks ok" in out and "buggy+fixed" in out and "correct" in out
    assert "swap_minmax" in out  # the v0 pack, listed as before
    broken = _write(tmp_path, [dict(GOOD, statement="two\nlines")])
    assert packs.main([str(broken)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'statement' must be one line" in err


# ---------------------------------------------------------------------------------------------- one-line errors
def _without(key):
    return lambda t: {k: v for k, v in t.items() if k != key}


BROKEN = [
    (_without("name"), "missing key 'name'"),
    (lambda t: dict(t, name="half of"), "'name' must be an ASCII Python identifier"),
    (lambda t: dict(t, name="x" * 41), "at most 40 characters"),
    (lambda t: dict(t, statement="two\nlines"), "'statement' must be one line"),
    (lambda t: dict(t, statement="caf\u00e9"), "'statement' must be one line of printable ASCII"),
    (lambda t: dict(t, statement="s" * 201), "keep it to at most 200"),
    (_without("source"), "give exactly one of 'source' (the buggy function) and 'correct_source'"),
    (lambda t: dict(t, correct_source=t["fixed_source"]), "got 'source' and 'correct_source'"),
    (lambda t: dict(t, source="def halve(n:\n"), "source does not parse (line 1"),
    (lambda t: dict(t, source="def other(n):\n    return n\n"),
     "source does not define a top-level function 'def halve(...)'"),
    (lambda t: dict(t, source="x = " + "[" * 150 + "]" * 150 + "\n"), "source is nested more than 100 levels deep"),
    (lambda t: dict(t, source="def halve(n):\n    return n // 3\n" + "#" * 4000), "keep it to at most 4000"),
    (lambda t: dict(t, source="def halve(n):\n    return '\u00e9'\n"), "printable ASCII (newlines and tabs allowed)"),
    (lambda t: dict(t, fixed_source="def halve(n):\n    return n\n"),
     "fixed_source fails 2 of 3 hidden cases (first: halve(4) expected 2 got 4)"),
    (lambda t: dict(t, fixed_source=t["source"]), "'fixed_source' is the same code as 'source'"),
    (lambda t: dict(t, fixed_source=42), "'fixed_source' must be a non-empty string"),
    (lambda t: dict(t, source=t["fixed_source"], fixed_source="def halve(n):\n    return n // 2 + 0\n"),
     "the buggy source passes all 3 hidden cases; add a case that exposes the bug"),
    (lambda t: dict(t, entry="not an id"), "'entry' must be an ASCII Python identifier"),
    (lambda t: dict(t, entry="helper"), "source does not define a top-level function 'def helper(...)'"),
    (lambda t: dict(t, visible=[]), "'visible' must be a non-empty list of test cases"),
    (lambda t: dict(t, hidden="all"), "'hidden' must be a non-empty list of test cases"),
    (lambda t: dict(t, visible=[{"args": [6], "expected": 3}]), "visible[0] is not among the hidden cases; add it "
                                                                "to 'hidden'"),
    (lambda t: dict(t, hidden=t["visible"]), "every hidden case is visible; add a hidden case"),
    (lambda t: dict(t, hidden=[{"args": [4], "expected": 2}, {"args": 4, "expected": 2}]),
     "hidden[1]: test case args must be a list"),
    (lambda t: dict(t, hidden=[{"args": [4], "expected": 2}, {"args": [1], "want": 0}]), "hidden[1]: a test case is"),
    (lambda t: dict(t, hidden=[{"args": [4], "expected": 2}, {"assert": "candidate(1) == 0", "args": []}]),
     "an assert case is {\"assert\": \"assert candidate(...) == ...\"} alone"),
    (lambda t: dict(t, hidden=[{"args": [4], "expected": 2}, {"assert": "assert candidate(1 == 0"}]),
     "hidden[1]: the assert does not parse"),
    (lambda t: dict(t, hidden=[{"args": [4], "expected": 2}, {"assert": "candidate(1) == 0"}]),
     "must be one assert statement"),
    (lambda t: dict(t, hidden=[{"args": [4], "expected": 2}, {"assert": "assert 1 == 1"}]),
     "the assert never calls candidate"),
    (lambda t: dict(t, hidden=[{"args": [4], "expected": 2}, {"assert": "assert candidate(1).real == 0"}]),
     "uses attribute access ('.')"),
    (lambda t: dict(t, hidden=[{"args": [4], "expected": 2}, {"assert": "assert candidate(1) * 10 ** 9 == 0"}]),
     "uses '*'"),
    (lambda t: dict(t, hidden=[{"args": [4], "expected": 2}, {"assert": "assert candidate(x) == 0"}]),
     "the assert uses the name 'x'"),
    (lambda t: dict(t, hidden=[{"args": [4], "expected": 2}, {"assert": "assert open(candidate(1))"}]),
     "the assert may call only candidate and the built-ins abs, all"),
    (lambda t: dict(t, hidden=[{"args": [4], "expected": 2}, {"assert": "assert [i for i in candidate(1)]"}]),
     "uses ListComp syntax"),
    (lambda t: dict(t, hidden=[{"args": [4], "expected": 2}, {"assert": "assert sum(candidate(1), []) == 0"}]),
     "call sum with one argument"),
    (lambda t: dict(t, hidden=[{"args": [4], "expected": 2}, {"assert": f"assert candidate(1) == '{'a' * 400}'"}]),
     "keep it to at most 400"),
    (lambda t: dict(t, support="def helper():\n    return 1\n"), "support line 1 is not 'NAME = <literal>'"),
    (lambda t: dict(t, support="LIMIT = len('abc')\n"), "support line 1 is not 'NAME = <literal>'"),
    (lambda t: dict(t, support="len = 3\n"), "support may not rebind 'len'"),
    (lambda t: dict(t, fix_op="swap_minmax"), "'fix_op' is a v0 key; a v1 task gives 'source'"),
    (lambda t: dict(t, flavour="x"), "unknown key 'flavour'; keys are name"),
    (lambda t: dict(_without("source")(t), correct_source="def halve(n):\n    return n // 3\n",
                    fixed_source=None), "'fixed_source' goes with a buggy 'source'"),
]


@pytest.mark.parametrize("breaks, says", BROKEN, ids=[says[:40] for _, says in BROKEN])
def test_each_broken_field_is_one_line_naming_the_file_the_task_and_what_to_change(tmp_path, breaks, says):
    path = _write(tmp_path, [copy.deepcopy(CORRECT), breaks(copy.deepcopy(GOOD))])
    message = _error(path)
    assert says in message and ": task 1" in message, message


def test_a_correct_source_that_fails_its_cases_is_refused(tmp_path):
    message = _error(_write(tmp_path, [dict(CORRECT, correct_source="def double(n):\n    return n * 3\n")]))
    assert "task 0 (double): correct_source fails 2 of 2 hidden cases (first: double(1) expected 2 got 3)" in message


@pytest.mark.parametrize("data, says", [
    ({"format": "bugfix-gym/v2", "tasks": [GOOD]}, "unknown format 'bugfix-gym/v2'; use \"format\": \"bugfix-gym/v1\""),
    ({"format": packs_v1.FORMAT_V1}, "a v1 pack needs a 'tasks' list"),
    ({"format": packs_v1.FORMAT_V1, "tasks": []}, "'tasks' must be a non-empty list"),
    ({"format": packs_v1.FORMAT_V1, "tasks": [GOOD], "extra": 1}, "unknown top-level key 'extra'"),
    ({"format": packs_v1.FORMAT_V1, "tasks": [GOOD, GOOD]}, "task 1 (halve): the name is used twice"),
    ({"format": packs_v1.FORMAT_V1, "tasks": ["halve"]}, "task 0: a task is a table/object"),
])
def test_broken_files_are_one_line_errors(tmp_path, data, says):
    path = tmp_path / "f.json"
    path.write_text(json.dumps(data))
    assert says in _error(path)


@pytest.mark.parametrize("fmt", [None, packs_v1.FORMAT_V0])
def test_v1_tasks_in_a_file_that_does_not_say_v1_get_a_hint(tmp_path, fmt):
    message = _error(_write(tmp_path, [GOOD], fmt=fmt))
    assert "task 0 (halve): 'fixed_source' is v1 task syntax; add \"format\": \"bugfix-gym/v1\"" in message
    assert_only = {k: v for k, v in GOOD.items() if k != "fixed_source"}
    message = _error(_write(tmp_path, [assert_only], fmt=fmt))
    assert "\"hidden case with 'assert'\" is v1 task syntax" in message


def test_v0_packs_load_as_before_also_with_an_explicit_v0_format(tmp_path):
    v0 = json.loads((EXAMPLES / "task_pack_example.json").read_text())
    before = load_task_pack(EXAMPLES / "task_pack_example.json")
    path = tmp_path / "v0.json"
    path.write_text(json.dumps({"format": packs_v1.FORMAT_V0, "tasks": v0["tasks"] if isinstance(v0, dict) else v0}))
    after = load_task_pack(path)
    assert all(isinstance(t, Task) for t in after) and after == before


# ---------------------------------------------------------------------------------------------- pack code stays out
def test_asserts_that_are_refused_never_reach_the_worker(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(packs_v1, "run_repair_tests", lambda *a, **k: ran.append(a))
    bad = dict(GOOD, hidden=GOOD["hidden"] + [{"assert": "assert candidate(().__class__.__base__) == 0"}])
    assert "attribute access" in _error(_write(tmp_path, [bad]))
    assert ran == []


@pytest.mark.skipif(available_isolation() != "namespace", reason="needs the namespace sandbox")
def test_pack_sources_run_only_in_the_worker(tmp_path):
    marker = tmp_path / "ran_here"  # the worker sees a fresh /tmp of its own: the folder is not there
    touch = f"try:\n    open({str(marker)!r}, 'w').close()\nexcept OSError:\n    pass\n"
    task = dict(GOOD, source=touch + GOOD["source"], fixed_source=touch + GOOD["fixed_source"])
    (loaded,) = load_task_pack(_write(tmp_path, [task]))
    assert loaded.source.startswith("try:") and not marker.exists()


def test_a_v1_pack_is_not_registered_with_v0_tasks(tmp_path):
    from bugfix_gym.tasks.library import REGISTRY

    load_task_pack(_write(tmp_path, [dict(GOOD, name="only_in_v1_pack", entry="halve")]))
    assert "only_in_v1_pack" not in REGISTRY
    assert packs.load_task_pack is load_task_pack
