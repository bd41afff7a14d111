"""TokenPPO: token-level PPO with a critic head behind the Stable-Baselines3 interface (book ch. 8).

``TokenPPO("TinyAgentPolicy", gym.make("BugFix-v0")).learn(total_timesteps)`` is SB3's own
``OnPolicyAlgorithm.learn``; TokenPPO overrides two hooks:

* :meth:`TokenPPO.collect_rollouts` samples ``n_episodes`` whole episodes in lockstep with the
  agent's KV-cache sampler (:func:`agents.rollout.rollout_batch`), stores them in a
  :class:`~agents.buffers.TokenRolloutBuffer`, then replays SB3's per-step bookkeeping
  (``num_timesteps``, ``callback.on_step()``, episode info for ``rollout/ep_rew_mean``), so
  callbacks, the progress bar and ``total_timesteps`` count environment steps (tool calls).
* :meth:`TokenPPO.train` runs one PPO update on that batch, top to bottom like the book:
  critic warm-up (first iteration), freeze pi_old (one forward: old log-probs, values, and
  reference log-probs for the KL penalty), GAE over policy tokens, whitening, then
  ``n_epochs`` x shuffled minibatches of whole trajectories with the clipped surrogate,
  clipped value loss, entropy bonus, optional KL penalty, grad-norm clip and ``target_kl``
  early stopping.

**Environment contract.** ``env`` is a BugFix-v0 environment (``gym.make("BugFix-v0", ...)``,
possibly wrapped, e.g. in ``Monitor``) or a ``VecEnv`` of them; a plain text env is wrapped in
:class:`agents.vec_env.TextDummyVecEnv` (SB3's ``DummyVecEnv`` cannot hold ``Text``
observations). The token sampler needs the raw text interface and the transcript, so
TokenPPO does not step ``self.env`` itself: it reads the env's configuration (``tasks``,
``max_turns``, ``call_cost``, ``edit_penalty``, through ``VecEnv.get_attr``) and drives
``n_episodes`` private, unwrapped ``BugFixEnv`` copies built from it, one per episode of a
batch, each reset to a task drawn uniformly from ``tasks``. Wrappers on ``env`` (other than
its configuration) therefore do not affect training; ``self.env`` is what ``get_env`` returns
and what SB3 resets at the start of ``learn``.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import math
import pathlib
import time
import zipfile
from typing import Any, ClassVar, TypeVar

import gymnasium as gym
import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.type_aliases import GymEnv, MaybeCallback, Schedule
from stable_baselines3.common.utils import FloatSchedule
from stable_baselines3.common.vec_env import VecEnv
from stable_baselines3.common.vec_env.patch_gym import _patch_env

from bugfix_gym import BugFixEnv, Tokenizer, build_tokenizer, episode_stats

from .advantages import explained_variance
from .buffers import TokenRolloutBuffer, TokenRolloutBufferSamples
from .losses import AGGREGATION_MODES, KL_KINDS, aggregate_loss, clipped_policy_loss, clipped_value_loss, kl_estimate
from .model import TinyAgent, TinyAgentConfig, sequence_logp_values_entropy
from .policies import TinyAgentPolicy, cached_base_agent
from .rollout import Trajectory, rollout_batch
from .vec_env import TextDummyVecEnv, is_text_space

SelfTokenPPO = TypeVar("SelfTokenPPO", bound="TokenPPO")

CHECKPOINT_FORMAT = "bugfix_gym.TokenPPO/1"
_ENV_CONFIG = ("tasks", "max_turns", "call_cost", "edit_penalty", "invalid_cost", "blank_tools")


class TokenPPO(OnPolicyAlgorithm):
    """Token-level PPO (clip version) for tool-using text agents, with SB3's interface.

    :param policy: ``"TinyAgentPolicy"`` or a :class:`~agents.policies.TinyAgentPolicy` subclass
    :param env: a BugFix-v0 env, its id, or a VecEnv of them (see the module docstring); None to load
    :param learning_rate: Adam learning rate (a float or SB3 schedule of progress remaining)
    :param n_episodes: episodes sampled per iteration (the batch; SB3's ``n_steps`` slot)
    :param batch_size: trajectories per minibatch; default ``ceil(n_episodes / n_minibatches)``
    :param n_epochs: passes over each batch
    :param gamma: discount per policy token (book: 1)
    :param gae_lambda: GAE lambda (book: 1 or 0.95)
    :param clip_range: epsilon_low of the ratio clip (float or schedule)
    :param clip_range_vf: value clip epsilon_v; None turns value clipping off
    :param normalize_advantage: whiten advantages over all policy tokens of the batch
    :param ent_coef: entropy bonus coefficient
    :param vf_coef: value-loss coefficient (the value loss already has the 0.5 factor)
    :param max_grad_norm: gradient-norm clip
    :param target_kl: KL (k3) target for early stopping; None = off. The default 0.02 (the book's
        target) is what makes runs reliable: at lr 1e-3 without it, 3 seeds ended at train pass
        0.55 / 0.56 (valid calls collapsing), with it at 0.89 / 0.89 / 0.93 using ~25% of the steps
    :param stats_window_size: episodes averaged by ``rollout/ep_rew_mean``; default ``n_episodes``
    :param tensorboard_log: TensorBoard log folder (None = off)
    :param policy_kwargs: extra :class:`TinyAgentPolicy` arguments (``tokenizer``, ``model_config``, ...)
    :param verbose: 0 silent, 1 SB3's log table, 2 also per-epoch lines
    :param seed: seeds torch, numpy, the sampler and the task draws
    :param device: torch device (``"cpu"``)
    :param n_minibatches: minibatches per epoch when ``batch_size`` is None
    :param clip_range_high: epsilon_high (clip-higher); None = ``clip_range``
    :param dual_clip: dual-clip constant c > 1 for negative advantages; None = off
    :param kl_coef: coefficient of the KL penalty to the frozen reference (base) agent; 0 = off
    :param kl_estimator: ``"k1"``, ``"k2"`` or ``"k3"`` for that penalty
    :param loss_mode: loss aggregation (``agents.losses.AGGREGATION_MODES``)
    :param loss_norm_const: the constant for ``loss_mode="constant"``
    :param target_kl_mode: ``"minibatch"`` (SB3: stop before a step whose minibatch KL exceeds
        ``1.5 * target_kl``) or ``"epoch"`` (book: stop after an epoch whose mean KL exceeds ``target_kl``)
    :param recompute_old_logp: recompute pi_old's log-probs with one trainer forward before the
        update (True) or use the sampler's ``sample_logp`` (False)
    :param critic_warmup_steps: Adam steps regressing the value head on Monte-Carlo returns of
        the first batch, before the first policy update (0 = off)
    :param critic_warmup_lr: learning rate of that warm-up
    :param base_agent: initial weights: ``"auto"`` (the behaviour-cloned base agent, cached
        under ``~/.cache/bugfix_gym``), a :class:`TinyAgent`, a path to a ``.pt`` state dict, or
        None (random init)
    :param temperature: sampling temperature of the rollouts
    :param max_call_tokens: the most tokens one call may have
    :param forward_chunk: score each minibatch in length-sorted chunks of this many trajectories, each
        trimmed to its own length (same loss and gradients, far less padding: BugFix episodes range
        from ~20 to ~230 tokens); None = one padded forward per minibatch
    :param rollout_buffer_class: buffer class (default :class:`TokenRolloutBuffer`)
    :param rollout_buffer_kwargs: extra buffer arguments
    :param monitor_wrapper: wrap a plain env in SB3's ``Monitor``
    :param _init_setup_model: build the networks now (SB3's ``load`` passes False)
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {"TinyAgentPolicy": TinyAgentPolicy}
    policy: TinyAgentPolicy
    rollout_buffer: TokenRolloutBuffer

    def __init__(
        self,
        policy: str | type[TinyAgentPolicy],
        env: GymEnv | str | None,
        learning_rate: float | Schedule = 1e-3,
        n_episodes: int = 64,
        batch_size: int | None = None,
        n_epochs: int = 4,
        gamma: float = 1.0,
        gae_lambda: float = 1.0,
        clip_range: float | Schedule = 0.2,
        clip_range_vf: float | None = 0.2,
        normalize_advantage: bool = True,
        ent_coef: float = 0.0,
        vf_coef: float = 0.5,
        max_grad_norm: float = 1.0,
        target_kl: float | None = 0.02,
        stats_window_size: int | None = None,
        tensorboard_log: str | None = None,
        policy_kwargs: dict[str, Any] | None = None,
        verbose: int = 0,
        seed: int | None = None,
        device: th.device | str = "cpu",
        _init_setup_model: bool = True,
        *,
        n_minibatches: int = 4,
        clip_range_high: float | None = None,
        dual_clip: float | None = 3.0,
        kl_coef: float = 0.0,
        kl_estimator: str = "k3",
        loss_mode: str = "token_mean",
        loss_norm_const: float | None = None,
        target_kl_mode: str = "minibatch",
        recompute_old_logp: bool = True,
        critic_warmup_steps: int = 50,
        critic_warmup_lr: float = 3e-3,
        base_agent: str | TinyAgent | None = "auto",
        temperature: float = 1.0,
        max_call_tokens: int = 8,
        forward_chunk: int | None = 4,
        rollout_buffer_class: type[TokenRolloutBuffer] | None = None,
        rollout_buffer_kwargs: dict[str, Any] | None = None,
        monitor_wrapper: bool = True,
    ):
        if isinstance(env, str):  # SB3 would ask for render_mode="rgb_array", which BugFix-v0 does not have
            env = gym.make(env)
        self._base_model: TinyAgent | None = None
        _check_args(n_episodes=n_episodes, n_epochs=n_epochs, n_minibatches=n_minibatches, dual_clip=dual_clip,
                    kl_estimator=kl_estimator, loss_mode=loss_mode, loss_norm_const=loss_norm_const,
                    target_kl_mode=target_kl_mode, batch_size=batch_size, temperature=temperature)
        super().__init__(
            policy, env, learning_rate=learning_rate, n_steps=n_episodes, gamma=gamma, gae_lambda=gae_lambda,
            ent_coef=ent_coef, vf_coef=vf_coef, max_grad_norm=max_grad_norm, use_sde=False, sde_sample_freq=-1,
            rollout_buffer_class=rollout_buffer_class or TokenRolloutBuffer,
            rollout_buffer_kwargs=rollout_buffer_kwargs, stats_window_size=stats_window_size or n_episodes,
            tensorboard_log=tensorboard_log, monitor_wrapper=monitor_wrapper, policy_kwargs=policy_kwargs,
            verbose=verbose, seed=seed, device=device, _init_setup_model=False,
            supported_action_spaces=(spaces.Text, spaces.MultiDiscrete),
        )
        self.n_episodes = n_episodes
        self.n_minibatches = n_minibatches
        self.batch_size = batch_size or math.ceil(n_episodes / n_minibatches)
        self._explicit_batch_size = batch_size is not None
        self.n_epochs = n_epochs
        self.clip_range = clip_range
        self.clip_range_high = clip_range_high
        self.clip_range_vf = clip_range_vf
        self.dual_clip = dual_clip
        self.normalize_advantage = normalize_advantage
        self.target_kl = target_kl
        self.target_kl_mode = target_kl_mode
        self.kl_coef = kl_coef
        self.kl_estimator = kl_estimator
        self.loss_mode = loss_mode
        self.loss_norm_const = loss_norm_const
        self.recompute_old_logp = recompute_old_logp
        self.critic_warmup_steps = critic_warmup_steps
        self.critic_warmup_lr = critic_warmup_lr
        self.temperature = temperature
        self.max_call_tokens = max_call_tokens
        self.forward_chunk = forward_chunk
        self.base_agent = base_agent if isinstance(base_agent, str) or base_agent is None else "<TinyAgent>"
        self.critic_warmed_up = critic_warmup_steps <= 0
        self.diagnostics: list[dict[str, Any]] = []  # one entry per iteration, with per-epoch stats
        self.total_policy_tokens = 0
        self._iteration = 0
        self._token_ppo_format = CHECKPOINT_FORMAT  # marks a saved file as a TokenPPO checkpoint
        if _init_setup_model:
            self._prepare_policy_kwargs(base_agent)
            self._setup_model()
            if self._base_model is not None:
                self.policy.model.load_state_dict(self._base_model.state_dict())
                if self.ref_model is not None:
                    self.ref_model.load_state_dict(self._base_model.state_dict())
            self._base_model = None

    # ------------------------------------------------------------------ set-up
    def _prepare_policy_kwargs(self, base_agent: str | TinyAgent | None) -> None:
        """Put the tokenizer and model config into ``policy_kwargs`` (they travel in saved files)
        and fetch the initial weights."""
        kw = dict(self.policy_kwargs)
        tok = kw.get("tokenizer")
        if tok is None:
            tok = build_tokenizer()
        elif isinstance(tok, dict):
            tok = Tokenizer.from_dict(tok)
        if isinstance(base_agent, TinyAgent):
            self._base_model = base_agent
        elif base_agent == "auto":
            self._base_model = cached_base_agent(tok, seed=0, verbose=self.verbose)
        elif isinstance(base_agent, (str, pathlib.Path)):
            blob = th.load(base_agent, map_location="cpu", weights_only=True)
            state = blob.get("state_dict", blob)
            config = blob.get("config") or dict(kw.get("model_config") or {"vocab_size": tok.vocab_size})
            self._base_model = TinyAgent(TinyAgentConfig(**config))
            self._base_model.load_state_dict(state)
        elif base_agent is not None:
            raise ValueError(f"base_agent must be 'auto', a TinyAgent, a path or None, got {base_agent!r}")
        if self._base_model is not None:
            cfg = self._base_model.config
            if cfg.vocab_size != tok.vocab_size:
                raise ValueError(f"the base agent's vocabulary ({cfg.vocab_size}) differs from the tokenizer's "
                                 f"({tok.vocab_size})")
            kw["model_config"] = dataclasses.asdict(cfg)
        elif isinstance(kw.get("model_config"), TinyAgentConfig):
            kw["model_config"] = dataclasses.asdict(kw["model_config"])
        kw["tokenizer"] = tok.to_dict()
        kw.setdefault("max_call_tokens", self.max_call_tokens)
        self.policy_kwargs = kw

    def _setup_model(self) -> None:
        if "tokenizer" not in self.policy_kwargs:  # built without __init__'s preparation
            self._prepare_policy_kwargs(None)
        self.rollout_buffer_kwargs = dict(self.rollout_buffer_kwargs)
        self.rollout_buffer_kwargs.setdefault("normalize_advantage", self.normalize_advantage)
        self.rollout_buffer_kwargs.setdefault("pad_id", int(self.policy_kwargs["tokenizer"]["words"].index("<pad>")))
        super()._setup_model()
        self.clip_range = FloatSchedule(self.clip_range)
        self.ref_model: TinyAgent | None = None
        if self.kl_coef:
            self.ref_model = copy.deepcopy(self.policy.model).requires_grad_(False).eval()
        # the sampler's own generator: seeded by `seed`, else drawn from torch's global RNG (no reseeding)
        seed = self.seed if self.seed is not None else int(th.randint(0, 2**62, (1,)))
        self._sampler = th.Generator().manual_seed(seed)
        self._task_rng = np.random.default_rng(self.seed)
        self._shuffle_rng = np.random.default_rng(None if self.seed is None else [self.seed, 1])  # minibatches
        self._workers: list[BugFixEnv] = []
        self._workers_for: int | None = None

    @staticmethod
    def _wrap_env(env: GymEnv, verbose: int = 0, monitor_wrapper: bool = True) -> VecEnv:
        """SB3's wrapping, with :class:`TextDummyVecEnv` for text observations."""
        if not isinstance(env, VecEnv) and is_text_space(env.observation_space):
            env = _patch_env(env)
            if monitor_wrapper and not _is_monitored(env):
                env = Monitor(env)
            instance = env
            return TextDummyVecEnv([lambda: instance])
        return BaseAlgorithm._wrap_env(env, verbose, monitor_wrapper)

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "ref_model", "_sampler", "_task_rng", "_shuffle_rng", "_workers",
                "_workers_for", "_base_model", "_last_good"]

    def _get_torch_save_params(self) -> tuple[list[str], list[str]]:
        state_dicts = ["policy", "policy.optimizer"]
        if self.ref_model is not None:
            state_dicts.append("ref_model")
        return state_dicts, []

    # ------------------------------------------------------------------ rollouts
    def _worker_envs(self, env: VecEnv, n: int) -> list[BugFixEnv]:
        """``n`` unwrapped BugFixEnv copies configured like ``env`` (see the module docstring)."""
        if self._workers_for != id(env) or len(self._workers) < n:
            try:
                config = {k: env.get_attr(k, indices=[0])[0] for k in _ENV_CONFIG}
            except AttributeError as e:
                raise ValueError("TokenPPO trains on BugFix-v0 environments (bugfix_gym.BugFixEnv, possibly "
                                 f"wrapped); this env has no {e}") from None
            self._workers = [BugFixEnv(**config) for _ in range(n)]
            self._workers_for = id(env)
        return self._workers[:n]

    def sample_episodes(self, n: int | None = None, env: VecEnv | None = None, tasks: list | None = None,
                        temperature: float | None = None, generator: th.Generator | None = None
                        ) -> list[Trajectory]:
        """Sample ``n`` whole episodes with the current policy (no grad), tasks drawn uniformly.

        :param n: number of episodes (default ``n_episodes``)
        :param env: the env whose configuration the episodes use (default ``self.env``)
        :param tasks: the tasks (names or Task objects) to play, one per episode; overrides ``n``
        :param temperature: sampling temperature (default ``self.temperature``)
        :param generator: seeds the sampling (default: the model's own sampler, seeded by ``seed``)
        """
        env = env if env is not None else self.env
        if env is None:
            raise ValueError("TokenPPO has no environment: pass env= to the constructor, load() or set_env()")
        n = len(tasks) if tasks is not None else (n or self.n_episodes)
        workers = self._worker_envs(env, n)
        if tasks is None:
            pool = workers[0].tasks
            tasks = [pool[i] for i in self._task_rng.integers(len(pool), size=n)]
        self.policy.set_training_mode(False)
        return rollout_batch(self.policy.model, workers, tasks, self.policy.tokenizer,
                             generator=self._sampler if generator is None else generator,
                             temperature=self.temperature if temperature is None else temperature,
                             max_call_tokens=self.max_call_tokens, grammar=self.policy.grammar)

    def collect_rollouts(self, env: VecEnv, callback: BaseCallback, rollout_buffer: TokenRolloutBuffer,
                         n_rollout_steps: int) -> bool:
        """Sample ``n_rollout_steps`` (= ``n_episodes``) whole episodes into ``rollout_buffer``, then
        replay SB3's per-step bookkeeping so callbacks and ``num_timesteps`` count env steps.

        :return: False if a callback asked to stop training
        """
        rollout_buffer.reset()
        callback.on_rollout_start()
        t0 = time.perf_counter()
        trajs = self.sample_episodes(n_rollout_steps, env)
        sample_s = time.perf_counter() - t0
        rollout_buffer.add(trajs)
        n_tokens = rollout_buffer.n_policy_tokens
        self.total_policy_tokens += n_tokens
        self._record_rollout(trajs, n_tokens, sample_s)

        n_envs = env.num_envs
        for dones, infos, rewards in _step_events(trajs, n_envs):
            self.num_timesteps += int(len(dones))
            callback.update_locals(locals())
            if not callback.on_step():
                return False
            self._update_info_buffer(infos, dones)
        callback.update_locals(locals())
        callback.on_rollout_end()
        return True

    def _record_rollout(self, trajs: list[Trajectory], n_tokens: int, sample_s: float) -> None:
        stats = episode_stats([t.info for t in trajs], [t.reward for t in trajs])
        for key in ("pass_rate", "valid_calls", "submit_rate", "read_rate", "edits_per_episode"):
            self.logger.record(f"rollout/{key}", stats[key])
        self.logger.record("rollout/policy_tokens", n_tokens)
        self.logger.record("time/policy_tokens", self.total_policy_tokens)
        self.logger.record("time/sample_s", sample_s, exclude="stdout")
        self._last_rollout = dict(stats, policy_tokens=n_tokens, sample_s=sample_s, num_timesteps=None)

    # ------------------------------------------------------------------ training
    def train(self) -> None:
        """One PPO update on the rollout buffer (see :meth:`train_on_buffer`), logged under ``train/``."""
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        self.train_on_buffer(self.rollout_buffer)

    def train_on_batch(self, trajectories: list[Trajectory]) -> list[dict[str, float]]:
        """One PPO update on given trajectories (for experiments: per-epoch statistics on a fixed batch).

        :param trajectories: episodes sampled by (a copy of) this policy
        :return: per-epoch statistics (also appended to :attr:`diagnostics`)
        """
        buffer = self.rollout_buffer_class(len(trajectories), self.observation_space, self.action_space,
                                           device=self.device, gamma=self.gamma, gae_lambda=self.gae_lambda,
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
        """
        if buffer.size() == 0:
            raise ValueError("the rollout buffer is empty")
        t0 = time.perf_counter()
        self._last_good = self._snapshot()  # restored if a loss turns NaN / inf
        if not self.critic_warmed_up:
            self.warmup_critic(buffer)
        # every epoch's shuffled minibatches, drawn up front so that pi_old can be frozen in the
        # first epoch's layout: its first minibatch then repeats the freezing forward bit for bit
        # a batch of another size (train_on_batch) keeps n_minibatches, unless batch_size was given
        batch_size = self.batch_size if self._explicit_batch_size else math.ceil(buffer.size() / self.n_minibatches)
        layouts = [buffer.minibatch_layout(batch_size, self._shuffle_rng) for _ in range(self.n_epochs)]
        # 1. freeze pi_old: one no-grad pass of the trainer over the whole batch
        self._freeze_old_policy(buffer, layouts[0])
        ev = buffer.explained_variance()  # before the critic sees this batch
        # 2. GAE over policy tokens, value targets, whitening over all policy tokens
        buffer.compute_returns_and_advantage()
        # 3. epochs x shuffled minibatches of whole trajectories
        clip_low = float(self.clip_range(self._current_progress_remaining))
        clip_high = clip_low if self.clip_range_high is None else float(self.clip_range_high)
        epochs: list[dict[str, float]] = []
        steps, stop = 0, False
        for epoch, layout in enumerate(layouts):
            mb_stats: list[dict[str, float]] = []
            for mb, sample in enumerate(buffer.get(batch_size, layout)):
                loss, stats = self._minibatch_loss(sample, clip_low, clip_high)
                if not th.isfinite(loss):
                    self._restore(self._last_good)
                    raise FloatingPointError(
                        f"TokenPPO: non-finite loss ({loss.item()}) at iteration {self._iteration + 1}, epoch "
                        f"{epoch + 1}, minibatch {mb + 1}; training stopped and the parameters restored to their "
                        "state before this update (lower learning_rate, or check rewards and loss coefficients)")
                if (self.target_kl is not None and self.target_kl_mode == "minibatch"
                        and stats["approx_kl"] > 1.5 * self.target_kl):
                    stop = True  # SB3's rule: skip this step and end the update
                    if self.verbose >= 2:
                        print(f"early stop at epoch {epoch + 1}, minibatch {mb + 1}: approx_kl "
                              f"{stats['approx_kl']:.4f} > 1.5 * target_kl")
                    break
                self.policy.optimizer.zero_grad()
                loss.backward()
                grad_norm = th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
                if not th.isfinite(grad_norm):
                    self._restore(self._last_good)
                    raise FloatingPointError(
                        f"TokenPPO: non-finite gradient norm at iteration {self._iteration + 1}, epoch {epoch + 1}; "
                        "training stopped and the parameters restored to their state before this update")
                self.policy.optimizer.step()
                steps += 1
                stats["grad_norm"] = float(grad_norm)
                mb_stats.append(stats)
            if mb_stats:
                epochs.append(_epoch_summary(epoch + 1, mb_stats))
                if self.verbose >= 2:
                    e = epochs[-1]
                    print(f"  epoch {epoch + 1}: clip {e['clip_fraction']:.3f}  kl {e['approx_kl']:.4f}  "
                          f"ratio [{e['ratio_min']:.2f}, {e['ratio_max']:.2f}]  vloss {e['value_loss']:.4f}")
            if stop:
                break
            if (self.target_kl is not None and self.target_kl_mode == "epoch" and epochs
                    and epochs[-1]["approx_kl"] > self.target_kl):
                break  # the book's rule: stop after an epoch whose mean KL exceeds the target
        self._n_updates += steps
        self._iteration += 1
        self._log_update(epochs, ev, steps, buffer, time.perf_counter() - t0)
        return epochs

    def _minibatch_loss(self, sample: TokenRolloutBufferSamples, clip_low: float, clip_high: float
                        ) -> tuple[th.Tensor, dict[str, float]]:
        """PPO loss of one minibatch of whole trajectories: one forward scores all its policy tokens."""
        mask = sample.action_mask  # [b, T-1]
        # the losses, KL-to-reference and explained variance read only policy positions: run the heads there only
        logp, values, entropy = score_by_length(self.policy.model, sample.ids, sample.owner, self.forward_chunk,
                                                mask, *self._grammar_args(sample))  # 3 x [b, T-1], 0 off the mask
        mode, norm = self.loss_mode, self.loss_norm_const
        pg_loss, stats = clipped_policy_loss(logp, sample.old_log_prob, sample.advantages, mask,
                                             clip_low=clip_low, clip_high=clip_high, dual_clip=self.dual_clip,
                                             mode=mode, norm_const=norm)
        v_loss = clipped_value_loss(values, sample.old_values, sample.returns, mask, clip=self.clip_range_vf,
                                    mode=mode, norm_const=norm)
        entropy_mean = aggregate_loss(entropy, mask, mode, norm)
        loss = pg_loss - self.ent_coef * entropy_mean + self.vf_coef * v_loss
        kl_ref = th.zeros(())
        if self.kl_coef and sample.ref_log_prob is not None:
            kl_ref = aggregate_loss(kl_estimate(logp, sample.ref_log_prob, self.kl_estimator), mask, mode, norm)
            loss = loss + self.kl_coef * kl_ref
        stats["clip_fraction"] = stats.pop("clip_frac")  # SB3's key names
        stats["dual_clip_fraction"] = stats.pop("dual_clip_frac")
        stats.update(policy_gradient_loss=pg_loss.item(), value_loss=v_loss.item(), entropy=entropy_mean.item(),
                     kl_ref=kl_ref.item(), loss=loss.item(),
                     explained_variance=explained_variance(values, sample.returns, mask))
        return loss, stats

    def _grammar_args(self, sample: TokenRolloutBufferSamples) -> tuple:
        """``(grammar_state, allowed)`` for scoring under the call grammar the sampler used, or ``()``."""
        grammar = self.policy.grammar
        if grammar is None or sample.grammar_state is None:
            return ()
        return sample.grammar_state, grammar.allowed

    @th.no_grad()
    def _freeze_old_policy(self, buffer: TokenRolloutBuffer, layout: list[np.ndarray] | None = None) -> None:
        """pi_old's log-probs and values (and pi_ref's log-probs) of the whole batch, computed ONCE.

        :param layout: score the batch minibatch by minibatch in this layout (the first epoch's), so the
            first minibatch's forward is the same computation and its ratios are exactly 1, not 1 up to
            float rounding of a differently padded batch; one pass over the whole batch if None
        """
        N, T = buffer.data["ids"].shape
        old_logp, old_values, ref_logp = th.zeros(N, T - 1), th.zeros(N, T - 1), th.zeros(N, T - 1)
        want_ref = self.ref_model is not None and bool(self.kl_coef)
        for rows in layout if layout is not None else [np.arange(N)]:
            sample = buffer._get_samples(rows)  # the trimmed [b, T_mb] tensors a minibatch sees
            # GAE, explained variance, the value clip and the KL penalty read pi_old / V_old / pi_ref only
            # at policy positions (gae_policy_tokens never reads the others): score only those
            args = (sample.ids, sample.owner, self.forward_chunk, sample.action_mask, *self._grammar_args(sample))
            logp, values, _ = score_by_length(self.policy.model, *args)  # 2 x [b, T_mb - 1]
            idx, t = th.as_tensor(rows, dtype=th.long), logp.shape[1]
            old_logp[idx, :t], old_values[idx, :t] = logp.cpu(), values.cpu()
            if want_ref:
                ref_logp[idx, :t] = score_by_length(self.ref_model, *args)[0].cpu()
        if not self.recompute_old_logp:
            old_logp = buffer.data["sample_logp"]
        buffer.set_old_policy(old_logp, old_values, ref_logp if want_ref else None)

    def warmup_critic(self, buffer: TokenRolloutBuffer, steps: int | None = None) -> list[float]:
        """Regress the value head on the batch's Monte-Carlo returns (book §8.4, "the critic needs a head
        start"), before the first policy update. Only the value head trains, so the policy is unchanged.

        :param buffer: the batch (the initial policy's rollouts)
        :param steps: Adam steps (default ``critic_warmup_steps``)
        :return: the value loss at each step
        """
        steps = self.critic_warmup_steps if steps is None else steps
        head = self.policy.model.value_head
        opt = th.optim.Adam(head.parameters(), lr=self.critic_warmup_lr)
        ids = buffer.data["ids"].to(self.device)
        mask = buffer.action_mask.to(self.device)
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
        epochs_run = len(epochs)  # epochs in which at least one gradient step was taken
        rec = self.logger.record
        if epochs:
            for key in ("clip_fraction", "approx_kl", "entropy", "value_loss", "policy_gradient_loss", "kl_ref",
                        "dual_clip_fraction", "grad_norm", "loss"):
                rec(f"train/{key}", float(np.mean([e[key] for e in epochs])))
            rec("train/ratio_min", min(e["ratio_min"] for e in epochs))
            rec("train/ratio_max", max(e["ratio_max"] for e in epochs))
            rec("train/entropy_loss", -float(np.mean([e["entropy"] for e in epochs])))
            for e in epochs:  # per-epoch diagnostics (book §8.5), kept out of the console table
                for key in ("clip_fraction", "approx_kl", "ratio_min", "ratio_max"):
                    rec(f"train_epoch/{key}_{e['epoch']}", e[key], exclude="stdout")
        rec("train/explained_variance", ev)
        rec("train/epochs_run", epochs_run)
        rec("train/grad_steps", steps)
        rec("train/n_updates", self._n_updates)
        rec("train/clip_range", float(self.clip_range(self._current_progress_remaining)))
        rec("time/train_s", train_s, exclude="stdout")
        entry = dict(iteration=self._iteration, num_timesteps=self.num_timesteps, explained_variance=ev,
                     epochs_run=epochs_run, grad_steps=steps, train_s=train_s, epochs=epochs,
                     policy_tokens=buffer.n_policy_tokens)
        if getattr(self, "_last_rollout", None) is not None:
            entry["rollout"] = {k: v for k, v in self._last_rollout.items() if k != "num_timesteps"}
            self._last_rollout = None
        self.diagnostics.append(entry)

    # ------------------------------------------------------------------ NaN guard
    def _snapshot(self) -> dict[str, Any]:
        return {"policy": copy.deepcopy(self.policy.state_dict()),
                "optimizer": copy.deepcopy(self.policy.optimizer.state_dict())}

    def _restore(self, snap: dict[str, Any]) -> None:
        self.policy.load_state_dict(snap["policy"])
        self.policy.optimizer.load_state_dict(snap["optimizer"])

    # ------------------------------------------------------------------ SB3 surface
    def learn(self: SelfTokenPPO, total_timesteps: int, callback: MaybeCallback = None, log_interval: int = 1,
              tb_log_name: str = "TokenPPO", reset_num_timesteps: bool = True,
              progress_bar: bool = False) -> SelfTokenPPO:
        """SB3's ``OnPolicyAlgorithm.learn``; ``total_timesteps`` counts env steps (tool calls)."""
        return super().learn(total_timesteps=total_timesteps, callback=callback, log_interval=log_interval,
                             tb_log_name=tb_log_name, reset_num_timesteps=reset_num_timesteps,
                             progress_bar=progress_bar)

    @classmethod
    def load(cls: type[SelfTokenPPO], path: str | pathlib.Path | io.BufferedIOBase, env: GymEnv | None = None,
             device: th.device | str = "cpu", custom_objects: dict[str, Any] | None = None,
             print_system_info: bool = False, force_reset: bool = True, **kwargs) -> SelfTokenPPO:
        """SB3's ``load`` after checking that ``path`` is a TokenPPO checkpoint.

        :raises FileNotFoundError: no such file
        :raises ValueError: the file is corrupt or was not saved by TokenPPO (one line)
        """
        check_checkpoint(path)
        try:
            return super().load(path, env=env, device=device, custom_objects=custom_objects,
                                print_system_info=print_system_info, force_reset=force_reset, **kwargs)
        except (ValueError, KeyError, RuntimeError, EOFError, zipfile.BadZipFile, OSError, TypeError) as e:
            raise ValueError(f"{path} is not a loadable TokenPPO checkpoint: {type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}") from None

    def set_parameters(self, load_path_or_dict: str | dict[str, Any], exact_match: bool = True,
                       device: th.device | str = "auto") -> None:
        if not isinstance(load_path_or_dict, dict):
            check_checkpoint(load_path_or_dict)
        super().set_parameters(load_path_or_dict, exact_match=exact_match, device=device)


# ---------------------------------------------------------------------- helpers
def _check_args(*, n_episodes: int, n_epochs: int, n_minibatches: int, dual_clip: float | None, kl_estimator: str,
                loss_mode: str, loss_norm_const: float | None, target_kl_mode: str, batch_size: int | None,
                temperature: float) -> None:
    if n_episodes < 1:
        raise ValueError(f"n_episodes must be at least 1, got {n_episodes}")
    if n_epochs < 1:
        raise ValueError(f"n_epochs must be at least 1, got {n_epochs}")
    if n_minibatches < 1:
        raise ValueError(f"n_minibatches must be at least 1, got {n_minibatches}")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be at least 1 (trajectories per minibatch), got {batch_size}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (typically 3) or None, got {dual_clip}")
    if kl_estimator not in KL_KINDS:
        raise ValueError(f"kl_estimator must be one of {KL_KINDS}, got {kl_estimator!r}")
    if loss_mode not in AGGREGATION_MODES:
        raise ValueError(f"loss_mode must be one of {AGGREGATION_MODES}, got {loss_mode!r}")
    if loss_mode == "constant" and loss_norm_const is None:
        raise ValueError("loss_mode='constant' needs loss_norm_const, e.g. batch_size * max_policy_tokens")
    if target_kl_mode not in ("minibatch", "epoch"):
        raise ValueError(f"target_kl_mode must be 'minibatch' or 'epoch', got {target_kl_mode!r}")
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")


def score_by_length(model: TinyAgent, ids: th.Tensor, owner: th.Tensor, chunk: int | None,
                    mask: th.Tensor | None = None, grammar_state: th.Tensor | None = None,
                    allowed: th.Tensor | None = None) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
    """``sequence_logp_values_entropy`` over a right-padded batch, run in length-sorted chunks.

    Each chunk of ``chunk`` trajectories is trimmed to its own longest row, so short episodes
    stop paying for the longest one's padding. The model is causal and right padding never
    changes earlier positions, so the result equals one full forward (up to float rounding).

    :param model: the TinyAgent
    :param ids: [B, T] token ids, right-padded
    :param owner: [B, T] owner codes (0 = pad), giving each row's length
    :param chunk: rows per chunk (None: one forward)
    :param mask: optional [B, T-1] action mask: the heads run only where it is set (see
        :func:`agents.model.sequence_logp_values_entropy`), the outputs are zero elsewhere
    :param grammar_state: optional [B, T-1] call-grammar states, with ``allowed`` [S, V]: score the
        grammar-masked distribution (see :mod:`agents.grammar`)
    :return: ``(logp, values, entropy)``, each [B, T-1], zero past each row's end
    """
    B, T = ids.shape
    if chunk is None or chunk >= B:
        return sequence_logp_values_entropy(model, ids, mask, grammar_state, allowed)
    lengths = (owner > 0).sum(1)  # [B]
    order = th.argsort(lengths, descending=True)  # [B]
    parts: list[list[th.Tensor]] = [[], [], []]
    for start in range(0, B, chunk):
        rows = order[start: start + chunk]
        L = max(int(lengths[rows].max()), 2)
        rows_mask = None if mask is None else mask[rows, :L - 1]
        rows_state = None if grammar_state is None else grammar_state[rows, :L - 1]
        outs = sequence_logp_values_entropy(model, ids[rows, :L], rows_mask, rows_state, allowed)  # 3 x [c, L-1]
        for part, out in zip(parts, outs):
            part.append(th.nn.functional.pad(out, (0, T - L)))  # [c, T-1]
    inverse = th.argsort(order)  # back to the batch's order
    return tuple(th.cat(part)[inverse] for part in parts)  # type: ignore[return-value]


def _is_monitored(env) -> bool:
    from stable_baselines3.common.env_util import is_wrapped

    return is_wrapped(env, Monitor)


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


def _step_rewards(traj: Trajectory) -> list[float]:
    """Per-env-step rewards of an episode: the token reward on the last token of each call."""
    mask = traj.action_mask  # [T-1]
    nxt = th.cat([mask[1:], th.zeros(1)])
    ends = (mask > 0) & (nxt == 0)  # last policy token of each call
    return traj.token_rewards[ends].tolist()


def _step_events(trajs: list[Trajectory], n_envs: int):
    """Replay a batch of episodes as SB3 VecEnv steps of ``n_envs`` envs: yields ``(dones, infos,
    rewards)`` per ``callback.on_step()``; each finished episode's info carries SB3's Monitor
    ``episode`` entry and ``is_success`` (hidden tests passed)."""
    steps: list[tuple[bool, dict, float]] = []
    t0 = time.time()
    for traj in trajs:
        rewards = _step_rewards(traj)
        n = int(traj.info.get("n_turns", len(rewards))) or len(rewards)
        rewards = (rewards + [0.0] * n)[:n]
        for j, r in enumerate(rewards):
            last = j == n - 1
            info: dict[str, Any] = {}
            if last:
                info = dict(traj.info)
                info["episode"] = {"r": float(traj.reward), "l": n, "t": round(time.time() - t0, 6)}
                info["is_success"] = bool(traj.info.get("submitted") and traj.info.get("hidden_pass"))
            steps.append((last, info, r))
    for start in range(0, len(steps), n_envs):
        chunk = steps[start: start + n_envs]
        dones = np.array([c[0] for c in chunk])
        yield dones, [c[1] for c in chunk], np.array([c[2] for c in chunk], dtype=np.float32)


def check_checkpoint(path: str | pathlib.Path | io.BufferedIOBase) -> None:
    """Raise a one-line error unless ``path`` holds a TokenPPO checkpoint (SB3 zip with TokenPPO's marker).

    :raises FileNotFoundError: neither ``path`` nor ``path.zip`` exists
    :raises ValueError: corrupt file or another library's / algorithm's checkpoint
    """
    if isinstance(path, (str, pathlib.Path)):
        p = pathlib.Path(path)
        if not p.exists() and pathlib.Path(str(p) + ".zip").exists():
            p = pathlib.Path(str(p) + ".zip")
        if not p.exists():
            raise FileNotFoundError(f"no model file at {path}")
        if p.is_dir():
            raise ValueError(f"{path} is a directory, not a TokenPPO checkpoint")
        source: Any = p
    else:
        source = path
        pos = path.tell()
    try:
        with zipfile.ZipFile(source) as archive:
            names = archive.namelist()
            data = json.loads(archive.read("data").decode()) if "data" in names else {}
    except (zipfile.BadZipFile, json.JSONDecodeError, UnicodeDecodeError, KeyError, OSError, EOFError) as e:
        raise ValueError(f"{path} is not a TokenPPO checkpoint: the file is corrupt or not a zip archive "
                         f"({type(e).__name__})") from None
    finally:
        if not isinstance(path, (str, pathlib.Path)):
            path.seek(pos)
    if data.get("_token_ppo_format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a TokenPPO checkpoint (no '{CHECKPOINT_FORMAT}' marker: saved by another "
                         "algorithm or library?)")
    if "policy.pth" not in names:
        raise ValueError(f"{path} is not a complete TokenPPO checkpoint: it has no policy weights")
