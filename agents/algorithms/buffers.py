"""TokenRolloutBuffer: SB3's rollout-buffer interface over whole token trajectories.

SB3's ``RolloutBuffer`` stores one row per env step with a fixed observation shape. A token
episode is one variable-length sequence in which only the policy tokens are actions, so this
buffer stores *trajectories*: ``add`` takes whole episodes, ``get`` yields minibatches of whole
episodes as right-padded ``[b, T]`` tensors, so one forward pass scores every policy token of
an episode (docs/CONTRACT.md alignment: per-token fields are ``[b, T-1]``).

Life of a batch (one PPO iteration)::

    buffer.reset(); buffer.add(trajectories)                  # collect_rollouts
    buffer.set_old_policy(old_logp, old_values, ref_logp)     # the trainer freezes pi_old once
    buffer.compute_returns_and_advantage()                    # GAE over policy tokens, whitening
    for sample in buffer.get(batch_size): ...                 # epochs x shuffled minibatches
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import NamedTuple

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import BaseBuffer
from stable_baselines3.common.utils import get_device
from stable_baselines3.common.vec_env import VecNormalize

from agents.algorithms.advantages import (ADVANTAGE_ESTIMATORS, NEEDS_STATE_KEYS, AdvantageBatch, AdvantageConfig,
                                          explained_variance, get_adv_estimator_fn, kl_in_reward, reward_to_go,
                                          whiten)
from agents.algorithms.config import PPOConfig
from agents.algorithms.group_advantages import anchor_state_keys
from agents.rollout.trajectory import Trajectory, collate, group_index


class TokenRolloutBufferSamples(NamedTuple):
    """One minibatch of whole trajectories; ``[b, T]`` token fields, ``[b, T-1]`` per-token fields."""

    ids: th.Tensor  # [b, T] token ids, right-padded with pad_id
    owner: th.Tensor  # [b, T] owner codes (prompt 1, policy 2, tool 3, pad 0)
    policy_mask: th.Tensor  # [b, T-1] 1 where the target ids[t+1] is a policy token
    grammar_state: th.Tensor  # [b, T-1] call-grammar state each policy token was sampled in (-1: none)
    old_logp: th.Tensor  # [b, T-1] log pi_old(ids[t+1] | ids[:t+1]), frozen
    old_values: th.Tensor  # [b, T-1] V_old(ids[:t+1]), frozen
    advantages: th.Tensor  # [b, T-1] GAE advantages (whitened over the batch's policy tokens)
    returns: th.Tensor  # [b, T-1] value targets = raw advantages + old values
    loss_mask: th.Tensor  # [b, T-1] the policy tokens the losses read (policy_mask less masked truncated episodes)
    ref_logp: th.Tensor | None  # [b, T-1] log pi_ref, when a KL penalty is used
    rewards: th.Tensor  # [b] episode returns
    indices: th.Tensor  # [b] positions of these trajectories in the buffer
    lengths: th.Tensor  # [b] real length of each trajectory


class TokenRolloutBuffer(BaseBuffer):
    """Rollout buffer of whole token trajectories, with SB3's interface.

    :param buffer_size: episodes per rollout (``n_episodes``)
    :param observation_space: the env's observation space (kept for SB3; not used for storage)
    :param action_space: the env's action space (kept for SB3; not used for storage)
    :param device: torch device of the yielded tensors
    :param gae_lambda: GAE lambda (1 = Monte-Carlo return minus value)
    :param gamma: discount per policy token
    :param n_envs: kept for SB3's constructor call
    :param pad_id: the tokenizer's pad id
    :param normalize_advantage: whiten advantages over all policy tokens of the batch
    :param adv_estimator: the advantage estimator, a name in
        :data:`agents.algorithms.advantages.ADVANTAGE_ESTIMATORS` (default ``"gae"``)
    :param scale_rewards: the group estimators' std, ``group``, ``batch`` or ``none`` (TRL's names)
    :param turn_gamma: discount per turn of the per-turn estimators (``rebn``, ``gigpo``)
    :param step_advantage_weight: GiGPO's omega
    :param mask_truncated_completions: episodes that ended truncated (``info["TimeLimit.truncated"]``)
        leave the loss mask (:meth:`loss_mask`)
    :param episode_baseline: GiGPO's episode-level statistics, ``episode`` or ``step_rows``
    :param kl_reward_coef: the KL to pi_ref subtracted from the rewards before the estimator
        (:func:`~agents.algorithms.advantages.kl_in_reward`; needs ``ref_logp`` in :meth:`set_old_policy`); 0 = off
    :param kl_reward_estimator: its estimator, ``k1``, ``k2`` or ``k3``
    """

    def __init__(
        self,
        buffer_size: int,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        device: th.device | str = "auto",
        gae_lambda: float = PPOConfig.gae_lambda,  # the defaults are TokenPPO's settings' (one definition)
        gamma: float = PPOConfig.gamma,
        n_envs: int = 1,
        pad_id: int = 0,
        normalize_advantage: bool = PPOConfig.normalize_advantage,
        adv_estimator: str = PPOConfig.adv_estimator,
        scale_rewards: str = PPOConfig.scale_rewards,
        turn_gamma: float = PPOConfig.turn_gamma,
        step_advantage_weight: float = PPOConfig.step_advantage_weight,
        mask_truncated_completions: bool = PPOConfig.mask_truncated_completions,
        episode_baseline: str = PPOConfig.episode_baseline,
        kl_reward_coef: float = PPOConfig.kl_reward_coef,
        kl_reward_estimator: str = PPOConfig.kl_reward_estimator,
    ):
        ADVANTAGE_ESTIMATORS.check(adv_estimator, "adv_estimator")
        # BaseBuffer.__init__ derives fixed array shapes from the spaces; a token trajectory has
        # none (the Text spaces have no shape), so set its fields here instead.
        self.buffer_size = buffer_size
        self.observation_space = observation_space
        self.action_space = action_space
        self.device = get_device(device)
        self.n_envs = n_envs
        self.gae_lambda = gae_lambda
        self.gamma = gamma
        self.pad_id = pad_id
        self.normalize_advantage = normalize_advantage
        self.adv_estimator = adv_estimator
        self.scale_rewards = scale_rewards
        self.turn_gamma = turn_gamma
        self.step_advantage_weight = step_advantage_weight
        self.mask_truncated_completions = mask_truncated_completions
        self.episode_baseline = episode_baseline
        self.kl_reward_coef = kl_reward_coef
        self.kl_reward_estimator = kl_reward_estimator
        self.reset()

    # ------------------------------------------------------------------ SB3 interface
    def reset(self) -> None:
        """Drop every stored trajectory."""
        super().reset()
        self.trajectories: list[Trajectory] = []
        self.data: dict[str, th.Tensor] = {}
        self.lengths = th.zeros(0, dtype=th.long)
        self.groups = th.zeros(0, dtype=th.long)  # [N] each trajectory's group (episodes of one reset)
        self.truncated = th.zeros(0, dtype=th.bool)  # [N] the episode ended truncated, not terminated
        self.old_logp: th.Tensor | None = None
        self.old_values: th.Tensor | None = None
        self.ref_logp: th.Tensor | None = None
        self.advantages: th.Tensor | None = None
        self.raw_advantages: th.Tensor | None = None
        self.returns: th.Tensor | None = None
        self.generator_ready = False

    def add(self, trajectories: Trajectory | Sequence[Trajectory]) -> None:
        """Store whole episodes (one :class:`~agents.rollout.trajectory.Trajectory` or a list)."""
        if isinstance(trajectories, Trajectory):
            trajectories = [trajectories]
        self.trajectories.extend(trajectories)
        self.pos = len(self.trajectories)
        self.full = self.pos >= self.buffer_size
        self.data = collate(self.trajectories, self.pad_id)  # ids [N, T], per-token fields [N, T-1]
        self.lengths = (self.data["owner"] > 0).sum(1)  # [N]
        self.groups = group_index(self.trajectories)  # [N]
        self.truncated = th.tensor([bool(t.info.get("TimeLimit.truncated", False)) for t in self.trajectories])
        self.old_logp = self.old_values = self.ref_logp = None
        self.advantages = self.raw_advantages = self.returns = None

    def size(self) -> int:
        return len(self.trajectories)

    @property
    def advantage_config(self) -> AdvantageConfig:
        """The settings the advantage estimator reads."""
        return AdvantageConfig(gamma=self.gamma, gae_lambda=self.gae_lambda, scale_rewards=self.scale_rewards,
                               turn_gamma=self.turn_gamma, step_advantage_weight=self.step_advantage_weight,
                               episode_baseline=self.episode_baseline)

    @property
    def policy_mask(self) -> th.Tensor:
        """[N, T-1] float, 1 on policy-token targets."""
        return self.data["policy_mask"]

    def loss_mask(self) -> th.Tensor:
        """[N, T-1] float: the policy tokens the losses read; with ``mask_truncated_completions`` the rows of
        truncated episodes are 0 (TRL's rule: they get no policy loss and leave its normaliser)."""
        if not self.mask_truncated_completions:
            return self.policy_mask
        return self.policy_mask * (~self.truncated).to(self.policy_mask.dtype)[:, None]

    @property
    def n_policy_tokens(self) -> int:
        return int(self.data["policy_mask"].sum()) if self.data else 0

    def set_old_policy(self, old_logp: th.Tensor, old_values: th.Tensor,
                       ref_logp: th.Tensor | None = None) -> None:
        """Freeze pi_old: log-probs and values of the whole batch, computed once by the trainer
        before any update (book §8.4; recomputing them inside the update loop makes every ratio 1).

        :param old_logp: [N, T-1] log pi_old of each target token
        :param old_values: [N, T-1] V_old at each position
        :param ref_logp: [N, T-1] log pi_ref (KL penalty), or None
        """
        mask = self.policy_mask
        self.old_logp = old_logp.detach().float() * mask
        self.old_values = old_values.detach().float()
        self.ref_logp = None if ref_logp is None else ref_logp.detach().float() * mask

    def compute_returns_and_advantage(self, last_values: th.Tensor | None = None,
                                      dones: np.ndarray | None = None) -> None:
        """The advantages of ``adv_estimator`` (by default GAE over policy tokens,
        :func:`agents.algorithms.advantages.gae_policy_tokens`: prompt and tool tokens are skipped,
        carrying the next value and running advantage across them) and value targets (advantages +
        old values), then whitening over all policy tokens of the batch. The estimator reads each
        trajectory's group (:attr:`groups`, the episodes that shared one reset), :attr:`advantage_config`
        and, for the estimators in :data:`~agents.algorithms.advantages.NEEDS_STATE_KEYS` (GiGPO), each
        turn's anchor-state key (:func:`~agents.algorithms.group_advantages.anchor_state_keys`).

        Uses the frozen ``old_values`` (:meth:`set_old_policy`), else the sampler's values.
        ``last_values`` / ``dones`` are SB3's bootstrap arguments; episodes here are complete,
        so they are ignored.
        """
        mask = self.policy_mask
        values = self.old_values if self.old_values is not None else self.data["values"]
        keys = anchor_state_keys(self.data["ids"], mask) if self.adv_estimator in NEEDS_STATE_KEYS else None
        batch = AdvantageBatch(self.data["token_rewards"], self.data["rewards"], mask, values, groups=self.groups,
                               state_keys=keys)
        if self.kl_reward_coef:
            if self.ref_logp is None or self.old_logp is None:
                raise RuntimeError("kl_reward_coef > 0 needs pi_old's and pi_ref's log-probs: call "
                                   "set_old_policy(old_logp, old_values, ref_logp) first")
            batch = kl_in_reward(batch, self.old_logp, self.ref_logp, self.kl_reward_coef, self.kl_reward_estimator)
        adv, returns = get_adv_estimator_fn(self.adv_estimator)(batch, self.advantage_config)
        if adv.dim() == 1:  # one advantage per episode -> [N, T-1]
            adv = adv[:, None] * mask
        if returns is None:  # an estimator without a critic: the critic learns advantage + value
            returns = th.where(mask > 0, adv + values, th.zeros_like(adv))
        self.raw_advantages = adv  # [N, T-1]
        self.returns = returns  # [N, T-1]
        if self.normalize_advantage and mask.sum() > 1:
            rewards = batch.rewards  # the KL-penalised returns with kl_reward_coef
            if float(rewards.max()) == float(rewards.min()):
                # every episode has the same return: the advantages are pure critic error
                # (zero in expectation), and whitening would blow that noise up to unit scale, so the
                # batch carries no policy signal (the critic still trains on it)
                self.advantages = th.zeros_like(adv)
            else:
                self.advantages = whiten(adv, mask)
        else:
            self.advantages = adv

    def monte_carlo_returns(self) -> th.Tensor:
        """[N, T-1] reward-to-go on policy tokens (the critic warm-up target, book §8.4)."""
        return reward_to_go(self.data["token_rewards"], self.policy_mask, self.gamma)

    def explained_variance(self) -> float:
        """Explained variance of the frozen values against Monte-Carlo returns on policy tokens,
        measured before the critic trains on this batch (book §8.4)."""
        values = self.old_values if self.old_values is not None else self.data["values"]
        return explained_variance(values, self.monte_carlo_returns(), self.policy_mask)

    def minibatch_layout(self, batch_size: int | None = None,
                         rng: np.random.Generator | None = None) -> list[np.ndarray]:
        """One epoch's shuffled split of the trajectories into minibatches of ``batch_size`` (all if None).

        :param rng: the shuffle's generator (numpy's global one if None, as SB3 does)
        """
        n = self.size()
        indices = rng.permutation(n) if rng is not None else np.random.permutation(n)
        batch_size = n if batch_size is None else batch_size
        return [indices[start: start + batch_size] for start in range(0, n, batch_size)]

    def get(self, batch_size: int | None = None, layout: list[np.ndarray] | None = None
            ) -> Generator[TokenRolloutBufferSamples, None, None]:
        """Shuffled minibatches of ``batch_size`` whole trajectories (all of them if None).

        :param layout: the minibatches' trajectory indices (from :meth:`minibatch_layout`); a new
            shuffle if None
        """
        if self.returns is None or self.old_logp is None:
            raise RuntimeError("call set_old_policy() and compute_returns_and_advantage() before get()")
        self.generator_ready = True
        for batch_inds in layout if layout is not None else self.minibatch_layout(batch_size):
            yield self._get_samples(batch_inds)

    def _get_samples(self, batch_inds: np.ndarray,
                     env: VecNormalize | None = None) -> TokenRolloutBufferSamples:
        idx = th.as_tensor(batch_inds, dtype=th.long)
        T = int(self.lengths[idx].max())  # trim the padding shared by this minibatch

        def tok(x: th.Tensor) -> th.Tensor:
            return x[idx, :T].to(self.device)

        def per_token(x: th.Tensor | None) -> th.Tensor | None:
            return None if x is None else x[idx, : T - 1].to(self.device)

        return TokenRolloutBufferSamples(
            ids=tok(self.data["ids"]),
            owner=tok(self.data["owner"]),
            policy_mask=per_token(self.data["policy_mask"]),
            grammar_state=per_token(self.data["grammar_state"]),
            old_logp=per_token(self.old_logp),
            old_values=per_token(self.old_values),
            advantages=per_token(self.advantages),
            returns=per_token(self.returns),
            loss_mask=per_token(self.loss_mask()),
            ref_logp=per_token(self.ref_logp),
            rewards=self.data["rewards"][idx].to(self.device),
            indices=idx,
            lengths=self.lengths[idx],
        )
