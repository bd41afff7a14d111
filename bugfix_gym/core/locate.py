"""Spectrum-based fault localisation for BugFix-v1's ``locate`` tool.

Each visible case ran some lines of the candidate (its coverage, recorded in the sandbox with the test run:
:func:`bugfix_gym.execution.repair_runner.run_repair_tests` with ``coverage=True``) and passed or failed. A line
that runs in the failing cases and rarely in the passing ones is suspicious. Ochiai's score (Abreu et al. 2007,
"On the accuracy of spectrum-based fault localization"), for line ``s``::

    ochiai(s) = failed(s) / sqrt(total_failed * (failed(s) + passed(s)))

with ``failed(s)`` / ``passed(s)`` the failing / passing cases that ran ``s`` and ``total_failed`` all failing
cases; 0 when either factor under the root is 0. It is 1 for a line that ran in every failing case and no
passing one.
"""

from __future__ import annotations

import math
from typing import Sequence

__all__ = ("TOP_LINES", "locate_text", "ochiai", "ranked")

TOP_LINES = 5
"""Lines ``locate`` shows at most."""


def ochiai(per_case: Sequence[bool], coverage: Sequence[frozenset[int]]) -> dict[int, float]:
    """Ochiai's suspiciousness of every line any case ran: ``{line: score}``, scores in [0, 1].

    :param per_case: whether each case passed
    :param coverage: per case, the lines it ran (same order and length as ``per_case``)
    """
    if len(per_case) != len(coverage):
        raise ValueError(f"per_case has {len(per_case)} cases and coverage {len(coverage)}; give one set per case")
    total_failed = sum(1 for ok in per_case if not ok)
    failed: dict[int, int] = {}
    passed: dict[int, int] = {}
    for ok, lines in zip(per_case, coverage):
        counts = passed if ok else failed
        for line in lines:
            counts[line] = counts.get(line, 0) + 1
    scores = {}
    for line in sorted(set(failed) | set(passed)):
        f, p = failed.get(line, 0), passed.get(line, 0)
        scores[line] = f / math.sqrt(total_failed * (f + p)) if total_failed and f else 0.0
    return scores


def ranked(scores: dict[int, float]) -> list[tuple[int, float]]:
    """The lines with a positive score, most suspicious first (ties: the earlier line first)."""
    return sorted(((line, s) for line, s in scores.items() if s > 0), key=lambda item: (-item[1], item[0]))


def locate_text(per_case: Sequence[bool], coverage: Sequence[frozenset[int]], first_failure: str | None,
                top: int = TOP_LINES) -> str:
    """What ``locate`` answers: the top lines with their scores, or why there are none.

    :param per_case: whether each visible case passed
    :param coverage: the lines each visible case ran
    :param first_failure: the first failing case in words (shown when no line can be scored)
    :param top: lines shown at most
    """
    total_failed = sum(1 for ok in per_case if not ok)
    if not total_failed:
        return f"all {len(per_case)} visible tests pass : no failing test to locate from"
    best = ranked(ochiai(per_case, coverage))[:top]
    if not best:
        return f"{total_failed} / {len(per_case)} visible tests fail but ran no line of the function : {first_failure}"
    lines = " , ".join(f"line {line} {score:.2f}" for line, score in best)
    return f"suspicious lines (Ochiai, {total_failed} / {len(per_case)} visible tests failing) : {lines}"
