"""Valid mutants of a :class:`~bugfix_gym.tasks.problems.Problem`: BugFix-v1's injected tasks.

A mutant is one bug (:func:`bugfix_gym.edits.inject.injections`) or two bugs on different lines of the entry
function, with the calls that repair it. It is kept only if (SWE-smith's rule):

* it compiles (the engine checks this when it injects);
* it fails at least one **visible** case (the agent's ``test`` shows a failure);
* it fails at least one **hidden** case, so it is not equivalent to the original on the hidden cases (the
  original passes them all; a problem whose original does not gets no mutants).

Both runs go through :func:`bugfix_gym.execution.repair_runner.run_repair_tests_many` with the env's own
settings (time limit, loop budget), one batch per suite and problem, so "valid" here means what the env's
``test`` and ``submit`` will find.

Two bugs: a valid one-bug mutant ``A`` gets a second bug ``B`` on an earlier line (so ``B``'s site is the same
in both sources), ``B`` itself a valid one-bug mutant of the original; the repair is ``B``'s call then ``A``'s.
Which pairs are tried is drawn with ``random.Random(f"{pid}|{seed}")``: the same (problem, seed) gives the same
mutants on any machine.

The HumanEval splits' valid mutants are committed (:data:`DATA_FILE`): per problem the candidate keys, the
changed lines and the repair calls, so building the tasks runs neither validation nor injection. ``python -m
bugfix_gym.tasks.mutants --check`` re-derives and re-validates all of them and prints the counts and seconds;
``--write`` regenerates the file.

A mutant becomes a :class:`~bugfix_gym.tasks.problems.RepairTask` named ``<entry>~<id>`` (``~<i>`` for the
``i``-th one-bug mutant of the problem, ``~<i>.<j>`` for a two-bug one: the indices of its candidates), with
``bugs`` the :class:`~bugfix_gym.edits.inject.Injection` s in repair order: ``bugs[k].repair`` applies to
``bugs[k].buggy_source`` (the task's source for ``k = 0``) and gives the next one's, the last gives
``fixed_source``.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import json
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Iterable, Sequence

from ..edits.defect_classes import classes_of
from ..edits.inject import Injection, candidates, candidates_digest, injections, second_injection
from ..execution.repair_runner import run_repair_tests_many
from .problems import Problem, RepairTask

__all__ = ("DATA_FILE", "MAX_TWO_BUG", "Mutant", "MutantDataError", "mutant_task", "mutants", "stored_mutants",
           "stored_tasks", "two_bug_candidates", "valid")

DATA_FILE = "humaneval_mutants.json.gz"
"""The committed mutants of the HumanEval problems, under ``bugfix_gym/tasks/data/``."""
FORMAT = "bugfix-gym/mutants-v1"
MAX_TWO_BUG = 12
"""Two-bug mutants kept per problem and seed at most."""
TWO_BUG_TRIES = 3
"""Pairs tried per two-bug mutant wanted (MAX_TWO_BUG * TWO_BUG_TRIES pairs at most are validated)."""
BATCH = 96
"""Sources per request to the worker."""


class MutantDataError(RuntimeError):
    """The committed mutant data does not match this engine (regenerate it with ``--write``)."""


@dataclass(frozen=True)
class Mutant:
    """A buggy version of a problem's function.

    :param problem: the problem's id
    :param entry: the entry function
    :param source: the buggy source (normalised)
    :param bugs: the injections in repair order (see the module docstring)
    :param ids: the candidate indices of its bugs in :func:`~bugfix_gym.edits.inject.candidates` of the original,
        in injection order (the later line first for two bugs)
    """

    problem: str
    entry: str
    source: str
    bugs: tuple[Injection, ...]
    ids: tuple[int, ...]

    @property
    def repair(self) -> tuple[str, ...]:
        """The repair calls, in the order they apply."""
        return tuple(bug.repair for bug in self.bugs)

    @property
    def families(self) -> tuple[str, ...]:
        return tuple(bug.family for bug in self.bugs)

    @property
    def name(self) -> str:
        """The task name: ``<entry>~<i>`` or ``<entry>~<i>.<j>``."""
        return f"{self.entry}~{'.'.join(str(i) for i in self.ids)}"


def _one_bug(problem: Problem) -> list[Mutant]:
    index = {c.key: i for i, c in enumerate(candidates(problem.source, problem.entry))}
    return [Mutant(problem.pid, problem.entry, inj.buggy_source, (inj,), (index[inj.key],))
            for inj in injections(problem.source, problem.entry)]


def two_bug_candidates(problem: Problem, one_bug: Sequence[Mutant], seed: int, limit: int) -> list[Mutant]:
    """Up to ``limit`` two-bug mutants built from pairs of the given one-bug mutants (different lines), in an order
    drawn from ``(problem, seed)``; not validated.

    :param one_bug: valid one-bug mutants of ``problem`` (in candidate order)
    """
    singles = [m for m in one_bug if len(m.bugs) == 1]
    pairs = [(a, b) for a in singles for b in singles if b.bugs[0].site[0] < a.bugs[0].site[0]]
    random.Random(f"{problem.pid}|{seed}").shuffle(pairs)
    out: list[Mutant] = []
    seen: set[str] = {m.source for m in singles}
    for a, b in pairs:
        if len(out) >= limit:
            break
        second = second_injection(a.bugs[0], problem.source, problem.entry, b.bugs[0].key)
        if second is None or second.buggy_source in seen:
            continue
        seen.add(second.buggy_source)
        out.append(Mutant(problem.pid, problem.entry, second.buggy_source, (second, a.bugs[0]), a.ids + b.ids))
    return out


def valid(problem: Problem, sources: Sequence[str]) -> list[bool]:
    """Which sources are valid mutants of ``problem``: each fails a visible case and a hidden case, as the env
    runs them. False for all when the original does not pass its hidden cases.

    :param sources: buggy sources of ``problem`` (compiling; the engine's injections do)
    """
    original = run_repair_tests_many(problem.entry, problem.support, problem.hidden, [problem.source])[0]
    if not original.ok:
        return [False] * len(sources)
    failing_visible = [i for i, ok in enumerate(_passes(problem, problem.visible, sources)) if not ok]
    failing_hidden = _passes(problem, problem.hidden, [sources[i] for i in failing_visible])
    out = [False] * len(sources)
    for i, ok in zip(failing_visible, failing_hidden):
        out[i] = not ok
    return out


FAST_TICKS = 20_000
"""The screening run's loop budget per call (the env's is ``bugfix_gym.execution.worker.LOOP_TICKS``)."""
FAST_TIMEOUT_S = 2.0
"""The screening run's wall-clock limit per source."""


def _no_handlers(source: str) -> bool:
    """No ``try`` or ``with`` in the source: nothing can catch the loop budget's exception."""
    return not any(isinstance(n, (ast.Try, ast.TryStar, ast.With)) for n in ast.walk(ast.parse(source)))


def _passes(problem: Problem, cases: tuple, sources: Sequence[str]) -> list[bool]:
    """Whether each source passes all the cases as the env judges them (its time limit and loop budget).

    A mutant that loops forever costs the full budget on every case, so sources run first with a small budget
    (:data:`FAST_TICKS`, :data:`FAST_TIMEOUT_S`); that run decides a source with no ``try`` / ``with`` when it
    passes (a bigger budget passes too) or when a case fails without running out of time (the same case fails
    with any budget). The rest run again with the env's settings.
    """
    out: list[bool | None] = [None] * len(sources)
    slow_case: dict[int, list[int]] = {}  # a case that ran out of time in the screen -> the sources it did so for
    for start in range(0, len(sources), BATCH):
        chunk = list(sources[start:start + BATCH])
        fast = run_repair_tests_many(problem.entry, problem.support, cases, chunk, max_ticks=FAST_TICKS,
                                     timeout_s=FAST_TIMEOUT_S)
        for i, (source, report) in enumerate(zip(chunk, fast)):
            failed = [k for k, ok in enumerate(report.per_case) if not ok]
            timed_out = all("Timeout" in report.details[k] for k in failed)
            if _no_handlers(source) and (report.ok or not timed_out):
                out[start + i] = report.ok
            elif failed:
                slow_case.setdefault(failed[0], []).append(start + i)
    # one case that failed with the full budget fails the whole suite (which gives that case less time, if any)
    for k, ids in sorted(slow_case.items()):
        for start in range(0, len(ids), BATCH):
            chunk_ids = ids[start:start + BATCH]
            for i, report in zip(chunk_ids, run_repair_tests_many(problem.entry, problem.support, (cases[k],),
                                                                  [sources[i] for i in chunk_ids])):
                if not report.ok:
                    out[i] = False
    todo = [i for i, decided in enumerate(out) if decided is None]
    for start in range(0, len(todo), BATCH):
        ids = todo[start:start + BATCH]
        for i, report in zip(ids, run_repair_tests_many(problem.entry, problem.support, cases,
                                                        [sources[i] for i in ids])):
            out[i] = report.ok
    return [bool(ok) for ok in out]


def mutants(problem: Problem, seed: int = 0, bugs: int = 1) -> tuple[Mutant, ...]:
    """The valid mutants of a problem, generated and validated now (seconds; the HumanEval splits' are stored:
    :func:`stored_mutants`).

    :param problem: a correct function and its tests
    :param seed: draws the two-bug pairs (one-bug mutants are all of them, whatever the seed)
    :param bugs: 1 or 2
    """
    if bugs not in (1, 2):
        raise ValueError(f"bugs must be 1 or 2, not {bugs!r}")
    one = _one_bug(problem)
    kept_one = [m for m, ok in zip(one, valid(problem, [m.source for m in one])) if ok]
    if bugs == 1:
        return tuple(kept_one)
    two = two_bug_candidates(problem, kept_one, seed, MAX_TWO_BUG * TWO_BUG_TRIES)
    kept_two = [m for m, ok in zip(two, valid(problem, [m.source for m in two])) if ok]
    return tuple(kept_two[:MAX_TWO_BUG])


def mutant_task(problem: Problem, mutant: Mutant) -> RepairTask:
    """The episode task of a mutant: its buggy source with the problem's statement and tests."""
    return RepairTask(name=mutant.name, entry=problem.entry, statement=problem.statement, source=mutant.source,
                      support=problem.support, visible=problem.visible, hidden=problem.hidden, split=problem.split,
                      origin=problem.origin, problem=problem.pid, fixed_source=problem.source, bugs=mutant.bugs)


# ------------------------------------------------------------------------------ the committed data
def _diff(original: str, changed: str) -> list[Any]:
    """``[start, removed, new_lines]``: ``changed`` is ``original``'s lines with ``removed`` lines from ``start``
    replaced by ``new_lines``."""
    a, b = original.splitlines(), changed.splitlines()
    start = 0
    while start < min(len(a), len(b)) and a[start] == b[start]:
        start += 1
    end = 0
    while end < min(len(a), len(b)) - start and a[len(a) - 1 - end] == b[len(b) - 1 - end]:
        end += 1
    return [start, len(a) - start - end, b[start:len(b) - end]]


def _patched(original: str, diff: Sequence[Any]) -> str:
    start, removed, new = diff
    lines = original.splitlines()
    return "\n".join(lines[:start] + list(new) + lines[start + removed:]) + "\n"


def _record(problem: Problem, mutant: Mutant) -> list[Any]:
    """A mutant as stored: ``[ids, [diff per bug], [repair per bug]]`` (diffs against the original source)."""
    return [list(mutant.ids), [_diff(problem.source, bug.buggy_source) for bug in mutant.bugs], list(mutant.repair)]


def _from_record(problem: Problem, record: Sequence[Any]) -> Mutant:
    ids, diffs, repairs = record
    found = candidates(problem.source, problem.entry)
    keys = [found[i] for i in ids]
    order = keys if len(keys) == 1 else [keys[1], keys[0]]  # repair order: the earlier line's bug first
    bugs = tuple(Injection(c.family, classes_of(c.family), c.site, _patched(problem.source, diff), repair, c.key)
                 for c, diff, repair in zip(order, diffs, repairs))
    return Mutant(problem.pid, problem.entry, bugs[0].buggy_source, bugs, tuple(ids))


def _data_path() -> Any:
    return resources.files("bugfix_gym.tasks") / "data" / DATA_FILE


@lru_cache(maxsize=1)
def _stored() -> dict[str, Any]:
    try:
        data = json.loads(gzip.decompress(_data_path().read_bytes()))
    except FileNotFoundError:
        raise MutantDataError(f"bugfix_gym/tasks/data/{DATA_FILE} is missing : reinstall the package or run "
                              f"python -m bugfix_gym.tasks.mutants --write") from None
    if data.get("format") != FORMAT:
        raise MutantDataError(f"{DATA_FILE} is not {FORMAT} : regenerate it with python -m bugfix_gym.tasks.mutants "
                              f"--write")
    return data


def stored_mutants(problem: Problem, bugs: int = 1) -> tuple[Mutant, ...]:
    """The committed valid mutants of a HumanEval problem (no validation, no injection run).

    :raises MutantDataError: the problem is not in the data, or the engine's candidates changed since it was
        written (regenerate it)
    """
    entry = _stored()["problems"].get(problem.pid)
    if entry is None:
        raise MutantDataError(f"no stored mutants for {problem.pid} : use mutants(problem) to generate them")
    if entry["digest"] != candidates_digest(problem.source, problem.entry):
        raise MutantDataError(f"the stored mutants of {problem.pid} are stale (the injection engine changed) : "
                              f"regenerate them with python -m bugfix_gym.tasks.mutants --write")
    return tuple(_from_record(problem, r) for r in entry["one" if bugs == 1 else "two"])


def stored_tasks(problems: Iterable[Problem], bugs: int = 1) -> tuple[RepairTask, ...]:
    """The committed mutants of the given HumanEval problems as tasks, in problem then mutant order."""
    return tuple(mutant_task(p, m) for p in problems for m in stored_mutants(p, bugs))


def _generate(problems: Sequence[Problem], seed: int, log: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every problem's valid one- and two-bug mutants, as records, with counts and seconds."""
    out: dict[str, Any] = {}
    families: dict[tuple[str, int], Counter] = {}
    totals: Counter = Counter()
    started = time.perf_counter()
    for n, problem in enumerate(problems, 1):
        one = _one_bug(problem)
        kept_one = [m for m, ok in zip(one, valid(problem, [m.source for m in one])) if ok]
        two = two_bug_candidates(problem, kept_one, seed, MAX_TWO_BUG * TWO_BUG_TRIES)
        kept_two = [m for m, ok in zip(two, valid(problem, [m.source for m in two])) if ok][:MAX_TWO_BUG]
        out[problem.pid] = {"digest": candidates_digest(problem.source, problem.entry),
                            "one": [_record(problem, m) for m in kept_one],
                            "two": [_record(problem, m) for m in kept_two]}
        for bugs, kept, tried in ((1, kept_one, one), (2, kept_two, two)):
            key = (problem.split, bugs)
            families.setdefault(key, Counter()).update(f for m in kept for f in m.families)
            totals[(problem.split, bugs, "valid")] += len(kept)
            totals[(problem.split, bugs, "candidates")] += len(tried)
        log(f"{n}/{len(problems)} {problem.pid}: {len(kept_one)}/{len(one)} one-bug, {len(kept_two)}/{len(two)} "
            f"two-bug ({time.perf_counter() - started:.0f} s)")
    stats = {"seconds": time.perf_counter() - started, "totals": totals, "families": families}
    return out, stats


def _report(stats: dict[str, Any], splits: Sequence[str]) -> str:
    from ..edits.inject import FAMILY_ORDER

    totals, families = stats["totals"], stats["families"]
    lines = ["split     bugs  candidates  valid"]
    for split in splits:
        for bugs in (1, 2):
            lines.append(f"{split:<9} {bugs:>4}  {totals[(split, bugs, 'candidates')]:>10}  "
                         f"{totals[(split, bugs, 'valid')]:>5}")
    lines.append("")
    lines.append("family (valid bugs)  " + "  ".join(f"{s}/1 {s}/2" for s in splits))
    for family in FAMILY_ORDER:
        row = [f"{families.get((s, b), Counter())[family]:>{len(s) + 2}}" for s in splits for b in (1, 2)]
        lines.append(f"{family:<20} " + " ".join(row))
    lines.append(f"\n{stats['seconds']:.1f} s to inject and validate all of them")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bugfix_gym.tasks.mutants --check`` (re-validate the committed mutants) or ``--write``."""
    from .humaneval import SPLITS, humaneval_problems

    parser = argparse.ArgumentParser(prog="python -m bugfix_gym.tasks.mutants", description=__doc__.split("\n")[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--check", action="store_true", help="regenerate and re-validate; compare with the data")
    what.add_argument("--write", metavar="FILE", help="regenerate and write the data file (e.g. "
                      f"bugfix_gym/tasks/data/{DATA_FILE})")
    parser.add_argument("--split", choices=(*SPLITS, "all"), default="all")
    parser.add_argument("--quiet", action="store_true", help="no line per problem")
    args = parser.parse_args(argv)
    problems = humaneval_problems(args.split)
    log = (lambda _: None) if args.quiet else (lambda text: print(text, file=sys.stderr, flush=True))
    records, stats = _generate(problems, 0, log)
    splits = [s for s in SPLITS if any(p.split == s for p in problems)]
    print(_report(stats, splits))
    if args.write:
        data = {"format": FORMAT, "seed": 0, "max_two_bug": MAX_TWO_BUG, "problems": records}
        text = json.dumps(data, separators=(",", ":"), sort_keys=True).encode()
        with open(args.write, "wb") as fh:
            fh.write(gzip.compress(text, compresslevel=9, mtime=0))
        print(f"wrote {args.write} ({len(text)} bytes of JSON)")
        return 0
    stored = _stored()["problems"]
    stale = [pid for pid, rec in records.items() if stored.get(pid) != rec]
    print(f"committed data: {len(records) - len(stale)} of {len(records)} problems match"
          + (f"; differ: {', '.join(stale[:8])}" if stale else ""))
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
