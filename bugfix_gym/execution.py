"""Running task code: bounded, exception-safe, cached by source text.

Built-in and generated tasks run in-process. Every loop body is instrumented (an AST
rewrite) with a tick that raises after ``MAX_LOOP_TICKS`` iterations per test case, so an
edit that makes a ``while`` loop spin fails that test with ``Timeout`` instead of hanging
the environment; the limit counts iterations, not seconds, so results are deterministic.
Exceptions become failed tests. User task packs run in a subprocess with wall-clock and
memory limits (``sandbox=True``), see :mod:`bugfix_gym.sandbox`.
"""

from __future__ import annotations

import ast
import builtins
import copy
import math
import sys
from dataclasses import dataclass
from typing import Any, Sequence

MAX_LOOP_TICKS = 100_000
MAX_RECURSION = 200

Case = tuple[tuple, Any]  # (args, expected)


class LoopBudgetExceeded(Exception):
    """Raised inside task code that runs more than MAX_LOOP_TICKS loop iterations."""


@dataclass(frozen=True)
class TestReport:
    """What one run of a test list found: counts and the first failure, already in words."""

    passed: int
    total: int
    first_failure: str | None = None

    @property
    def ok(self) -> bool:
        return self.passed == self.total


class _TickLoops(ast.NodeTransformer):
    def _tick(self, node):
        self.generic_visit(node)
        call = ast.Expr(ast.Call(ast.Name("__bf_tick__", ast.Load()), [], []))
        node.body.insert(0, ast.copy_location(call, node.body[0]))
        return node

    visit_For = visit_While = visit_AsyncFor = _tick


def compile_function(source: str, name: str):
    """Source -> (function, tick_reset) or raise the compile/exec error (as the test tool reports it)."""
    tree = _TickLoops().visit(ast.parse(source))
    ast.fix_missing_locations(tree)
    code = compile(tree, f"<task {name}>", "exec")
    counter = [0]

    def tick():
        counter[0] += 1
        if counter[0] > MAX_LOOP_TICKS:
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


def format_call(name: str, args: tuple) -> str:
    return f"{name}({', '.join(repr(a) for a in args)})"


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _error_name(exc: BaseException) -> str:
    return "Timeout" if isinstance(exc, LoopBudgetExceeded) else type(exc).__name__


def run_cases(source: str, name: str, cases: Sequence[Case]) -> TestReport:
    """Run ``name(*args)`` from ``source`` on every case; never raises."""
    try:
        func, reset = compile_function(source, name)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - task code may raise anything
        return TestReport(0, len(cases), f"the code does not load : {_error_name(exc)}")
    passed, first = 0, None
    old_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old_limit, 1000))
    try:
        for args, expected in cases:
            reset()
            try:
                got = func(*copy.deepcopy(args))  # task code must not change the stored cases
                ok = same_value(got, expected)
                detail = f"{format_call(name, args)} expected {_short(expected)} got {_short(got)}"
            except (Exception, SystemExit) as exc:  # noqa: BLE001
                ok = False
                detail = f"{format_call(name, args)} expected {_short(expected)} raised {_error_name(exc)}"
            if ok:
                passed += 1
            elif first is None:
                first = detail
    finally:
        sys.setrecursionlimit(old_limit)
    return TestReport(passed, len(cases), first)


_CACHE: dict[tuple[str, str, str], TestReport] = {}
_CACHE_LIMIT = 200_000
stats = {"hits": 0, "misses": 0}


def run_tests(task, source: str, which: str, *, cache: bool = True) -> TestReport:
    """Run the task's ``which`` ('visible' | 'hidden') tests on ``source``, cached by source text."""
    key = (task.uid, source, which)
    if cache:
        report = _CACHE.get(key)
        if report is not None:
            stats["hits"] += 1
            return report
    stats["misses"] += 1
    cases = task.visible if which == "visible" else task.hidden
    if task.sandbox:
        from .sandbox import run_cases_sandboxed

        report = run_cases_sandboxed(source, task.name, cases)
    else:
        report = run_cases(source, task.name, cases)
    if cache:
        if len(_CACHE) >= _CACHE_LIMIT:
            _CACHE.clear()
        _CACHE[key] = report
    return report


def clear_cache() -> None:
    _CACHE.clear()
    stats.update(hits=0, misses=0)
