"""BugFix-v1's baselines on the HumanEval splits: what a learned repairer must beat, at the same call budget.

    python benchmarks/baselines_v1.py                            # heldout and test, one- and two-bug, every task
    python benchmarks/baselines_v1.py --limit 40 --bugs 1        # 40 tasks per split (evenly spaced): a quick run
    python benchmarks/baselines_v1.py --jobs 4 --out runs/b.json # four processes
    python benchmarks/baselines_v1.py --merge runs/a.json runs/b.json --out runs/all.json  # join runs, one table

Every baseline of :mod:`bugfix_gym.core.scripted_v1` (oracle, brute force, random legal, scripted debugger)
plays every stored mutant of each split at the env's call budget (``--max-turns``, default 12), each episode
seeded by ``--seed`` and its task's index. Brute force (and with ``--unbounded-baselines``, the debugger) is also
run **unbounded** (``--unbounded`` tasks per problem, drawn with ``random.Random(seed)``; every legal edit tried if
need be) to count the test calls it needs.

Prints a table (pass rate, mean calls, mean test calls: ``test`` and ``locate`` calls, each a run of the visible
tests) and writes every episode and the table as JSON (``--out``, default ``runs/baselines_v1_<time>_<pid>.json``,
written to a temporary file and renamed, so concurrent runs never clobber one another).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from typing import Any, Sequence

from bugfix_gym.core.env_v1 import BugFixEnvV1
from bugfix_gym.core.scripted_v1 import (KINDS_V1, brute_force_order, debugger_order, locate_scores, make_policy,
                                         play_episode)
from bugfix_gym.tasks.humaneval import humaneval_problems
from bugfix_gym.tasks.mutants import stored_tasks

UNBOUNDED_TURNS = 100_000
"""The env's budget for unbounded brute force (three calls per edit; no HumanEval source has 33,000 edits)."""
_ENVS: dict[tuple, Any] = {}


def split_tasks(split: str, bugs: int, limit: int | None) -> list[Any]:
    """The stored mutants of a split; with ``limit``, that many evenly spaced over the list (every problem
    represented in proportion)."""
    tasks = list(stored_tasks(humaneval_problems(split), bugs=bugs))
    if limit is not None and limit < len(tasks):
        tasks = [tasks[i * len(tasks) // limit] for i in range(limit)]
    return tasks


def unbounded_tasks(split: str, per_problem: int, seed: int, limit: int | None = None) -> list[Any]:
    """``per_problem`` one-bug tasks of each problem of the split, drawn with ``random.Random(seed)``; with
    ``limit``, that many evenly spaced over them."""
    rng = random.Random(seed)
    chosen = []
    for problem in humaneval_problems(split):
        tasks = list(stored_tasks([problem], bugs=1))
        chosen += rng.sample(tasks, min(per_problem, len(tasks)))
    if limit is not None and limit < len(chosen):
        chosen = [chosen[i * len(chosen) // limit] for i in range(limit)]
    return chosen


def _env(split: str, bugs: int, limit: int | None, max_turns: int, unbounded: tuple[int, int] | None
         ) -> tuple[Any, list[Any]]:
    """One env per (split, bugs, budget) and process, and its tasks: the group's (``max_turns=0``: the tasks
    only)."""
    key = (split, bugs, limit, max_turns, unbounded)
    if key not in _ENVS:
        if unbounded:
            tasks = unbounded_tasks(split, unbounded[0], unbounded[1], limit)
        else:
            tasks = split_tasks(split, bugs, limit)
        _ENVS[key] = (BugFixEnvV1(tasks=tasks, max_turns=max_turns) if max_turns else None, tasks)
    return _ENVS[key]


def run_chunk(job: dict[str, Any]) -> list[dict[str, Any]]:
    """Play ``job``'s episodes (one baseline, one split and bug count, task indices ``job["indices"]``)."""
    unbounded = job["unbounded"]
    max_turns = UNBOUNDED_TURNS if unbounded else job["max_turns"]
    env, tasks = _env(job["split"], job["bugs"], job["limit"], max_turns, unbounded)
    policy = make_policy(job["baseline"], tasks, None if unbounded else max_turns)
    out = []
    for i in job["indices"]:
        start = time.perf_counter()
        name = f"{tasks[i].problem}:{tasks[i].name}"  # unique even where two problems share an entry name
        episode = play_episode(env, policy, name, seed=job["seed"] * 1_000_003 + i)
        out.append({**asdict(episode), "seconds": round(time.perf_counter() - start, 3)})
    return out


def summarise(episodes: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Pass rate, mean calls and mean test calls of a group's episodes (and, for the passing ones, the median
    test calls)."""
    n = len(episodes)
    passed = [e for e in episodes if e["passed"]]
    return {"tasks": n, "pass_rate": len(passed) / n if n else 0.0,
            "mean_calls": statistics.fmean(e["calls"] for e in episodes) if n else 0.0,
            "mean_test_calls": statistics.fmean(e["test_calls"] for e in episodes) if n else 0.0,
            "median_test_calls_passed": statistics.median(e["test_calls"] for e in passed) if passed else None,
            "mean_invalid": statistics.fmean(e["invalid"] for e in episodes) if n else 0.0,
            "seconds": round(sum(e["seconds"] for e in episodes), 1)}


def _jobs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every (group, chunk) to play: the bounded groups, then the unbounded brute force."""
    base = {"limit": args.limit, "max_turns": args.max_turns, "seed": args.seed}
    groups = [{**base, "split": s, "bugs": b, "baseline": k, "unbounded": None}
              for s in args.splits for b in args.bugs for k in args.baselines]
    if args.unbounded:
        groups += [{**base, "split": s, "bugs": 1, "baseline": k, "unbounded": (args.unbounded, args.seed)}
                   for s in args.splits for k in args.unbounded_baselines]
    jobs = []
    for group in groups:
        n = len(_env(group["split"], group["bugs"], group["limit"], 0, group["unbounded"])[1])
        step = max(1, -(-n // max(1, args.chunks_per_group)))
        jobs += [{**group, "indices": list(range(lo, min(n, lo + step)))} for lo in range(0, n, step)]
    return jobs


def _group_key(job: dict[str, Any]) -> str:
    budget = "unbounded" if job["unbounded"] else f"{job['max_turns']} turns"
    return f"{job['split']}|{job['bugs']}|{job['baseline']}|{budget}"


def table(rows: dict[str, dict[str, Any]]) -> str:
    """The printed table, one row per (split, bugs, baseline, budget)."""
    head = (f"{'split':8} {'bugs':>4} {'baseline':12} {'budget':>10} {'tasks':>6} {'pass':>6} {'calls':>7} "
            f"{'tests':>7} {'tests|pass':>10}")
    lines = [head, "-" * len(head)]
    for key, row in rows.items():
        split, bugs, baseline, budget = key.split("|")
        median = row["median_test_calls_passed"]
        lines.append(f"{split:8} {bugs:>4} {baseline:12} {budget:>10} {row['tasks']:6d} {row['pass_rate']:6.3f} "
                     f"{row['mean_calls']:7.2f} {row['mean_test_calls']:7.2f} "
                     f"{'-' if median is None else f'{median:.0f}':>10}")
    return "\n".join(lines)


def write_json(path: str, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder (an atomic rename)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--splits", nargs="+", default=["heldout", "test"], choices=["train", "heldout", "test"])
    parser.add_argument("--bugs", nargs="+", type=int, default=[1, 2], choices=[1, 2])
    parser.add_argument("--baselines", nargs="*", default=list(KINDS_V1), choices=list(KINDS_V1))
    parser.add_argument("--max-turns", type=int, default=12, help="the env's call budget (default 12)")
    parser.add_argument("--limit", type=int, default=None, help="at most N tasks per group (split, bug count, budget)")
    parser.add_argument("--unbounded", type=int, default=1,
                        help="one-bug tasks per problem for unbounded brute force (0: skip)")
    parser.add_argument("--unbounded-baselines", nargs="+", default=["brute_force"],
                        choices=["brute_force", "debugger"], help="the searches to run unbounded")
    parser.add_argument("--ranks", action="store_true",
                        help="only where each one-bug task's known repair stands in the searches' orders")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1, help="processes (each with its own env and worker)")
    parser.add_argument("--chunks-per-group", type=int, default=None, help="default: --jobs")
    parser.add_argument("--out", default=None, help="the JSON file (default runs/baselines_v1_<time>_<pid>.json)")
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 1 or args.max_turns < 1 or args.jobs < 1 or args.unbounded < 0:
        parser.error("--limit, --max-turns and --jobs must be at least 1, --unbounded at least 0")
    args.chunks_per_group = args.chunks_per_group or args.jobs
    args.out = args.out or f"runs/baselines_v1_{time.strftime('%Y%m%d_%H%M%S')}_{os.getpid()}.json"
    return args


def merge(paths: Sequence[str], out: str) -> dict[str, Any]:
    """Join the episodes of several runs' JSON files (runs split by split, baseline or task range), each task
    counted once per group, and recompute the rows; written to ``out``."""
    episodes: dict[str, dict[str, dict[str, Any]]] = {}
    commands = []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        commands.append(data.get("command", path))
        for key, eps in data["episodes"].items():
            episodes.setdefault(key, {}).update({e["task"]: e for e in eps})
    joined = {key: list(eps.values()) for key, eps in episodes.items()}
    merged = {"merged": list(paths), "commands": commands, "episodes": joined,
              "rows": {key: summarise(eps) for key, eps in joined.items()}}
    write_json(out, merged)
    return merged


def repair_ranks(split: str, limit: int | None) -> dict[str, Any]:
    """Where each one-bug task's known repair stands in brute force's and the debugger's orders (1 = tried first;
    None: not a listed call, i.e. ``insert L CODE``): an unbounded search stops at or before that many test calls
    (it stops at the first edit that passes the visible tests). Measured with the oracle's knowledge, never used
    by a policy. Runs one ``locate`` per task."""
    env, tasks = _env(split, 1, limit, 12, None)
    ranks: dict[str, list[int | None]] = {"brute_force": [], "debugger": []}
    for task in tasks:
        env.reset(seed=0, options={"task": f"{task.problem}:{task.name}"})
        observation = env.step("locate")[0]
        legal = env.unwrapped.legal_calls()
        orders = {"brute_force": brute_force_order(legal),
                  "debugger": debugger_order(legal, locate_scores(observation))}
        for kind, order in orders.items():
            ranks[kind].append(order.index(task.bugs[0].repair) + 1 if task.bugs[0].repair in order else None)
    return ranks


def rank_table(ranks_by_split: dict[str, dict[str, list[int | None]]]) -> str:
    """Quantiles of :func:`repair_ranks` per split and search."""
    lines = [f"{'split':8} {'search':12} {'tasks':>6} {'listed':>6} {'<=3':>6} {'<=10':>6} {'median':>7} {'p90':>6} "
             f"{'max':>6}"]
    for split, ranks in ranks_by_split.items():
        for kind, values in ranks.items():
            listed = sorted(v for v in values if v is not None)
            if not listed:
                continue
            lines.append(f"{split:8} {kind:12} {len(values):6d} {len(listed):6d} {sum(v <= 3 for v in listed):6d} "
                         f"{sum(v <= 10 for v in listed):6d} {statistics.median(listed):7.0f} "
                         f"{listed[int(0.9 * (len(listed) - 1))]:6d} {listed[-1]:6d}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "--merge":
        if len(argv) < 4 or argv[-2] != "--out":
            raise SystemExit("usage: baselines_v1.py --merge RUN.json... --out MERGED.json")
        print(table(merge(argv[1:-2], argv[-1])["rows"]))
        return 0
    args = parse_args(argv)
    if args.ranks:
        ranks = {split: repair_ranks(split, args.limit) for split in args.splits}
        write_json(args.out, {"args": vars(args), "ranks": ranks})
        print(rank_table(ranks))
        return 0
    jobs = _jobs(args)
    episodes: dict[str, list[dict[str, Any]]] = {}
    started = time.perf_counter()
    data: dict[str, Any] = {"args": {k: v for k, v in vars(args).items()}, "command": " ".join(sys.argv)}
    with ProcessPoolExecutor(args.jobs) if args.jobs > 1 else _Serial() as pool:
        for job, result in zip(jobs, pool.map(run_chunk, jobs)):
            episodes.setdefault(_group_key(job), []).extend(result)
            rows = {key: summarise(eps) for key, eps in episodes.items()}
            data.update(rows=rows, episodes=episodes, seconds=round(time.perf_counter() - started, 1))
            write_json(args.out, data)
            print(f"[{time.perf_counter() - started:7.1f} s] {_group_key(job)}: {len(result)} episodes",
                  file=sys.stderr, flush=True)
    print(table(data["rows"]))
    print(f"wrote {args.out} ({data['seconds']} s)")
    return 0


class _Serial:
    """``ProcessPoolExecutor``'s ``map`` in this process (``--jobs 1``)."""

    def __enter__(self) -> _Serial:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def map(self, fn: Any, items: Sequence[Any]) -> Any:
        return map(fn, items)


if __name__ == "__main__":
    raise SystemExit(main())
