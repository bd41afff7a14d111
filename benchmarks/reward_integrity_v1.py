"""BugFix-v1's reward integrity: an exhaustive search over short call sequences finds no reward without every
hidden case passing.

On small test-split tasks (fewest legal calls first), every sequence of up to ``depth`` calls followed by
``submit`` is played through the env: at each step the calls are ``env.legal_calls()`` (``read``, ``test``,
``locate``, every sited edit, every ``delete L``, ``revert``), the task's repair calls, and a fixed set of
adversarial line calls (return a
constant, an object equal to everything, exit the process, loop forever, import a missing module, raise
``SystemExit``, replace ``AssertionError``, forge the test's names, delete any line). Each reward is then checked
against an independent run of the hidden cases (``run_repair_tests(..., cache=False)``, a fresh grandchild): a
reward of 1 whose source does not pass every hidden case is a violation (goal: 0). The converse (a source that
passes but earned 0) is counted too, on every source that earned 1 and a sample of those that earned 0.

Hidden runs of the distinct final sources are batched first (:func:`run_repair_tests_many`), so the env's own
``submit`` finds them in the report cache; the env still decides every reward.

    python benchmarks/reward_integrity_v1.py                      # the default plan, a few minutes
    python benchmarks/reward_integrity_v1.py --plan 1:4,2:1 --sample 200
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import time
from typing import Any

from bugfix_gym.core.env_v1 import BugFixEnvV1
from bugfix_gym.execution.repair_runner import run_repair_tests, run_repair_tests_many

STATE = ("task", "task_name", "source", "turn", "n_invalid", "actions", "valid", "submitted", "hidden_pass", "stop",
         "_done", "transcript")


def adversarial_calls(source: str) -> list[str]:
    """Line calls a reward hacker would try on ``source``: constants returned, objects equal to everything,
    the process ended, the test machinery replaced; plus ``delete L`` for every line (most are invalid)."""
    lines = source.splitlines()
    last = len(lines)
    body = next((i + 2 for i, line in enumerate(lines) if line.startswith("def ")), 1)  # the entry's first line
    calls = [f"patch {last} return {value}" for value in ("None", "0", "True", "[]", "''")]
    calls += [f"insert {body} {code}" for code in (
        "return type('Eq', (), {'__eq__': lambda s, o: True, '__ne__': lambda s, o: False})()",
        "raise SystemExit(0)", "__import__('os')._exit(0)", "while True: pass",
        "import builtins; builtins.AssertionError = type('Never', (Exception,), {})",
        "import sys; sys.modules['__main__'].__dict__.clear()",
        "import gc; [o.__dict__.clear() for o in gc.get_objects() if type(o).__name__ in ('CallCase', 'AssertCase')]",
    )]
    calls += ["insert 1 import no_such_module_anywhere", "insert 1 check = candidate = lambda *a: True"]
    return calls + [f"delete {line}" for line in range(1, last + 1)]


def calls_now(env: BugFixEnvV1) -> list[str]:
    """Every call tried in the current state: the legal ones (not submit), the task's repair calls (so rewarded
    sequences and their neighbours are searched too, ``insert`` repairs included) and the adversarial ones."""
    assert env.task is not None
    legal = [c for c in env.legal_calls() if c != "submit"]
    extra = [bug.repair for bug in env.task.bugs] + adversarial_calls(env.source)
    return legal + [c for c in dict.fromkeys(extra) if c not in legal]


def _save(env: BugFixEnvV1) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, list) else v) for k, v in vars(env).items() if k in STATE}


def _restore(env: BugFixEnvV1, state: dict[str, Any]) -> None:
    for k, v in state.items():
        setattr(env, k, list(v) if isinstance(v, list) else v)


def leaves(env: BugFixEnvV1, depth: int, out: list[dict[str, Any]]) -> None:
    """Every state reachable in up to ``depth`` calls from the env's current one (each a place to submit)."""
    here = _save(env)
    out.append(here)
    if depth == 0:
        return
    for call in calls_now(env):
        _restore(env, here)
        _, _, terminated, truncated, _ = env.step(call)
        if not (terminated or truncated):
            leaves(env, depth - 1, out)
    _restore(env, here)


def search_task(env: BugFixEnvV1, name: str, depth: int, sample: int, rng: random.Random) -> dict[str, Any]:
    """Every sequence of up to ``depth`` calls then ``submit`` on one task, each reward checked independently."""
    env.reset(options={"task": name})
    states: list[dict[str, Any]] = []
    leaves(env, depth, states)
    task = env.task
    assert task is not None
    sources = sorted({s["source"] for s in states})
    run_repair_tests_many(task.entry, task.support, task.hidden, sources)  # warm the env's report cache
    earned: dict[str, set[float]] = {}
    for state in states:
        _restore(env, state)
        reward = env.step("submit")[1]
        earned.setdefault(state["source"], set()).add(reward)
    rewarded = [s for s, r in earned.items() if 1.0 in r]
    unrewarded = [s for s, r in earned.items() if 1.0 not in r]
    checked = rewarded + rng.sample(unrewarded, min(sample, len(unrewarded)))
    independent = {s: run_repair_tests(task.entry, task.support, task.hidden, s, cache=False).ok for s in checked}
    return {"task": name, "depth": depth, "sequences": len(states), "sources": len(sources),
            "rewarded": sum(1 for st in states if 1.0 in earned[st["source"]]), "rewarded_sources": len(rewarded),
            "violations": sum(1 for s in rewarded if not independent[s]),
            "missed": sum(1 for s in checked if independent[s] and 1.0 not in earned[s]),
            "mixed": sum(1 for r in earned.values() if len(r) > 1), "checked": len(checked)}


def smallest_tasks(env: BugFixEnvV1, count: int, per_problem: int = 2) -> list[str]:
    """The test-split tasks with the fewest legal calls, at most ``per_problem`` of a problem."""
    sizes = []
    for i in range(len(env.tasks)):
        env.reset(options={"task": i})
        sizes.append((len(env.legal_calls()), env._names[i], env.tasks[i].problem))
    chosen: list[str] = []
    taken: dict[str, int] = {}
    for _, name, problem in sorted(sizes):
        if len(chosen) < count and taken.get(problem, 0) < per_problem:
            chosen.append(name)
            taken[problem] = taken.get(problem, 0) + 1
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", default="1:24,2:1",
                        help="DEPTH:TASKS,...: the TASKS smallest test-split tasks, to DEPTH calls before submit")
    parser.add_argument("--sample", type=int, default=300, help="unrewarded sources per task checked for a missed pass")
    args = parser.parse_args(argv)
    plan = [tuple(int(x) for x in part.split(":")) for part in args.plan.split(",")]
    env = BugFixEnvV1(split="test", max_turns=12)
    rng = random.Random(0)
    started = time.perf_counter()
    small = smallest_tasks(env, max(n for _, n in plan))
    totals = {"sequences": 0, "sources": 0, "rewarded": 0, "violations": 0, "missed": 0, "mixed": 0, "checked": 0}
    print(f"{'task':28s} {'depth':>5s} {'sequences':>9s} {'sources':>8s} {'rewarded':>8s} {'violations':>10s} "
          f"{'missed':>6s} {'s':>6s}")
    tasks_seen = set()
    for depth, count in plan:
        for name in small[:count]:
            t0 = time.perf_counter()
            row = search_task(env, name, depth, args.sample, rng)
            tasks_seen.add(name)
            for key in totals:
                totals[key] += row[key]
            print(f"{name:28s} {depth:5d} {row['sequences']:9d} {row['sources']:8d} {row['rewarded']:8d} "
                  f"{row['violations']:10d} {row['missed']:6d} {time.perf_counter() - t0:6.1f}", flush=True)
    seconds = time.perf_counter() - started
    print(f"\n{totals['sequences']} sequences (each ending in submit) on {len(tasks_seen)} test-split tasks, "
          f"{totals['sources']} distinct final sources; {totals['rewarded']} rewarded")
    print(f"rewards without every hidden case passing (independent run): {totals['violations']}")
    print(f"sources that pass every hidden case but earned 0: {totals['missed']} of {totals['checked']} checked; "
          f"sources with two different rewards: {totals['mixed']}")
    print(f"{seconds:.1f} s; python {platform.python_version()}; {os.cpu_count()} CPUs; "
          f"load average {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 1 if totals["violations"] or totals["mixed"] else 0


if __name__ == "__main__":
    sys.exit(main())
