"""The statistics of finished BugFix-v0 episodes, from their final ``info`` dicts and returns: what the env
advertises to its agents as their episode summary (``metadata["agent_defaults"]["episode_summary"]``) and what
evaluations report. It imports nothing of the env, so the env can name it."""

from __future__ import annotations

from typing import Sequence


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
