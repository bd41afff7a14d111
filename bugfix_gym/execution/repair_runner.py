"""BugFix-v1's tests of a source: run in the contained worker, judged here, cached by content.

:func:`run_repair_tests` is the one entry point for BugFix-v1's ``test``, ``locate``, the hidden
tests behind the reward and the baselines. It takes what a task carries: the entry function's
name, the trusted ``support`` code, the case tuple (:class:`~bugfix_gym.execution.repair_cases.CallCase`
and :class:`~bugfix_gym.execution.repair_cases.AssertCase` items) and the source to test. Every
source runs in the persistent worker (:mod:`bugfix_gym.execution.worker`), whatever its origin:
mutants and free-form patches are code nobody has reviewed.

Judging happens in this process only: a CallCase's outcome against its expected value (which
never leaves this process), an AssertCase by replaying the worker's recorded calls against the
test run here (:func:`bugfix_gym.execution.repair_cases.replay_assert_case`). A load error, a
timeout, a crash or a malformed answer fails the cases it touches, and a suite of no cases passes
nothing (``ok`` is False).

Reports are cached by what decides them: the entry name, the support code, the cases (their
``repr``, which tells ``1``, ``1.0`` and ``True`` apart), the source and whether coverage was
asked; a report with coverage also answers the same request without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .repair_cases import AssertCase, CallCase, case_head, judge_call_case, replay_assert_case
from .worker import Job, JobResult, Worker, default_worker

CACHE_LIMIT = 50_000  # cached reports; the cache empties itself when full
_CACHE: dict[tuple, RepairReport] = {}
_SUITE_KEYS: dict[int, tuple[Sequence, str]] = {}  # id(cases) -> (cases, repr(cases)); holds the cases alive
stats = {"hits": 0, "misses": 0}


@dataclass(frozen=True)
class RepairReport:
    """What one run of a case list found, judged.

    :param passed: cases that passed
    :param total: cases in the list (none passes nothing: ``ok`` is False)
    :param first_failure: the first failing case in words (input, expected, got), or None
    :param per_case: whether each case passed, in order
    :param coverage: per case the frozenset of the candidate's line numbers it ran (when asked), else None
    :param details: each case in words, in order
    """

    passed: int
    total: int
    first_failure: str | None
    per_case: tuple[bool, ...]
    coverage: tuple[frozenset[int], ...] | None = None
    details: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.total > 0 and self.passed == self.total


def judge(entry: str, support: str, cases: Sequence, result: JobResult) -> RepairReport:
    """The report of one job's checked result (:class:`bugfix_gym.execution.worker.JobResult`)."""
    total = len(cases)
    if result.load_error is not None:
        why = f"the code does not load : {result.load_error}"
        return RepairReport(0, total, why, (False,) * total, result.lines, (why,) * total)
    per_case, details = [], []
    for case, outcome in zip(cases, result.outcomes):
        if type(case) is CallCase:
            ok, detail = judge_call_case(entry, case, outcome)
        elif outcome[0] == "calls":
            ok, detail = replay_assert_case(case, support, outcome[1])
        else:
            ok, detail = False, f"test {case_head(case)} : {outcome[1]}"
        per_case.append(ok)
        details.append(detail)
    first = next((d for ok, d in zip(per_case, details) if not ok), None)
    return RepairReport(sum(per_case), total, first, tuple(per_case), result.lines, tuple(details))


def _check_cases(entry: str, support: str, cases: Sequence) -> None:
    if not isinstance(entry, str) or not isinstance(support, str):
        raise TypeError("entry and support must be str")
    for case in cases:
        if type(case) not in (CallCase, AssertCase):
            raise TypeError(f"a test case must be a CallCase or an AssertCase, got {type(case).__name__}")


def run_repair_tests(entry: str, support: str, cases: Sequence, source: str, *, coverage: bool = False,
                     timeout_s: float | None = None, max_ticks: int | None = None, cache: bool = True,
                     worker: Worker | None = None) -> RepairReport:
    """Run ``entry`` of ``source`` on ``cases`` in the contained worker and judge it here; never raises for
    anything the source does (``TypeError`` for a case that is neither a CallCase nor an AssertCase).

    :param entry: the function the cases call (an AssertCase calls it as ``candidate``)
    :param support: trusted code the AssertCases may use (the original module's helpers, the tests' own
        top-level code), run before each of them on both sides; never the candidate's
    :param cases: the case tuple (visible or hidden)
    :param source: the module to test
    :param coverage: also return, per case, the candidate's lines it ran (for ``locate``)
    :param timeout_s: wall-clock limit for all the cases (default ``bugfix_gym.execution.sandbox.TIMEOUT_S``)
    :param max_ticks: loop iterations per candidate call (default ``bugfix_gym.execution.worker.LOOP_TICKS``)
    :param cache: look the report up / store it (off: always run)
    :param worker: the worker to use (default: this process's :func:`bugfix_gym.execution.worker.default_worker`)
    """
    return run_repair_tests_many(entry, support, cases, [source], coverage=coverage, timeout_s=timeout_s,
                                 max_ticks=max_ticks, cache=cache, worker=worker)[0]


def run_repair_tests_many(entry: str, support: str, cases: Sequence, sources: Sequence[str], *,
                          coverage: bool = False, timeout_s: float | None = None, max_ticks: int | None = None,
                          cache: bool = True, worker: Worker | None = None) -> list[RepairReport]:
    """:func:`run_repair_tests` for many sources against one case list: the ones not cached run in one
    round trip to the worker (each in its own grandchild, with its own deadline), for brute force."""
    _check_cases(entry, support, cases)
    suite = (entry, support, _cases_key(cases), timeout_s, max_ticks)
    reports: list[RepairReport | None] = [None] * len(sources)
    todo: dict[str, list[int]] = {}
    for i, source in enumerate(sources):
        found = _lookup(suite, source, coverage) if cache else None
        if found is not None:
            stats["hits"] += 1
            reports[i] = found
        else:
            todo.setdefault(source, []).append(i)
    if todo:
        stats["misses"] += len(todo)
        jobs = [Job(source, entry, tuple(cases), support, coverage) for source in todo]
        results = (worker or default_worker()).run_many(jobs, timeout_s=timeout_s, max_ticks=max_ticks)
        for (source, indices), result in zip(todo.items(), results):
            report = judge(entry, support, cases, result)
            if cache:
                if len(_CACHE) >= CACHE_LIMIT:
                    clear_cache(keep_stats=True)
                _CACHE[(suite, source, coverage)] = report
            for i in indices:
                reports[i] = report
    return [report for report in reports if report is not None]


def _lookup(suite: tuple, source: str, coverage: bool) -> RepairReport | None:
    found = _CACHE.get((suite, source, True))
    if found is None and not coverage:
        found = _CACHE.get((suite, source, False))
    return found


def _cases_key(cases: Sequence) -> str:
    """``repr(cases)``, computed once per cases object (a task's case tuples are reused every step)."""
    known = _SUITE_KEYS.get(id(cases))
    if known is not None and known[0] is cases:
        return known[1]
    text = repr(cases)
    _SUITE_KEYS[id(cases)] = (cases, text)
    return text


def clear_cache(keep_stats: bool = False) -> None:
    """Forget every cached report (and, unless ``keep_stats``, reset the hit / miss counts)."""
    _CACHE.clear()
    _SUITE_KEYS.clear()
    if not keep_stats:
        stats.update(hits=0, misses=0)
