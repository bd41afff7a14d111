"""Episode statistics, and the evaluation of scripted policies (callables ``(obs, info) -> call``).

Token models are evaluated by the agents' episode sampler (``agents.bugfix.evaluation.evaluate``), which
plays them in lockstep with a KV cache; both report :func:`episode_stats`.
"""

from __future__ import annotations

from typing import Callable, Sequence

from .env import BugFixEnv
from .episode_stats import episode_stats
from ..tasks.library import SPLITS, Task, get_task, make_tasks


def evaluate(policy: Callable[[str, dict], str], split: str | Sequence[Task | str] = "train", n_per_task: int = 16,
             seed: int = 0, tasks: Sequence[Task | str] | None = None, **env_kwargs) -> dict:
    """Run ``policy`` for ``n_per_task`` episodes on each task -> dict of
    ``reward, pass_rate, valid_calls, submit_rate, turns, read_rate, edits_per_episode, first_edit_right``.

    :param policy: ``(observation, info) -> call``
    :param split: the book's ``"train"``, ``"heldout"`` or ``"all"``, or the tasks themselves (a list of
        :class:`Task` or task names, as ``evaluate(policy, tasks)`` reads)
    :param n_per_task: episodes per task
    :param seed: the first episode's reset seed (then one more per episode)
    :param tasks: the tasks (instead of ``split``)
    :param env_kwargs: :class:`BugFixEnv` options
    """
    if tasks is None and not isinstance(split, str):
        split, tasks = "custom", split
    if tasks is None and split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)} or a list of tasks, got {str(split)[:40]!r}")
    chosen: list[Task] = [get_task(t) if isinstance(t, str) else t for t in tasks] if tasks is not None \
        else make_tasks(str(split))
    env = BugFixEnv(tasks=chosen, **env_kwargs)
    infos, returns, fix_ops = [], [], []
    k = 0
    for task in chosen:
        for _ in range(n_per_task):
            obs, info = env.reset(seed=seed + k, options={"task": task})
            k += 1
            total, done = 0.0, False
            while not done:
                obs, reward, terminated, truncated, info = env.step(policy(obs, info))
                total += reward
                done = terminated or truncated
            infos.append(info)
            returns.append(total)
            fix_ops.append(task.fix_op)
    return episode_stats(infos, returns, fix_ops)
