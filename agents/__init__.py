"""agents: the token-level agent for bugfix-gym — TinyAgent, rollouts, REINFORCE and TokenPPO.

Public names load lazily (PEP 562), so ``import agents`` is cheap and a submodule is only
imported when one of its names is used: ``from agents import TokenPPO``.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "TinyAgent": "model", "TinyAgentConfig": "model", "sequence_log_probs": "model", "score_tokens": "model",
    "Trajectory": "rollout", "EpisodeSampler": "rollout", "write_calls": "rollout", "sample_episodes": "rollout",
    "scripted_rollout": "rollout", "collate": "rollout", "rollout_stats": "rollout",
    "CallGrammar": "grammar",
    "make_base_agent": "base_agent", "cached_base_agent": "base_agent",
    "masked_mean": "losses", "aggregate_loss": "losses", "reinforce_loss": "losses",
    "clipped_policy_loss": "losses", "clipped_value_loss": "losses", "kl_estimate": "losses",
    "reward_to_go": "advantages", "gae_policy_tokens": "advantages", "whiten": "advantages",
    "explained_variance": "advantages",
    "TokenOnPolicyAlgorithm": "on_policy", "Reinforce": "reinforce", "policy_gradient_step": "reinforce",
    "TinyAgentPolicy": "policies", "TokenRolloutBuffer": "buffers", "TokenPPO": "ppo",
    "StopAfterIterations": "callbacks", "TextDummyVecEnv": "vec_env", "make_text_vec_env": "vec_env",
    "RayVecEnv": "ray_vec_env",
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
