"""Named algorithms: PPO, REINFORCE and the GRPO family as presets of the two token on-policy classes.

One class with a name, not one class per algorithm: every name is a :class:`Preset` (a class,
:class:`~agents.algorithms.ppo.TokenPPO` or :class:`~agents.algorithms.reinforce.Reinforce`, plus the
settings that make it that algorithm). :func:`make_algorithm` builds it; the preset's settings are
defaults and the caller's keyword arguments win, so the result is an ordinary TokenPPO or Reinforce
(``learn``, callbacks, logger keys, ``save`` / ``load``, ``predict``, ``evaluate_policy`` as ever)
whose ``preset`` setting holds the name. The name travels in saved files with the settings;
:func:`load_algorithm` rebuilds the class a file holds.

The critic-free presets run on TokenPPO with the critic switched off (``vf_coef=0``, no warm-up, no
value clip), no whitening in the buffer (the estimator already scales), no dual clip (TRL and the
papers have none) and groups of ``G = 8`` episodes per task (8 groups at ``n_episodes=64``).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from bugfix_gym.contract.text import printable

from agents.algorithms.on_policy import TokenOnPolicyAlgorithm
from agents.algorithms.ppo import TokenPPO
from agents.algorithms.reinforce import Reinforce
from agents.algorithms.registry import check_choice
from agents.files import checkpoint

#: what every critic-free preset on TokenPPO sets
CRITIC_FREE: dict[str, Any] = dict(vf_coef=0.0, critic_warmup_steps=0, clip_range_vf=None, normalize_advantage=False,
                                   dual_clip=None, group_size=8)


@dataclasses.dataclass(frozen=True)
class Preset:
    """One named algorithm.

    :param name: its ``--algo`` name
    :param cls: the class it builds
    :param settings: the settings that make it this algorithm (defaults; the caller's win)
    :param summary: what it is, in one line
    """

    name: str
    cls: type[TokenOnPolicyAlgorithm]
    settings: dict[str, Any]
    summary: str


def _critic_free(name: str, summary: str, **settings: Any) -> Preset:
    return Preset(name, TokenPPO, dict(CRITIC_FREE, **settings), summary)


ALGORITHMS: dict[str, Preset] = {p.name: p for p in (
    Preset("ppo", TokenPPO, {},
           "token-level PPO with a critic, GAE, whitening and the dual clip: TokenPPO's own defaults"),
    Preset("reinforce", Reinforce, {}, "REINFORCE with an EMA baseline: Reinforce's own defaults"),
    _critic_free("grpo", "group-normalised advantage (R - mean) / std, k3 KL to the base agent in the loss, "
                 "per-sequence token mean (TRL's loss_type='grpo')",
                 adv_estimator="grpo", scale_rewards="group", kl_coef=0.04, kl_estimator="k3",
                 loss_mode="seq_mean_token_mean"),
    _critic_free("dr_grpo", "R - mean, no std; constant normaliser G * L_max (B * L_max per minibatch)",
                 adv_estimator="dr_grpo", loss_mode="seq_mean_token_sum_norm"),
    _critic_free("dapo", "clip-higher 0.2 / 0.28, token mean over the whole batch (one minibatch), dynamic "
                 "sampling (drop zero-variance groups and play more), overlong filtering (no loss on truncated "
                 "episodes)",
                 adv_estimator="grpo", clip_range=0.2, clip_range_high=0.28, loss_mode="token_mean", n_minibatches=1,
                 drop_zero_variance_groups=True, mask_truncated_completions=True),
    _critic_free("rloo", "leave-one-out baseline R_i - mean of the other G - 1; k1 KL summed into the episode "
                 "reward (TRL's beta 0.05)", adv_estimator="rloo", loss_mode="token_mean", kl_reward_coef=0.05,
                 kl_reward_estimator="k1"),
    _critic_free("reinforce_pp", "REINFORCE++: k1 KL in each token's reward (0.01), reward-to-go whitened over the "
                 "whole batch", adv_estimator="reinforce_pp", group_size=1, loss_mode="token_mean",
                 kl_reward_coef=0.01, kl_reward_estimator="k1"),
    _critic_free("reinforce_pp_baseline", "REINFORCE++-baseline: R - group mean, then whitened over the batch",
                 adv_estimator="reinforce_pp_baseline", loss_mode="token_mean"),
    _critic_free("gspo", "GSPO: one geometric-mean ratio per sequence, clipped at 3e-4 / 4e-4",
                 adv_estimator="grpo", policy_loss="gspo", clip_range=3e-4, clip_range_high=4e-4,
                 loss_mode="seq_mean_token_mean"),
    _critic_free("cispo", "CISPO: REINFORCE weighted by a stop-gradient IS weight capped at 5 (absolute), so "
                 "every token keeps a gradient; token mean over the whole batch", adv_estimator="grpo",
                 policy_loss="cispo", max_is_weight=5.0, loss_mode="token_mean", n_minibatches=1),
    _critic_free("gmpo", "GMPO: geometric mean of the token ratios, clipped token-wise in log space at +-0.4",
                 adv_estimator="grpo", policy_loss="gmpo", clip_range=0.4, loss_mode="seq_mean_token_mean"),
    Preset("rebn", Reinforce, dict(adv_estimator="rebn", baseline="none"),
           "GEM's per-turn REINFORCE with return batch normalisation"),
    _critic_free("gigpo", "GiGPO: episode groups plus step groups of turns that start from an equal state "
                 "(the code version plus what the tools said), step returns discounted 0.95 per turn, token mean "
                 "(verl-agent's)", adv_estimator="gigpo", turn_gamma=0.95, loss_mode="token_mean",
                 episode_baseline="episode"),
)}

#: the ``--algo`` names, in the order of the docs' table
ALGORITHM_NAMES = tuple(ALGORITHMS)


def get_preset(name: str) -> Preset:
    """The preset called ``name``; an unknown name is a one-line ``ValueError`` that lists the names."""
    check_choice("algo", name, ALGORITHM_NAMES)
    return ALGORITHMS[name]


def preset_settings(name: str, overrides: dict[str, Any], env: Any = None) -> dict[str, Any]:
    """The keyword arguments of preset ``name`` with ``overrides``: the preset's settings, then the
    overrides, then what the preset derives from them (Dr. GRPO's ``L_max``).

    :param name: a name in :data:`ALGORITHMS`
    :param overrides: settings and constructor arguments that win over the preset's
    :param env: the env, read for the most policy tokens of an episode when ``L_max`` is needed
    """
    preset = get_preset(name)
    kwargs = dict(preset.settings, **overrides)
    if kwargs.get("loss_mode") == "seq_mean_token_sum_norm" and kwargs.get("loss_norm_const") is None:
        call_tokens = kwargs.get("max_call_tokens", preset.cls.config_class.max_call_tokens)  # the default
        kwargs["loss_norm_const"] = float(episode_token_budget(env, call_tokens))
    return kwargs


def episode_token_budget(env: Any, max_call_tokens: int) -> int:
    """``L_max``, the most policy tokens an episode may have: the env's turn budget (``max_turns``) times
    ``max_call_tokens``; a one-line error when the env does not say its turn budget.

    :param env: a gym env or an SB3 ``VecEnv``
    :param max_call_tokens: the most tokens one call may have
    """
    turns = None
    try:
        if hasattr(env, "get_attr"):  # a VecEnv: ask its first env
            turns = env.env_method("get_wrapper_attr", "max_turns", indices=[0])[0]
        elif env is not None:
            turns = env.get_wrapper_attr("max_turns")
    except AttributeError:
        turns = None
    if not isinstance(turns, int) or turns < 1:
        raise ValueError("loss_mode='seq_mean_token_sum_norm' needs loss_norm_const = L_max, the most policy "
                         "tokens an episode may have; this env has no max_turns to derive it from: pass it")
    return turns * int(max_call_tokens)


def make_algorithm(name: str, policy: Any = "TinyAgentPolicy", env: Any = None, **overrides: Any
                   ) -> TokenOnPolicyAlgorithm:
    """The algorithm called ``name`` on ``env``: its preset's class with the preset's settings, the
    ``overrides`` winning (settings and constructor arguments: ``seed``, ``base_agent``, ``policy_kwargs``, ...).

    :param name: a name in :data:`ALGORITHMS` (``ppo``, ``grpo``, ...)
    :param policy: the policy (``"TinyAgentPolicy"``)
    :param env: a text env, its id, or a ``VecEnv`` of text envs
    :raises ValueError: an unknown name or a bad setting (one line)
    :raises TypeError: a setting the preset's class does not have (one line)
    """
    if isinstance(env, str):
        import gymnasium as gym

        env = gym.make(env)
    preset = get_preset(name)
    return preset.cls(policy, env, **dict(preset_settings(name, overrides, env), preset=name))


def model_class(path: str | Path) -> type[TokenOnPolicyAlgorithm]:
    """The class of the model saved at ``path`` (its file says which), e.g. to ``load`` it.

    :raises FileNotFoundError: no such file
    :raises ValueError: a corrupt or foreign file, or one of another algorithm (one line)
    """
    algorithm = checkpoint.read(path).data.get("algorithm")
    classes = {cls.__name__: cls for cls in (TokenPPO, Reinforce)}
    if algorithm not in classes:
        raise checkpoint.ModelFileError(f"{path} holds a {printable(str(algorithm), 40)} model, not one of "
                                        f"{', '.join(classes)}")
    return classes[algorithm]


def load_algorithm(path: str | Path, env: Any = None, **kwargs: Any) -> TokenOnPolicyAlgorithm:
    """The model saved at ``path``, rebuilt as the class it was saved from with its saved settings
    (its ``preset`` among them).

    :param path: a model file from ``save``
    :param env: the env to continue with, or None
    :param kwargs: ``load``'s other arguments (``device``, settings that replace the saved ones)
    """
    return model_class(path).load(path, env=env, **kwargs)


def describe(name: str) -> str:
    """``name``'s settings as ``key=value`` text (empty for a preset of the class's defaults)."""
    return ", ".join(f"{key}={value!r}" for key, value in get_preset(name).settings.items())


def trained_by(model: TokenOnPolicyAlgorithm) -> dict[str, Any]:
    """Which algorithm trained ``model``: its ``--algo`` name (a model without one: its class's own preset,
    ``ppo`` or ``reinforce``), its class, and the model's values of the settings that make the preset that
    algorithm (for ``bugfix-gym eval --json`` and a run's ``results.json``)."""
    name = model.config.preset or ("reinforce" if isinstance(model, Reinforce) else "ppo")
    settings = {key: getattr(model.config, key) for key in get_preset(name).settings}
    return dict(algo=name, cls=type(model).__name__, preset_settings=settings)
