"""How often a sampled ``BugFixCalls-v1`` action is a legal call, by how the heads are masked; the views' own cost.

    OMP_NUM_THREADS=1 python benchmarks/views_v1.py --steps 2000 --split test

Three samplers over the same tasks (HumanEval's ``--split``, seeded resets, ``--steps`` actions each, an episode
reset when it ends): uniform over the whole ``MultiDiscrete`` (no mask); each head drawn independently under
``action_masks()`` (what sb3-contrib's ``MaskablePPO`` does with a ``MultiDiscrete``); the heads drawn in order
under ``head_masks(prefix)`` (an autoregressive policy). Printed: the share of actions that were legal calls
(``info["legal_action"]``), and each view's own time per step (its step minus the text env's step inside it: the
masks, the call text, the token arrays), the byte token view playing the same calls as bytes.
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

import numpy as np

from bugfix_gym.core.env_v1 import BugFixEnvV1
from bugfix_gym.views.heads_v1 import HEAD_SIZES, ByteTokenCalls, FactorisedCalls

Sampler = Callable[[FactorisedCalls, np.random.Generator], np.ndarray]


def uniform(view: FactorisedCalls, rng: np.random.Generator) -> np.ndarray:
    return np.array([rng.integers(n) for n in HEAD_SIZES])


def independent(view: FactorisedCalls, rng: np.random.Generator) -> np.ndarray:
    masks = np.split(view.action_masks(), np.cumsum(HEAD_SIZES)[:-1])
    return np.array([rng.choice(np.flatnonzero(m)) for m in masks])


def autoregressive(view: FactorisedCalls, rng: np.random.Generator) -> np.ndarray:
    return view.sample_legal(rng)


class Timed:
    """The text env's ``step`` with a stopwatch: what the view adds is the view's time minus this."""

    def __init__(self, env: BugFixEnvV1):
        self.inner, self.seconds = env.step, 0.0
        env.step = self  # type: ignore[method-assign]

    def __call__(self, action: str):
        start = time.perf_counter()
        try:
            return self.inner(action)
        finally:
            self.seconds += time.perf_counter() - start


def run(sampler: Sampler, tasks: list, steps: int, seed: int) -> tuple[float, float, list[str]]:
    """The share of legal actions, the view's own milliseconds per step, and the calls played."""
    env = BugFixEnvV1(tasks=tasks)
    timed = Timed(env)
    view = FactorisedCalls(env, max_len=2048)
    rng = np.random.default_rng(seed)
    view.reset(seed=seed)
    legal, calls, resets, total = 0, [], 0, 0.0
    for _ in range(steps):
        action = sampler(view, rng)
        start = time.perf_counter()
        _, _, terminated, truncated, info = view.step(action)
        total += time.perf_counter() - start
        legal += info["legal_action"]
        calls.append(env.actions[-1])
        if terminated or truncated:
            resets += 1
            view.reset(seed=seed + resets)
            calls.append("")
    return legal / steps, 1000 * (total - timed.seconds) / steps, calls


def replay(calls: list[str], tasks: list, seed: int) -> float:
    """The byte token view's own milliseconds per step, playing the same calls."""
    env = BugFixEnvV1(tasks=tasks)
    timed = Timed(env)
    view = ByteTokenCalls(env, max_len=2048, max_call_tokens=300)
    view.reset(seed=seed)
    total, n, resets = 0.0, 0, 0
    for call in calls:
        if not call:
            resets += 1
            view.reset(seed=seed + resets)
            continue
        action = view.encode_call(call)
        start = time.perf_counter()
        view.step(action)
        total += time.perf_counter() - start
        n += 1
    return 1000 * (total - timed.seconds) / n


def main(argv: list[str] | None = None) -> dict[str, tuple[float, float, float]]:
    """Print the table; return ``{sampler: (share of legal calls, calls view ms, tokens view ms)}``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--split", default="test")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print("| sampler | legal calls | BugFixCalls-v1's own ms / step | BugFixTokens-v1's own ms / step (same calls) |")
    print("|---|---|---|---|")
    tasks = BugFixEnvV1(split=args.split).tasks  # the split's tasks, loaded once
    out = {}
    for name, sampler in (("uniform, no mask", uniform), ("independent heads, action_masks()", independent),
                          ("heads in order, head_masks(prefix)", autoregressive)):
        share, calls_ms, calls = run(sampler, tasks, args.steps, args.seed)
        out[name] = (share, calls_ms, replay(calls, tasks, args.seed))
        print(f"| {name} | {share:.1%} | {calls_ms:.2f} | {out[name][2]:.2f} |")
    return out


if __name__ == "__main__":
    main()
