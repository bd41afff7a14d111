"""BugFix-v0's task sources as BugFix-v1 :class:`~.problems.Problem` s: more correct functions to inject bugs into.

* **The book's tasks** (:mod:`.book_tasks`, 20 ``train`` and 10 ``heldout``): each row's *correct* function,
  its statement and its inputs; pid ``book/<name>``, origin ``"book"``.
* **The generator's templates** (:mod:`.templates`, 63 ``train``, 6 ``heldout``, 7 ``test``: v0's disjoint
  template splits): each template's correct function with its placeholders filled by the first word of
  each pool (``xs``, ``x``, ``t``, ``count``, ...) and named after its key, its first phrasing as the
  statement, and the inputs its generator draws from ``numpy.random.default_rng(crc32(key))``, repeated
  inputs dropped; pid ``template/<key>``, origin ``"template"``.

Every case is a :class:`CallCase`; the expected values come from running the correct function on the inputs
in the contained worker (:mod:`bugfix_gym.execution.worker`, one batch for all of them), as every v1 run of
task code does. The first :data:`N_VISIBLE` cases are visible, as in v0. Sources are normalised.

Nothing here changes v0: its modules are only read, no task is built or registered, and no random state
but this module's own generators is drawn.
"""

from __future__ import annotations

import functools
import textwrap
import zlib
from typing import Sequence

import numpy as np

from ..execution.repair_cases import CallCase
from ..execution.worker import Job, default_worker
from . import book_tasks
from .problems import Problem, normalise_source
from .templates import TEMPLATES, WORDS, Template

Row = tuple[str, str, str, str, Sequence[tuple], str]
"""(pid, entry, statement, correct source, inputs, split)."""

N_VISIBLE = 3  # v0's visible cases: the first three
BOOK_SPLITS = ("train", "heldout")
TEMPLATE_SPLITS = ("train", "heldout", "test")
TIMEOUT_S = 20.0  # wall-clock seconds for one function's inputs


class V0SourceError(RuntimeError):
    """A v0 function did not run on its own inputs (a bug in the project's data)."""


def template_names(template: Template) -> dict[str, str]:
    """The identifiers a template is written with: the first word of each pool, and its key as the name."""
    names = {role: pool[0] for role, pool in WORDS.items()}
    names["f"] = template.key
    return names


def template_inputs(template: Template) -> list[tuple]:
    """The inputs the template's generator draws from its own seeded generator, repeats dropped (as v0 does)."""
    rng = np.random.default_rng(zlib.crc32(template.key.encode()))
    inputs, seen = [], set()
    for args in template.inputs(rng):
        if repr(args) not in seen:
            seen.add(repr(args))
            inputs.append(tuple(args))
    return inputs


def _book_rows() -> list[Row]:
    """A :data:`Row` per book task."""
    rows: list[Row] = []
    for split, table in (("train", book_tasks.TRAIN), ("heldout", book_tasks.HELDOUT)):
        for name, statement, correct, _fix_op, inputs in table:
            rows.append((f"book/{name}", name, statement, textwrap.dedent(correct), inputs, split))
    return rows


def _template_rows() -> list[Row]:
    """A :data:`Row` per template."""
    rows: list[Row] = []
    for split in TEMPLATE_SPLITS:
        for template in TEMPLATES[split]:
            names = template_names(template)
            phrasing = template.statement if isinstance(template.statement, str) else template.statement[0]
            rows.append((f"template/{template.key}", template.key, phrasing.format(**names),
                         template.source.format(**names), template_inputs(template), split))
    return rows


def _problems(rows: list[Row], origin: str) -> tuple[Problem, ...]:
    sources = [normalise_source(row[3]) for row in rows]
    jobs = [Job(source, row[1], tuple(CallCase(tuple(args), None) for args in row[4]))
            for source, row in zip(sources, rows)]
    results = default_worker().run_many(jobs, timeout_s=TIMEOUT_S)
    problems = []
    for (pid, entry, statement, _, inputs, split), source, result in zip(rows, sources, results):
        cases = []
        for args, outcome in zip(inputs, result.outcomes):
            if result.load_error is not None or outcome[0] != "value":
                why = result.load_error or f"{outcome[0]} {outcome[1]}"
                raise V0SourceError(f"{pid} does not run on its input {args!r} in the worker ({why}); "
                                    "check the sandbox (bugfix_gym.execution.sandbox.available_isolation())")
            cases.append(CallCase(tuple(args), outcome[1]))
        problems.append(Problem(pid=pid, entry=entry, statement=statement, source=source, support="",
                                visible=tuple(cases[:N_VISIBLE]), hidden=tuple(cases), split=split, origin=origin))
    return tuple(problems)


@functools.lru_cache(maxsize=1)
def _book() -> tuple[Problem, ...]:
    return _problems(_book_rows(), "book")


@functools.lru_cache(maxsize=1)
def _templates() -> tuple[Problem, ...]:
    return _problems(_template_rows(), "template")


def _of_split(problems: tuple[Problem, ...], split: str, splits: Sequence[str], what: str) -> tuple[Problem, ...]:
    if split != "all" and split not in splits:
        raise ValueError(f"unknown {what} split {split!r}; use one of {', '.join(splits)} or 'all'")
    return tuple(p for p in problems if split == "all" or p.split == split)


def book_problems(split: str = "all") -> tuple[Problem, ...]:
    """The book's tasks as problems, in the book's order.

    :param split: ``"train"`` (20), ``"heldout"`` (10) or ``"all"``
    """
    return _of_split(_book(), split, BOOK_SPLITS, "book")


def template_problems(split: str = "all") -> tuple[Problem, ...]:
    """The generator's templates as problems, in the templates' order.

    :param split: ``"train"`` (63), ``"heldout"`` (6), ``"test"`` (7) or ``"all"``
    """
    return _of_split(_templates(), split, TEMPLATE_SPLITS, "template")


def v0_problem(pid: str) -> Problem:
    """One problem by pid (``"book/clamp"``, ``"template/count_greater"``); ``KeyError`` for another."""
    for problem in (*_book(), *_templates()):
        if problem.pid == pid:
            return problem
    raise KeyError(f"no v0 problem {pid!r}; pids are 'book/<name>' (bugfix_gym.tasks.book_tasks) and "
                   "'template/<key>' (bugfix_gym.tasks.templates)")
