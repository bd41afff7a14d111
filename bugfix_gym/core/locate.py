"""Spectrum-based fault localisation for BugFix-v1's ``locate`` tool.

Each visible case ran some lines of the candidate (its coverage, recorded in the sandbox with the test run:
:func:`bugfix_gym.execution.repair_runner.run_repair_tests` with ``coverage=True``) and passed or failed. A line
that runs in the failing cases and rarely in the passing ones is suspicious. Ochiai's score (Abreu et al. 2007,
"On the accuracy of spectrum-based fault localization"), for line ``s``::

    ochiai(s) = failed(s) / sqrt(total_failed * (failed(s) + passed(s)))

with ``failed(s)`` / ``passed(s)`` the failing / passing cases that ran ``s`` and ``total_failed`` all failing
cases; 0 when either factor under the root is 0. It is 1 for a line that ran in every failing case and no
passing one.

After the lines, ``locate`` lists the sites of the lines it shows (most suspicious first, whole lines, while they
fit in :data:`SITES_CHARS` characters; the first line always, cut at that length): ``L.K`` and the expression's
code, so that an agent can write ``edit L.K ...`` without numbering a line's expressions itself. Every site of a
line with a legal edit is listed, whatever the bug: the list says where an edit can go, not which one repairs.
"""

from __future__ import annotations

import ast
import math
from typing import Sequence

from ..edits.sites import MAX_EXPRS, analysis, clip_text

__all__ = ("SITES_CHARS", "SITES_MARK", "TOP_LINES", "line_sites", "locate_text", "ochiai", "ranked")

TOP_LINES = 5
"""Lines ``locate`` shows at most."""
SITES_CHARS = 200
"""Characters of site lists ``locate`` adds after its lines at most (a first line longer than that is cut)."""
SITE_CHARS = 16
"""Characters of one site's code at most (longer code ends ``...``)."""
SITES_MARK = " . sites : "
"""What separates ``locate``'s scored lines from its site lists."""


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


def line_sites(source: str, line: int) -> str:
    """The sites of ``line`` that have a legal edit, ``L.K code`` joined by `` , `` (``L.0 statement`` for the
    statement itself); empty when there are none or the source does not parse."""
    try:
        found = analysis(source)
    except SyntaxError:
        return ""
    parts = []
    for k in range(MAX_EXPRS):  # legal_at has nothing past MAX_EXPRS
        if found.legal_at(line, k):
            code = "statement" if k == 0 else clip_text(ast.unparse(found.sites.slots[(line, k)].node), SITE_CHARS)
            parts.append(f"{line}.{k} {code}")
    return " , ".join(parts)


def _sites(source: str, lines: Sequence[int]) -> str:
    """The site lists of ``lines`` in order, ``;``-separated, whole lines while they fit in :data:`SITES_CHARS`;
    a first line longer than that shows the sites that fit (one at least), then ``...``."""
    out: list[str] = []
    used = 0
    for line in lines:
        text = line_sites(source, line)
        if not text:
            continue
        if out and used + len(text) > SITES_CHARS:
            break
        if len(text) > SITES_CHARS:
            cut = text.rfind(" , ", 0, SITES_CHARS)
            text = (text[:cut] if cut > 0 else text.split(" , ")[0]) + " , ..."
        out.append(text)
        used += len(text)
    return " ; ".join(out)


def locate_text(per_case: Sequence[bool], coverage: Sequence[frozenset[int]], first_failure: str | None,
                top: int = TOP_LINES, source: str | None = None) -> str:
    """What ``locate`` answers: the top lines with their scores (and, given ``source``, their sites), or why
    there are none.

    :param per_case: whether each visible case passed
    :param coverage: the lines each visible case ran
    :param first_failure: the first failing case in words (shown when no line can be scored)
    :param top: lines shown at most
    :param source: the source the cases ran: its shown lines' sites follow :data:`SITES_MARK`
    """
    total_failed = sum(1 for ok in per_case if not ok)
    if not total_failed:
        return f"all {len(per_case)} visible tests pass : no failing test to locate from"
    best = ranked(ochiai(per_case, coverage))[:top]
    if not best:
        return f"{total_failed} / {len(per_case)} visible tests fail but ran no line of the function : {first_failure}"
    lines = " , ".join(f"line {line} {score:.2f}" for line, score in best)
    text = f"suspicious lines (Ochiai, {total_failed} / {len(per_case)} visible tests failing) : {lines}"
    sites = _sites(source, [line for line, _ in best]) if source is not None else ""
    return text + SITES_MARK + sites if sites else text
