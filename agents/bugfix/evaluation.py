"""Playing and scoring BugFix tasks: the one task sampler (seeded episodes of a task list on
BugFix-v0) and the one evaluator (pass rate, valid calls, behaviour, first edit right), for a
trained algorithm, its policy, or a bare :class:`TinyAgent` with its tokenizer."""

from __future__ import annotations

from typing import Any, Sequence

import torch
from bugfix_gym import Tokenizer, episode_stats, get_task
from bugfix_gym.views.text_wrappers import make_bugfix_env
from bugfix_gym.contract.tokens import TokenizerLike

from agents.algorithms.policies import TinyAgentPolicy
from agents.model.tinyagent import TinyAgent
from agents.rollout.sampler import EpisodeSampler
from agents.model.threads import use_threads
from agents.rollout.trajectory import Trajectory, rollout_stats
from agents.rollout.vec_env import FreshInfoDummyVecEnv

#: what plays the tasks: an algorithm (``TokenPPO``, ``Reinforce``), its policy, or a bare model
Agent = Any


# ---------------------------------------------------------------------- task lists and statistics
def task_vec_env(n_envs: int, **env_kwargs) -> FreshInfoDummyVecEnv:
    """A ``DummyVecEnv`` of ``n_envs`` BugFix-v0 envs (for playing given tasks), without SB3's deep copies
    of every step's infos (BugFix-v0 returns a new info dict from every step)."""
    return FreshInfoDummyVecEnv([lambda: make_bugfix_env(**env_kwargs) for _ in range(n_envs)])


def playing_settings(agent: Agent,
                     tokenizer: TokenizerLike | None = None) -> tuple[TinyAgent, TokenizerLike, dict[str, Any]]:
    """The model, tokenizer and decoding settings an agent plays with.

    An algorithm gives its policy's (grammar, call mask, foresight, ``max_call_tokens``) and its
    sampling ``temperature``; a :class:`TinyAgentPolicy` its own (temperature 1); a bare
    :class:`TinyAgent` needs ``tokenizer`` and plays free text. A policy is put in eval mode.

    :param agent: an algorithm with a ``policy``, a :class:`TinyAgentPolicy` or a :class:`TinyAgent`
    :param tokenizer: the tokenizer of a bare :class:`TinyAgent` (a policy brings its own)
    :return: ``(model, tokenizer, sampler settings)``
    """
    policy = getattr(agent, "policy", agent)
    if isinstance(policy, TinyAgentPolicy):
        policy.set_training_mode(False)
        settings = policy.sampler_kwargs()
        if hasattr(getattr(agent, "config", None), "temperature"):  # an algorithm's setting
            settings["temperature"] = agent.config.temperature
        return policy.model, policy.tokenizer, settings
    if not isinstance(agent, TinyAgent):
        raise TypeError(f"play a TokenPPO / Reinforce model, a TinyAgentPolicy or a TinyAgent, not a "
                        f"{type(agent).__name__}")
    if tokenizer is None:
        raise ValueError("a bare TinyAgent plays with a tokenizer: pass tokenizer=tok")
    return agent, tokenizer, {}


def sample_episodes(agent: Agent, tasks: Sequence[Any], n_per_task: int = 1, seed: int = 0, *,
                    tokenizer: TokenizerLike | None = None, env_kwargs: dict | None = None, max_envs: int = 64,
                    **sampler_kwargs: Any) -> list[Trajectory]:
    """``n_per_task`` episodes of each task (names or Task objects) on BugFix-v0, seeded, in task order,
    under the agent's torch thread setting (``torch_threads``; a bare TinyAgent: ``"auto"``).

    :param agent: what plays (see :func:`playing_settings`)
    :param tasks: the tasks to play
    :param n_per_task: episodes per task
    :param seed: seeds the sampling
    :param tokenizer: the tokenizer of a bare :class:`TinyAgent`
    :param env_kwargs: BugFix-v0 options (e.g. ``call_cost``)
    :param max_envs: the most envs stepped in lockstep
    :param sampler_kwargs: override the agent's settings: :class:`EpisodeSampler` arguments
        (``max_call_tokens``, ``grammar``, ...) and ``temperature`` / ``deterministic``
    """
    if isinstance(tasks, Tokenizer):
        raise TypeError("the tokenizer is a keyword now: sample_episodes(model, tasks, ..., tokenizer=tok)")
    model, tok, settings = playing_settings(agent, tokenizer)
    settings.update(sampler_kwargs)
    batch = [t for t in tasks for _ in range(n_per_task)]
    if not batch:
        return []
    play = {k: settings.pop(k) for k in ("temperature", "deterministic") if k in settings}
    sampler = EpisodeSampler(task_vec_env(min(max_envs, len(batch)), **(env_kwargs or {})), tok, **settings)
    device = next(model.parameters()).device
    with use_threads(getattr(agent, "torch_threads", "auto"), device):  # an algorithm's setting, else "auto"
        return sampler.play_tasks(model, batch, generator=torch.Generator().manual_seed(seed), **play)


def evaluate(agent: Agent, tasks: Sequence[Any], n_per_task: int = 1, seed: int = 0, *, per_task: bool = False,
             **kwargs: Any) -> dict[str, Any]:
    """The evaluator: :func:`sample_episodes` of the tasks, summarised by :func:`bugfix_gym.episode_stats`
    (pass rate, valid calls, behaviour, and ``first_edit_right`` from each task's answer) and the
    policy tokens per episode.

    :param agent: what plays (see :func:`playing_settings`): an algorithm plays as it samples its
        rollouts (its temperature, grammar, call mask and foresight)
    :param tasks: Task objects (or names of registered tasks)
    :param n_per_task: episodes per task
    :param seed: seeds the sampling
    :param per_task: also ``"per_task"``: each task's name -> its pass rate and episodes, in task order
    :param kwargs: more :func:`sample_episodes` arguments (``tokenizer``, ``env_kwargs``, ``grammar``,
        ``temperature``, ...)
    """
    if isinstance(tasks, Tokenizer):
        raise TypeError("the tokenizer is a keyword now: evaluate(model, tasks, ..., tokenizer=tok)")
    tasks = [get_task(t) for t in tasks]
    trajs = sample_episodes(agent, tasks, n_per_task, seed, **kwargs)
    fix_ops = [t.fix_op for t in tasks for _ in range(n_per_task)]
    stats: dict[str, Any] = rollout_stats(trajs, summarise=lambda infos, rewards: episode_stats(infos, rewards,
                                                                                                fix_ops))
    if per_task:
        stats["per_task"] = _per_task(tasks, trajs, n_per_task)
    return stats


def _per_task(tasks: Sequence[Any], trajs: Sequence[Trajectory], n_per_task: int) -> dict[str, dict[str, float]]:
    """Each task's pass rate (hidden tests passed) over its episodes; ``trajs`` are in task order."""
    out = {}
    for i, task in enumerate(tasks):
        own = trajs[i * n_per_task: (i + 1) * n_per_task]
        passed = [bool(t.info.get("hidden_pass")) for t in own]
        out[task.name] = {"pass_rate": sum(passed) / len(passed) if passed else float("nan"), "episodes": len(own)}
    return out
