"""BugFix-v0 throughput as a ratio to CartPole-v1, measured side by side in the same run.

    python benchmarks/env_throughput.py                # default: 5 alternating repeats of 20k steps
    python benchmarks/env_throughput.py --steps 5000 --repeats 3

Both envs are built with ``gym.make`` (so both carry gymnasium's default wrappers).
BugFix-v0 plays a fixed cycling script of calls (reads, tests, edits, revert, submit,
resetting when an episode ends); CartPole-v1 plays random actions. The two are timed
alternately, several times, and the ratio of the medians is reported (goal >= 0.25).
"Uncached" clears the test-result cache and the edit-op cache before every step, so every
``test`` / ``submit`` runs the task code and every ``edit`` re-parses the source: the cost
of a step the first time a source is seen. The token views (``DiscreteCalls``) are timed too.

BugFix-v1 (``gym.make("BugFix-v1", split="test")``, HumanEval's test-split mutants) plays random legal calls: a
call kind drawn uniformly among those ``info["call_mask"]`` allows (not ``patch`` / ``insert``, which are free
text), a sited edit drawn head by head through ``edit_mask`` (line, site, mutation, argument), ``delete L`` among
the deletable lines. Only ``step`` and ``reset`` are timed, not the drawing. "Uncached" is the first play of
those episodes with the report and legal-edit caches emptied (most sources are new: every ``test``, ``locate``
and ``submit`` runs in the contained worker); "cached" replays the same calls, as a training run that meets a
source again would.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import gymnasium as gym
import numpy as np

import bugfix_gym
from bugfix_gym.execution import runner
from bugfix_gym.edits.ops import apply_op
from bugfix_gym.edits import sites
from bugfix_gym.edits.sites import ARGS, MUTATIONS
from bugfix_gym.execution import repair_runner
from bugfix_gym.views.wrappers import DiscreteCalls

SCRIPT = ("read", "test", "edit fix_comparison", "test", "edit swap_minmax", "revert", "edit fix_init", "submit",
          "read", "edit add_zero_guard", "edit fix_range_end", "test", "submit", "garbage call")


def _uncache() -> None:
    runner.clear_cache()
    apply_op.cache_clear()


def bugfix_steps_per_s(n_steps: int, uncached: bool = False, env_id: str = "BugFix-v0") -> float:
    env = gym.make(env_id)
    env.reset(seed=0)
    clear: Callable[[], None] = _uncache if uncached else (lambda: None)
    k, episodes = 0, 0
    start = time.perf_counter()
    for _ in range(n_steps):
        clear()
        _, _, terminated, truncated, _ = env.step(SCRIPT[k % len(SCRIPT)])
        k += 1
        if terminated or truncated:
            episodes += 1
            env.reset(seed=episodes)
    elapsed = time.perf_counter() - start
    env.close()
    return n_steps / elapsed


def discrete_steps_per_s(n_steps: int) -> float:
    env = DiscreteCalls(gym.make("BugFix-v0"))
    env.reset(seed=0)
    indices = [bugfix_gym.CALLS.index(c) if c in bugfix_gym.CALLS else 0 for c in SCRIPT]
    k = 0
    start = time.perf_counter()
    for _ in range(n_steps):
        _, _, terminated, truncated, _ = env.step(indices[k % len(indices)])
        k += 1
        if terminated or truncated:
            env.reset()
    return n_steps / (time.perf_counter() - start)


def random_legal_call(env, rng: np.random.Generator) -> str:
    """A random legal BugFix-v1 call: a kind among the legal ones (no free text), an edit drawn head by head."""
    from bugfix_gym.core.calls_v1 import CALL_KINDS

    mask = env.call_mask()
    kinds = [k for k, ok in zip(CALL_KINDS, mask) if ok and k not in ("patch", "insert")]
    kind = kinds[int(rng.integers(len(kinds)))]
    if kind == "delete":
        lines = [int(c.split()[1]) for c in env.legal_calls() if c.startswith("delete ")]
        return f"delete {lines[int(rng.integers(len(lines)))]}"
    if kind != "edit":
        return kind
    line = int(rng.choice(np.flatnonzero(env.edit_mask()))) + 1
    expr = int(rng.choice(np.flatnonzero(env.edit_mask(line))))
    mutation = MUTATIONS[int(rng.choice(np.flatnonzero(env.edit_mask(line, expr))))]
    args = np.flatnonzero(env.edit_mask(line, expr, mutation))
    return f"edit {line}.{expr} {mutation}" + (f" {ARGS[int(rng.choice(args))]}" if len(args) else "")


def v1_play(n_steps: int, episodes: list[tuple[int, list[str]]] | None = None, seed: int = 0
            ) -> tuple[float, list[tuple[int, list[str]]]]:
    """BugFix-v1 steps per second (``step`` and ``reset`` timed only) over random legal calls on the test split;
    with ``episodes`` (``(reset seed, calls)`` from an earlier play) the same calls are replayed."""
    env = gym.make("BugFix-v1", split="test")
    rng = np.random.default_rng(seed)
    played: list[tuple[int, list[str]]] = []
    elapsed, steps = 0.0, 0
    while steps < n_steps:
        k = len(played)
        reset_seed, script = episodes[k % len(episodes)] if episodes else (seed * 100_003 + k, [])
        start = time.perf_counter()
        env.reset(seed=reset_seed)
        elapsed += time.perf_counter() - start
        calls: list[str] = []
        done = False
        while not done and steps < n_steps:
            call = script[len(calls)] if len(calls) < len(script) else random_legal_call(env.unwrapped, rng)
            start = time.perf_counter()
            _, _, terminated, truncated, _ = env.step(call)
            elapsed += time.perf_counter() - start
            calls.append(call)
            steps += 1
            done = terminated or truncated
        played.append((reset_seed, calls))
    env.close()
    return steps / elapsed, played


def _uncache_v1() -> None:
    from bugfix_gym.core import env_v1

    repair_runner.clear_cache()
    sites._analysis.cache_clear()
    env_v1.apply_call.cache_clear()
    env_v1.deletable_lines.cache_clear()
    env_v1.source_calls.cache_clear()


def cartpole_steps_per_s(n_steps: int) -> float:
    env = gym.make("CartPole-v1")
    env.reset(seed=0)
    env.action_space.seed(0)
    start = time.perf_counter()
    for _ in range(n_steps):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
    elapsed = time.perf_counter() - start
    env.close()
    return n_steps / elapsed


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000, help="steps per timing (default 20000)")
    parser.add_argument("--repeats", type=int, default=5, help="alternating repeats (default 5)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.repeats < 1:
        parser.error("--steps and --repeats must be positive")

    bugfix_steps_per_s(1000)  # warm the cache and imports, as a training run would
    cartpole_steps_per_s(1000)
    v1_steps = max(args.steps // 20, 50)
    v1_play(min(v1_steps, 200), seed=10_000)  # the worker started, HumanEval loaded
    runs: dict[str, list[float]] = {"CartPole-v1 (random)": [], "BugFix-v0 (cached)": [], "ratio": [],
                                    "BugFix-v0 (uncached)": [], "DiscreteCalls view": [], "BugFix-v1 (cached)": [],
                                    "BugFix-v1 (uncached)": []}
    for repeat in range(args.repeats):
        cart = cartpole_steps_per_s(args.steps)
        bug = bugfix_steps_per_s(args.steps)
        runs["CartPole-v1 (random)"].append(cart)
        runs["BugFix-v0 (cached)"].append(bug)
        runs["ratio"].append(bug / cart)
        runs["BugFix-v0 (uncached)"].append(bugfix_steps_per_s(max(args.steps // 10, 100), uncached=True))
        runs["DiscreteCalls view"].append(discrete_steps_per_s(max(args.steps // 4, 100)))
        _uncache_v1()
        first, played = v1_play(v1_steps, seed=repeat)
        runs["BugFix-v1 (uncached)"].append(first)
        runs["BugFix-v1 (cached)"].append(v1_play(v1_steps, episodes=played)[0])
    med = {k: statistics.median(v) for k, v in runs.items()}
    ratio = med["BugFix-v0 (cached)"] / med["CartPole-v1 (random)"]
    cart = med["CartPole-v1 (random)"]

    print(f"{'env':24s} {'steps/s (median)':>17s} {'us/step':>9s} {'min':>10s} {'max':>10s} {'/ CartPole':>10s}")
    for key in ("CartPole-v1 (random)", "BugFix-v0 (cached)", "BugFix-v0 (uncached)", "DiscreteCalls view",
                "BugFix-v1 (cached)", "BugFix-v1 (uncached)"):
        v = runs[key]
        print(f"{key:24s} {med[key]:17,.0f} {1e6 / med[key]:9.1f} {min(v):10,.0f} {max(v):10,.0f} "
              f"{med[key] / cart:10.4f}")
    print(f"\nBugFix-v0 / CartPole-v1 ratio of medians: {ratio:.3f} (per repeat: "
          f"{', '.join(f'{r:.3f}' for r in runs['ratio'])}); goal >= 0.25: {'met' if ratio >= 0.25 else 'MISSED'}")
    print(f"uncached / cached step cost: {med['BugFix-v0 (cached)'] / med['BugFix-v0 (uncached)']:.1f}x "
          f"({args.repeats} alternating repeats of {args.steps} steps)")
    print(f"BugFix-v1 (test split, random legal calls) / CartPole-v1: cached {med['BugFix-v1 (cached)'] / cart:.4f}, "
          f"uncached {med['BugFix-v1 (uncached)'] / cart:.4f} ({v1_steps} steps a repeat)")
    return {**med, "ratio": ratio, "v1_ratio": med["BugFix-v1 (cached)"] / cart,
            "v1_uncached_ratio": med["BugFix-v1 (uncached)"] / cart}  # ratios of medians


if __name__ == "__main__":
    main()
