"""Episode statistics, and the evaluation of scripted policies (callables ``(obs, info) -> call``).

Token models are evaluated by the agents' episode sampler (``agents.bugfix.evaluation.evaluate``), which
plays them in lockstep with a KV cache; both report :func:`episode_stats`.
"""

from __future__ import annotations

from typing import Callable, Sequence

from .env import BugFixEnv
from ..tasks.library import SPLITS, Task, get_task, make_tasks


def _called(info: dict, call: str) -> bool:
    return any(a.split() == [call] for a in info["actions"])


def _rate(hits: Sequence[bool], among: Sequence[bool]) -> float:
    """Share of ``hits`` among the episodes where ``among`` holds (nan when there are none)."""
    n = sum(among)
    return sum(h for h, a in zip(hits, among) if a) / n if n else float("nan")


def episode_stats(infos: Sequence[dict], rewards: Sequence[float], fix_ops: Sequence[str] | None = None) -> dict:
    """Summary of finished BugFix-v0 episodes from their final ``info`` dicts and returns.

    :return: ``reward``, ``pass_rate``, ``valid_calls`` (share of turns with a legal call),
        ``submit_rate``, ``turns``; behaviour: ``read_rate`` / ``test_rate`` / ``revert_rate``
        (share of episodes with at least one such call), ``edits_per_episode``, and the pass rate
        of the episodes that read (``pass_if_read``), tested (``pass_if_tested``) or did neither
        (``pass_if_blind``; nan when no episode is in the group); with ``fix_ops`` (each task's
        answer, known to the evaluator, never to the agent) also ``first_edit_right``
    """
    n = len(infos)
    if n == 0:
        raise ValueError("episode_stats needs at least one finished episode")
    turns = sum(i["n_turns"] for i in infos)
    passed = [bool(i["submitted"] and i["hidden_pass"]) for i in infos]
    read = [_called(i, "read") for i in infos]
    tested = [_called(i, "test") for i in infos]
    stats = dict(
        n_episodes=n,
        reward=sum(rewards) / n,
        pass_rate=sum(passed) / n,
        valid_calls=1 - sum(i["n_invalid"] for i in infos) / max(turns, 1),
        submit_rate=sum(bool(i["submitted"]) for i in infos) / n,
        turns=turns / n,
        read_rate=sum(read) / n,
        test_rate=sum(tested) / n,
        revert_rate=sum(_called(i, "revert") for i in infos) / n,
        edits_per_episode=sum(len(i["ops"]) for i in infos) / n,
        pass_if_read=_rate(passed, read),
        pass_if_tested=_rate(passed, tested),
        pass_if_blind=_rate(passed, [not r and not t for r, t in zip(read, tested)]),
    )
    if fix_ops is not None:
        stats["first_edit_right"] = sum(bool(i["ops"]) and i["ops"][0] == op for i, op in zip(infos, fix_ops)) / n
    return stats


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
