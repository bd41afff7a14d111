"""Reinforce: REINFORCE on token trajectories (book §6.7) in Stable-Baselines3's shape.

``Reinforce("TinyAgentPolicy", env).learn(total_timesteps)`` shares everything but the update
with TokenPPO (:class:`agents.algorithms.on_policy.TokenOnPolicyAlgorithm`: rollouts of the env it is
given, callbacks, logger, safe ``save`` / ``load``). One iteration is the book's step:

1. sample at least ``n_episodes`` episodes at temperature 1, in lockstep;
2. advantage = return - b, with ``b`` an EMA of past batch means fixed *before* the batch is
   seen (eq. 6.3), or the batch mean, or 0; per token ``G_t - b`` with reward-to-go;
3. one :func:`policy_gradient_step` (Adam, grad-norm clip) on the surrogate ``-A * log pi``
   over policy tokens, skipped when every advantage is zero (Adam's momentum would still move
   the weights, book §6.8).

``total_timesteps`` counts env steps (tool calls), as in SB3; to run the book's "80 steps of
64 episodes", stop on iterations: :class:`agents.algorithms.callbacks.StopAfterIterations`.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

import torch as th
from stable_baselines3.common.type_aliases import GymEnv

from agents.algorithms.advantages import (NEEDS_STATE_KEYS, AdvantageBatch, AdvantageConfig, EMABaseline,
                                          get_adv_estimator_fn)
from agents.algorithms.buffers import TokenRolloutBuffer
from agents.algorithms.group_advantages import anchor_state_keys
from agents.algorithms.config import ReinforceConfig
from agents.algorithms.losses import PolicyLossConfig, get_policy_loss_fn
from agents.model.tinyagent import TinyAgent, score_tokens
from agents.algorithms.on_policy import TokenOnPolicyAlgorithm
from agents.algorithms.policies import TinyAgentPolicy

BASELINES = ReinforceConfig.BASELINES


def policy_gradient_step(model: TinyAgent, optimizer: th.optim.Optimizer, batch: dict[str, th.Tensor],
                         advantages: th.Tensor, mode: str = ReinforceConfig.loss_mode, norm_const: float | None = None,
                         max_grad_norm: float = ReinforceConfig.max_grad_norm,
                         skip_zero: bool = ReinforceConfig.skip_zero, grammar: Any = None, chunk: int | None = None,
                         policy_loss: str = ReinforceConfig.policy_loss) -> dict[str, Any]:
    """One REINFORCE update on a collated batch (book §6.7).

    :param model: the policy (trained in place)
    :param optimizer: its optimizer
    :param batch: output of :func:`agents.rollout.trajectory.collate` (``ids``, ``policy_mask``, ``grammar_state``)
    :param advantages: ``[B]`` (one per trajectory) or ``[B, T-1]`` (per token); detached
    :param mode: loss aggregation mode (:func:`agents.algorithms.losses.aggregate_loss`)
    :param norm_const: constant for ``mode='constant'``
    :param max_grad_norm: global gradient-norm clip
    :param skip_zero: when every advantage on a policy token is zero, return without touching the
        optimizer (a zero-gradient Adam step still moves the weights by its momentum)
    :param grammar: the call grammar the tokens were sampled under (scores the masked distribution)
    :param chunk: score in length-sorted chunks of this many trajectories (same gradient, far less
        padding; :func:`agents.model.tinyagent.score_tokens`); None = one padded pass
    :param policy_loss: the loss, a name in :data:`agents.algorithms.losses.POLICY_LOSSES`; pi_old is
        the policy itself (one step on its own samples)
    :return: ``dict(loss, grad_norm, skipped)``; ``grad_norm`` is measured before clipping
    """
    mask = batch["policy_mask"]  # [B, T-1]
    adv = advantages.detach()
    if skip_zero:
        per_token = adv[:, None].expand_as(mask) if adv.dim() == 1 else adv  # [B, T-1]
        if not bool((per_token * mask != 0).any()):
            return dict(loss=0.0, grad_norm=0.0, skipped=True)
    lengths = (batch["owner"] > 0).sum(1) if "owner" in batch else None  # [B]
    logp, _, _ = score_tokens(model, batch["ids"], mask, lengths=lengths, chunk=chunk, grammar=grammar,
                              grammar_state=batch.get("grammar_state"))  # [B, T-1], with grad, 0 off the mask
    config = PolicyLossConfig(mode=mode, norm_const=norm_const)
    loss, _ = get_policy_loss_fn(policy_loss)(logp, logp.detach(), adv, mask, config)
    optimizer.zero_grad()
    loss.backward()
    grad_norm = th.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return dict(loss=loss.item(), grad_norm=float(grad_norm), skipped=False)


class Reinforce(TokenOnPolicyAlgorithm):
    """REINFORCE with a baseline, on whole token trajectories, with SB3's interface.

    The constructor takes the arguments of :class:`~agents.algorithms.on_policy.TokenOnPolicyAlgorithm`
    (``policy``, ``env``, ``policy_kwargs``, ``base_agent``, ``seed``, ...; Adam keeps torch's own
    ``eps`` (1e-8) here, as in the book) and its settings as one
    :class:`~agents.algorithms.config.ReinforceConfig` (``config=``) or by name (sugar that builds it).
    """

    config_class: ClassVar[type[ReinforceConfig]] = ReinforceConfig
    config: ReinforceConfig

    def __init__(self, policy: str | type[TinyAgentPolicy], env: GymEnv | str | None, *,
                 policy_kwargs: dict[str, Any] | None = None, **kwargs: Any):
        policy_kwargs = dict(policy_kwargs or {})
        policy_kwargs.setdefault("optimizer_kwargs", {"foreach": True})  # torch Adam eps 1e-8, as the book
        super().__init__(policy, env, policy_kwargs=policy_kwargs, **kwargs)
        init = self.config.baseline_init
        self.ema: EMABaseline | None = None if init is None else EMABaseline(init, self.config.ema_decay)

    def _extra_state(self) -> dict[str, Any]:
        return {"ema": None if self.ema is None else self.ema.state_dict()}

    def _set_extra_state(self, state: dict[str, Any]) -> None:
        if state.get("ema") is not None:
            self.ema = EMABaseline()
            self.ema.load_state_dict(state["ema"])

    def _advantages(self, buffer: TokenRolloutBuffer, batch: dict[str, th.Tensor], baseline: float) -> th.Tensor:
        """The advantages of ``adv_estimator`` (default: R - b, or G_t - b per token) over every policy token
        of the batch, with its groups and, for GiGPO, its anchor-state keys."""
        mask = batch["policy_mask"]
        keys = anchor_state_keys(batch["ids"], mask) if self.config.adv_estimator in NEEDS_STATE_KEYS else None
        cfg = self.config
        config = AdvantageConfig(gamma=cfg.gamma, reward_to_go=cfg.use_reward_to_go, scale_rewards=cfg.scale_rewards,
                                 turn_gamma=cfg.turn_gamma, step_advantage_weight=cfg.step_advantage_weight,
                                 episode_baseline=cfg.episode_baseline)
        advantages, _ = get_adv_estimator_fn(self.config.adv_estimator)(
            AdvantageBatch(batch["token_rewards"], batch["rewards"], mask, baseline=baseline,
                           groups=buffer.groups.to(self.device), state_keys=keys), config)
        return advantages

    def train(self) -> None:
        """One REINFORCE update on the batch in the rollout buffer (see the module docstring)."""
        buffer = self.rollout_buffer
        if buffer.size() == 0:
            return
        t0 = time.perf_counter()
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        batch = {k: v.to(self.device) for k, v in buffer.data.items()}
        rewards = batch["rewards"]  # [B]
        if self.config.baseline == "ema":
            if self.ema is None:
                self.ema = EMABaseline(float(rewards.mean()), self.config.ema_decay)
            b = self.ema.value  # fixed before this batch was seen (eq. 6.3)
        elif self.config.baseline == "batch_mean":
            b = float(rewards.mean())
        else:
            b = 0.0
        advantages = self._advantages(buffer, batch, b)
        batch["policy_mask"] = buffer.loss_mask().to(self.device)  # less masked truncated episodes
        if self.first_update_dump is not None:  # bugfix-gym train --dump: this update, before its step
            self._dump_first_update(buffer, batch, advantages)
        cfg = self.config
        stats = policy_gradient_step(self.policy.model, self.policy.optimizer, batch, advantages, cfg.loss_mode,
                                     cfg.loss_norm_const, cfg.max_grad_norm, cfg.skip_zero, self.policy.grammar,
                                     cfg.forward_chunk, cfg.policy_loss)
        if self.ema is not None and self.config.baseline == "ema":
            self.ema.update(rewards)
        self._n_updates += 0 if stats["skipped"] else 1
        self._iteration += 1
        rec = self.logger.record
        rec("train/loss", stats["loss"])
        rec("train/grad_norm", stats["grad_norm"])
        rec("train/skipped", float(stats["skipped"]))
        rec("train/baseline", b)
        rec("train/n_updates", self._n_updates)
        rec("time/train_s", time.perf_counter() - t0, exclude="stdout")
        entry = dict(iteration=self._iteration, num_timesteps=self.num_timesteps, baseline=b,
                     reward=float(rewards.mean()), train_s=time.perf_counter() - t0, **stats)
        if self._last_rollout is not None:
            entry["rollout"] = self._last_rollout
            self._last_rollout = None
        self.diagnostics.append(entry)

    def _dump_first_update(self, buffer: TokenRolloutBuffer, batch: dict[str, th.Tensor], advantages: th.Tensor
                           ) -> None:
        """Write the conformance dump of this update (:mod:`agents.algorithms.first_update_dump`) to
        ``first_update_dump``, then forget the path. pi_old is the policy itself here, so the old and the new
        log-probs are one scoring of the batch (at every policy token, as sampled); the loss weights are
        ``d loss / d logp`` of :func:`policy_gradient_step`'s loss. A forked torch RNG: training is unchanged."""
        from agents.algorithms import first_update_dump as dump

        mask = batch["policy_mask"]
        with th.random.fork_rng(devices=[]), th.no_grad():
            logp, _, _ = score_tokens(self.policy.model, batch["ids"], buffer.policy_mask.to(self.device),
                                      lengths=(batch["owner"] > 0).sum(1), chunk=self.config.forward_chunk,
                                      grammar=self.policy.grammar, grammar_state=batch.get("grammar_state"))
            config = PolicyLossConfig(mode=self.config.loss_mode, norm_const=self.config.loss_norm_const)
            loss_fn = get_policy_loss_fn(self.config.policy_loss)
            weights = dump.policy_loss_weights(lambda x: loss_fn(x, x.detach(), advantages, mask, config)[0], logp)
        per_token = advantages[:, None].expand_as(mask) if advantages.dim() == 1 else advantages
        assert self.first_update_dump is not None
        cfg = self.config
        common = dump.loss_fields(cfg.loss_mode, cfg.loss_norm_const, cfg.mask_truncated_completions, cfg.adv_estimator)
        dump.write_dump(self.first_update_dump, dump.episodes(buffer, logp.cpu(), weights.cpu(), per_token.cpu(),
                                                              common, groups=self.config.group_size > 1),
                        tokenizer=self.policy.tokenizer)
        self.first_update_dump = None


__all__ = ["BASELINES", "Reinforce", "policy_gradient_step"]
