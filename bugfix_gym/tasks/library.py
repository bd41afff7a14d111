"""Tasks: one small Python function with exactly one injected defect.

The book-style library (its data is in :mod:`bugfix_gym.tasks.book_tasks`) is written as *correct*
functions plus the op that repairs the defect; :func:`bugfix_gym.edits.ops.inject_defect` derives the
buggy source, and expected values come from running the correct function on each input.
``visible`` tests are the first few hidden cases, so they are a strict subset of what ``submit``
checks.
"""

from __future__ import annotations

import copy
import re
import textwrap
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from . import book_tasks
from ..execution.cases import Case, compile_function
from ..edits.ops import DEFECTS, FIX_OPS, apply_op, inject_defect
from ..execution.runner import run_tests

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
    """A task as plain (JSON-able) data; test cases are kept as Python literals (``repr``). Reading it back
    is :func:`bugfix_gym.core.saved_state.restore_task`, which trusts no ``sandbox`` flag in the data."""
    return dict(name=task.name, statement=task.statement, source=task.source, defect=task.defect, fix_op=task.fix_op,
                visible=repr(task.visible), hidden=repr(task.hidden), split=task.split, sandbox=task.sandbox,
                uid=task.uid, template=task.template)


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


_LIBRARY: dict[str, tuple[Task, ...]] = {}
REGISTRY: dict[str, Task] = {}  # uid and name -> task, for scripted oracles and task lookup by name
GENERATED_NAME = re.compile(r"\w+_[0-9a-f]{6}")  # generate_tasks names tasks verb_noun_<6 hex digits>


def register(tasks: Iterable[Task]) -> list[Task]:
    """Make tasks findable by uid and by name.

    A name stays with the first built-in or generated task that had it; a pack task holds a name
    only while no other task has it (a reloaded pack replaces its earlier version), so a pack
    never shadows a built-in or generated task, whatever the load order.
    :mod:`bugfix_gym.tasks.packs` also refuses such names up front (:func:`name_taken`).
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
        rows = book_tasks.TRAIN if split == "train" else book_tasks.HELDOUT
        _LIBRARY[split] = tuple(register(task_from_correct(*row, split=split) for row in rows))
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
