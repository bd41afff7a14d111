"""What one sandboxed ``test`` call of a task-pack task costs, per isolation mode, side by side in one run.

    python benchmarks/sandbox_overhead.py               # default: 20 alternating rounds
    python benchmarks/sandbox_overhead.py --rounds 50

Every round times, in turn: the same cases run in-process (what built-in tasks cost), a
bare child (``python -I -S`` importing ``cases`` and ``json``: the floor of any design
with one fresh interpreter per call), and :func:`bugfix_gym.execution.sandbox.run_cases_sandboxed`
in each isolation mode this machine offers (``namespace`` needs ``unshare`` and user
namespaces, ``uid`` needs root). The task is ``bounded_score`` from
``examples/task_pack_example.json``: its repaired source on its five hidden cases. The
result cache is not involved: every call runs the code.
"""

from __future__ import annotations

import argparse
import inspect
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from bugfix_gym.execution import sandbox
from bugfix_gym.execution.cases import run_cases

SOURCE = "def bounded_score(score, top):\n    return max(0, min(score, top))\n"
CASES = [((5, 10), 5), ((-3, 10), 0), ((12, 10), 10), ((0, 10), 0), ((10, 10), 10)]
PACKAGE = Path(sandbox.__file__).resolve().parent


def _bare_child() -> None:
    code = "import sys, json; sys.path.append(sys.argv[1]); import cases"
    subprocess.run([sys.executable, "-I", "-S", "-c", code, str(PACKAGE)], check=True, env={}, cwd="/")


def _timers() -> dict[str, Callable[[], object]]:
    timers: dict[str, Callable[[], object]] = {
        "in-process": lambda: run_cases(SOURCE, "bounded_score", CASES),
        "bare child (floor)": _bare_child,
    }
    if "isolation" not in inspect.signature(sandbox.run_cases_sandboxed).parameters:  # a version with one mode
        timers["sandbox"] = lambda: sandbox.run_cases_sandboxed(SOURCE, "bounded_score", CASES)
        return timers
    modes = ["plain"]
    sandbox.ALLOW_ROOT_PLAIN = True  # as root plain mode is refused unless allowed; time it all the same
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        modes.insert(0, "uid")
    if sandbox.available_isolation() == "namespace":
        modes.insert(0, "namespace")
    for mode in modes:
        timers[f"sandbox, {mode}"] = lambda mode=mode: sandbox.run_cases_sandboxed(SOURCE, "bounded_score", CASES,
                                                                                   isolation=mode)
    return timers


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="alternating rounds (default 20)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be positive")
    timers = _timers()
    for fn in timers.values():  # warm imports and the isolation probe
        fn()
    times: dict[str, list[float]] = {name: [] for name in timers}
    for _ in range(args.rounds):
        for name, fn in timers.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    med = {name: statistics.median(v) * 1e3 for name, v in times.items()}
    floor = med["bare child (floor)"]
    print(f"{'one call of 5 cases':24s} {'ms (median)':>12s} {'min':>8s} {'max':>8s} {'/ bare child':>13s}")
    for name, v in times.items():
        print(f"{name:24s} {med[name]:12.2f} {min(v) * 1e3:8.2f} {max(v) * 1e3:8.2f} {med[name] / floor:13.2f}")
    print(f"\n{args.rounds} alternating rounds; {os.cpu_count()} CPUs; load average "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return med


if __name__ == "__main__":
    main()
