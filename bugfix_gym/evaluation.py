"""Evaluate a policy callable on every task of a split."""

from __future__ import annotations

from typing import Callable, Sequence

from .env import BugFixEnv
from .tasks import Task, make_tasks


def episode_stats(infos: Sequence[dict], rewards: Sequence[float], fix_ops: Sequence[str] | None = None) -> dict:
    """Summary of finished episodes from their final ``info`` dicts and returns."""
    n = len(infos)
    turns = sum(i["n_turns"] for i in infos)
    stats = dict(
        reward=sum(rewards) / n,
        pass_rate=sum(bool(i["submitted"] and i["hidden_pass"]) for i in infos) / n,
        valid_calls=1 - sum(i["n_invalid"] for i in infos) / max(turns, 1),
        submit_rate=sum(bool(i["submitted"]) for i in infos) / n,
        turns=turns / n,
        read_rate=sum(any(a.split() == ["read"] for a in i["actions"]) for i in infos) / n,
        edits_per_episode=sum(len(i["ops"]) for i in infos) / n,
    )
    if fix_ops is not None:
        stats["first_edit_right"] = sum(bool(i["ops"]) and i["ops"][0] == op for i, op in zip(infos, fix_ops)) / n
    return stats


def evaluate(policy: Callable[[str, dict], str], split: str = "train", n_per_task: int = 16, seed: int = 0,
             tasks: Sequence[Task] | None = None, **env_kwargs) -> dict:
    """Run ``policy`` for ``n_per_task`` episodes on each task -> dict of
    ``reward, pass_rate, valid_calls, submit_rate, turns, read_rate, edits_per_episode, first_edit_right``."""
    tasks = list(tasks) if tasks is not None else make_tasks(split)
    env = BugFixEnv(tasks=tasks, **env_kwargs)
    infos, returns, fix_ops = [], [], []
    k = 0
    for task in tasks:
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
