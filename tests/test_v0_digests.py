"""BugFix-v0 stays byte-identical: SHA-256 digests of whole v0 episodes (scripted policies, several seeds, the
transcript, rewards, flags and masks of every step), computed on main before BugFix-v1 was added and hard-coded
here. A change to any v0 observation, reward, mask or task draw changes a digest."""

from __future__ import annotations

import hashlib
import json

import gymnasium as gym
import numpy as np
import pytest

import bugfix_gym  # noqa: F401 (registers the envs)
from bugfix_gym.core.scripted import scripted_policy

INVALID = ("", "edit fix_everything", "x" * 500, "read\u00a0", "submit now")
"""Calls the digests also cover: each is an invalid turn in v0."""

CONFIGS = {
    "train-oracle": (dict(split="train"), "oracle"),
    "heldout-random": (dict(split="heldout"), "random"),
    "train-careful": (dict(split="train"), "careful"),
    "generated-test-noisy": (dict(generated="test"), "noisy_oracle"),
    "all-random-costs": (dict(split="all", call_cost=0.1, invalid_cost=0.2, no_change_cost=0.05,
                              edit_penalty=0.01), "random"),
}

DIGESTS = {
    "train-oracle": "e3e07d0577fbab737f304a244b827046710d66b5231ed238d41f5b3cd75a7ff4",
    "heldout-random": "edda3c1673493aa392dc9ef5f5828ec921be1e28dc85a15c282205c0e64e2944",
    "train-careful": "dec8f78255dd260b9e84bf4b53eb633ddb38be38a4849aed1a7492e970d0d30c",
    "generated-test-noisy": "87911f3259aacdfdea06e05454815a863485018fd4ccd10202dcd1de59374bdf",
    "all-random-costs": "3d0be7fd5212c6775890f537dc435b06bb8e8da58e2a0941994637a878b26bba",
}
"""Computed on main at 34a6ebf (before BugFix-v1's env) by :func:`v0_digest`."""


def _plain(value):
    if isinstance(value, np.ndarray):
        return value.astype(int).tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def v0_digest(kwargs: dict, kind: str, seeds: range = range(4)) -> str:
    """SHA-256 of the episodes of ``kind`` on ``gym.make("BugFix-v0", **kwargs)``, one per seed; every third step
    of an episode is replaced by one of :data:`INVALID`."""
    env = gym.make("BugFix-v0", **kwargs)
    record = []
    for seed in seeds:
        policy = scripted_policy(kind, seed=seed)
        obs, info = env.reset(seed=seed)
        steps = [[obs, {k: _plain(v) for k, v in sorted(info.items())}]]
        done, turn = False, 0
        while not done:
            turn += 1
            action = INVALID[(seed + turn) % len(INVALID)] if turn % 3 == 0 else policy(obs, info)
            obs, reward, terminated, truncated, info = env.step(action)
            done = terminated or truncated
            steps.append([action, obs, reward, terminated, truncated,
                          {k: _plain(v) for k, v in sorted(info.items())}])
        steps.append([list(seg) for seg in env.unwrapped.transcript])
        record.append(steps)
    env.close()
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_v0_episodes_are_byte_identical_to_main_before_v1(name):
    kwargs, kind = CONFIGS[name]
    assert v0_digest(kwargs, kind) == DIGESTS[name]


def test_the_digest_sees_a_one_character_change(monkeypatch):
    from bugfix_gym.core import env as v0_env

    kwargs, kind = CONFIGS["train-oracle"]
    monkeypatch.setattr(v0_env.BugFixEnv, "_read", lambda self, arg: (self.source + " ", 0.0))
    assert v0_digest(kwargs, kind) != DIGESTS["train-oracle"]


def test_making_v0_beside_v1_warns_nothing():
    """gymnasium calls a v0 id "out of date" once a v1 of the same name is registered; BugFix-v1 is another env,
    so a user running with warnings as errors still makes BugFix-v0."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    code = "import gymnasium as gym, bugfix_gym; gym.make('BugFix-v0').reset(seed=0); gym.make('BugFixCalls-v0')"
    out = subprocess.run([sys.executable, "-W", "error", "-c", code], cwd=root, capture_output=True, text=True,
                         timeout=120, env={"PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-800:]
    assert "out of date" not in out.stderr


if __name__ == "__main__":  # prints the table above, for a commit that changes v0 on purpose
    for key, (kw, policy_kind) in CONFIGS.items():
        print(f'    "{key}": "{v0_digest(kw, policy_kind)}",')
