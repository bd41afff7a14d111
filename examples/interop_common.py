"""What the library examples share: the env id and size, one pass-rate evaluation, the result line.

Every ``examples/<library>_*.py`` trains on ``gym.make("BugFixCalls-v0", max_len=MAX_LEN)``
(the ``DiscreteCalls`` view: ``Discrete(9)`` calls, bool call mask) with that library's own
classes, and measures the pass rate before and after training with :func:`pass_rate`:
sampled, masked actions on the same seeded episodes of both splits.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable

import gymnasium as gym
import numpy as np

import bugfix_gym  # noqa: F401  (registers BugFix-v0 and the views)

ENV_ID = "BugFixCalls-v0"
MAX_LEN = 128  # the prompt plus a few short turns; longer episodes keep the prompt (see bugfix_gym.views.wrappers)
EVAL_EPISODES = 200
EVAL_SEED = 10_000
SPLITS = ("train", "heldout")
RUNS = Path("runs") / "interop"


def set_threads() -> None:
    """One torch thread (the machines these run on are small and shared); ``BUGFIX_THREADS`` overrides."""
    import torch

    torch.set_num_threads(int(os.environ.get("BUGFIX_THREADS", "1")))


def pass_rate(act: Callable[[dict[str, np.ndarray], np.ndarray], int], split: str, layout: str = "dict",
              masked: bool = True, episodes: int = EVAL_EPISODES, seed: int = EVAL_SEED) -> float:
    """Fraction of ``episodes`` seeded episodes of ``split`` that end in a passing submit.

    :param act: ``(obs, call_mask) -> call index``, as the library's policy acts
    :param split: ``"train"`` or ``"heldout"``
    :param layout: the ``DiscreteCalls`` layout ``act`` reads
    :param masked: the policy claims to respect the call mask: a masked call is an error
        (else the env plays it as it plays any illegal call: an invalid turn)
    """
    env = gym.make(ENV_ID, split=split, max_len=MAX_LEN, layout=layout)
    passed = 0
    for k in range(episodes):
        obs, info = env.reset(seed=seed + k)
        done = False
        while not done:
            call = act(obs, info["call_mask"])
            if masked and not info["call_mask"][call]:
                raise AssertionError(f"the policy chose masked call {call}")
            obs, reward, terminated, truncated, info = env.step(call)
            done = terminated or truncated
        passed += bool(info["submitted"] and info["hidden_pass"])
    env.close()
    return passed / episodes


def evaluate(act: Callable[[dict[str, np.ndarray], np.ndarray], int], layout: str = "dict",
             masked: bool = True) -> dict[str, float]:
    """:func:`pass_rate` on both splits."""
    return {split: pass_rate(act, split, layout, masked) for split in SPLITS}


def report(name: str, steps: int, seconds: float, before: dict[str, float], after: dict[str, float],
           **extra: Any) -> None:
    """Print the before -> after table and keep it in ``runs/interop/<name>.json``."""
    print(f"{name}: {steps} env steps in {seconds:.0f} s")
    print(f"{'split':<8} {'pass before':>12} {'pass after':>11}")
    for split in SPLITS:
        print(f"{split:<8} {before[split]:12.3f} {after[split]:11.3f}")
    RUNS.mkdir(parents=True, exist_ok=True)
    result = {"example": name, "env_steps": steps, "train_seconds": round(seconds, 1), "before": before,
              "after": after, **extra}
    (RUNS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")


class Timer:
    """``with Timer() as t: ...; t.seconds``."""

    def __enter__(self) -> "Timer":
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start
