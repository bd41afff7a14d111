"""The formulas of the critic-free GRPO family: group statistics and per-turn returns.

Pure tensor functions; :mod:`agents.algorithms.advantages` registers the estimators built on them
(``grpo``, ``dr_grpo``, ``rloo``, ``reinforce_pp``, ``reinforce_pp_baseline``, ``rebn``, ``gigpo``).

* Groups: ``groups [B]`` gives each episode's group (G episodes of one task that share one reset);
  :func:`group_mean`, :func:`group_std`, :func:`group_normalised`, :func:`leave_one_out`.
  A group of one episode, or one whose returns are all equal, has std 0 and advantage exactly 0.
* Turns: a turn is one model call, a maximal run of policy tokens in the policy mask ``[B, T]``;
  :func:`turn_index`, :func:`turn_rewards`, :func:`discounted_turn_returns`, :func:`spread_over_turns`.
* Anchor states (GiGPO): :func:`anchor_state_keys` names the state before each call by its exact
  token prefix; :func:`step_group_advantage` normalises turn returns among equal states of a group.
"""
from __future__ import annotations

import torch

from agents.algorithms.registry import check_choice

#: ``scale_rewards`` (TRL's names): divide by the group's std, the whole batch's std, or not at all
SCALE_REWARDS = ("group", "batch", "none")


def group_ids(groups: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Any group labels ``[B]`` -> ``(index [B] in 0..n-1, n)`` (equal labels, equal index)."""
    unique, index = torch.unique(groups, return_inverse=True)
    return index, int(unique.numel())


def _group_sums(x: torch.Tensor, index: torch.Tensor, n: int) -> torch.Tensor:
    """``[n]``: the sum of ``x [B]`` over each group (``index [B]`` from :func:`group_ids`)."""
    return torch.zeros(n, dtype=x.dtype, device=x.device).index_add_(0, index, x)


def group_sizes(groups: torch.Tensor) -> torch.Tensor:
    """Each element's group size ``G`` ``[B]`` (float)."""
    index, n = group_ids(groups)
    return _group_sums(torch.ones(groups.shape, device=groups.device), index, n)[index]


def group_mean(x: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Each element's group mean ``[B]`` (``x [B]`` float, ``groups [B]`` labels)."""
    index, n = group_ids(groups)
    return (_group_sums(x, index, n) / _group_sums(torch.ones_like(x), index, n))[index]


def group_std(x: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Each element's group std ``[B]``, Bessel-corrected as ``torch.std`` (TRL's and verl's), and 0
    for a group of one (where ``torch.std`` is NaN)."""
    index, n = group_ids(groups)
    squares = _group_sums((x - group_mean(x, groups)) ** 2, index, n)  # [n]
    return torch.sqrt(squares / (_group_sums(torch.ones_like(x), index, n) - 1).clamp(min=1.0))[index]


def group_normalised(rewards: torch.Tensor, groups: torch.Tensor, scale_rewards: str = "group",
                     eps: float = 1e-6) -> torch.Tensor:
    """GRPO's advantage per episode (Shao et al. 2024, arXiv 2402.03300; TRL's ``scale_rewards``)::

        A_i = (r_i - mean_G(r)) / (std + eps)

    with ``std`` the group's (``'group'``), the whole batch's rewards' (``'batch'``, Hu et al.'s
    REINFORCE++ suggestion, TRL's option) or none (``'none'``: ``A_i = r_i - mean_G``, Dr. GRPO,
    arXiv 2503.20783). A group of one or of equal returns (std 0) gets ``A = 0`` exactly.

    :param rewards: ``[B]`` episode returns.
    :param groups: ``[B]`` group labels.
    :param scale_rewards: one of :data:`SCALE_REWARDS`.
    :param eps: added to the std (verl's 1e-6; TRL's is 1e-4).
    :return: ``[B]`` advantages; they sum to 0 within each group.
    """
    check_choice("scale_rewards", scale_rewards, SCALE_REWARDS)
    rewards = rewards.float()
    centred = rewards - group_mean(rewards, groups)  # [B]
    if scale_rewards == "none":
        return centred
    if scale_rewards == "batch":
        std = rewards.std() if rewards.numel() > 1 else torch.zeros((), device=rewards.device)
    else:
        std = group_std(rewards, groups)  # [B]
    # torch.where, not a plain division: std 0 gives exactly 0 whatever eps, never 0 / 0
    return torch.where(std > 0, centred / (std + eps), torch.zeros_like(centred))


def leave_one_out(rewards: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """RLOO's advantage (Kool et al. 2019; Ahmadian et al. 2024, arXiv 2402.14740)::

        A_i = r_i - (1 / (G - 1)) sum_{j != i} r_j  =  G / (G - 1) * (r_i - mean_G(r))

    the second form is how it is computed (verl's). A group of one gets 0 (no other episode to
    compare with; verl leaves its raw reward).

    :param rewards: ``[B]`` episode returns.
    :param groups: ``[B]`` group labels.
    :return: ``[B]`` advantages; they sum to 0 within each group.
    """
    rewards = rewards.float()
    size = group_sizes(groups)  # [B] G of each episode
    factor = torch.where(size > 1, size / (size - 1).clamp(min=1.0), torch.zeros_like(size))
    return factor * (rewards - group_mean(rewards, groups))


# ---------------------------------------------------------------- turns (one model call each)

def call_starts(mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` bool: True on the first policy token of each call (a maximal run of policy tokens)."""
    on = mask > 0  # [B, T]
    starts = on.clone()
    starts[:, 1:] &= ~on[:, :-1]
    return starts


def turn_index(mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` long: the turn (0, 1, ...) of each policy token, -1 off the mask; a turn is a
    maximal run of consecutive policy tokens (one call, ``<eoc>`` its last token)."""
    index = call_starts(mask).long().cumsum(dim=1) - 1  # [B, T]
    return torch.where(mask > 0, index, torch.full_like(index, -1))


def turn_rewards(token_rewards: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each turn's reward (the sum over its tokens; it sits on ``<eoc>``) and the turn mask.

    :param token_rewards: ``[B, T]`` rewards on policy positions.
    :param mask: ``[B, T]`` policy mask.
    :return: ``(rewards [B, K], turn_mask [B, K])``, ``K`` the most turns of an episode (at least 1).
    """
    index = turn_index(mask)  # [B, T]
    n_turns = index.max(dim=1).values + 1  # [B]
    k = max(int(n_turns.max()) if n_turns.numel() else 0, 1)
    # [B, K+1]; column K collects the (zero) off-mask entries
    rewards = torch.zeros(index.shape[0], k + 1, dtype=token_rewards.dtype, device=token_rewards.device)
    rewards.scatter_add_(1, torch.where(index >= 0, index, torch.full_like(index, k)), token_rewards * (index >= 0))
    turn_mask = (torch.arange(k, device=mask.device)[None] < n_turns[:, None]).to(token_rewards.dtype)  # [B, K]
    return rewards[:, :k], turn_mask


def discounted_turn_returns(rewards: torch.Tensor, turn_mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """``G_k = sum_{j >= k} gamma^(j - k) r_j`` over the turns of each episode ``[B, K]`` (0 off the mask)."""
    running = torch.zeros_like(rewards[:, 0])  # [B]
    out = torch.zeros_like(rewards)
    for k in reversed(range(rewards.shape[1])):
        running = (rewards[:, k] + gamma * running) * turn_mask[:, k]
        out[:, k] = running
    return out


def spread_over_turns(per_turn: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, K]`` values per turn -> ``[B, T]``: every policy token gets its turn's value, 0 elsewhere."""
    index = turn_index(mask)  # [B, T]
    spread = per_turn.gather(1, index.clamp(min=0).clamp(max=per_turn.shape[1] - 1))  # [B, T]
    return torch.where(index >= 0, spread, torch.zeros_like(spread))


# ---------------------------------------------------------------- anchor states (GiGPO)

def anchor_state_keys(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The state before each call, as an integer key ``[B, K]`` (-1 where a row has no turn ``k``).

    The state is the exact token prefix ``ids[:p+1]`` that precedes the call's first token
    ``ids[p+1]``: the task's prompt (its code version) plus every earlier call and what the tools
    said. Two keys are equal if and only if the prefixes are token for token equal (they are
    interned, not hashed: no collisions). This is stricter than GiGPO's environment state: two
    different histories that reach the same code never share a key.

    :param ids: ``[B, T+1]`` token ids of the episodes (``collate``'s ``ids``).
    :param mask: ``[B, T]`` policy mask aligned with the targets ``ids[:, 1:]``.
    :return: ``[B, K]`` long keys, ``K`` as :func:`turn_rewards`.
    """
    index = turn_index(mask)  # [B, T]
    starts = call_starts(mask)  # [B, T]
    k = max(int(index.max()) + 1 if index.numel() else 0, 1)
    keys = torch.full((ids.shape[0], k), -1, dtype=torch.long, device=ids.device)
    seen: dict[tuple[int, ...], int] = {}
    for b, p in starts.nonzero().tolist():
        prefix = tuple(ids[b, :p + 1].tolist())
        keys[b, int(index[b, p])] = seen.setdefault(prefix, len(seen))
    return keys


def step_group_advantage(turn_returns: torch.Tensor, turn_mask: torch.Tensor, groups: torch.Tensor,
                         state_keys: torch.Tensor, scale_rewards: str = "group", eps: float = 1e-6
                         ) -> torch.Tensor:
    """GiGPO's step-level advantage (Feng et al. 2025, arXiv 2505.10978), per turn ``[B, K]``::

        A^S(k) = (G_k - mean_{step group}(G)) / (std_{step group}(G) + eps)

    A step group holds the turns of one episode group whose anchor keys are equal
    (:func:`anchor_state_keys`); a state seen once in its group gets 0. ``scale_rewards`` as in
    :func:`group_normalised`.

    :param turn_returns: ``[B, K]`` discounted returns from each turn.
    :param turn_mask: ``[B, K]`` 1 on real turns.
    :param groups: ``[B]`` episode group labels.
    :param state_keys: ``[B, K]`` anchor keys, -1 where there is no turn.
    """
    on = (turn_mask > 0) & (state_keys >= 0)  # [B, K]
    out = torch.zeros_like(turn_returns)
    if not bool(on.any()):
        return out
    episode_group = group_ids(groups)[0][:, None].expand_as(state_keys)  # [B, K]
    step_group = episode_group[on] * (int(state_keys.max()) + 1) + state_keys[on]  # [n] one label per (group, key)
    out[on] = group_normalised(turn_returns[on], step_group, scale_rewards, eps).to(out.dtype)
    return out
