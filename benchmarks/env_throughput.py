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
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import gymnasium as gym

import bugfix_gym
from bugfix_gym.execution import runner
from bugfix_gym.edits.ops import apply_op
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
    runs: dict[str, list[float]] = {"CartPole-v1 (random)": [], "BugFix-v0 (cached)": [], "ratio": [],
                                    "BugFix-v0 (uncached)": [], "DiscreteCalls view": []}
    for _ in range(args.repeats):
        cart = cartpole_steps_per_s(args.steps)
        bug = bugfix_steps_per_s(args.steps)
        runs["CartPole-v1 (random)"].append(cart)
        runs["BugFix-v0 (cached)"].append(bug)
        runs["ratio"].append(bug / cart)
        runs["BugFix-v0 (uncached)"].append(bugfix_steps_per_s(max(args.steps // 10, 100), uncached=True))
        runs["DiscreteCalls view"].append(discrete_steps_per_s(max(args.steps // 4, 100)))
    med = {k: statistics.median(v) for k, v in runs.items()}
    ratio = med["BugFix-v0 (cached)"] / med["CartPole-v1 (random)"]

    print(f"{'env':24s} {'steps/s (median)':>17s} {'us/step':>9s} {'min':>10s} {'max':>10s}")
    for key in ("CartPole-v1 (random)", "BugFix-v0 (cached)", "BugFix-v0 (uncached)", "DiscreteCalls view"):
        v = runs[key]
        print(f"{key:24s} {med[key]:17,.0f} {1e6 / med[key]:9.1f} {min(v):10,.0f} {max(v):10,.0f}")
    print(f"\nBugFix-v0 / CartPole-v1 ratio of medians: {ratio:.3f} (per repeat: "
          f"{', '.join(f'{r:.3f}' for r in runs['ratio'])}); goal >= 0.25: {'met' if ratio >= 0.25 else 'MISSED'}")
    print(f"uncached / cached step cost: {med['BugFix-v0 (cached)'] / med['BugFix-v0 (uncached)']:.1f}x "
          f"({args.repeats} alternating repeats of {args.steps} steps)")
    return {**med, "ratio": ratio}  # the ratio of medians (med["ratio"] is the median of per-repeat ratios)


if __name__ == "__main__":
    main()
