"""Playing and scoring BugFix tasks: a vector env of BugFix-v0, seeded episodes of a task list, and
the evaluator (pass rate, valid calls, behaviour, first edit right)."""

from __future__ import annotations

from typing import Any, Sequence

import torch
from stable_baselines3.common.vec_env import DummyVecEnv

from bugfix_gym import Tokenizer, episode_stats
from bugfix_gym.text_wrappers import make_bugfix_env

from agents.model.tinyagent import TinyAgent
from agents.rollout.sampler import EpisodeSampler
from agents.rollout.trajectory import Trajectory


# ---------------------------------------------------------------------- task lists and statistics
def task_vec_env(n_envs: int, **env_kwargs) -> DummyVecEnv:
    """A ``DummyVecEnv`` of ``n_envs`` BugFix-v0 envs (for playing given tasks)."""
    return DummyVecEnv([lambda: make_bugfix_env(**env_kwargs) for _ in range(n_envs)])


def sample_episodes(model: TinyAgent, tokenizer: Tokenizer, tasks: Sequence[Any], n_per_task: int = 1,
                    seed: int = 0, env_kwargs: dict | None = None, max_envs: int = 64,
                    **sampler_kwargs) -> list[Trajectory]:
    """``n_per_task`` episodes of each task (names or Task objects) on BugFix-v0, seeded, in task order.

    :param model: the policy
    :param tokenizer: its tokenizer
    :param tasks: the tasks to play
    :param n_per_task: episodes per task
    :param seed: seeds the sampling
    :param env_kwargs: BugFix-v0 options (e.g. ``call_cost``)
    :param max_envs: the most envs stepped in lockstep
    :param sampler_kwargs: :class:`EpisodeSampler` arguments (``max_call_tokens``, ``grammar``) and
        ``temperature`` / ``deterministic``
    """
    batch = [t for t in tasks for _ in range(n_per_task)]
    if not batch:
        return []
    play = {k: sampler_kwargs.pop(k) for k in ("temperature", "deterministic") if k in sampler_kwargs}
    sampler = EpisodeSampler(task_vec_env(min(max_envs, len(batch)), **(env_kwargs or {})), tokenizer,
                             **sampler_kwargs)
    return sampler.play_tasks(model, batch, generator=torch.Generator().manual_seed(seed), **play)


def evaluate(model: TinyAgent, tokenizer: Tokenizer, tasks: Sequence[Any], n_per_task: int = 1, seed: int = 0,
             **kwargs: Any) -> dict[str, float]:
    """The evaluator: :func:`sample_episodes` of the tasks, summarised by :func:`bugfix_gym.episode_stats`
    (pass rate, valid calls, behaviour, and ``first_edit_right`` from each task's answer).

    :param model: the policy
    :param tokenizer: its tokenizer
    :param tasks: Task objects (or names of registered tasks)
    :param n_per_task: episodes per task
    :param seed: seeds the sampling
    :param kwargs: more :func:`sample_episodes` arguments (``env_kwargs``, ``grammar``, ``temperature``, ...)
    """
    from bugfix_gym import get_task

    tasks = [get_task(t) for t in tasks]
    trajs = sample_episodes(model, tokenizer, tasks, n_per_task, seed, **kwargs)
    fix_ops = [t.fix_op for t in tasks for _ in range(n_per_task)]
    return dict(episode_stats([t.info for t in trajs], [t.reward for t in trajs], fix_ops),
                policy_tokens=sum(float(t.policy_mask.sum()) for t in trajs) / len(trajs))
