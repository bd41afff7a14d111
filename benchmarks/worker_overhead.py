"""What one BugFix-v1 ``test`` call costs in the persistent worker, against running in-process and one child per call.

    python benchmarks/worker_overhead.py               # default: 30 alternating rounds
    python benchmarks/worker_overhead.py --rounds 100 --batch 50

Every round times, in turn, the same five cases of ``bounded_score`` (the repaired source of
``examples/task_pack_example.json``'s task, as ``benchmarks/sandbox_overhead.py`` uses):

* ``in-process``: :func:`bugfix_gym.execution.cases.run_cases` in this process (what v0's built-in tasks cost);
* ``one child per call``: :func:`bugfix_gym.execution.sandbox.run_cases_sandboxed` (v0's pack sandbox: a fresh
  interpreter each call);
* ``worker``: :func:`bugfix_gym.execution.repair_runner.run_repair_tests` (``cache=False``: every call runs),
  the persistent worker forking a contained grandchild, judged here. The worker forks the next call's
  grandchild after it has answered, so a call that follows other work (as an env step's does) finds one
  ready: the alternation lets this row show that;
* ``worker, back to back``: ten such calls in a row, per call: each waits for the fork the one before
  started;
* ``worker, batch``: :func:`bugfix_gym.execution.repair_runner.run_repair_tests_many` on ``--batch`` sources in
  one round trip, divided by ``--batch`` (what brute force pays per candidate).

The sandbox and the worker run in the same isolation mode, the strongest this machine gives.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Callable

from bugfix_gym.execution import sandbox
from bugfix_gym.execution.cases import run_cases
from bugfix_gym.execution.repair_cases import CallCase
from bugfix_gym.execution.repair_runner import run_repair_tests, run_repair_tests_many
from bugfix_gym.execution.worker import Worker

SOURCE = "def bounded_score(score, top):\n    return max(0, min(score, top))\n"
CASES = [((5, 10), 5), ((-3, 10), 0), ((12, 10), 10), ((0, 10), 0), ((10, 10), 10)]
V1_CASES = tuple(CallCase(args, expected) for args, expected in CASES)


def _timers(batch: int, worker: Worker) -> dict[str, tuple[Callable[[], object], int]]:
    """name -> (a call, how many test calls it makes)."""
    sources = [SOURCE + f"# {k}\n" for k in range(batch)]  # distinct texts, the same function
    return {
        "in-process": (lambda: run_cases(SOURCE, "bounded_score", CASES), 1),
        "one child per call": (lambda: sandbox.run_cases_sandboxed(SOURCE, "bounded_score", CASES), 1),
        "worker": (lambda: run_repair_tests("bounded_score", "", V1_CASES, SOURCE, cache=False, worker=worker), 1),
        "worker, back to back": (lambda: [run_repair_tests("bounded_score", "", V1_CASES, SOURCE, cache=False,
                                                           worker=worker) for _ in range(10)], 10),
        f"worker, batch of {batch}": (lambda: run_repair_tests_many("bounded_score", "", V1_CASES, sources,
                                                                    cache=False, worker=worker), batch),
    }


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="alternating rounds (default 30)")
    parser.add_argument("--batch", type=int, default=20, help="sources in one batch request (default 20)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.batch < 1:
        parser.error("--rounds and --batch must be positive")
    mode = sandbox.available_isolation()
    worker = Worker(isolation=mode)
    timers = _timers(args.batch, worker)
    for call, _ in timers.values():  # warm imports, the isolation probe and the worker's start
        report = call()
        assert all(r.ok for r in report) if isinstance(report, list) else report.ok, report  # type: ignore
    times: dict[str, list[float]] = {name: [] for name in timers}
    for _ in range(args.rounds):
        for name, (call, calls) in timers.items():
            start = time.perf_counter()
            call()
            times[name].append((time.perf_counter() - start) / calls)
    worker.close()
    med = {name: statistics.median(v) * 1e3 for name, v in times.items()}
    child = med["one child per call"]
    print(f"{'one test call, 5 cases':26s} {'ms (median)':>12s} {'min':>8s} {'max':>8s} {'/ one child':>12s}")
    for name, v in times.items():
        print(f"{name:26s} {med[name]:12.2f} {min(v) * 1e3:8.2f} {max(v) * 1e3:8.2f} {med[name] / child:12.3f}")
    print(f"\nworker / in-process {med['worker'] / med['in-process']:.1f}x; one child per call / worker "
          f"{child / med['worker']:.1f}x; back to back / batch per source "
          f"{med['worker, back to back'] / med[f'worker, batch of {args.batch}']:.2f}x")
    print(f"{args.rounds} alternating rounds; isolation {mode}; {os.cpu_count()} CPUs; load average "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return med


if __name__ == "__main__":
    main()
