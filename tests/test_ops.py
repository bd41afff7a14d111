"""Edit ops: deterministic, composable, inverse of inject_defect; execution: bounded, exact, cached."""

from __future__ import annotations

import dataclasses
import random

import pytest

from bugfix_gym import FIX_OPS, apply_op, inject_defect, make_tasks
from bugfix_gym.execution import cases as execution, runner
from bugfix_gym.execution.cases import run_cases, same_value
from bugfix_gym.tasks.generator import TEMPLATES, WORDS
from bugfix_gym.edits.ops import describe_change
from bugfix_gym.execution.runner import run_tests
from bugfix_gym.tasks.library import correct_source

TASKS = make_tasks("all")
INVOLUTIONS = ("swap_minmax", "fix_comparison", "fix_init")


def _template_sources() -> list[tuple[str, str]]:
    names = {role: pool[0] for role, pool in WORDS.items()} | {"f": "g"}
    return [(t.source.format(**names), op) for split in TEMPLATES.values() for t in split for op in t.ops]


@pytest.mark.parametrize("op", INVOLUTIONS)
def test_involutions_applied_twice_are_the_identity(op):
    sources = [t.source for t in TASKS] + [correct_source(t) for t in TASKS] + [s for s, _ in _template_sources()]
    for src in sources:
        assert apply_op(apply_op(src, op), op) == src


def test_apply_op_undoes_inject_defect_on_every_correct_function():
    pairs = [(correct_source(t), t.fix_op) for t in TASKS] + _template_sources()
    for correct, op in pairs:
        buggy = inject_defect(correct, op)
        assert buggy != correct, (op, correct)
        assert apply_op(buggy, op) == correct


def test_each_op_on_its_own_example():
    assert apply_op("def f(x, y):\n    return x < y\n", "fix_comparison") == "def f(x, y):\n    return x <= y\n"
    assert apply_op("def f(a):\n    return min(a, max(a, 0))\n", "swap_minmax") == \
        "def f(a):\n    return max(a, min(a, 0))\n"
    assert apply_op("def f(n):\n    return list(range(n))\n", "fix_range_end") == \
        "def f(n):\n    return list(range(n + 1))\n"
    assert apply_op("def f(n):\n    return list(range(1, n - 1))\n", "fix_range_end") == \
        "def f(n):\n    return list(range(1, n))\n"
    assert apply_op("def f(xs):\n    total = 1\n    return total\n", "fix_init") == \
        "def f(xs):\n    total = 0\n    return total\n"
    guarded = apply_op("def f(a, b):\n    return a / b\n", "add_zero_guard")
    assert guarded == "def f(a, b):\n    if not b:\n        return 0\n    return a / b\n"
    assert apply_op(guarded, "add_zero_guard") == guarded  # idempotent, never stacks guards


def test_ops_without_a_site_leave_the_source_unchanged():
    src = "def f(s):\n    return s.upper()\n"
    for op in FIX_OPS:
        assert apply_op(src, op) == src
    assert describe_change(src, src) == "no change"


def test_ops_never_raise_on_garbage_and_unknown_ops_are_rejected():
    rng = random.Random(0)
    alphabet = "def f(x):\n return range min max < <= 0 1 / [ ] : \t é \x00 '\""
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        for op in FIX_OPS:
            assert isinstance(apply_op(text, op), str)
    with pytest.raises(ValueError, match="unknown edit op"):
        apply_op("x = 1\n", "fix_everything")
    with pytest.raises(ValueError, match="unknown edit op"):
        inject_defect("x = 1\n", "fix_everything")


def test_stacked_wrong_edits_can_still_pass_as_in_the_book():
    # swap_minmax is an involution: stacked twice on a min/max task it is back to the bug, three times the fix.
    task = next(t for t in TASKS if t.fix_op == "swap_minmax")
    src = task.source
    seen = []
    for _ in range(3):
        src = apply_op(src, "swap_minmax")
        seen.append(src)
    assert seen == [correct_source(task), task.source, correct_source(task)]


def test_describe_change_names_the_first_changed_line():
    before = "def f(x):\n    a = 1\n    return a\n"
    assert describe_change(before, before.replace("a = 1", "a = 0")) == "changed line 2 : a = 0"
    assert describe_change("a\n", "a\nb\n") == "changed line 2 : b"


def test_same_value_is_strict_about_bools_and_tolerant_about_floats():
    assert same_value(0.1 + 0.2, 0.3) and same_value(3, 3.0)
    assert not same_value(1, True) and not same_value(False, 0) and same_value(True, True)
    assert not same_value("1", 1) and not same_value(None, 0) and same_value([1, 2], [1, 2])


def test_run_cases_turns_every_problem_into_a_failed_test():
    report = run_cases("def f(x):\n    return 10 // x\n", "f", [((2,), 5), ((0,), 0), ((5,), 1)])
    assert (report.passed, report.total) == (1, 3)
    assert report.first_failure == "f(0) expected 0 raised ZeroDivisionError"
    assert run_cases("def f(x:\n", "f", [((1,), 1)]).first_failure == "the code does not load : SyntaxError"
    report = run_cases("def g(x):\n    return x\n", "f", [((1,), 1)])
    assert report.first_failure == "the code does not load : NameError"
    deep = run_cases("def f(n):\n    return f(n + 1)\n", "f", [((0,), 0)])
    assert deep.first_failure == "f(0) expected 0 raised RecursionError"
    leave = run_cases("def f(n):\n    raise SystemExit(3)\n", "f", [((0,), 0)])
    assert leave.first_failure == "f(0) expected 0 raised SystemExit"


def test_loop_budget_counts_iterations_per_case_so_results_are_deterministic():
    src = "def f(n):\n    t = 0\n    for i in range(n):\n        t += 1\n    return t\n"
    n_ok = execution.MAX_LOOP_TICKS
    report = run_cases(src, "f", [((n_ok,), n_ok), ((n_ok,), n_ok), ((n_ok + 1,), n_ok + 1)])
    assert (report.passed, report.total) == (2, 3)  # the budget resets for every case
    assert "raised Timeout" in report.first_failure


def test_results_are_cached_by_content_not_by_task_uid():
    task = TASKS[0]
    fixed = correct_source(task)
    extra = ((task.hidden[0][0], "not what it returns"),)  # a variant with one more hidden case, same uid
    variant = dataclasses.replace(task, hidden=task.hidden + extra)
    assert variant.uid == task.uid
    assert run_tests(task, fixed, "hidden").ok
    stale = run_tests(variant, fixed, "hidden")
    assert (stale.passed, stale.total) == (len(task.hidden), len(task.hidden) + 1)


def test_results_are_cached_by_source_text():
    task = TASKS[0]
    runner.clear_cache()
    first = run_tests(task, task.source, "hidden")
    again = run_tests(task, task.source, "hidden")
    assert again is first and runner.stats == {"hits": 1, "misses": 1}
    fresh = run_tests(task, task.source, "hidden", cache=False)
    assert fresh == first and fresh is not first and runner.stats["misses"] == 2


def test_ops_edit_the_right_characters_next_to_unicode_and_odd_line_separators():
    # ast columns count UTF-8 bytes and ast does not split lines at U+2028; edits must still land right.
    src = ('def f(n):\n    label = "héé\u2028"; total = 1\n    for i in range(len(label), n):\n'
           '        total += i\n    return total\n')
    assert apply_op(src, "fix_init") == src.replace("total = 1", "total = 0")
    assert apply_op(src, "fix_range_end") == src.replace("range(len(label), n)", "range(len(label), n + 1)")
    assert inject_defect(src, "fix_range_end") == src.replace("range(len(label), n)", "range(len(label), n - 1)")
    guarded = 'def f(a, b):\n    s = "é\u2028"\n    return a / b\n'
    fixed = apply_op(guarded, "add_zero_guard")
    assert fixed == 'def f(a, b):\n    if not b:\n        return 0\n    s = "é\u2028"\n    return a / b\n'
    assert inject_defect(fixed, "add_zero_guard") == guarded
    assert apply_op('def f(x):\n    return "ö" < x\n', "fix_comparison") == 'def f(x):\n    return "ö" <= x\n'


def test_task_code_cannot_change_the_stored_test_cases():
    cases = [(([3, 1, 2],), [1, 2, 3]), (([3, 1, 2],), [1, 2, 3])]
    report = run_cases("def f(xs):\n    xs.sort()\n    xs.append(9)\n    return xs[:3]\n", "f", cases)
    assert (report.passed, report.total) == (2, 2)
    assert cases[0][0] == ([3, 1, 2],)  # the stored input is untouched
