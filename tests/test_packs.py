"""User task packs: loading JSON/TOML, one-line validation errors, sandboxed execution."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bugfix_gym import BugFixEnv, TaskPackError, evaluate, get_task, load_task_pack, scripted_policy
from bugfix_gym.tasks import library as tasks_module
from bugfix_gym.execution.sandbox import run_cases_sandboxed

DIGITS = sys.get_int_max_str_digits()  # the longest integer literal Python reads
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "task_pack_example.json"

GOOD = {
    "name": "half_of",
    "statement": "return half of n rounded down, but never less than 0",
    "source": "def half_of(n):\n    return min(n // 2, 0)\n",
    "fix_op": "swap_minmax",
    "visible": [{"args": [4], "expected": 2}],
    "hidden": [{"args": [4], "expected": 2}, {"args": [-4], "expected": 0}, [[7], 3]],
}


def _write(tmp_path: Path, tasks, suffix: str = ".json") -> Path:
    path = tmp_path / f"pack{suffix}"
    path.write_text(json.dumps({"tasks": tasks}) if suffix == ".json" else tasks)
    return path


def test_example_pack_loads_and_the_oracle_solves_it_in_the_sandbox():
    tasks = load_task_pack(EXAMPLE)
    assert [t.name for t in tasks] == ["bounded_score", "mean_length", "count_long"]
    assert all(t.sandbox and t.split == "pack" for t in tasks)
    assert evaluate(scripted_policy("oracle"), tasks=tasks, n_per_task=1)["pass_rate"] == 1.0
    assert evaluate(scripted_policy("blind", seed=1), tasks=tasks, n_per_task=4)["pass_rate"] < 1.0


GOOD_TOML = '''
[[tasks]]
name = "half_of_t"
statement = "return half of n rounded down, but never less than 0"
source = """
def half_of_t(n):
    return min(n // 2, 0)
"""
fix_op = "swap_minmax"
visible = [{args = [4], expected = 2}]
hidden = [{args = [4], expected = 2}, {args = [-4], expected = 0}]
'''


def test_toml_pack_loads(tmp_path):
    (task,) = load_task_pack(_write(tmp_path, GOOD_TOML, ".toml"))
    assert task.name == "half_of_t" and task.visible == (((4,), 2),) and task.hidden[1] == ((-4,), 0)


def _mutated(**changes):
    task = copy.deepcopy(GOOD)
    for key, value in changes.items():
        if value is None:
            del task[key]
        else:
            task[key] = value
    return task


@pytest.mark.parametrize("task, message", [
    (_mutated(fix_op=None, hidden=None), "missing keys 'fix_op', 'hidden'"),
    (_mutated(fix_op="fix_everything"), "unknown fix_op 'fix_everything'"),
    (_mutated(source="def half_of(n:\n    return n\n"), "source does not parse (line 1"),
    (_mutated(source="def other(n):\n    return min(n // 2, 0)\n"),
     "does not define a top-level function 'def half_of"),
    (_mutated(visible=[{"args": [9], "expected": 4}]), "strict subset"),
    (_mutated(visible=GOOD["hidden"]), "strict subset"),
    (_mutated(source="def half_of(n):\n    return max(n // 2, 0)\n"), "passes all 3 hidden tests"),
    (_mutated(fix_op="fix_init"), "fix_init does not repair the source"),
    (_mutated(name="half of"), "'name' must be an ASCII Python identifier"),
    (_mutated(hidden=[]), "'hidden' must be a non-empty list"),
    (_mutated(visible=[{"args": 4, "expected": 2}]), "args must be a list"),
    (_mutated(visible=[{"input": [4]}]), "a test case is"),
    (_mutated(colour="red"), "unknown key 'colour'"),
    (_mutated(defect="minmaxx"), "does not match fix_op"),
    (_mutated(statement="one\ntwo"), "must be one line"),
])
def test_each_problem_gives_a_one_line_task_pack_error(tmp_path, task, message):
    with pytest.raises(TaskPackError) as err:
        load_task_pack(_write(tmp_path, [task]))
    text = str(err.value)
    assert message in text and "\n" not in text and "task 0" in text
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize("content, suffix, message", [
    ("{not json", ".json", "invalid JSON at line 1"),
    ("tasks = [", ".toml", "invalid TOML"),
    ("[]", ".json", "non-empty list"),
    ('{"name": "x"}', ".json", "needs a 'tasks' list"),
    ("[]", ".yaml", "task packs are .json or .toml"),
    ("[" * 100_000 + "]" * 100_000, ".json", "invalid JSON: lists or tables are nested too deeply"),
    ("tasks = " + "[" * 5000 + "]" * 5000, ".toml", "invalid TOML: lists or tables are nested too deeply"),
    ("tasks = " + "{a = " * 3000 + "1" + "}" * 3000, ".toml", "invalid TOML: lists or tables are nested too deeply"),
    ('{"tasks": [' + "1" * 5000 + "]}", ".json", f"invalid JSON: an integer has more than {DIGITS} digits"),
    ("tasks = [" + "1" * 5000 + "]", ".toml", f"invalid TOML: an integer has more than {DIGITS} digits"),
    ("[" + " " * (4 * 1024 * 1024) + "]", ".json", "the file is over 4 MiB; split it into smaller packs"),
])
def test_file_level_problems_are_one_line_errors(tmp_path, content, suffix, message):
    path = tmp_path / f"p{suffix}"
    path.write_text(content)
    with pytest.raises(TaskPackError, match=message.replace("(", r"\(").replace("[", r"\[")) as err:
        load_task_pack(path)
    assert "\n" not in str(err.value)
    with pytest.raises(TaskPackError, match="cannot read the file"):
        load_task_pack(tmp_path / "missing.json")


def test_duplicate_and_builtin_names_are_rejected(tmp_path):
    with pytest.raises(TaskPackError, match="used twice"):
        load_task_pack(_write(tmp_path, [GOOD, GOOD]))
    clash = _mutated(name="clamp", source="def clamp(n):\n    return min(n // 2, 0)\n")
    with pytest.raises(TaskPackError, match="taken by a built-in"):
        load_task_pack(_write(tmp_path, [clash]))


@pytest.fixture
def fresh_registry(monkeypatch):
    """The task registry of a process that has not built the book's tasks yet (a fresh ``python -c``)."""
    monkeypatch.setattr(tasks_module, "_LIBRARY", {})
    saved = dict(tasks_module.REGISTRY)
    tasks_module.REGISTRY.clear()
    yield
    tasks_module.REGISTRY.clear()
    tasks_module.REGISTRY.update(saved)


def test_a_pack_cannot_take_a_builtin_name_when_it_is_loaded_first(tmp_path, fresh_registry):
    clash = _mutated(name="clamp", source="def clamp(n):\n    return min(n // 2, 0)\n")
    with pytest.raises(TaskPackError, match=r"task 0 \(clamp\): the name is taken by a built-in") as err:
        load_task_pack(_write(tmp_path, [clash]))
    assert "\n" not in str(err.value)
    assert get_task("clamp").split == "train"


def test_generated_task_names_are_reserved_before_they_are_generated(tmp_path):
    clash = _mutated(name="tally_ledger_3f2a91", source="def tally_ledger_3f2a91(n):\n    return min(n // 2, 0)\n")
    with pytest.raises(TaskPackError, match="reserved for generated tasks"):
        load_task_pack(_write(tmp_path, [clash]))


@pytest.mark.parametrize("changes, message", [
    ({"statement": "x" * 1000}, "'statement' is 1000 characters; keep it to at most 200"),
    ({"statement": "red \x1b[31m alert"}, "'statement' must be one line of printable ASCII; character 4 is '\\x1b'"),
    ({"statement": "half\tof n"}, "'statement' must be one line of printable ASCII; character 4 is '\\t'"),
    ({"statement": "moiti\u00e9 de n"}, "character 5 is '\\xe9'"),
    ({"statement": "line\u2028break"}, "character 4 is '\\u2028'"),
    ({"source": "def half_of(n):\n    return min(n // 2, 0)  # \x1b[2J\n"}, "'source' must be printable ASCII"),
    ({"source": "def half_of(n):\n" + "    n = n\n" * 500 + "    return min(n // 2, 0)\n"}, "keep it to at most 4000"),
    ({"name": "h" * 41}, "'name' must be an ASCII Python identifier of at most 40 characters"),
    ({"name": "moiti\u00e9"}, "'name' must be an ASCII Python identifier"),
])
def test_text_an_agent_or_a_terminal_sees_is_short_printable_ascii(tmp_path, changes, message):
    if "name" in changes:
        changes["source"] = GOOD["source"].replace("half_of", changes["name"])
    with pytest.raises(TaskPackError) as err:
        load_task_pack(_write(tmp_path, [_mutated(**changes)]))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_test_values_must_be_json_values(tmp_path):
    toml = GOOD_TOML.replace("hidden = [{args = [4], expected = 2},",
                             "hidden = [{args = [4], expected = 2}, {args = [1979-05-27], expected = 0},")
    with pytest.raises(TaskPackError, match="test values are JSON values"):
        load_task_pack(_write(tmp_path, toml, ".toml"))
    deep = _mutated(hidden=GOOD["hidden"] + [[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]], 0]])
    with pytest.raises(TaskPackError, match="nested at most 20 deep"):
        load_task_pack(_write(tmp_path, [deep]))


def test_reloading_an_edited_pack_uses_the_new_tests(tmp_path):
    (first,) = load_task_pack(_write(tmp_path, [GOOD]))
    edited = _mutated(hidden=GOOD["hidden"] + [{"args": [9], "expected": 4}])
    (second,) = load_task_pack(_write(tmp_path, [edited]))
    assert first.uid != second.uid
    env = BugFixEnv(tasks=[second])
    env.reset(options={"task": "half_of"})
    env.step("edit swap_minmax")
    assert env.step("submit")[0] == "hidden tests passed"
    assert len(env.task.hidden) == 4


def test_sandbox_turns_timeouts_memory_and_crashes_into_failed_reports():
    cases = [((1,), 1), ((2,), 2)]
    sleepy = run_cases_sandboxed("def f(x):\n    import time\n    time.sleep(30)\n", "f", cases, timeout_s=1)
    assert (sleepy.passed, sleepy.total, sleepy.first_failure) == (0, 2, "sandbox : Timeout after 1 s")
    crash = run_cases_sandboxed("def f(x):\n    import os\n    os._exit(3)\n", "f", cases)
    assert crash.first_failure == "sandbox : the code crashed (exit code 3)"
    spin = run_cases_sandboxed("def f(x):\n    while True:\n        pass\n", "f", cases)
    assert spin.passed == 0 and "raised Timeout" in spin.first_failure
    chatty = run_cases_sandboxed("def f(x):\n    print('{\"passed\": 9}')\n    return x\n", "f", cases)
    assert (chatty.passed, chatty.total, chatty.first_failure) == (2, 2, None)  # printing cannot fake a report
    partial = run_cases_sandboxed("def f(x):\n    return 1\n", "f", cases)
    assert (partial.passed, partial.first_failure) == (1, "f(2) expected 2 got 1")


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS is enforced on Linux only")
def test_sandbox_memory_limit_turns_a_huge_allocation_into_a_failed_test():
    hungry = run_cases_sandboxed("def f(x):\n    return len(bytearray(2 ** 33))\n", "f", [((1,), 1)], memory_mb=256)
    assert hungry.passed == 0 and hungry.first_failure == "f(1) expected 1 raised MemoryError"


def test_pack_cli_checks_files(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "bugfix_gym.tasks.packs", str(EXAMPLE)], capture_output=True, text=True,
                        timeout=60)
    assert ok.returncode == 0 and "3 tasks ok" in ok.stdout
    bad = _write(tmp_path, [_mutated(fix_op="fix_init")])
    out = subprocess.run([sys.executable, "-m", "bugfix_gym.tasks.packs", str(bad)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "does not repair" in out.stderr
