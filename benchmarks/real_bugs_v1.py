"""BugFix-v1 on a pack of human-written bugs (``examples/real_bugs_v1.json``): how many one sited call repairs, and
what the scripted baselines score.

    python benchmarks/real_bugs_v1.py                               # the pack, both measures
    python benchmarks/real_bugs_v1.py --pack mine.json --max-turns 20

1. **Writable as one sited call.** For each task, every ``edit`` and ``delete`` call that ``legal_calls()`` lists
   on the buggy source is played in a freshly reset env (the call, then ``submit``); the task counts as writable
   if any one of them passes every hidden case. That is the ceiling of a policy that repairs with sited calls
   only: the others need ``patch`` or ``insert`` (free text) or more than one call. The candidates' hidden runs
   are batched into one worker round trip per task (the sources made by the env's own ``apply_call``); the ones
   that pass there are then played in the env, whose ``submit`` must agree. About 1.5 s per 100 candidates.
2. **The scripted baselines** (:mod:`bugfix_gym.core.scripted_v1`: ``debugger`` and ``brute_force``) play each
   task once at ``--max-turns`` (seed 0): the pass rate, mean calls and mean test calls.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any, Sequence

from bugfix_gym import load_task_pack
from bugfix_gym.core.calls_v1 import parse_call_v1
from bugfix_gym.core.env_v1 import BugFixEnvV1, apply_call
from bugfix_gym.core.scripted_v1 import SEARCH_CALLS, make_policy, play_episode
from bugfix_gym.execution.repair_runner import run_repair_tests_many
from bugfix_gym.tasks.problems import RepairTask

BASELINES = ("debugger", "brute_force")


def one_call_repairs(env: BugFixEnvV1, task: Any) -> tuple[int, list[str]]:
    """``(candidates, repairs)``: how many ``edit`` / ``delete`` calls are legal on the task's buggy source, and
    those after which ``submit`` passes every hidden case, each played in a freshly reset ``env``.

    Every candidate's source is made first with the env's own :func:`apply_call` and run on the hidden cases in
    one batch; a candidate that fails them there fails them after ``submit`` too (the same source, cases and
    runner), so only the ones that pass are played in the env, whose ``submit`` must then agree."""
    env.reset(seed=0, options={"task": task.name})
    calls = [call for call in env.legal_calls() if call.startswith(SEARCH_CALLS)]
    sources = [apply_call(task.source, parse_call_v1(call)) for call in calls]
    reports = run_repair_tests_many(task.entry, task.support, task.hidden, sources)
    repairs = []
    for call, report in zip(calls, reports):
        if not report.ok:
            continue
        env.reset(seed=0, options={"task": task.name})
        env.step(call)
        info = env.step("submit")[4]
        if not info["hidden_pass"]:
            raise RuntimeError(f"{task.name}: {call} passed the hidden cases in the batch but not after submit")
        repairs.append(call)
    return len(calls), repairs


def baseline_rows(tasks: Sequence[Any], max_turns: int) -> dict[str, dict[str, Any]]:
    """Each baseline's episodes on every task (seed 0): which passed, mean calls, mean test calls."""
    env = BugFixEnvV1(tasks=tasks, max_turns=max_turns)
    rows = {}
    for kind in BASELINES:
        episodes = [play_episode(env, make_policy(kind, max_turns=max_turns), task.name) for task in tasks]
        rows[kind] = {"passed": [e.task for e in episodes if e.passed],
                      "calls": sum(e.calls for e in episodes) / len(episodes),
                      "test_calls": sum(e.test_calls for e in episodes) / len(episodes)}
    return rows


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pack", default="examples/real_bugs_v1.json")
    parser.add_argument("--max-turns", type=int, default=12, help="the baselines' turn budget")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    tasks = [t for t in load_task_pack(args.pack) if isinstance(t, RepairTask)]  # the buggy tasks
    env = BugFixEnvV1(tasks=tasks, max_turns=3)  # a call, then submit
    writable = {}
    print(f"{'task':22} {'lines':>5} {'candidates':>10} {'repairs':>7}  first repairing call")
    for task in tasks:
        n, repairs = one_call_repairs(env, task)
        writable[task.name] = repairs
        print(f"{task.name:22} {len(task.source.splitlines()):5d} {n:10d} {len(repairs):7d}  "
              f"{repairs[0] if repairs else '-'}")
    share = sum(bool(r) for r in writable.values())
    print(f"writable as one sited edit or delete: {share} / {len(tasks)} = {share / len(tasks):.3f}")
    rows = baseline_rows(tasks, args.max_turns)
    for kind, row in rows.items():
        print(f"{kind:12} max_turns={args.max_turns}: passed {len(row['passed'])} / {len(tasks)} = "
              f"{len(row['passed']) / len(tasks):.3f}; mean calls {row['calls']:.2f}, mean test calls "
              f"{row['test_calls']:.2f}; passed: {', '.join(row['passed']) or '-'}")
    print(f"{time.perf_counter() - started:.1f} s; {os.cpu_count()} CPUs; load average "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return {"writable": writable, "baselines": rows}


if __name__ == "__main__":
    main()
