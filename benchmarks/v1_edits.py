"""What BugFix-v1's sited edits cost and how many there are, over HumanEval's 164 canonical solutions.

    python benchmarks/v1_edits.py             # every problem
    python benchmarks/v1_edits.py --limit 40  # the first 40

For each problem's normalised source (the entry function without its docstring, imports and helpers kept):

* ``legal_edits``: the number of legal sited edits, and the time to compute the legal set from the text with the
  cache emptied first (a source the env has not seen), then from the cache;
* the heads: sites with a legal edit per line (the expression head), legal mutations per site (the mutation
  head), arguments per (site, mutation) (the argument head), lines with a legal site (the line head): each the
  most over the source;
* ``apply_edit``: the time of one legal edit (a fixed sample of 20 per source);
* ``injections``: candidates and kept injections of the entry function, and the time to build them all.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

from bugfix_gym.edits import inject, sites
from bugfix_gym.edits.mutations import apply_edit
from bugfix_gym.edits.sites import edit_list, legal_edits
from bugfix_gym.tasks.humaneval import humaneval_problems


def _quantiles(values: list[float]) -> str:
    values = sorted(values)
    p90 = values[int(0.9 * (len(values) - 1))]
    return f"median {statistics.median(values):8.2f}  p90 {p90:8.2f}  max {values[-1]:8.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=int, default=None, help="only the first N problems")
    args = parser.parse_args()
    problems = humaneval_problems("all")[: args.limit]
    rng = random.Random(0)
    cold, warm, counts, lines, apply_ms = [], [], [], [], []
    heads = {"line": 0, "expression": 0, "mutation": 0, "argument": 0}
    for problem in problems:
        source = problem.source
        lines.append(len(source.splitlines()))
        sites._analysis.cache_clear()
        start = time.perf_counter()
        legal = legal_edits(source)
        cold.append((time.perf_counter() - start) * 1e3)
        start = time.perf_counter()
        legal_edits(source)
        warm.append((time.perf_counter() - start) * 1e6)
        edits = edit_list(source)
        counts.append(len(edits))
        per_line: dict[int, int] = {}
        for (line, _), muts in legal.items():
            per_line[line] = per_line.get(line, 0) + 1
            heads["mutation"] = max(heads["mutation"], len(muts))
            heads["argument"] = max(heads["argument"], max(len(a) for a in muts.values()))
        heads["line"] = max(heads["line"], len(per_line))
        heads["expression"] = max(heads["expression"], max(per_line.values()))
        for edit in rng.sample(edits, min(20, len(edits))):
            start = time.perf_counter()
            apply_edit(source, edit)
            apply_ms.append((time.perf_counter() - start) * 1e3)
    print(f"{len(problems)} HumanEval solutions, normalised source lines: {_quantiles([float(n) for n in lines])}")
    print(f"legal edits per source:           {_quantiles([float(n) for n in counts])}   total {sum(counts)}")
    print(f"legal_edits, cold (ms):           {_quantiles(cold)}")
    print(f"legal_edits, cached (us):         {_quantiles(warm)}")
    print(f"apply_edit, one edit (ms):        {_quantiles(apply_ms)}")
    print("largest head over all sources:   " + ", ".join(f"{k} {v}" for k, v in heads.items()))
    n_cand, n_inj, inj_s = [], [], []
    for problem in problems:
        inject.candidates.cache_clear()
        inject.injections.cache_clear()
        start = time.perf_counter()
        found = inject.injections(problem.source, problem.entry)
        inj_s.append(time.perf_counter() - start)
        n_cand.append(float(len(inject.candidates(problem.source, problem.entry))))
        n_inj.append(float(len(found)))
    print(f"injection candidates per source:  {_quantiles(n_cand)}")
    print(f"injections kept per source:       {_quantiles(n_inj)}")
    print(f"injections, all of a source (s):  {_quantiles(inj_s)}   total {sum(inj_s):.1f} s")
    print(f"({os.cpu_count()} CPUs; load average {', '.join(f'{x:.1f}' for x in os.getloadavg())})")


if __name__ == "__main__":
    main()
