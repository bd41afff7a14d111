"""Tasks: one small Python function with exactly one injected defect.

The book-style library is written as *correct* functions plus the op that repairs the
defect; :func:`bugfix_gym.ops.inject_defect` derives the buggy source, and expected values
come from running the correct function on each input. ``visible`` tests are the first
few hidden cases, so they are a strict subset of what ``submit`` checks.
"""

from __future__ import annotations

import copy
import re
import textwrap
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from .execution import Case, compile_function
from .ops import DEFECTS, FIX_OPS, apply_op, inject_defect
from .runner import run_tests

SPLITS = ("train", "heldout", "all")


@dataclass(frozen=True)
class Task:
    """One repair task.

    :param name: the function's name; it appears in the statement
    :param statement: one line saying what the function should do
    :param source: the buggy source code
    :param defect: defect kind (``comparison``, ``zero_guard``, ``minmax``, ``range_end``, ``init``)
    :param fix_op: the one edit op that repairs it
    :param visible: ``(args, expected)`` cases the ``test`` tool runs
    :param hidden: the cases ``submit`` runs; they decide the reward (a superset of ``visible``)
    :param split: ``train``, ``heldout``, ``test`` or ``pack``
    :param sandbox: run this task's code in a subprocess with limits (user task packs)
    :param template: the generator template a generated task came from (``""`` otherwise); for
        per-template reports, never shown to the agent
    """

    name: str
    statement: str
    source: str
    defect: str
    fix_op: str
    visible: tuple[Case, ...]
    hidden: tuple[Case, ...]
    split: str = "train"
    sandbox: bool = False
    uid: str = field(default="", compare=False)
    template: str = field(default="", compare=False)

    def __post_init__(self):
        if not self.uid:
            object.__setattr__(self, "uid", f"{self.split}/{self.name}")


def task_to_data(task: Task) -> dict[str, Any]:
    """A task as plain (JSON-able) data; test cases are kept as Python literals (``repr``)."""
    return dict(name=task.name, statement=task.statement, source=task.source, defect=task.defect, fix_op=task.fix_op,
                visible=repr(task.visible), hidden=repr(task.hidden), split=task.split, sandbox=task.sandbox,
                uid=task.uid, template=task.template)


def task_from_data(data: dict[str, Any]) -> Task:
    """The task :func:`task_to_data` described (cases parsed with ``ast.literal_eval``: no code runs)."""
    import ast

    cases = {k: tuple(ast.literal_eval(data[k])) for k in ("visible", "hidden")}
    return Task(name=data["name"], statement=data["statement"], source=data["source"], defect=data["defect"],
                fix_op=data["fix_op"], split=data["split"], sandbox=bool(data["sandbox"]), uid=data["uid"],
                template=str(data.get("template", "")), **cases)


def task_from_correct(name: str, statement: str, correct: str, fix_op: str, inputs: Sequence[tuple],
                      split: str, n_visible: int = 3, template: str = "") -> Task:
    """Build a task from a correct function: inject the defect, compute expected values."""
    correct = textwrap.dedent(correct).strip("\n") + "\n"
    func, reset = compile_function(correct, name)
    cases = []
    for args in inputs:
        reset()
        cases.append((tuple(args), func(*copy.deepcopy(tuple(args)))))
    return Task(name=name, statement=statement, source=inject_defect(correct, fix_op), defect=DEFECTS[fix_op],
                fix_op=fix_op, visible=tuple(cases[:n_visible]), hidden=tuple(cases), split=split, template=template)


# (name, statement, correct source, fix_op, inputs). The cases that expose each defect are
# among the inputs; tests/test_tasks.py checks the buggy source fails the hidden tests.
_TRAIN = [
    ("count_above", "count the items of xs that are strictly greater than t", """
        def count_above(xs, t):
            count = 0
            for x in xs:
                if x > t:
                    count += 1
            return count
        """, "fix_comparison", [([1, 5, 3], 2), ([2, 2, 3], 2), ([], 0), ([4, 4], 4), ([7, 1, 9], 8)]),
    ("is_sorted", "return True if xs is in non-decreasing order", """
        def is_sorted(xs):
            for i in range(len(xs) - 1):
                if xs[i] > xs[i + 1]:
                    return False
            return True
        """, "fix_comparison", [([1, 2, 3],), ([1, 1, 2],), ([3, 1],), ([],), ([5, 5],), ([2, 9, 4],)]),
    ("in_range", "return True if lo <= x <= hi", """
        def in_range(x, lo, hi):
            return lo <= x <= hi
        """, "fix_comparison", [(2, 1, 5), (1, 1, 5), (9, 1, 5), (5, 1, 5), (0, 1, 5), (3, 3, 3)]),
    ("max_index", "return the index of the first largest item of xs", """
        def max_index(xs):
            best = 0
            for i in range(1, len(xs)):
                if xs[i] > xs[best]:
                    best = i
            return best
        """, "fix_comparison", [([1, 3, 2],), ([4, 1, 4],), ([2, 7, 7, 1],), ([5],), ([0, 0],), ([1, 2, 3],)]),
    ("mean", "return the average of xs, or 0 if xs is empty", """
        def mean(xs):
            if not xs:
                return 0
            return sum(xs) / len(xs)
        """, "add_zero_guard", [([1, 2, 3],), ([],), ([4],), ([2, 4],), ([-1, 1],)]),
    ("safe_ratio", "return a divided by b, or 0 when b is 0", """
        def safe_ratio(a, b):
            if not b:
                return 0
            return a / b
        """, "add_zero_guard", [(6, 3), (1, 0), (5, 2), (0, 4), (-8, 2), (3, 0)]),
    ("first", "return the first item of xs, or 0 if xs is empty", """
        def first(xs):
            if not xs:
                return 0
            return xs[0]
        """, "add_zero_guard", [([3, 4],), ([],), ([9],), ([0, 1],), ([-2, 5, 6],)]),
    ("percent", "return part as a percentage of whole, or 0 when whole is 0", """
        def percent(part, whole):
            if not whole:
                return 0
            return 100 * part / whole
        """, "add_zero_guard", [(1, 4), (3, 0), (5, 10), (0, 7), (2, 2), (9, 0)]),
    ("clamp", "clamp x into the range from lo to hi", """
        def clamp(x, lo, hi):
            return max(lo, min(x, hi))
        """, "swap_minmax", [(5, 0, 3), (-2, 0, 3), (1, 0, 3), (3, 0, 3), (10, 4, 8), (0, 0, 0)]),
    ("spread", "return the largest item of xs minus the smallest", """
        def spread(xs):
            return max(xs) - min(xs)
        """, "swap_minmax", [([1, 5, 3],), ([2],), ([7, 7],), ([-3, 4],), ([9, 0, 2],)]),
    ("cap", "return x, but never more than limit", """
        def cap(x, limit):
            return min(x, limit)
        """, "swap_minmax", [(5, 3), (1, 3), (3, 3), (-4, 0), (10, 20), (8, 2)]),
    ("larger_abs", "return the larger absolute value of a and b", """
        def larger_abs(a, b):
            return max(abs(a), abs(b))
        """, "swap_minmax", [(3, -5), (2, 1), (-4, -4), (0, 7), (6, -1)]),
    ("sum_to", "return the sum of the integers from 1 to n inclusive", """
        def sum_to(n):
            total = 0
            for i in range(1, n + 1):
                total += i
            return total
        """, "fix_range_end", [(3,), (1,), (0,), (5,), (10,)]),
    ("factorial", "return n factorial", """
        def factorial(n):
            result = 1
            for i in range(2, n + 1):
                result *= i
            return result
        """, "fix_range_end", [(3,), (0,), (1,), (5,), (6,)]),
    ("sum_list", "return the sum of the items of xs using their indices", """
        def sum_list(xs):
            total = 0
            for i in range(len(xs)):
                total += xs[i]
            return total
        """, "fix_range_end", [([1, 2, 3],), ([],), ([5],), ([4, -4, 2],), ([10, 20],)]),
    ("evens_upto", "return the even numbers from 0 to n inclusive", """
        def evens_upto(n):
            return [i for i in range(0, n + 1, 2)]
        """, "fix_range_end", [(4,), (5,), (0,), (1,), (8,)]),
    ("product", "return the product of the items of xs", """
        def product(xs):
            result = 1
            for x in xs:
                result *= x
            return result
        """, "fix_init", [([2, 3],), ([],), ([5],), ([1, 2, 3, 4],), ([-1, 7],)]),
    ("count_positive", "count the items of xs that are greater than 0", """
        def count_positive(xs):
            count = 0
            for x in xs:
                if x > 0:
                    count += 1
            return count
        """, "fix_init", [([1, -2, 3],), ([],), ([-1],), ([0, 4],), ([2, 2, 2],)]),
    ("sum_squares", "return the sum of the squares of the items of xs", """
        def sum_squares(xs):
            total = 0
            for x in xs:
                total += x * x
            return total
        """, "fix_init", [([1, 2],), ([],), ([3],), ([-2, 2],), ([1, 1, 1],)]),
    ("power", "return base raised to the integer power exp", """
        def power(base, exp):
            result = 1
            for _ in range(exp):
                result *= base
            return result
        """, "fix_init", [(2, 3), (5, 0), (3, 1), (-2, 2), (1, 9)]),
]

_HELDOUT = [
    ("all_positive", "return True if every item of xs is greater than 0", """
        def all_positive(xs):
            for x in xs:
                if x <= 0:
                    return False
            return True
        """, "fix_comparison", [([1, 2],), ([0, 3],), ([],), ([-1],), ([5, 0],), ([4],)]),
    ("passes", "return True if score is at least cutoff", """
        def passes(score, cutoff):
            return score >= cutoff
        """, "fix_comparison", [(7, 5), (5, 5), (3, 5), (0, 0), (9, 10)]),
    ("average_of", "return total divided by count, or 0 when count is 0", """
        def average_of(total, count):
            if not count:
                return 0
            return total / count
        """, "add_zero_guard", [(10, 2), (4, 0), (9, 3), (0, 5), (7, 0)]),
    ("last", "return the last item of xs, or 0 if xs is empty", """
        def last(xs):
            if not xs:
                return 0
            return xs[-1]
        """, "add_zero_guard", [([3, 4],), ([],), ([8],), ([1, 2, 0],), ([-5, 6],)]),
    ("floor_at", "return x, but never less than low", """
        def floor_at(x, low):
            return max(x, low)
        """, "swap_minmax", [(1, 3), (5, 3), (3, 3), (-6, -2), (0, 9)]),
    ("min_of_three", "return the smallest of a, b and c", """
        def min_of_three(a, b, c):
            return min(a, min(b, c))
        """, "swap_minmax", [(3, 1, 2), (5, 5, 5), (-1, 4, 0), (7, 8, 6), (2, 9, 4)]),
    ("squares_upto", "return the squares of the integers from 1 to n inclusive", """
        def squares_upto(n):
            return [i * i for i in range(1, n + 1)]
        """, "fix_range_end", [(3,), (1,), (0,), (4,), (6,)]),
    ("sum_odds", "return the sum of the odd numbers from 1 to n inclusive", """
        def sum_odds(n):
            total = 0
            for i in range(1, n + 1, 2):
                total += i
            return total
        """, "fix_range_end", [(5,), (4,), (1,), (0,), (9,)]),
    ("sum_cubes", "return the sum of the cubes of the items of xs", """
        def sum_cubes(xs):
            total = 0
            for x in xs:
                total += x * x * x
            return total
        """, "fix_init", [([1, 2],), ([],), ([3],), ([-1, 1],), ([2, 2],)]),
    ("count_matches", "count the items of xs that are equal to v", """
        def count_matches(xs, v):
            count = 0
            for x in xs:
                if x == v:
                    count += 1
            return count
        """, "fix_init", [([1, 2, 1], 1), ([], 3), ([4], 5), ([7, 7, 7], 7), ([0, 1], 0)]),
]

_LIBRARY: dict[str, tuple[Task, ...]] = {}
REGISTRY: dict[str, Task] = {}  # uid and name -> task, for scripted oracles and task lookup by name
GENERATED_NAME = re.compile(r"\w+_[0-9a-f]{6}")  # generate_tasks names tasks verb_noun_<6 hex digits>


def register(tasks: Iterable[Task]) -> list[Task]:
    """Make tasks findable by uid and by name.

    A name stays with the first built-in or generated task that had it; a pack task holds a name
    only while no other task has it (a reloaded pack replaces its earlier version), so a pack
    never shadows a built-in or generated task, whatever the load order.
    :mod:`bugfix_gym.packs` also refuses such names up front (:func:`name_taken`).
    """
    tasks = list(tasks)
    for task in tasks:
        REGISTRY[task.uid] = task
        held = REGISTRY.get(task.name)
        if held is None or held.split == "pack":
            REGISTRY[task.name] = task
    return tasks


def name_taken(name: str) -> str | None:
    """Why a task pack may not use ``name`` (in words), or None when it may.

    Built-in names are registered before the check, so the answer does not depend on load order;
    names shaped like generated ones are reserved even before those tasks are generated.
    """
    make_tasks("all")
    held = REGISTRY.get(name)
    if held is not None and held.split != "pack":
        return f"the name is taken by a built-in or generated task ({held.uid})"
    if GENERATED_NAME.fullmatch(name):
        return "names ending in '_' and six hex digits are reserved for generated tasks"
    return None


def _library(split: str) -> tuple[Task, ...]:
    if split not in _LIBRARY:
        rows = _TRAIN if split == "train" else _HELDOUT
        _LIBRARY[split] = tuple(register(task_from_correct(*row, split=split)  # type: ignore[arg-type]
                                         for row in rows))
    return _LIBRARY[split]


def make_tasks(split: str = "train") -> list[Task]:
    """The book's fixed task set: ``'train'`` (20), ``'heldout'`` (10) or ``'all'`` (30)."""
    if split == "all":
        return [*_library("train"), *_library("heldout")]
    if split not in ("train", "heldout"):
        raise ValueError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
    return list(_library(split))


def get_task(key: str | Task) -> Task:
    """A task by uid (``'train/clamp'``) or name (``'clamp'``)."""
    if isinstance(key, Task):
        return key
    make_tasks("all")
    try:
        return REGISTRY[key]
    except KeyError:
        raise KeyError(f"no task named {key!r}; see bugfix_gym.make_tasks('all')") from None


def task_problems(task: Task) -> list[str]:
    """What is wrong with a task, in words (empty when it is a well-formed repair task).

    Checks: the fix op is known, visible tests are a strict subset of the hidden tests, the
    untouched buggy source fails the hidden tests, and the fix op repairs it.
    """
    problems = []
    if task.fix_op not in FIX_OPS:
        return [f"unknown fix_op {task.fix_op!r}; ops are {', '.join(FIX_OPS)}"]
    hidden = list(task.hidden)  # cases hold lists: compare with ==, not hashing
    if not all(case in hidden for case in task.visible) or all(case in task.visible for case in hidden):
        problems.append("visible tests must be a strict subset of the hidden tests")
    buggy = run_tests(task, task.source, "hidden")
    if buggy.ok:
        problems.append(f"the buggy source passes all {buggy.total} hidden tests; add a case that exposes the defect")
    fixed = run_tests(task, apply_op(task.source, task.fix_op), "hidden")
    if not fixed.ok:
        problems.append(f"{task.fix_op} does not repair the source ({fixed.passed} / {fixed.total} hidden tests "
                        f"pass after it; first failure: {fixed.first_failure})")
    return problems


def correct_source(task: Task) -> str:
    """The repaired source: the task's fix op applied to its buggy source."""
    return apply_op(task.source, task.fix_op)


assert set(DEFECTS) == set(FIX_OPS)
