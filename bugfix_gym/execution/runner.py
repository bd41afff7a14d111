"""Running a task's tests: in-process or sandboxed, cached by content.

:func:`run_tests` is the one entry point the env and the task checks use. Built-in and
generated tasks run in this process (:func:`bugfix_gym.execution.cases.run_cases`); task-pack
tasks (``task.sandbox``) run in a contained child (:func:`bugfix_gym.execution.sandbox.run_cases_sandboxed`).

Results are cached by what decides them: the function name, the source, the test cases
(their ``repr``, which tells ``1``, ``1.0`` and ``True`` apart) and where they ran. Two tasks
with the same uid but different cases (an edited pack, a variant with an extra hidden case)
never share a result.
"""

from __future__ import annotations

from typing import Sequence

from .cases import Case, TestReport, run_cases
from .sandbox import run_cases_sandboxed

CACHE_LIMIT = 50_000  # cached reports (tens of MB at most with generated tasks); the cache empties itself when full
_CACHE: dict[tuple[str, bool, str, str], TestReport] = {}
_CASES_KEYS: dict[int, tuple[Sequence[Case], str]] = {}  # id(cases) -> (cases, repr(cases)); holds cases alive
stats = {"hits": 0, "misses": 0}


def run_tests(task, source: str, which: str, *, cache: bool = True) -> TestReport:
    """Run the task's ``which`` (``'visible'`` | ``'hidden'``) tests on ``source``; never raises.

    :param task: a :class:`bugfix_gym.tasks.library.Task`
    :param source: the code to test (the task's current source)
    :param which: ``'visible'`` or ``'hidden'``
    :param cache: look the result up / store it (off: always run)
    """
    if which not in ("visible", "hidden"):
        raise ValueError(f"which must be 'visible' or 'hidden', got {which!r}")
    cases = task.visible if which == "visible" else task.hidden
    key = (task.name, bool(task.sandbox), source, _cases_key(cases))
    if cache:
        report = _CACHE.get(key)
        if report is not None:
            stats["hits"] += 1
            return report
    stats["misses"] += 1
    if task.sandbox:
        report = run_cases_sandboxed(source, task.name, cases)
    else:
        report = run_cases(source, task.name, cases)
    if cache:
        if len(_CACHE) >= CACHE_LIMIT:
            clear_cache(keep_stats=True)
        _CACHE[key] = report
    return report


def _cases_key(cases: Sequence[Case]) -> str:
    """``repr(cases)``, computed once per cases object (a task's case tuples are reused every step)."""
    known = _CASES_KEYS.get(id(cases))
    if known is not None and known[0] is cases:
        return known[1]
    text = repr(cases)
    _CASES_KEYS[id(cases)] = (cases, text)
    return text


def clear_cache(keep_stats: bool = False) -> None:
    """Forget every cached report (and, unless ``keep_stats``, reset the hit / miss counts)."""
    _CACHE.clear()
    _CASES_KEYS.clear()
    if not keep_stats:
        stats.update(hits=0, misses=0)
