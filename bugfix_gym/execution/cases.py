"""Running task code: bounded, exception-safe, and judged by value.

This module is a leaf: it imports only the standard library and nothing of this package,
so the sandbox child (:mod:`bugfix_gym.execution.sandbox_child`) can load it on its own under
``python -I -S``. ``tests/test_layering.py`` checks that.

Every loop body of task code is instrumented (an AST rewrite) with a tick that raises
after ``MAX_LOOP_TICKS`` iterations per test case, so an edit that makes a ``while`` loop
spin fails that test with ``Timeout`` instead of hanging the environment; the limit counts
iterations, not seconds, so results are deterministic. Exceptions become failed tests.

Running a test list is split in two halves so that the sandbox can keep the judging on the
trusted side: :func:`call_one` runs one call and returns an *outcome* (the value, or the
name of the exception), :func:`judge` compares outcomes with the expected values. For
built-in and generated tasks :func:`run_cases` does both in-process; for task packs the
child only calls and the parent judges (:mod:`bugfix_gym.execution.sandbox`). Dispatch between the
two and the result cache live in :mod:`bugfix_gym.execution.runner`.
"""

from __future__ import annotations

import ast
import builtins
import copy
import functools
import math
import re
import sys
from dataclasses import dataclass
from types import CodeType
from typing import Any, Callable, Sequence

MAX_LOOP_TICKS = 100_000
COMPILED_CACHE_SIZE = 1024  # instrumented code objects kept, most recently used first
MAX_NAME_CHARS = 40  # an exception or type name longer than this (or not an ASCII identifier) is not repeated
MAX_VALUE_DEPTH = 20  # test values nest lists / dicts at most this deep

Case = tuple[tuple, Any]  # (args, expected)
Outcome = tuple[str, Any]  # ("value", returned value) | ("raised", exception name) | ("unsent", why, in words)

_SAFE_NAME = re.compile(rf"[A-Za-z_][A-Za-z0-9_]{{0,{MAX_NAME_CHARS - 1}}}")


class LoopBudgetExceeded(Exception):
    """Raised inside task code that runs more than MAX_LOOP_TICKS loop iterations."""


@dataclass(frozen=True)
class TestReport:
    """What one run of a test list found: counts and the first failure, already in words.

    :param passed: cases that passed
    :param total: cases run (an empty list passes nothing: ``ok`` is False)
    :param first_failure: the first failing case in words, or ``None``
    """

    passed: int
    total: int
    first_failure: str | None = None

    @property
    def ok(self) -> bool:
        return self.total > 0 and self.passed == self.total


class _TickLoops(ast.NodeTransformer):
    def _tick(self, node):
        self.generic_visit(node)
        call = ast.Expr(ast.Call(ast.Name("__bf_tick__", ast.Load()), [], []))
        node.body.insert(0, ast.copy_location(call, node.body[0]))
        return node

    visit_For = visit_While = visit_AsyncFor = _tick


def compile_ticked(source: str, filename: str) -> CodeType:
    """``source`` compiled as a module whose every loop body first calls ``__bf_tick__()`` (which the
    namespace it runs in must define). A source that does not compile raises."""
    tree = _TickLoops().visit(ast.parse(source))
    ast.fix_missing_locations(tree)
    return compile(tree, filename, "exec")


@functools.lru_cache(maxsize=COMPILED_CACHE_SIZE)
def _compiled(source: str, name: str) -> CodeType:
    """The instrumented code object of ``source`` (immutable, so shared: an episode compiles the
    sources its task check already compiled). A source that does not compile raises, uncached."""
    return compile_ticked(source, f"<task {name}>")


def compile_function(source: str, name: str, max_ticks: int | None = None) -> tuple[Callable, Callable[[], None]]:
    """Source -> (function, tick_reset) or raise the compile/exec error (as the test tool reports it).

    Every call executes the code in a new namespace, so each function has its own tick counter.

    :param max_ticks: loop iterations allowed per call between two resets (default :data:`MAX_LOOP_TICKS`)
    """
    code = _compiled(source, name)
    counter = [0]
    limit = MAX_LOOP_TICKS if max_ticks is None else max_ticks

    def tick():
        counter[0] += 1
        if counter[0] > limit:
            raise LoopBudgetExceeded

    namespace: dict[str, Any] = {"__builtins__": builtins, "__bf_tick__": tick}
    exec(code, namespace)
    func = namespace.get(name)
    if not callable(func):
        raise NameError(name)

    def reset():
        counter[0] = 0

    return func, reset


def same_value(got: Any, expected: Any) -> bool:
    """Equality as a test would check it: bools are not ints, floats compare with a tolerance."""
    if isinstance(got, bool) or isinstance(expected, bool):
        return type(got) is type(expected) and got == expected
    if isinstance(got, float) or isinstance(expected, float):
        try:
            return math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-9)
        except TypeError:
            return False
    try:
        return bool(got == expected)
    except Exception:  # noqa: BLE001 - a strange object from task code
        return False


def is_plain(value: Any, depth: int = MAX_VALUE_DEPTH) -> bool:
    """True for a JSON value of exact built-in types: None, bool, int, float, str, list, dict with str keys.

    Subclasses (and so objects with their own ``__eq__``) are not plain; neither is anything
    nested more than ``depth`` lists / dicts deep.
    """
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return True
    if depth <= 0:
        return False
    if kind is list:
        return all(is_plain(v, depth - 1) for v in value)
    if kind is dict:
        return all(type(k) is str and is_plain(v, depth - 1) for k, v in value.items())
    return False


def safe_name(text: Any) -> str | None:
    """``text`` if it is an ASCII identifier of at most MAX_NAME_CHARS characters, else None."""
    return text if isinstance(text, str) and _SAFE_NAME.fullmatch(text) else None


def error_name(exc: BaseException) -> str:
    """How a test report names an exception: ``Timeout`` for the loop budget, else its (bounded) class name."""
    if isinstance(exc, LoopBudgetExceeded):
        return "Timeout"
    return safe_name(type(exc).__name__) or "an exception with an unprintable name"


def format_call(name: str, args: Sequence) -> str:
    return f"{name}({', '.join(ascii(a) for a in args)})"


def _short(value: Any, limit: int = 60) -> str:
    text = ascii(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def call_one(func: Callable, reset: Callable[[], None], args: Sequence) -> Outcome:
    """Call ``func(*args)`` on a copy of the arguments with a fresh loop budget; never raises."""
    reset()
    try:
        return "value", func(*copy.deepcopy(tuple(args)))  # task code must not change the stored cases
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - task code may raise anything
        return "raised", error_name(exc)


def judge_one(name: str, args: Sequence, expected: Any, outcome: Outcome) -> tuple[bool, str]:
    """Whether an outcome passes its case, and the case in words."""
    kind, payload = outcome
    call = f"{format_call(name, args)} expected {_short(expected)}"
    if kind == "value":
        return same_value(payload, expected), f"{call} got {_short(payload)}"
    if kind == "raised":
        return False, f"{call} raised {payload}"
    return False, f"{call} got {payload}"


def judge(name: str, cases: Sequence[Case], load_error: str | None, outcomes: Sequence[Outcome]) -> TestReport:
    """Compare one outcome per case with its expected value (``load_error``: the code did not load)."""
    if load_error is not None:
        return TestReport(0, len(cases), f"the code does not load : {load_error}")
    if len(outcomes) != len(cases):
        raise ValueError(f"{len(outcomes)} outcomes for {len(cases)} cases")
    passed, first = 0, None
    for (args, expected), outcome in zip(cases, outcomes):
        ok, detail = judge_one(name, args, expected, outcome)
        if ok:
            passed += 1
        elif first is None:
            first = detail
    return TestReport(passed, len(cases), first)


def run_cases(source: str, name: str, cases: Sequence[Case]) -> TestReport:
    """Run ``name(*args)`` from ``source`` on every case in this process and judge it; never raises."""
    try:
        func, reset = compile_function(source, name)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - task code may raise anything
        return judge(name, cases, error_name(exc), [])
    passed, first = 0, None
    old_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old_limit, 1000))
    try:
        for args, expected in cases:  # judged right after each call: a later call cannot change an earlier value
            ok, detail = judge_one(name, args, expected, call_one(func, reset, args))
            if ok:
                passed += 1
            elif first is None:
                first = detail
    finally:
        sys.setrecursionlimit(old_limit)
    return TestReport(passed, len(cases), first)
