"""The ``"rllib"`` layout in RLlib's action-masking RLModule (run by ``make test-rllib`` in .venv-rllib).

ray[rllib] pins an older gymnasium than ``.venv`` has, so these tests are skipped in the
default ``make test`` and run in their own venv (docs/interop.md). Training to a pass rate
is ``examples/rllib_ppo.py`` (``make rllib``).
"""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("ray.rllib", reason="RLlib runs in .venv-rllib: make test-rllib")

from ray.rllib.examples.rl_modules.classes.action_masking_rlm import ActionMaskingTorchRLModule  # noqa: E402

import bugfix_gym  # noqa: E402,F401
from bugfix_gym import CALLS  # noqa: E402

REVERT = CALLS.index("revert")


def test_rllib_layout_passes_gymnasium_check_env_under_rllibs_gymnasium():
    from gymnasium.utils.env_checker import check_env

    env = gym.make("bugfix_gym:BugFixCalls-v0", max_len=64, layout="rllib")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env.env.env)
    assert [str(w.message) for w in caught if "different from the unwrapped" not in str(w.message)] == []


def test_action_masking_rl_module_reads_the_layout_and_never_samples_a_masked_call():
    torch.manual_seed(0)
    env = gym.make("bugfix_gym:BugFixCalls-v0", max_len=64, layout="rllib")
    module = ActionMaskingTorchRLModule(observation_space=env.observation_space, action_space=env.action_space,
                                        model_config={"fcnet_hiddens": [32]})
    obs, _ = env.reset(seed=0)
    assert not obs["action_mask"][REVERT]  # nothing to revert yet
    batch = {"obs": {"observations": torch.as_tensor(obs["observations"])[None].repeat(256, 1),
                     "action_mask": torch.as_tensor(obs["action_mask"])[None].repeat(256, 1)}}
    with torch.no_grad():
        logits = module.forward_exploration(batch)["action_dist_inputs"]  # [256, 9]
    calls = torch.distributions.Categorical(logits=logits).sample()
    assert (calls != REVERT).all() and len(set(calls.tolist())) == len(CALLS) - 1
    obs, *_ = env.step(CALLS.index("edit fix_init"))  # now revert is legal
    assert np.all(obs["action_mask"])
