"""Procedural tasks: templates x defects x renamed identifiers, with disjoint splits.

Each template is a *correct* function written with placeholder identifiers, the edit ops
whose defect it can carry, and an input generator. :func:`generate_tasks` picks a template
of the split, a defect, fresh function and variable names from word lists, and random
inputs; the buggy source comes from :func:`bugfix_gym.ops.inject_defect` and the expected
values from running the correct function (:func:`bugfix_gym.tasks.task_from_correct`).
A candidate is kept only if :func:`bugfix_gym.tasks.task_problems` finds nothing wrong
(the oracle's op repairs it, the buggy source fails the hidden tests, visible tests are a
strict subset of hidden ones); otherwise another is drawn.

The ``train``, ``heldout`` and ``test`` splits use disjoint template sets, so an agent
cannot score on held-out tasks by remembering function names or shapes seen in training.
Every split covers all five defect kinds. Function names end in a short hash of the task's
content, so they are unique and the same name always means the same task; generated tasks
are registered so the scripted oracle finds them by name.

:func:`draw_task` makes one task per episode (``BugFixEnv(generated=split)``); those are
registered only while they are among the ``RECENT_LIMIT`` most recent, so millions of
resets do not grow the registry.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .ops import FIX_OPS
from .tasks import REGISTRY, Task, register, task_from_correct, task_problems

GENERATED_SPLITS = ("train", "heldout", "test")
RECENT_LIMIT = 1024  # per-episode tasks kept registered (by name and uid), oldest dropped first
MAX_DRAWS = 100  # candidates tried for one per-episode task before giving up

# Disjoint word pools per role, so renamed identifiers never collide inside one function
# and never shadow a builtin the templates use (min, max, len, range, sum, abs).
WORDS: dict[str, tuple[str, ...]] = {
    "xs": ("xs", "items", "values", "nums", "data", "seq", "vals", "arr", "scores", "readings"),
    "x": ("x", "v", "item", "elem", "val", "entry", "w"),
    "t": ("t", "limit", "bound", "cut", "level", "mark", "thresh", "pivot"),
    "acc": ("count", "total", "acc", "tally", "result", "running", "agg"),
    "i": ("i", "j", "k", "idx", "pos"),
    "a": ("a", "p", "num", "amount", "part", "top"),
    "b": ("b", "q", "den", "whole", "size", "base"),
    "lo": ("lo", "low", "lower", "least"),
    "hi": ("hi", "high", "upper", "most"),
    "n": ("n", "m", "stop", "upto", "end"),
}
VERBS = ("calc", "get", "find", "compute", "eval", "measure", "check", "tally", "scan", "probe")
NOUNS = ("widget", "ledger", "signal", "batch", "record", "metric", "series", "sample", "bucket", "stream")

Inputs = Callable[[np.random.Generator], list[tuple]]


@dataclass(frozen=True)
class Template:
    """A correct function with placeholder identifiers.

    :param key: the template's id (unique over all splits)
    :param statement: one line saying what the function does, with the same placeholders
    :param source: the correct function; ``{f}`` is the function name, other ``{role}`` s are
        variable names drawn from :data:`WORDS`
    :param ops: the edit ops whose defect this template can carry
    :param inputs: ``rng -> list of argument tuples``; the first three become visible tests
    """

    key: str
    statement: str
    source: str
    ops: tuple[str, ...]
    inputs: Inputs


def _ints(rng: np.random.Generator, k: int, lo: int = -5, hi: int = 10) -> list[int]:
    return [int(v) for v in rng.integers(lo, hi, size=k)]


def _lists(rng: np.random.Generator, fixed: list[list[int]], n_random: int = 4, lo: int = -5, hi: int = 10,
           min_len: int = 0) -> list[list[int]]:
    return fixed + [_ints(rng, int(rng.integers(min_len, 6)), lo, hi) for _ in range(n_random)]


def _with_threshold(rng: np.random.Generator, lists: list[list[int]]) -> list[tuple]:
    """(xs, t) pairs; t is often an item of xs, so strict vs non-strict comparisons differ."""
    out = []
    for xs in lists:
        t = int(rng.choice(xs)) if xs and rng.random() < 0.7 else int(rng.integers(-3, 8))
        out.append((xs, t))
    return out


def _count_cmp_inputs(rng: np.random.Generator) -> list[tuple]:
    return [([2, 2, 3], 2), ([5, 1, 5, 9], 5), ([], 1), *_with_threshold(rng, _lists(rng, [[4, 4]], 4))]


def _pair_inputs(rng: np.random.Generator) -> list[tuple]:
    """(a, b) pairs including zeros for b, so a missing zero guard shows."""
    fixed = [(6, 3), (7, 0), (5, 2), (0, 4), (9, 0)]
    return fixed + [(int(a), int(b)) for a, b in rng.integers(-9, 10, size=(3, 2))]


def _clamp_inputs(rng: np.random.Generator) -> list[tuple]:
    fixed = [(5, 0, 3), (-2, 0, 3), (1, 0, 3), (3, 0, 3)]
    rand = []
    for _ in range(3):
        lo = int(rng.integers(-5, 5))
        rand.append((int(rng.integers(-10, 10)), lo, lo + int(rng.integers(0, 6))))
    return fixed + rand


def _n_inputs(lo: int, hi: int, fixed: list[int]) -> Inputs:
    def inputs(rng: np.random.Generator) -> list[tuple]:
        return [(n,) for n in fixed] + [(int(n),) for n in rng.integers(lo, hi, size=3)]
    return inputs


def _seq_inputs(fixed: list[list[int]], min_len: int = 0) -> Inputs:
    def inputs(rng: np.random.Generator) -> list[tuple]:
        return [(xs,) for xs in _lists(rng, fixed, 4, min_len=min_len)]
    return inputs


TEMPLATES: dict[str, tuple[Template, ...]] = {
    "train": (
        Template("count_greater", "count the items of {xs} that are strictly greater than {t}", """
def {f}({xs}, {t}):
    {acc} = 0
    for {x} in {xs}:
        if {x} > {t}:
            {acc} += 1
    return {acc}
""", ("fix_comparison", "fix_init"), _count_cmp_inputs),
        Template("count_nonneg", "count the items of {xs} that are at least 0", """
def {f}({xs}):
    {acc} = 0
    for {x} in {xs}:
        if {x} >= 0:
            {acc} += 1
    return {acc}
""", ("fix_comparison", "fix_init"), _seq_inputs([[0, 1, -1], [0], [], [3, -2]])),
        Template("sum_between", "return the sum of the integers from {lo} to {hi} inclusive", """
def {f}({lo}, {hi}):
    {acc} = 0
    for {i} in range({lo}, {hi} + 1):
        {acc} += {i}
    return {acc}
""", ("fix_range_end", "fix_init"),
            lambda rng: [(1, 3), (2, 2), (0, 4), *[(int(a), int(a + d)) for a, d in rng.integers(-3, 6, size=(3, 2))]]),
        Template("product_upto", "return the product of the integers from 1 to {n} inclusive", """
def {f}({n}):
    {acc} = 1
    for {i} in range(1, {n} + 1):
        {acc} *= {i}
    return {acc}
""", ("fix_range_end", "fix_init"), _n_inputs(0, 8, [3, 1, 0, 5])),
        Template("safe_div", "return {a} divided by {b}, or 0 when {b} is 0", """
def {f}({a}, {b}):
    if not {b}:
        return 0
    return {a} / {b}
""", ("add_zero_guard",), _pair_inputs),
        Template("average", "return the average of {xs}, or 0 if {xs} is empty", """
def {f}({xs}):
    if not {xs}:
        return 0
    return sum({xs}) / len({xs})
""", ("add_zero_guard",), _seq_inputs([[1, 2, 3], [], [4]], min_len=1)),
        Template("head", "return the first item of {xs}, or 0 if {xs} is empty", """
def {f}({xs}):
    if not {xs}:
        return 0
    return {xs}[0]
""", ("add_zero_guard",), _seq_inputs([[3, 4], [], [9]], min_len=1)),
        Template("clip", "clamp {x} into the range from {lo} to {hi}", """
def {f}({x}, {lo}, {hi}):
    return max({lo}, min({x}, {hi}))
""", ("swap_minmax",), _clamp_inputs),
        Template("gap", "return the larger of {a} and {b} minus the smaller", """
def {f}({a}, {b}):
    return max({a}, {b}) - min({a}, {b})
""", ("swap_minmax",),
            lambda rng: [(3, 7), (5, 5), (9, 2), *[(int(a), int(b)) for a, b in rng.integers(-9, 10, size=(3, 2))]]),
        Template("sum_first", "return the sum of the first {n} items of {xs}", """
def {f}({xs}, {n}):
    {acc} = 0
    for {i} in range({n}):
        {acc} += {xs}[{i}]
    return {acc}
""", ("fix_range_end", "fix_init"),
            lambda rng: [([1, 2, 3], 2), ([4, 5], 0), ([7, 1, 2], 3),
                         *[(xs, int(rng.integers(0, len(xs) + 1))) for xs in _lists(rng, [], 3, min_len=1)]]),
        Template("count_in_window", "count the items of {xs} with {lo} <= item < {hi}", """
def {f}({xs}, {lo}, {hi}):
    {acc} = 0
    for {x} in {xs}:
        if {lo} <= {x} < {hi}:
            {acc} += 1
    return {acc}
""", ("fix_comparison", "fix_init"),
            lambda rng: [([1, 2, 3], 2, 5), ([0, 4, 2], 1, 4), ([], 0, 3),
                         *[(xs, int(rng.choice(xs)), int(rng.choice(xs)) + 3)
                           for xs in _lists(rng, [], 4, min_len=1)]]),
    ),
    "heldout": (
        Template("lowest", "return the smallest item of {xs}", """
def {f}({xs}):
    return min({xs})
""", ("swap_minmax",), _seq_inputs([[3, 1, 2], [5], [4, 8]], min_len=1)),
        Template("count_at_most", "count the items of {xs} that are at most {t}", """
def {f}({xs}, {t}):
    {acc} = 0
    for {x} in {xs}:
        if {x} <= {t}:
            {acc} += 1
    return {acc}
""", ("fix_comparison", "fix_init"), _count_cmp_inputs),
        Template("percent_of", "return {a} as a whole percentage of {b}, or 0 when {b} is 0", """
def {f}({a}, {b}):
    if not {b}:
        return 0
    return {a} * 100 // {b}
""", ("add_zero_guard",), _pair_inputs),
        Template("sum_steps", "return the sum of 0, {b}, 2 * {b}, ... up to {n} inclusive", """
def {f}({n}, {b}):
    {acc} = 0
    for {i} in range(0, {n} + 1, {b}):
        {acc} += {i}
    return {acc}
""", ("fix_range_end", "fix_init"),
            lambda rng: [(6, 2), (4, 4), (7, 3),
                         *[(int(n), int(b)) for n, b in zip(rng.integers(0, 12, 3), rng.integers(1, 4, 3))]]),
        Template("tail", "return the last item of {xs}, or 0 if {xs} is empty", """
def {f}({xs}):
    if not {xs}:
        return 0
    return {xs}[-1]
""", ("add_zero_guard",), _seq_inputs([[3, 4], [], [8]], min_len=1)),
        Template("all_below", "return True if every item of {xs} is less than {t}", """
def {f}({xs}, {t}):
    for {x} in {xs}:
        if {x} >= {t}:
            return False
    return True
""", ("fix_comparison",),
            lambda rng: [([1, 2], 3), ([1, 3], 3), ([], 0), *_with_threshold(rng, _lists(rng, [[2, 5]], 4))]),
    ),
    "test": (
        Template("strictly_rising", "return True if each item of {xs} is greater than the one before", """
def {f}({xs}):
    for {i} in range(len({xs}) - 1):
        if {xs}[{i}] >= {xs}[{i} + 1]:
            return False
    return True
""", ("fix_comparison", "fix_range_end"),
            _seq_inputs([[1, 2, 3], [1, 1, 2], [1, 3, 2], [2, 5, 5], []])),
        Template("per_unit", "return {a} split evenly into {b} parts (whole parts), or 0 when {b} is 0", """
def {f}({a}, {b}):
    if not {b}:
        return 0
    return {a} // {b}
""", ("add_zero_guard",), _pair_inputs),
        Template("saturate", "return {x}, but never more than {t}", """
def {f}({x}, {t}):
    return min({x}, {t})
""", ("swap_minmax",),
            lambda rng: [(5, 3), (1, 3), (3, 3), *[(int(a), int(b)) for a, b in rng.integers(-9, 10, size=(3, 2))]]),
        Template("sum_evens_below", "return the sum of the even numbers from 0 up to but not including {n}", """
def {f}({n}):
    {acc} = 0
    for {i} in range(0, {n}, 2):
        {acc} += {i}
    return {acc}
""", ("fix_range_end", "fix_init"), _n_inputs(0, 12, [5, 7, 4, 1])),
        Template("triangle", "return 0 + 1 + ... + {n}", """
def {f}({n}):
    {acc} = 0
    for {i} in range({n} + 1):
        {acc} += {i}
    return {acc}
""", ("fix_range_end", "fix_init"), _n_inputs(0, 10, [3, 1, 0, 4])),
        Template("count_odd", "count the odd items of {xs}", """
def {f}({xs}):
    {acc} = 0
    for {x} in {xs}:
        if {x} % 2 == 1:
            {acc} += 1
    return {acc}
""", ("fix_init",), _seq_inputs([[1, 2, 3], [], [2], [5, 7]])),
        Template("first_big", "return True if the first item of {xs} exceeds {t}, or 0 if {xs} is empty", """
def {f}({xs}, {t}):
    if not {xs}:
        return 0
    return {xs}[0] > {t}
""", ("add_zero_guard",),
            lambda rng: [([5, 1], 3), ([], 2), ([3], 3), *_with_threshold(rng, _lists(rng, [], 3, min_len=1))]),
    ),
}


def _name(rng: np.random.Generator, content: str) -> str:
    digest = hashlib.sha1(content.encode()).hexdigest()[:6]
    return f"{VERBS[int(rng.integers(len(VERBS)))]}_{NOUNS[int(rng.integers(len(NOUNS)))]}_{digest}"


def make_task(template: Template, fix_op: str, rng: np.random.Generator, split: str) -> Task:
    """One task from ``template`` with defect ``fix_op``, identifiers and inputs drawn from ``rng``."""
    if fix_op not in template.ops:
        raise ValueError(f"template {template.key!r} carries only {', '.join(template.ops)}, not {fix_op!r}")
    names = {role: str(pool[int(rng.integers(len(pool)))]) for role, pool in WORDS.items()}
    inputs, seen = [], set()
    for args in template.inputs(rng):  # drop repeated inputs, keep the first of each in order
        if repr(args) not in seen:
            seen.add(repr(args))
            inputs.append(args)
    content = f"{template.key}|{fix_op}|{sorted(names.items())}|{inputs!r}"
    names["f"] = _name(rng, content)
    return task_from_correct(names["f"], template.statement.format(**names), template.source.format(**names),
                             fix_op, inputs, split=split)


def _candidate(split: str, fix_op: str, rng: np.random.Generator) -> Task | None:
    """One checked task with defect ``fix_op`` from a random template of ``split``, or None on a bad draw."""
    options = [t for t in TEMPLATES[split] if fix_op in t.ops]
    template = options[int(rng.integers(len(options)))]
    try:
        task = make_task(template, fix_op, rng, split)
    except Exception:  # noqa: BLE001 - a template/input mismatch; the caller draws another
        return None
    return None if task_problems(task) else task


def _name_free(task: Task) -> bool:
    """No other task is registered under this task's name (the same task may be)."""
    known = REGISTRY.get(task.name)
    return known is None or known == task


def generate_tasks(split: str = "train", n: int = 100, seed: int = 0) -> list[Task]:
    """``n`` procedurally generated, checked and registered tasks from the split's templates.

    :param split: ``"train"``, ``"heldout"`` or ``"test"`` (disjoint template sets)
    :param n: how many tasks; names are unique within the result
    :param seed: the same ``(split, n, seed)`` always gives the same tasks
    :return: tasks cycling through the five defect kinds, usable as ``BugFixEnv(tasks=...)``
    """
    if split not in TEMPLATES:
        raise ValueError(f"unknown generator split {split!r}; use one of {', '.join(GENERATED_SPLITS)}")
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    rng = np.random.default_rng([seed, GENERATED_SPLITS.index(split)])
    tasks: list[Task] = []
    names: set[str] = set()
    attempts = 0
    while len(tasks) < n:
        attempts += 1
        if attempts > 20 * n + 100:
            raise RuntimeError(f"could not generate {n} valid {split} tasks (made {len(tasks)})")
        task = _candidate(split, FIX_OPS[len(tasks) % len(FIX_OPS)], rng)
        if task is None or task.name in names or not _name_free(task):
            continue
        names.add(task.name)
        tasks.append(task)
    return register(tasks)


_RECENT: OrderedDict[str, Task] = OrderedDict()  # name -> per-episode task registered by draw_task, oldest first


def draw_task(split: str, rng: np.random.Generator) -> Task:
    """One fresh checked task for one episode: a defect kind drawn uniformly, then a template of
    ``split`` carrying it, names and inputs, all from ``rng`` (so the same generator state gives
    the same task). It stays registered by name while it is among the ``RECENT_LIMIT`` most
    recently drawn tasks, so the scripted oracle finds it during its episode.

    :param split: ``"train"``, ``"heldout"`` or ``"test"``
    :param rng: the env's ``np_random``
    """
    if split not in TEMPLATES:
        raise ValueError(f"unknown generator split {split!r}; use one of {', '.join(GENERATED_SPLITS)}")
    for _ in range(MAX_DRAWS):
        task = _candidate(split, FIX_OPS[int(rng.integers(len(FIX_OPS)))], rng)
        if task is not None and _name_free(task):
            return _register_recent(task)
    raise RuntimeError(f"could not generate a valid {split} task in {MAX_DRAWS} draws")


def _register_recent(task: Task) -> Task:
    """Register a per-episode task, dropping the oldest such registration beyond ``RECENT_LIMIT``."""
    if task.name in _RECENT:
        _RECENT.move_to_end(task.name)
        return _RECENT[task.name]
    if task.name in REGISTRY:  # registered for good (generate_tasks made the same task)
        return task
    REGISTRY[task.uid] = REGISTRY[task.name] = task
    _RECENT[task.name] = task
    while len(_RECENT) > RECENT_LIMIT:
        name, old = _RECENT.popitem(last=False)
        if REGISTRY.get(old.uid) is old:  # not re-registered for good since
            del REGISTRY[old.uid]
            if REGISTRY.get(name) is old:
                del REGISTRY[name]
    return task
