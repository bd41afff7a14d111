"""agents: the token-level agent for bugfix-gym — TinyAgent, rollouts, REINFORCE and TokenPPO.

Layers, each a sub-package that imports only those before it (tests/test_layering.py):
``model`` -> ``decoding`` -> ``rollout`` -> ``files`` -> ``algorithms`` -> ``bugfix`` -> ``cli``.

Public names load lazily (PEP 562), so ``import agents`` is cheap and a submodule is only
imported when one of its names is used: ``from agents import TokenPPO``.
"""

from __future__ import annotations

import importlib

_EXPORTS = {  # public name -> the module that defines it (see docs/architecture.md for the layers)
    "TinyAgent": "model.tinyagent", "TinyAgentConfig": "model.tinyagent",
    "sequence_log_probs": "model.tinyagent", "score_tokens": "model.tinyagent",
    "CallGrammar": "decoding.grammar", "write_calls": "decoding.decoder",
    "Trajectory": "rollout.trajectory", "scripted_rollout": "rollout.trajectory", "collate": "rollout.trajectory",
    "rollout_stats": "rollout.trajectory", "EpisodeSampler": "rollout.sampler",
    "TextDummyVecEnv": "rollout.vec_env", "make_text_vec_env": "rollout.vec_env", "RayVecEnv": "rollout.ray_vec_env",
    "masked_mean": "algorithms.losses", "aggregate_loss": "algorithms.losses", "reinforce_loss": "algorithms.losses",
    "clipped_policy_loss": "algorithms.losses", "clipped_value_loss": "algorithms.losses",
    "kl_estimate": "algorithms.losses",
    "reward_to_go": "algorithms.advantages", "gae_policy_tokens": "algorithms.advantages",
    "whiten": "algorithms.advantages", "explained_variance": "algorithms.advantages",
    "TokenOnPolicyAlgorithm": "algorithms.on_policy", "Reinforce": "algorithms.reinforce",
    "policy_gradient_step": "algorithms.reinforce", "TinyAgentPolicy": "algorithms.policies",
    "TokenRolloutBuffer": "algorithms.buffers", "TokenPPO": "algorithms.ppo",
    "StopAfterIterations": "algorithms.callbacks",
    "make_base_agent": "bugfix.base_agent", "cached_base_agent": "bugfix.base_agent",
    "sample_episodes": "bugfix.evaluation",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agents' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"agents.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
