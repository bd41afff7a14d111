"""Returns, baselines and advantages over policy tokens (book ch. 6 and 7).

Tensors are per predicted token, ``[B, T-1]`` (written ``[B, T]``), aligned as in
``docs/CONTRACT.md``; ``mask`` is the policy mask (1 on policy tokens). Rewards sit on
policy positions: each env step's reward is on the last token (``<eoc>``) of the call
that earned it.

* :func:`reward_to_go` - causality (book §6.5, eq. 6.4), over policy tokens only.
* baselines - :func:`batch_mean`, :class:`EMABaseline`, :func:`per_task_baseline`,
  :func:`optimal_constant_baseline` (book §6.4).
* :func:`gae_policy_tokens` - GAE that skips prompt / tool / pad positions (verl's rule).
* :data:`ADVANTAGE_ESTIMATORS` - the estimators the algorithms pick by ``adv_estimator``
  (``gae``: TokenPPO's; ``return_minus_baseline``: Reinforce's); :func:`register_adv_est` adds one.
* the critic-free GRPO family by name: ``grpo``, ``dr_grpo``, ``rloo``, ``reinforce_pp``,
  ``reinforce_pp_baseline``, ``rebn``, ``gigpo`` (their formulas in
  :mod:`agents.algorithms.group_advantages`; groups from :attr:`AdvantageBatch.groups`).
* :func:`whiten`, :func:`explained_variance` - batch statistics over policy tokens.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence

import torch

from agents.algorithms.group_advantages import (discounted_turn_returns, group_normalised, leave_one_out,
                                                spread_over_turns, step_group_advantage, turn_rewards)
from agents.algorithms.losses import kl_estimate, masked_mean
from agents.algorithms.registry import Registry, check_choice


def _check_rewards_on_policy(token_rewards: torch.Tensor, mask: torch.Tensor) -> None:
    off = token_rewards * (1 - mask)
    if bool((off != 0).any()):
        raise ValueError("token_rewards must be zero off the policy mask: each reward sits on the last "
                         "policy token of the call that earned it (docs/CONTRACT.md)")


def reward_to_go(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """``G_i = sum_{j >= i} gamma^(k(j) - k(i)) r_j`` over policy tokens (book §6.5, eq. 6.4).

    ``k`` counts policy tokens only: prompt / tool / pad positions are skipped, not
    discounted. With ``gamma=1`` this is a reverse cumulative sum. Off-mask entries are 0.

    :param token_rewards: ``[B, T]`` rewards on policy positions.
    :param mask: ``[B, T]`` policy mask.
    :param gamma: discount per policy token.
    :return: ``[B, T]`` reward-to-go on policy tokens, 0 elsewhere.
    """
    mask = mask.to(token_rewards.dtype)
    _check_rewards_on_policy(token_rewards, mask)
    running = torch.zeros_like(token_rewards[:, 0])  # [B]
    out = torch.zeros_like(token_rewards)
    for t in reversed(range(token_rewards.shape[1])):
        m = mask[:, t]
        # at a policy token fold in its reward; elsewhere carry the running sum unchanged
        running = m * (token_rewards[:, t] + gamma * running) + (1 - m) * running
        out[:, t] = running * m
    return out


# ---------------------------------------------------------------- baselines (book §6.4)

def batch_mean(rewards: torch.Tensor) -> torch.Tensor:
    """The batch's own mean reward (a scalar tensor).

    Note: it includes each trajectory's own return, which shrinks the expected gradient
    by ``1 - 1/B`` (book §6.4); negligible at B = 64.
    """
    return rewards.float().mean()


class EMABaseline:
    """Exponential moving average of past batch means (book §6.7).

    Use :attr:`value` for the advantage *before* calling :meth:`update` with the batch,
    so the baseline is fixed before the batch is sampled (eq. 6.3 stays unbiased).

    :param init: initial value (the book starts at the base agent's measured pass rate).
    :param decay: weight of the old value; ``b <- decay * b + (1 - decay) * mean(rewards)``.
    """

    def __init__(self, init: float = 0.0, decay: float = 0.9) -> None:
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"decay must be in [0, 1], got {decay!r}")
        self.value = float(init)
        self.decay = float(decay)

    def update(self, rewards: torch.Tensor | Sequence[float]) -> float:
        """Fold one batch's mean reward in; returns the new value."""
        mean = float(torch.as_tensor(rewards, dtype=torch.float32).mean())
        self.value = self.decay * self.value + (1.0 - self.decay) * mean
        return self.value

    def state_dict(self) -> dict:
        return dict(value=self.value, decay=self.decay)

    def load_state_dict(self, state: dict) -> None:
        self.value, self.decay = float(state["value"]), float(state["decay"])

    def __repr__(self) -> str:
        return f"EMABaseline(value={self.value:.4f}, decay={self.decay})"


def per_task_baseline(tasks: Sequence[str], ref_tasks: Sequence[str], ref_rewards: torch.Tensor | Sequence[float],
                      default: Optional[float] = None) -> torch.Tensor:
    """Per-task mean reward measured on a *separate* batch (book §6.4).

    The reference batch must be independent of the episodes the baseline is used on,
    so the baseline is fixed before their actions are sampled.

    :param tasks: task name of each episode that needs a baseline (length N).
    :param ref_tasks: task names of the reference episodes.
    :param ref_rewards: rewards of the reference episodes.
    :param default: value for a task absent from the reference batch (default: the
        reference batch's overall mean).
    :return: ``[N]`` float tensor.
    """
    ref_rewards = torch.as_tensor(ref_rewards, dtype=torch.float32)
    if len(ref_tasks) != len(ref_rewards):
        raise ValueError(f"ref_tasks ({len(ref_tasks)}) and ref_rewards ({len(ref_rewards)}) differ in length")
    if default is None:
        default = float(ref_rewards.mean()) if len(ref_rewards) else 0.0
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for name, r in zip(ref_tasks, ref_rewards.tolist()):
        sums[name] = sums.get(name, 0.0) + r
        counts[name] = counts.get(name, 0) + 1
    return torch.tensor([sums[n] / counts[n] if n in counts else default for n in tasks], dtype=torch.float32)


def optimal_constant_baseline(rewards: torch.Tensor, sq_norms: torch.Tensor) -> float:
    """Variance-minimising constant ``b* = E[R ||g||^2] / E[||g||^2]`` (book §6.4).

    :param rewards: ``[N]`` episode returns.
    :param sq_norms: ``[N]`` squared norms of each episode's score ``g = grad log p(tau)``.
    """
    rewards, sq_norms = rewards.double(), sq_norms.double()
    return float((rewards * sq_norms).sum() / sq_norms.sum().clamp(min=1e-30))


# ---------------------------------------------------------------- GAE (book ch. 7/8)

def gae_policy_tokens(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                      gamma: float = 1.0, lam: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over policy tokens only (Schulman et al. 2016), skipping prompt / tool / pad tokens.

    Iterating backwards over positions, at a policy token ``t``::

        delta_t   = r_t + gamma * V_next - V_t
        A_t       = delta_t + gamma * lam * A_next
        V_next, A_next <- V_t, A_t

    and at every other position ``V_next`` and ``A_next`` are carried unchanged, so the
    next *policy* token's value bootstraps across the tool output in between (verl's
    multi-turn rule, ``compute_gae_advantage_return`` with ``response_mask``). After the
    last policy token ``V_next = 0`` (the episode has ended). Values at non-policy
    positions are never read, so they cannot change the advantages.

    :param token_rewards: ``[B, T]`` rewards, non-zero only on policy positions.
    :param values: ``[B, T]`` critic values ``V(ids[:t+1])`` (old values; detached here).
    :param mask: ``[B, T]`` policy mask.
    :param gamma: discount per policy token.
    :param lam: GAE lambda (1 gives Monte-Carlo returns minus values).
    :return: ``(advantages, returns)``, both ``[B, T]``, 0 off the mask;
        ``returns = advantages + values`` on policy tokens (the critic's targets).
    """
    mask = mask.to(token_rewards.dtype)
    _check_rewards_on_policy(token_rewards, mask)
    values = values.detach().to(token_rewards.dtype)
    next_value = torch.zeros_like(token_rewards[:, 0])  # [B]
    last_gae = torch.zeros_like(token_rewards[:, 0])  # [B]
    adv = torch.zeros_like(token_rewards)
    for t in reversed(range(token_rewards.shape[1])):
        m = mask[:, t]
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        gae = delta + gamma * lam * last_gae
        # verl's rule: at non-policy positions keep next_value and last_gae unchanged.
        # torch.where (not a 0/1 blend) so a NaN/inf value at a masked position cannot leak in.
        on = m > 0
        next_value = torch.where(on, values[:, t], next_value)
        last_gae = torch.where(on, gae, last_gae)
        adv[:, t] = torch.where(on, gae, torch.zeros_like(gae))
    returns = torch.where(mask > 0, adv + values, torch.zeros_like(adv))
    return adv, returns


# ---------------------------------------------------------------- advantage estimators by name
@dataclass(frozen=True)
class AdvantageBatch:
    """What an advantage estimator reads of a batch of ``B`` whole episodes.

    :param token_rewards: ``[B, T]`` rewards on policy positions
    :param rewards: ``[B]`` episode returns
    :param mask: ``[B, T]`` policy mask
    :param values: ``[B, T]`` the critic's values at rollout time (V_old), or None without a critic
    :param baseline: a baseline fixed before the batch was seen (Reinforce's EMA), 0 if none
    :param groups: ``[B]`` long, the group of each episode (G episodes of one task that share one
        reset: ``group_size``), or None: the group estimators then treat the whole batch as ONE group
        (GRPO's baseline becomes the batch mean)
    :param state_keys: ``[B, K]`` long, an anchor-state key per turn (-1: no such turn; GiGPO's,
        :func:`agents.algorithms.group_advantages.anchor_state_keys`), or None: no two states are
        known to be equal, so GiGPO's step-level term is 0
    """

    token_rewards: torch.Tensor
    rewards: torch.Tensor
    mask: torch.Tensor
    values: Optional[torch.Tensor] = None
    baseline: float = 0.0
    groups: Optional[torch.Tensor] = None
    state_keys: Optional[torch.Tensor] = None


#: GiGPO's episode-level mean and std over the episodes of a group: ``episode`` counts each episode once (the
#: paper's), ``step_rows`` once per turn (verl-agent's, whose batch holds one row per step)
EPISODE_BASELINES = ("episode", "step_rows")


@dataclass(frozen=True)
class AdvantageConfig:
    """The settings an advantage estimator may read.

    :param gamma: discount per policy token
    :param gae_lambda: GAE lambda
    :param reward_to_go: per-token returns from each token on (book §6.5) instead of the episode's
    :param scale_rewards: the group estimators' std: ``group``, ``batch`` or ``none`` (TRL's names)
    :param std_eps: added to a std before dividing by it (verl's 1e-6; TRL's is 1e-4)
    :param turn_gamma: discount per turn (one model call) of ``rebn`` and ``gigpo``'s step returns
    :param step_advantage_weight: GiGPO's omega, the weight of the step-level advantage
    :param episode_baseline: GiGPO's episode-level group statistics, one of :data:`EPISODE_BASELINES`
    """

    gamma: float = 1.0
    gae_lambda: float = 1.0
    reward_to_go: bool = False
    scale_rewards: str = "group"
    std_eps: float = 1e-6
    turn_gamma: float = 1.0
    step_advantage_weight: float = 1.0
    episode_baseline: str = "episode"


#: ``fn(batch, config) -> (advantages, returns)``: advantages ``[B]`` (one per episode) or ``[B, T]``
#: (0 off the mask), and the critic's targets ``[B, T]`` or None (an estimator without a critic)
AdvantageEstimator = Callable[[AdvantageBatch, AdvantageConfig], tuple[torch.Tensor, Optional[torch.Tensor]]]
ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator")
register_adv_est = ADVANTAGE_ESTIMATORS.register
get_adv_estimator_fn = ADVANTAGE_ESTIMATORS.get
#: the estimators that read :attr:`AdvantageBatch.state_keys` (a buffer builds the keys only for these;
#: a new estimator that reads them adds its name here)
NEEDS_STATE_KEYS: set[str] = {"gigpo"}


@register_adv_est("gae")
def gae_estimator(batch: AdvantageBatch, config: AdvantageConfig) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """GAE over policy tokens with the critic's values (:func:`gae_policy_tokens`), TokenPPO's default."""
    if batch.values is None:
        raise ValueError("adv_estimator='gae' needs the critic's values of the batch")
    return gae_policy_tokens(batch.token_rewards, batch.values, batch.mask, config.gamma, config.gae_lambda)


@register_adv_est("return_minus_baseline")
def return_minus_baseline(batch: AdvantageBatch, config: AdvantageConfig
                          ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``R - b`` per episode, or ``G_t - b`` per policy token with ``reward_to_go`` (book §6.5,
    :func:`reward_to_go`), Reinforce's default; no critic targets."""
    if config.reward_to_go:
        return (reward_to_go(batch.token_rewards, batch.mask, config.gamma) - batch.baseline) * batch.mask, None
    return batch.rewards - batch.baseline, None  # [B], broadcast over each episode's policy tokens


# ---------------------------------------------------------------- the GRPO family (critic-free)

def _groups_of(batch: AdvantageBatch) -> torch.Tensor:
    """``[B]`` group labels; a batch without groups is one group."""
    if batch.groups is None:
        return torch.zeros(batch.rewards.shape[0], dtype=torch.long, device=batch.rewards.device)
    if batch.groups.shape != batch.rewards.shape:
        raise ValueError(f"groups must hold one label per episode {tuple(batch.rewards.shape)}, "
                         f"got {tuple(batch.groups.shape)}")
    return batch.groups


def _outcome(per_episode: torch.Tensor, batch: AdvantageBatch) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """One advantage per episode ``[B]`` -> ``[B, T]`` on its policy tokens; no critic targets."""
    mask = batch.mask.to(torch.float32)
    return per_episode.to(mask.dtype)[:, None] * mask, None


@register_adv_est("grpo")
def grpo_advantage(batch: AdvantageBatch, config: AdvantageConfig) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """GRPO's ``(R - mean_G) / (std + eps)`` on every policy token of the episode (arXiv 2402.03300),
    the std as ``config.scale_rewards`` says (:func:`~agents.algorithms.group_advantages.group_normalised`)."""
    return _outcome(group_normalised(batch.rewards, _groups_of(batch), config.scale_rewards, config.std_eps), batch)


@register_adv_est("dr_grpo")
def dr_grpo_advantage(batch: AdvantageBatch, config: AdvantageConfig) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Dr. GRPO's ``R - mean_G``, no std (arXiv 2503.20783); pair it with ``seq_mean_token_sum_norm``."""
    return _outcome(group_normalised(batch.rewards, _groups_of(batch), "none"), batch)


@register_adv_est("rloo")
def rloo_advantage(batch: AdvantageBatch, config: AdvantageConfig) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """RLOO's ``R_i - mean of the other G - 1`` (arXiv 2402.14740,
    :func:`~agents.algorithms.group_advantages.leave_one_out`)."""
    return _outcome(leave_one_out(batch.rewards, _groups_of(batch)), batch)


@register_adv_est("reinforce_pp")
def reinforce_pp_advantage(batch: AdvantageBatch, config: AdvantageConfig
                           ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """REINFORCE++ (Hu 2025, arXiv 2501.03262; verl's ``reinforce_plus_plus``): the per-token return
    ``G_t`` (:func:`reward_to_go`, ``config.gamma`` per policy token) whitened over every policy token
    of the batch (:func:`whiten`: mean 0, std 1). The paper's KL in the reward is the setting
    ``kl_reward_coef`` (:func:`kl_in_reward`, applied to the batch before any estimator)."""
    return whiten(reward_to_go(batch.token_rewards, batch.mask, config.gamma), batch.mask), None


@register_adv_est("reinforce_pp_baseline")
def reinforce_pp_baseline_advantage(batch: AdvantageBatch, config: AdvantageConfig
                                    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """REINFORCE++-baseline (arXiv 2501.03262; verl's ``reinforce_plus_plus_baseline``): ``R - mean_G``
    on every policy token of the episode, then whitened over every policy token of the batch."""
    centred, _ = _outcome(group_normalised(batch.rewards, _groups_of(batch), "none"), batch)
    return whiten(centred, batch.mask), None


def _turn_returns(batch: AdvantageBatch, config: AdvantageConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """``(G_k [B, K], turn_mask [B, K])``: each turn's discounted return, ``config.turn_gamma`` per turn."""
    rewards, turn_mask = turn_rewards(batch.token_rewards, batch.mask)
    return discounted_turn_returns(rewards, turn_mask, config.turn_gamma), turn_mask


@register_adv_est("rebn")
def rebn_advantage(batch: AdvantageBatch, config: AdvantageConfig) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """GEM's REINFORCE with return batch normalisation (Liu et al. 2025, arXiv 2510.01051): per turn
    (one model call) the discounted return ``G_k``, normalised over every turn of the batch,
    ``(G_k - mean) / (std + eps)`` (Bessel std), on every policy token of the turn."""
    _check_rewards_on_policy(batch.token_rewards, batch.mask.to(batch.token_rewards.dtype))
    returns, turn_mask = _turn_returns(batch, config)
    on = turn_mask > 0
    normalised = torch.zeros_like(returns)
    if bool(on.any()):
        one_group = torch.zeros(int(on.sum()), dtype=torch.long, device=on.device)  # every turn of the batch
        normalised[on] = group_normalised(returns[on], one_group, "group", config.std_eps)
    return spread_over_turns(normalised, batch.mask), None


@register_adv_est("gigpo")
def gigpo_advantage(batch: AdvantageBatch, config: AdvantageConfig) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """GiGPO (Feng et al. 2025, arXiv 2505.10978): ``A = A^E + omega * A^S`` per turn, with ``A^E`` the
    episode's GRPO advantage in its group and ``A^S`` the step-level one among the turns of the group
    that start from an equal anchor state (:func:`~agents.algorithms.group_advantages.step_group_advantage`;
    returns discounted by ``config.turn_gamma`` per turn, the paper's 0.95). ``A^E``'s group mean and std
    count each episode once or once per turn, as ``config.episode_baseline`` says
    (:func:`_gigpo_episode_advantage`). Without ``state_keys`` no two states are known to be equal and
    ``A = A^E``."""
    _check_rewards_on_policy(batch.token_rewards, batch.mask.to(batch.token_rewards.dtype))
    groups = _groups_of(batch)
    episode, _ = _outcome(_gigpo_episode_advantage(batch, groups, config), batch)
    if batch.state_keys is None:
        return episode, None
    returns, turn_mask = _turn_returns(batch, config)
    if batch.state_keys.shape != returns.shape:
        raise ValueError(f"state_keys must be [B, K] = {tuple(returns.shape)} (one key per turn), "
                         f"got {tuple(batch.state_keys.shape)}: build them with anchor_state_keys(ids, mask)")
    step = step_group_advantage(returns, turn_mask, groups, batch.state_keys, config.scale_rewards, config.std_eps)
    return episode + config.step_advantage_weight * spread_over_turns(step, batch.mask), None


def _gigpo_episode_advantage(batch: AdvantageBatch, groups: torch.Tensor, config: AdvantageConfig) -> torch.Tensor:
    """GiGPO's ``A^E`` per episode ``[B]``: the return normalised in its group, the group's mean and std over
    its episodes (``episode_baseline="episode"``) or over its step rows, one row per turn holding the
    episode's return (``"step_rows"``: an episode of more turns weighs more in the baseline)."""
    check_choice("episode_baseline", config.episode_baseline, EPISODE_BASELINES)
    if config.episode_baseline == "episode":
        return group_normalised(batch.rewards, groups, config.scale_rewards, config.std_eps)
    _, turn_mask = turn_rewards(batch.token_rewards, batch.mask)  # [B, K]
    on = turn_mask > 0
    rows = batch.rewards.float()[:, None].expand(on.shape)[on]  # one row per turn
    row_groups = groups[:, None].expand(on.shape)[on]
    per_turn = torch.zeros(on.shape, dtype=torch.float32, device=on.device)
    per_turn[on] = group_normalised(rows, row_groups, config.scale_rewards, config.std_eps)
    return per_turn[:, 0]  # equal on every turn of an episode; 0 for an episode without a turn


# ---------------------------------------------------------------- KL in the reward

def kl_in_reward(batch: AdvantageBatch, logp: torch.Tensor, ref_logp: torch.Tensor, coef: float,
                 kind: str = "k1") -> AdvantageBatch:
    """``batch`` with the KL to the reference policy subtracted from its rewards, before an estimator reads
    them (verl's ``use_kl_in_reward``, TRL RLOO's ``beta``; REINFORCE++'s placement)::

        r'_t = r_t - coef * KL_t        on every policy token t (KL_t: ``kind`` of pi_old against pi_ref)
        R'   = R   - coef * sum_t KL_t  the episode return, still the sum of its token rewards

    An estimator of per-token returns (``reinforce_pp``, ``gae``, the per-turn ones) reads ``r'``: a
    token's penalty counts for it and every earlier token (verl's per-token placement); an estimator of
    episode returns (``grpo``, ``rloo``, ...) reads ``R'``: the sequence's summed KL (TRL RLOO's). The
    penalty is a reward, so it is fixed before the update: no gradient flows through it.

    :param batch: the batch as sampled
    :param logp: ``[B, T]`` log pi_old of each target token (the policy that sampled it)
    :param ref_logp: ``[B, T]`` log pi_ref of each target token
    :param coef: the KL coefficient beta (0: the batch unchanged)
    :param kind: the KL estimator, ``k1`` (the references'), ``k2`` or ``k3``
        (:func:`~agents.algorithms.losses.kl_estimate`)
    """
    if not coef:
        return batch
    mask = batch.mask.to(batch.token_rewards.dtype)
    penalty = coef * kl_estimate(logp.detach().to(mask.dtype), ref_logp.detach().to(mask.dtype), kind) * mask
    return replace(batch, token_rewards=batch.token_rewards - penalty,
                   rewards=batch.rewards - penalty.sum(dim=1).to(batch.rewards.dtype))


# ---------------------------------------------------------------- batch statistics

def whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """Normalise ``x`` to zero mean, unit variance over the masked positions of the whole batch.

    Mean and (unbiased) variance are taken over all policy tokens of the batch, as in
    verl's ``masked_whiten`` and the book's §8.4. ``shift_mean=False`` only rescales
    (the mean is added back). Off-mask entries are returned as 0.

    :param x: ``[B, T]`` (e.g. GAE advantages).
    :param mask: ``[B, T]`` policy mask.
    """
    mask = mask.to(x.dtype)
    n = mask.sum()
    mean = masked_mean(x, mask)
    var = (((x - mean) ** 2) * mask).sum() / (n - 1).clamp(min=1.0)  # Bessel-corrected
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask


def explained_variance(pred: torch.Tensor, target: torch.Tensor, mask: Optional[torch.Tensor] = None) -> float:
    """``1 - Var[target - pred] / Var[target]`` over masked positions (SB3's definition).

    1 is a perfect critic, 0 no better than a constant, negative worse than a constant;
    NaN when the target has zero variance.
    """
    pred, target = pred.detach().double(), target.detach().double()
    if mask is None:
        mask = torch.ones_like(target)
    mask = mask.to(target.dtype)

    def var(z: torch.Tensor) -> torch.Tensor:
        mu = masked_mean(z, mask)
        return masked_mean((z - mu) ** 2, mask)

    var_target = var(target)
    if float(var_target) == 0.0:
        return float("nan")
    return float(1.0 - var(target - pred) / var_target)
