"""How well BugFix-v1's ``locate`` points at the bug: the Ochiai rank of the mutated line on one-bug tasks.

For each one-bug task of a split, the visible cases run with coverage (as ``locate`` runs them) and the mutated line
(the line of the injected bug's site, in the task's source) is ranked by Ochiai score. Its rank counts the lines
scored strictly higher, plus one; "first, alone" means no other line has its score. A mutated line that no failing
case ran scores 0 and is "not ranked" (a ``line_drop`` bug's line is the one missing).

    python benchmarks/locate_v1.py                 # the test split's one-bug tasks
    python benchmarks/locate_v1.py --split heldout --limit 300
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter

from bugfix_gym.core.locate import ochiai, ranked
from bugfix_gym.execution.repair_runner import run_repair_tests
from bugfix_gym.tasks.humaneval import humaneval_problems
from bugfix_gym.tasks.mutants import stored_tasks


def mutated_line_rank(task) -> tuple[int | None, bool]:
    """``(rank, alone)`` of the task's mutated line among the lines ``locate`` scores (None: not ranked)."""
    report = run_repair_tests(task.entry, task.support, task.visible, task.source, coverage=True)
    scores = dict(ranked(ochiai(report.per_case, report.coverage or [frozenset()] * report.total)))
    line = task.bugs[0].site[0]
    if line not in scores:
        return None, False
    higher = sum(1 for s in scores.values() if s > scores[line])
    return higher + 1, sum(1 for s in scores.values() if s == scores[line]) == 1


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", default="test", choices=("train", "heldout", "test"))
    parser.add_argument("--limit", type=int, default=0, help="tasks at most (every k-th, spread over the split)")
    args = parser.parse_args(argv)
    tasks = [t for t in stored_tasks(humaneval_problems(args.split), 1) if t.bugs[0].family != "line_drop"]
    if args.limit:
        tasks = tasks[:: max(1, len(tasks) // args.limit)][: args.limit]
    started = time.perf_counter()
    ranks: Counter = Counter()
    alone = 0
    for task in tasks:
        rank, single = mutated_line_rank(task)
        ranks[rank if rank is None or rank <= 3 else 4] += 1
        alone += rank == 1 and single
    n = len(tasks)
    out = {"first": ranks[1] / n, "first_alone": alone / n, "top3": (ranks[1] + ranks[2] + ranks[3]) / n,
           "not_ranked": ranks[None] / n}
    print(f"{args.split} split, {n} one-bug tasks (line_drop left out: its line is missing)")
    print(f"mutated line ranked first: {out['first']:.3f} (alone: {out['first_alone']:.3f}); in the top 3: "
          f"{out['top3']:.3f}; below: {ranks[4] / n:.3f}; not ranked: {out['not_ranked']:.3f}")
    print(f"{time.perf_counter() - started:.1f} s; {os.cpu_count()} CPUs; load average "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
