"""DAgger for the BugFix-v1 base agent: the scripted debugger labels the states the clone itself reaches.

Behaviour cloning teaches the clone on the debugger's own transcripts; in play, the clone's first wrong edit takes
it to transcripts the debugger never made, and there it was never taught. DAgger (Ross, Gordon and Bagnell, 2011)
plays the clone, asks the expert what it would call at each state the clone reached, and clones again on the
union. The expert here is the scripted debugger, continued from any transcript by :func:`debugger_next`: it sees
what the debugger sees (the tool outputs, whether the source is changed, the legal calls, which edits were
tried), never the injected bug or the fixed source. Played on **train-split** tasks only.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from bugfix_gym.contract.tokens import OWNER_POLICY, TokenizerLike, encode_segment
from bugfix_gym.core.env_v1 import BugFixEnvV1
from bugfix_gym.core.scripted_v1 import SEARCH_CALLS, debugger_order, locate_scores, tests_passed
from bugfix_gym.tasks.problems import RepairTask

from agents.rollout.trajectory import Trajectory

OPENING = ("read", "test", "locate")


def debugger_next(history: Sequence[tuple[str, str]], left: int, changed: bool,
                  legal: Callable[[], Sequence[str]]) -> str:
    """The scripted debugger's next call after ``history``, made by anyone.

    On the debugger's own transcripts it is the debugger's call; on others it does what the debugger does in the
    same situation: ``submit`` with one turn left or after a passing ``test``; the opening calls (``read``,
    ``test``, ``locate``) not yet made, in order; with the source changed, ``test`` right after an edit and
    ``revert`` otherwise; on the task's source, the first edit in the debugger's order (``locate``'s scores
    times the fixed prior) not yet tried, or ``submit`` when none is left or fewer than 3 turns are.

    :param history: the ``(call, tool output)`` pairs so far
    :param left: turns left, this one included
    :param changed: whether the source differs from the task's (an edit not reverted)
    :param legal: the legal calls now
    """
    last, answer = history[-1] if history else (None, "")
    if left <= 1 or (last == "test" and tests_passed(answer)):
        return "submit"
    made = {call for call, _ in history}
    for call in OPENING:
        if call not in made:
            return call
    if changed:
        return "test" if last is not None and last.startswith(SEARCH_CALLS) else "revert"
    located = next((out for call, out in reversed(history) if call == "locate"), "")
    todo = [c for c in debugger_order(legal(), locate_scores(located)) if c not in made]
    return todo[0] if todo and left >= 3 else "submit"


def relabel(env: BugFixEnvV1, task: RepairTask, calls: Sequence[str]) -> list[str]:
    """The debugger's call at each turn of an episode that made ``calls`` on ``task``, by replaying them in
    ``env`` (whose ``max_turns`` is the episode's)."""
    env.reset(options={"task": task})
    assert env.task is not None
    history: list[tuple[str, str]] = []
    labels = []
    for turn, call in enumerate(calls):
        labels.append(debugger_next(history, env.max_turns - turn, env.source != env.task.source,
                                    env.legal_calls))
        obs, _, terminated, truncated, _ = env.step(call)
        history.append((call, str(obs)))
        if terminated or truncated:
            break
    return labels


def labelled_sequences(traj: Trajectory, labels: Sequence[str], tok: TokenizerLike, max_len: int,
                       max_call_tokens: int) -> list[dict[str, torch.Tensor]]:
    """Training rows of one clone episode and its labels: the episode up to each call where the clone and the
    debugger differ, ending with the debugger's call (the target), and the calls since the previous difference
    where they agree as targets too; then the run of agreeing calls after the last difference. Each row:
    ``ids`` [T], ``owner`` [T], ``policy_mask`` [T-1] (1 on the target tokens). A label the grammar could not
    write (more than ``max_call_tokens``) or a row longer than ``max_len`` is left out."""
    ids, owner = traj.ids.tolist(), traj.owner.tolist()
    starts = [t for t in range(len(owner)) if owner[t] == OWNER_POLICY and (t == 0 or owner[t - 1] != OWNER_POLICY)]
    rows: list[dict[str, torch.Tensor]] = []
    agreed: list[tuple[int, int]] = []  # [start, end) of the agreeing calls since the last row
    for turn, (start, label) in enumerate(zip(starts, labels)):
        end = start
        while end < len(owner) and owner[end] == OWNER_POLICY:
            end += 1
        target = encode_segment(tok, OWNER_POLICY, label)
        if target == ids[start:end]:
            agreed.append((start, end))
            continue
        if len(target) <= max_call_tokens and start + len(target) <= max_len:
            rows.append(_row(ids[:start] + target, owner[:start] + [OWNER_POLICY] * len(target),
                             agreed + [(start, start + len(target))]))
        agreed = []
    if agreed:
        end = agreed[-1][1]
        rows.append(_row(ids[:end], owner[:end], agreed))
    return rows


def _row(ids: list[int], owner: list[int], targets: Sequence[tuple[int, int]]) -> dict[str, torch.Tensor]:
    mask = torch.zeros(len(ids) - 1)
    for start, end in targets:
        mask[start - 1:end - 1] = 1.0  # position t predicts ids[t + 1]
    return dict(ids=torch.tensor(ids, dtype=torch.long), owner=torch.tensor(owner, dtype=torch.long),
                policy_mask=mask)


def stack_rows(rows: Sequence[dict[str, torch.Tensor]], pad_id: int) -> dict[str, torch.Tensor]:
    """Rows right-padded into one batch (``owner`` 0 and ``policy_mask`` 0 on the padding)."""
    T = max(len(r["ids"]) for r in rows)
    out = dict(ids=torch.full((len(rows), T), pad_id, dtype=torch.long),
               owner=torch.zeros(len(rows), T, dtype=torch.long), policy_mask=torch.zeros(len(rows), T - 1))
    for i, r in enumerate(rows):
        n = len(r["ids"])
        out["ids"][i, :n], out["owner"][i, :n], out["policy_mask"][i, :n - 1] = r["ids"], r["owner"], r["policy_mask"]
    return out


def join(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], pad_id: int) -> dict[str, torch.Tensor]:
    """Two batches of rows (``ids``, ``owner``, ``policy_mask``) as one, padded to the longer."""
    T = max(a["ids"].shape[1], b["ids"].shape[1])

    def pad(x: torch.Tensor, width: int, value: Any) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)

    return dict(ids=torch.cat([pad(a["ids"], T, pad_id), pad(b["ids"], T, pad_id)]),
                owner=torch.cat([pad(a["owner"], T, 0), pad(b["owner"], T, 0)]),
                policy_mask=torch.cat([pad(a["policy_mask"], T - 1, 0.0), pad(b["policy_mask"], T - 1, 0.0)]))


def dagger_rows(trajs: Sequence[Trajectory], tasks: Sequence[RepairTask], tok: TokenizerLike, max_len: int,
                max_call_tokens: int, max_turns: int) -> tuple[list[dict[str, torch.Tensor]], dict[str, float]]:
    """:func:`labelled_sequences` of clone episodes ``trajs`` played on ``tasks`` (one each, in order; an episode
    cut for the context is left out), and how often the clone made the debugger's call (``agreement``) and its
    edit (``edit_agreement``: over the turns where the debugger would edit)."""
    env = BugFixEnvV1(split="train", bugs=1, max_turns=max_turns)
    rows: list[dict[str, torch.Tensor]] = []
    turns = agree = edits = edits_agree = 0
    for traj, task in zip(trajs, tasks):
        if traj.info.get("context_cut"):
            continue
        calls = list(traj.info["actions"])
        labels = relabel(env, task, calls)
        for call, label in zip(calls, labels):
            turns += 1
            agree += call == label
            if label.startswith(SEARCH_CALLS):
                edits += 1
                edits_agree += call == label
        rows += labelled_sequences(traj, labels, tok, max_len, max_call_tokens)
    return rows, dict(agreement=agree / max(turns, 1), edit_agreement=edits_agree / max(edits, 1),
                      turns=turns, rows=len(rows))


__all__: Sequence[str] = ("debugger_next", "relabel", "labelled_sequences", "stack_rows", "join", "dagger_rows")
