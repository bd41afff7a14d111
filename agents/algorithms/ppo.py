"""TokenPPO: token-level PPO with a critic head behind the Stable-Baselines3 interface (book ch. 8).

``TokenPPO("TinyAgentPolicy", gym.make("BugFix-v0")).learn(total_timesteps)`` is SB3's own
``learn``: rollouts are whole episodes of the env it was given
(:class:`agents.algorithms.on_policy.TokenOnPolicyAlgorithm`), and :meth:`TokenPPO.train` runs one PPO
update on them, top to bottom like the book:

1. critic warm-up on Monte-Carlo returns (first iteration only);
2. freeze pi_old: one no-grad pass for old log-probs, values (and reference log-probs);
3. GAE over policy tokens, value targets, whitening;
4. ``n_epochs`` x shuffled minibatches of whole trajectories: clipped surrogate (clip-higher,
   dual clip), clipped value loss, entropy bonus, optional KL penalty to the reference,
   gradient-norm clip, ``target_kl`` early stop.

The statistics keep the book's names (``clip_frac``, ``approx_kl``, ``ratio_min``, ...) and are
renamed to SB3's logger keys only when logged (``train/clip_fraction``, ...).
"""

from __future__ import annotations

import copy
import math
import time
from typing import Any, ClassVar

import numpy as np
import torch as th
from stable_baselines3.common.type_aliases import GymEnv
from stable_baselines3.common.utils import FloatSchedule

from agents.algorithms.buffers import TokenRolloutBuffer, TokenRolloutBufferSamples
from agents.files.checkpoint import ParameterSnapshot
from agents.algorithms.auxiliary import AuxLoss, build_aux_losses
from agents.algorithms.config import PPOConfig
from agents.algorithms.losses import (PolicyLossConfig, aggregate_loss, clipped_value_loss, get_policy_loss_fn,
                                      kl_estimate)
from agents.model.tinyagent import TinyAgent, score_tokens
from agents.algorithms.on_policy import TokenOnPolicyAlgorithm
from agents.algorithms.policies import TinyAgentPolicy
from agents.rollout.trajectory import Trajectory

#: internal statistic -> SB3 logger key (``train/<key>``); the others keep their names
SB3_KEYS = {"clip_frac": "clip_fraction", "dual_clip_frac": "dual_clip_fraction", "pg_loss": "policy_gradient_loss"}


class DivergenceError(FloatingPointError):
    """A non-finite loss or gradient; the parameters were restored to their last good state."""


class TokenPPO(TokenOnPolicyAlgorithm):
    """Token-level PPO (clip version) for tool-using text agents, with SB3's interface.

    The constructor takes the arguments of :class:`~agents.algorithms.on_policy.TokenOnPolicyAlgorithm`
    (``policy``, ``env``, ``policy_kwargs``, ``base_agent``, ``seed``, ...) and its settings as one
    :class:`~agents.algorithms.config.PPOConfig` (``config=``) or by name (sugar that builds it).
    """

    config_class: ClassVar[type[PPOConfig]] = PPOConfig
    config: PPOConfig
    clip_schedule: Any  # SB3's schedule of the setting clip_range (built by _setup_model)
    auxiliary_losses: list[AuxLoss]  # the setting aux_losses (objects or specs) built (by _setup_model)

    def __init__(self, policy: str | type[TinyAgentPolicy], env: GymEnv | str | None, **kwargs: Any):
        self.ref_model: TinyAgent | None = None  # pi_ref, with kl_coef or kl_reward_coef
        super().__init__(policy, env, **kwargs)
        self.critic_warmed_up = self.config.critic_warmup_steps <= 0

    def _setup_model(self) -> None:
        self.rollout_buffer_kwargs = dict(self.rollout_buffer_kwargs or {})
        self.rollout_buffer_kwargs.setdefault("normalize_advantage", self.config.normalize_advantage)
        self.rollout_buffer_kwargs.setdefault("adv_estimator", self.config.adv_estimator)
        self.rollout_buffer_kwargs.setdefault("kl_reward_coef", self.config.kl_reward_coef)
        self.rollout_buffer_kwargs.setdefault("kl_reward_estimator", self.config.kl_reward_estimator)
        super()._setup_model()
        self.auxiliary_losses = build_aux_losses(self.config.aux_losses)
        for aux in self.auxiliary_losses:
            aux.setup(self.policy.tokenizer, self.seed or 0)
        self.clip_schedule = FloatSchedule(self.config.clip_range)
        if self._wants_reference():
            self.ref_model = copy.deepcopy(self.policy.model).requires_grad_(False).eval()
        self._shuffle_rng = np.random.default_rng(None if self.seed is None else [self.seed, 1])  # minibatches

    def _wants_reference(self) -> bool:
        """A KL to pi_ref is used: in the loss (``kl_coef``) or in the reward (``kl_reward_coef``)."""
        return bool(self.config.kl_coef or self.config.kl_reward_coef)

    def saved_settings(self) -> dict[str, Any]:
        """The saved settings, each auxiliary loss as its JSON spec."""
        specs = [aux.spec() for aux in build_aux_losses(self.config.aux_losses)]
        return dict(super().saved_settings(), aux_losses=specs)

    def _after_initial_weights(self) -> None:
        if self.ref_model is not None:  # pi_ref = the initial (base) policy
            self.ref_model.load_state_dict(self.policy.model.state_dict())

    def _extra_state(self) -> dict[str, Any]:
        return {"critic_warmed_up": bool(self.critic_warmed_up)}

    def _set_extra_state(self, state: dict[str, Any]) -> None:
        self.critic_warmed_up = bool(state.get("critic_warmed_up", self.critic_warmed_up))

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "ref_model", "_shuffle_rng"]

    # ------------------------------------------------------------------ training
    def train(self) -> None:
        """One PPO update on the rollout buffer (see :meth:`train_on_buffer`), logged under ``train/``."""
        if self.rollout_buffer.size() == 0:  # the step budget ended before any episode finished
            return
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        self.train_on_buffer(self.rollout_buffer)

    def train_on_batch(self, trajectories: list[Trajectory]) -> list[dict[str, float]]:
        """One PPO update on given trajectories (for experiments: per-epoch statistics on a fixed batch).

        :param trajectories: episodes sampled by (a copy of) this policy
        :return: per-epoch statistics (also appended to :attr:`diagnostics`)
        """
        buffer_class: type[TokenRolloutBuffer] = self.rollout_buffer_class or TokenRolloutBuffer
        buffer = buffer_class(len(trajectories), self.observation_space, self.action_space, device=self.device,
                              gamma=self.config.gamma, gae_lambda=self.config.gae_lambda,
                              **self.rollout_buffer_kwargs)
        buffer.add(trajectories)
        if not hasattr(self, "_logger"):  # used outside learn(): a silent logger
            from stable_baselines3.common.logger import configure
            self._logger = configure(folder=None, format_strings=[])
        self.policy.set_training_mode(True)
        return self.train_on_buffer(buffer)

    def train_on_buffer(self, buffer: TokenRolloutBuffer) -> list[dict[str, float]]:
        """The PPO update (book §8.4-8.5): warm-up, freeze pi_old, GAE + whitening, epochs x minibatches.

        :return: per-epoch statistics
        :raises DivergenceError: on a non-finite loss or gradient (parameters restored first)
        """
        if buffer.size() == 0:
            raise ValueError("the rollout buffer is empty")
        t0 = time.perf_counter()
        last_good = ParameterSnapshot(self.policy)  # restored if a loss turns NaN / inf
        if not self.critic_warmed_up:
            self.warmup_critic(buffer)
        # every epoch's shuffled minibatches, drawn up front so that pi_old can be frozen in the
        # first epoch's layout: its first minibatch then repeats the freezing pass bit for bit
        batch_size = self.config.batch_size or math.ceil(buffer.size() / self.config.n_minibatches)
        layouts = [buffer.minibatch_layout(batch_size, self._shuffle_rng) for _ in range(self.config.n_epochs)]
        # 1. freeze pi_old: one no-grad pass of the trainer over the whole batch
        self._freeze_old_policy(buffer, layouts[0])
        ev = buffer.explained_variance()  # before the critic sees this batch
        # 2. GAE over policy tokens, value targets, whitening over all policy tokens
        buffer.compute_returns_and_advantage()
        # 3. epochs x shuffled minibatches of whole trajectories
        clip_low = float(self.clip_schedule(self._current_progress_remaining))
        clip_high = clip_low if self.config.clip_range_high is None else float(self.config.clip_range_high)
        if self.first_update_dump is not None:  # bugfix-gym train --dump: this first update, before its first step
            self._dump_first_update(buffer, layouts[0], clip_low, clip_high)
        epochs: list[dict[str, float]] = []
        steps, stop = 0, False
        for epoch, layout in enumerate(layouts):
            mb_stats: list[dict[str, float]] = []
            for mb, sample in enumerate(buffer.get(batch_size, layout)):
                loss, stats = self._minibatch_loss(sample, clip_low, clip_high)
                where = f"iteration {self._iteration + 1}, epoch {epoch + 1}, minibatch {mb + 1}"
                if not th.isfinite(loss):
                    last_good.restore()
                    raise DivergenceError(f"TokenPPO diverged: non-finite loss ({loss.item()}) at {where}; the "
                                          "parameters are back to their state before this update (lower "
                                          "learning_rate, or check rewards and loss coefficients)")
                if self._minibatch_kl_stop(stats["approx_kl"], epoch, mb):
                    stop = True  # SB3's rule: skip this step and end the update
                    break
                stats["grad_norm"] = self._gradient_step(loss, where, last_good)
                steps += 1
                mb_stats.append(stats)
            if mb_stats:
                epochs.append(_epoch_summary(epoch + 1, mb_stats))
                if self.verbose >= 2:
                    e = epochs[-1]
                    print(f"  epoch {epoch + 1}: clip {e['clip_frac']:.3f}  kl {e['approx_kl']:.4f}  "
                          f"ratio [{e['ratio_min']:.2f}, {e['ratio_max']:.2f}]  vloss {e['value_loss']:.4f}")
            if stop:
                break
            if (self.config.target_kl is not None and self.config.target_kl_mode == "epoch" and epochs
                    and epochs[-1]["approx_kl"] > self.config.target_kl):
                break  # the book's rule: stop after an epoch whose mean KL exceeds the target
        self._n_updates += len(epochs)  # SB3 counts epochs (passes over the batch) in train/n_updates
        self._iteration += 1
        self._log_update(epochs, ev, steps, buffer, time.perf_counter() - t0)
        return epochs

    def _minibatch_kl_stop(self, approx_kl: float, epoch: int, mb: int) -> bool:
        """SB3's early stop: this minibatch's KL exceeds ``1.5 * target_kl`` (``target_kl_mode="minibatch"``)."""
        target, mode = self.config.target_kl, self.config.target_kl_mode
        stop = target is not None and mode == "minibatch" and approx_kl > 1.5 * target
        if stop and self.verbose >= 2:
            print(f"early stop at epoch {epoch + 1}, minibatch {mb + 1}: approx_kl {approx_kl:.4f} > 1.5 * target_kl")
        return stop

    def _gradient_step(self, loss: th.Tensor, where: str, last_good: ParameterSnapshot) -> float:
        """Backward, gradient-norm clip and one optimizer step; the norm before clipping.

        :raises DivergenceError: a non-finite gradient norm (``last_good`` restored first)
        """
        self.policy.optimizer.zero_grad()
        loss.backward()
        grad_norm = th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.config.max_grad_norm)
        if not th.isfinite(grad_norm):
            last_good.restore()
            raise DivergenceError(f"TokenPPO diverged: non-finite gradient norm at {where}; the parameters "
                                  "are back to their state before this update")
        self.policy.optimizer.step()
        return float(grad_norm)

    def _score(self, model: TinyAgent, sample: TokenRolloutBufferSamples) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        """(logp, values, entropy) [b, T-1] of a minibatch, at policy positions only, in length-sorted chunks,
        under the call grammar the tokens were sampled with."""
        return score_tokens(model, sample.ids, sample.policy_mask, lengths=sample.lengths,
                            chunk=self.config.forward_chunk, grammar=self.policy.grammar,
                            grammar_state=sample.grammar_state)

    def _minibatch_scores(self, sample: TokenRolloutBufferSamples
                          ) -> tuple[th.Tensor, th.Tensor, th.Tensor, list[th.Tensor | None]]:
        """(logp, values, entropy, targets) of one minibatch: one pass scores all its policy tokens and the
        positions the auxiliary losses predict (``targets``, one mask or None per auxiliary loss)."""
        targets = [aux.target_mask(sample.ids, sample.owner)  # [b, T-1] or None each
                   for aux in self.auxiliary_losses]
        scored = sample.policy_mask
        for target in targets:
            scored = scored if target is None else th.maximum(scored, target)
        logp, values, entropy = self._score(self.policy.model, sample._replace(policy_mask=scored))  # 3 x [b, T-1]
        return logp, values, entropy, targets

    def _policy_terms(self, logp: th.Tensor, sample: TokenRolloutBufferSamples, clip_low: float, clip_high: float
                      ) -> tuple[th.Tensor, th.Tensor | None, dict[str, float]]:
        """(policy loss, KL-to-reference term or None, the policy loss's statistics) of a minibatch's log-probs."""
        cfg = self.config
        mask, mode, norm = sample.loss_mask, cfg.loss_mode, cfg.loss_norm_const  # loss_mask: less masked truncated
        config = PolicyLossConfig(clip_low=clip_low, clip_high=clip_high, dual_clip=cfg.dual_clip, mode=mode,
                                  norm_const=norm, max_is_weight=cfg.max_is_weight)
        pg_loss, stats = get_policy_loss_fn(cfg.policy_loss)(logp, sample.old_logp, sample.advantages, mask, config)
        kl_ref = None
        if self.config.kl_coef and sample.ref_logp is not None:
            kl_ref = aggregate_loss(kl_estimate(logp, sample.ref_logp, self.config.kl_estimator), mask, mode, norm)
        return pg_loss, kl_ref, stats

    def _minibatch_loss(self, sample: TokenRolloutBufferSamples, clip_low: float, clip_high: float
                        ) -> tuple[th.Tensor, dict[str, float]]:
        """PPO loss of one minibatch of whole trajectories: one pass scores all its policy tokens
        (and the positions the auxiliary losses predict), then each auxiliary loss is added."""
        mask, mode, norm = sample.loss_mask, self.config.loss_mode, self.config.loss_norm_const
        logp, values, entropy, targets = self._minibatch_scores(sample)
        pg_loss, kl_term, stats = self._policy_terms(logp, sample, clip_low, clip_high)
        v_loss = clipped_value_loss(values, sample.old_values, sample.returns, mask, clip=self.config.clip_range_vf,
                                    mode=mode, norm_const=norm)
        entropy_mean = aggregate_loss(entropy, mask, mode, norm)
        loss = pg_loss - self.config.ent_coef * entropy_mean + self.config.vf_coef * v_loss
        kl_ref = th.zeros(())
        if kl_term is not None:
            kl_ref = kl_term
            loss = loss + self.config.kl_coef * kl_ref
        stats.update(pg_loss=pg_loss.item(), value_loss=v_loss.item(), entropy=entropy_mean.item(),
                     kl_ref=kl_ref.item())
        for aux, target in zip(self.auxiliary_losses, targets):
            aux_loss = aux.loss(self.policy.model, logp, target, len(sample.ids))
            loss = loss + aux.weight * aux_loss
            stats[f"{aux.name}_loss"] = aux_loss.item()
        stats["loss"] = loss.item()
        return loss, stats

    def _dump_first_update(self, buffer: TokenRolloutBuffer, layout: list[np.ndarray], clip_low: float,
                           clip_high: float) -> None:
        """Write the conformance dump of this update (:mod:`agents.algorithms.first_update_dump`) to
        ``first_update_dump``, then forget the path: each minibatch of the first epoch scored and its policy
        loss differentiated with the weights before the first step (the first minibatch's numbers are those
        its step uses), under a forked torch RNG, so training goes on exactly as without it."""
        from agents.algorithms import first_update_dump as dump

        N, T = buffer.data["ids"].shape
        new_logp, weights = th.zeros(N, T - 1), th.zeros(N, T - 1)
        per_episode: list[dict[str, Any]] = [{} for _ in range(N)]
        with th.random.fork_rng(devices=[]), th.no_grad():
            for mb, rows in enumerate(layout):
                sample = buffer._get_samples(rows)
                logp = self._minibatch_scores(sample)[0]
                stats: dict[str, float] = {}

                def loss(x: th.Tensor, sample: TokenRolloutBufferSamples = sample) -> th.Tensor:
                    pg_loss, kl_term, pg_stats = self._policy_terms(x, sample, clip_low, clip_high)
                    stats.update(pg_stats)
                    return pg_loss if kl_term is None else pg_loss + self.config.kl_coef * kl_term

                grad = dump.policy_loss_weights(loss, logp)
                idx, t = th.as_tensor(rows, dtype=th.long), logp.shape[1]
                new_logp[idx, :t], weights[idx, :t] = logp.cpu(), grad.cpu()
                for i in rows:
                    per_episode[int(i)] = dict(minibatch=mb, clip_fraction=stats.get("clip_frac", 0.0))
        assert buffer.advantages is not None and self.first_update_dump is not None
        cfg = self.config
        common = dump.loss_fields(cfg.loss_mode, cfg.loss_norm_const, cfg.mask_truncated_completions, cfg.adv_estimator)
        if cfg.kl_reward_coef:  # the advantages read rewards less the KL: say so (the zero-variance check skips)
            common["kl_in_reward"] = cfg.kl_reward_coef
        dump.write_dump(self.first_update_dump, dump.episodes(buffer, new_logp, weights, buffer.advantages.cpu(),
                                                              common, per_episode, groups=self.config.group_size > 1),
                        tokenizer=self.policy.tokenizer)
        self.first_update_dump = None

    @th.no_grad()
    def _freeze_old_policy(self, buffer: TokenRolloutBuffer, layout: list[np.ndarray] | None = None) -> None:
        """pi_old's log-probs and values (and pi_ref's log-probs) of the whole batch, computed ONCE.

        :param layout: score the batch minibatch by minibatch in this layout (the first epoch's), so the
            first minibatch's pass is the same computation and its ratios are exactly 1, not 1 up to
            float rounding of a differently padded batch; one pass over the whole batch if None
        """
        N, T = buffer.data["ids"].shape
        old_logp, old_values, ref_logp = th.zeros(N, T - 1), th.zeros(N, T - 1), th.zeros(N, T - 1)
        want_ref = self.ref_model is not None and self._wants_reference()
        for rows in layout if layout is not None else [np.arange(N)]:
            sample = buffer._get_samples(rows)  # the trimmed [b, T_mb] tensors a minibatch sees
            # GAE, explained variance, the value clip and the KL penalty read pi_old / V_old / pi_ref only
            # at policy positions: score only those
            logp, values, _ = self._score(self.policy.model, sample)  # 2 x [b, T_mb - 1]
            idx, t = th.as_tensor(rows, dtype=th.long), logp.shape[1]
            old_logp[idx, :t], old_values[idx, :t] = logp.cpu(), values.cpu()
            if want_ref:
                assert self.ref_model is not None
                ref_logp[idx, :t] = self._score(self.ref_model, sample)[0].cpu()
        if not self.config.recompute_old_logp:
            old_logp = buffer.data["sample_logp"]
        buffer.set_old_policy(old_logp, old_values, ref_logp if want_ref else None)

    def warmup_critic(self, buffer: TokenRolloutBuffer, steps: int | None = None) -> list[float]:
        """Regress the value head on the batch's Monte-Carlo returns (book §8.4, "the critic needs a head
        start"), before the first policy update. Only the value head trains, so the policy is unchanged.

        :param buffer: the batch (the initial policy's rollouts)
        :param steps: Adam steps (default ``critic_warmup_steps``)
        :return: the value loss at each step
        """
        steps = self.config.critic_warmup_steps if steps is None else steps
        head = self.policy.model.value_head
        opt = th.optim.Adam(head.parameters(), lr=self.config.critic_warmup_lr)
        ids = buffer.data["ids"].to(self.device)
        mask = buffer.policy_mask.to(self.device)
        target = buffer.monte_carlo_returns().to(self.device)
        with th.no_grad():  # the trunk is frozen here: compute its features once
            model = self.policy.model
            h = model.ln_f(model.trunk(ids))[:, :-1]  # [B, T-1, C] features at positions predicting ids[1:]
        losses = []
        for _ in range(steps):
            values = head(h).squeeze(-1)  # [B, T-1]
            loss = 0.5 * aggregate_loss((values - target) ** 2, mask, "token_mean")
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        self.critic_warmed_up = True
        if losses:
            self.logger.record("train/critic_warmup_loss", losses[-1])
        return losses

    def _log_update(self, epochs: list[dict[str, float]], ev: float, steps: int, buffer: TokenRolloutBuffer,
                    train_s: float) -> None:
        rec = self.logger.record
        if epochs:
            for key in ("clip_frac", "approx_kl", "entropy", "value_loss", "pg_loss", "kl_ref", "dual_clip_frac",
                        "grad_norm", "loss"):
                rec(f"train/{SB3_KEYS.get(key, key)}", float(np.mean([e[key] for e in epochs])))
            for aux in self.auxiliary_losses:
                rec(f"train/{aux.name}_loss", float(np.mean([e[f"{aux.name}_loss"] for e in epochs])))
            rec("train/ratio_min", min(e["ratio_min"] for e in epochs))
            rec("train/ratio_max", max(e["ratio_max"] for e in epochs))
            rec("train/entropy_loss", -float(np.mean([e["entropy"] for e in epochs])))
            for e in epochs:  # per-epoch diagnostics (book §8.5), kept out of the console table
                for key in ("clip_frac", "approx_kl", "ratio_min", "ratio_max"):
                    rec(f"train_epoch/{SB3_KEYS.get(key, key)}_{e['epoch']}", e[key], exclude="stdout")
        rec("train/explained_variance", ev)
        rec("train/epochs_run", len(epochs))
        rec("train/grad_steps", steps)
        rec("train/n_updates", self._n_updates)
        rec("train/clip_range", float(self.clip_schedule(self._current_progress_remaining)))
        rec("time/train_s", train_s, exclude="stdout")
        entry = dict(iteration=self._iteration, num_timesteps=self.num_timesteps, explained_variance=ev,
                     epochs_run=len(epochs), grad_steps=steps, train_s=train_s, epochs=epochs,
                     policy_tokens=buffer.n_policy_tokens)
        if self._last_rollout is not None:
            entry["rollout"] = self._last_rollout
            self._last_rollout = None
        self.diagnostics.append(entry)


# ---------------------------------------------------------------------- helpers
def _epoch_summary(epoch: int, mb: list[dict[str, float]]) -> dict[str, float]:
    """Minibatch statistics -> one epoch's: means, except the ratio extremes."""
    out: dict[str, float] = {"epoch": epoch, "minibatches": len(mb)}
    for key in mb[0]:
        if key == "ratio_min":
            out[key] = min(s[key] for s in mb)
        elif key == "ratio_max":
            out[key] = max(s[key] for s in mb)
        else:
            out[key] = float(np.mean([s[key] for s in mb]))
    return out
