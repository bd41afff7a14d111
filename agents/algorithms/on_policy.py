"""TokenOnPolicyAlgorithm: what TokenPPO and Reinforce share behind Stable-Baselines3's interface.

``learn`` is SB3's own ``OnPolicyAlgorithm.learn``; this class overrides the hooks a token
trainer needs and leaves the update (``train``) to its subclasses:

* **Rollouts.** :meth:`collect_rollouts` plays the policy in *the env it was given*
  (``self.env``, an SB3 ``VecEnv`` of text envs, wrappers included) with the
  :class:`~agents.rollout.sampler.EpisodeSampler` until at least ``n_episodes`` whole episodes have
  finished. Every vector-env step advances ``num_timesteps`` by ``n_envs``, calls
  ``callback.on_step()`` and feeds SB3's episode-info buffer (``Monitor`` statistics of the
  real episodes), exactly like SB3's own collection. ``n_envs`` is independent of
  ``n_episodes`` (with ``fresh_batches=False`` an episode still running when the batch is
  complete continues in the next iteration). Collection stops at the first vector step that
  reaches ``total_timesteps`` (the last batch may be smaller), so ``num_timesteps`` ends less
  than ``n_envs`` past it.
* **Set-up.** The policy's tokenizer and model config go into ``policy_kwargs`` (they travel
  in saved files). Without a tokenizer in ``policy_kwargs`` and with ``base_agent="auto"``, the
  env's advertised defaults are used (``env.metadata["agent_defaults"]``, entry points
  ``"module:name"``: BugFix-v0 names its tokenizer and its behaviour-cloned base agent), so this
  layer imports nothing of an env.
* **Files.** ``save`` / ``load`` keep SB3's zip layout but never unpickle anything. As in SB3,
  the algorithm assembles plain data and its state dicts (:meth:`model_file_contents`) and
  :mod:`agents.files.checkpoint`, which knows no algorithm, writes and reads them; ``load``
  rebuilds the algorithm from them. The training counters (:data:`TRAINING_COUNTERS`) travel
  as :meth:`training_progress`, in model files and in a run's snapshots alike.
"""

from __future__ import annotations

import dataclasses
import pathlib
import time
import warnings
from typing import Any, Callable, ClassVar, TypeVar

import gymnasium as gym
import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.type_aliases import GymEnv, MaybeCallback
from stable_baselines3.common.vec_env import VecEnv
from stable_baselines3.common.vec_env.patch_gym import _patch_env

from bugfix_gym.contract.text import printable
from bugfix_gym.contract.tokenizer import SPECIALS
from bugfix_gym.contract.tokens import TokenizerLike, tokenizer_from_dict

from agents.files import checkpoint
from agents.algorithms.buffers import TokenRolloutBuffer
from agents.algorithms.config import OnPolicyConfig
from agents.algorithms.registry import load_entry_point
from agents.model.char_tokenizer import CharTokenizer
from agents.model.hf_adapter import config_dict
from agents.model.threads import ThreadSetting, check_thread_setting, use_threads
from agents.model.tinyagent import TinyAgent, TinyAgentConfig
from agents.algorithms.policies import TinyAgentPolicy
from agents.rollout.sampler import EpisodeSampler, GroupSampling
from agents.rollout.trajectory import Trajectory, rollout_stats
from agents.rollout.vec_env import TextDummyVecEnv, is_unshaped_text

SelfTokenAlgorithm = TypeVar("SelfTokenAlgorithm", bound="TokenOnPolicyAlgorithm")
Upgrade = TypeVar("Upgrade", bound=Callable[[dict[str, Any]], dict[str, Any]])
#: the training counters: their name in model files and snapshots -> the attribute that holds them
#: (``num_timesteps`` and ``_n_updates`` are SB3's own)
TRAINING_COUNTERS = {"num_timesteps": "num_timesteps", "n_updates": "_n_updates", "iteration": "_iteration",
                     "total_policy_tokens": "total_policy_tokens"}

#: upgrades of older model files' saved settings, by algorithm class name: each takes the settings a file holds and
#: returns them in today's names. A layer above registers its own (:func:`register_saved_settings_upgrade`; BugFix's
#: settings that became auxiliary losses: agents/bugfix/aux_losses.py), so this layer names none of them
SAVED_SETTINGS_UPGRADES: dict[str, list[Callable[[dict[str, Any]], dict[str, Any]]]] = {}
#: upgrades of older model files' policy arguments (``policy_kwargs``), for every algorithm, registered the same way
#: (:func:`register_saved_policy_upgrade`; foresight's words of BugFix files saved before the env advertised them)
SAVED_POLICY_UPGRADES: list[Callable[[dict[str, Any]], dict[str, Any]]] = []

#: the batch statistics logged for any env (``rollout/reward``: the mean return, ``rollout/turns``: the mean episode
#: length in calls); an env's own statistics are logged when it advertises their keys (``"logged_stats"``)
ALWAYS_LOGGED = ("reward", "turns")

#: the warning for a plain env with gymnasium's shapeless Text spaces (trained in a TextDummyVecEnv)
TEXT_SPACE_ADVICE = ("this env has gymnasium Text spaces, which SB3's DummyVecEnv cannot hold (TypeError: 'NoneType' "
                     "object is not iterable): training wraps it in agents.TextDummyVecEnv; give evaluate_policy and "
                     "EvalCallback agents.make_text_vec_env(make_env) (make_env: a function that returns a new env)")


class TokenOnPolicyAlgorithm(OnPolicyAlgorithm):
    """Base class of the token-level on-policy algorithms (see the module docstring).

    :param policy: ``"TinyAgentPolicy"`` or a :class:`~agents.algorithms.policies.TinyAgentPolicy` subclass
    :param env: a text env, its id, or a ``VecEnv`` of text envs; None when loading
    :param policy_kwargs: extra :class:`TinyAgentPolicy` arguments (``tokenizer``, ``model_config``,
        ``call_grammar``, ...)
    :param tensorboard_log: TensorBoard log folder (None = off)
    :param verbose: 0 silent, 1 SB3's log table, 2 also per-epoch lines
    :param seed: seeds torch, numpy, the envs (``VecEnv.seed``), the sampler and the minibatches
    :param device: torch device (``"cpu"``)
    :param _init_setup_model: build the networks now (``load`` passes False)
    :param base_agent: initial weights: ``"auto"`` (the env's advertised base agent, e.g. BugFix-v0's
        behaviour-cloned one, cached under ``~/.cache/bugfix_gym``; random init for an env that
        advertises none), a :class:`TinyAgent`, a path to a ``.pt`` state dict, or None (random init)
    :param rollout_buffer_class: buffer class (default :class:`TokenRolloutBuffer`)
    :param rollout_buffer_kwargs: extra buffer arguments
    :param monitor_wrapper: wrap a plain env in SB3's ``Monitor``
    :param torch_threads: torch threads the model's work (building it, ``learn``, sampling, ``predict``)
        runs under, the caller's count put back afterwards: ``"auto"`` (one thread on a CPU, where it is
        fastest for this tiny model, unless you chose a count with ``torch.set_num_threads`` or
        ``OMP_NUM_THREADS``; :mod:`agents.model.threads`), a count, or None (leave torch's count alone)
    :param config: the settings, one :attr:`config_class` object (TRL's ``args=``; the code reads
        ``self.config.x``); default: the defaults
    :param settings: SB3-style sugar: settings of :attr:`config_class` by name, which replace those of
        ``config`` (``TokenPPO(policy, env, clip_range=0.1)``); one documentation for them, the config's fields
        (a signature listing them would be a second copy)
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {"TinyAgentPolicy": TinyAgentPolicy}
    policy: TinyAgentPolicy
    rollout_buffer: TokenRolloutBuffer
    #: the settings (agents.algorithms.config): one field each, with its default, doc and check
    config_class: ClassVar[type[OnPolicyConfig]] = OnPolicyConfig
    config: OnPolicyConfig  # the settings as given

    def __init__(self, policy: str | type[TinyAgentPolicy], env: GymEnv | str | None, *,
                 config: OnPolicyConfig | None = None, policy_kwargs: dict[str, Any] | None = None,
                 tensorboard_log: str | None = None, verbose: int = 0, seed: int | None = None,
                 device: th.device | str = "cpu", _init_setup_model: bool = True,
                 base_agent: str | TinyAgent | pathlib.Path | None = "auto",
                 rollout_buffer_class: type[TokenRolloutBuffer] | None = None,
                 rollout_buffer_kwargs: dict[str, Any] | None = None, monitor_wrapper: bool = True,
                 torch_threads: ThreadSetting = "auto", **settings: Any):
        self.torch_threads = check_thread_setting(torch_threads)
        self.config = self.config_class.build(type(self).__name__, config, settings)  # checks every setting
        if isinstance(env, str):
            env = gym.make(env)
        self.base_agent = base_agent if isinstance(base_agent, str) or base_agent is None else "<given>"
        self._base_model: TinyAgent | None = None
        cfg = self.config
        super().__init__(  # SB3's own slots, read by its machinery; this class's code reads self.config
            policy, env, n_steps=cfg.n_episodes, stats_window_size=cfg.stats_window_size or cfg.n_episodes,
            use_sde=False, sde_sample_freq=-1, rollout_buffer_class=rollout_buffer_class or TokenRolloutBuffer,
            rollout_buffer_kwargs=rollout_buffer_kwargs, tensorboard_log=tensorboard_log,
            monitor_wrapper=monitor_wrapper, policy_kwargs=policy_kwargs, verbose=verbose, seed=seed, device=device,
            _init_setup_model=False, supported_action_spaces=(spaces.Text,), **cfg.sb3_arguments(),
        )
        self.diagnostics: list[dict[str, Any]] = []  # one entry per iteration
        self.total_policy_tokens = 0
        self._iteration = 0
        self._last_rollout: dict[str, Any] | None = None
        #: a file for the conformance dump of the next update (written once, before its first step, then None;
        #: agents/algorithms/first_update_dump.py, ``bugfix-gym train --dump``)
        self.first_update_dump: str | pathlib.Path | None = None
        if _init_setup_model:
            with use_threads(self.torch_threads, self.device):  # the base agent may be trained here
                self._prepare_policy_kwargs(base_agent)
                self._setup_model()
            if self._base_model is not None:
                self.policy.model.load_state_dict(self._base_model.state_dict())
                self._after_initial_weights()
            self._base_model = None

    @classmethod
    def upgrade_saved_args(cls, args: dict[str, Any]) -> dict[str, Any]:
        """The saved arguments of an older file in today's names: the registered upgrades of this class
        (:data:`SAVED_SETTINGS_UPGRADES`), in the order registered."""
        for upgrade in SAVED_SETTINGS_UPGRADES.get(cls.__name__, ()):
            args = upgrade(args)
        return args

    @staticmethod
    def _upgrade_policy_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
        """An older file's policy arguments in today's form: the registered :data:`SAVED_POLICY_UPGRADES`."""
        for upgrade in SAVED_POLICY_UPGRADES:
            kwargs = upgrade(kwargs)
        return kwargs

    def saved_settings(self) -> dict[str, Any]:
        """``{name: value}`` of the config's fields saved with the model, as they are now."""
        return {name: getattr(self.config, name) for name in self.config_class.saved_names()}

    # ------------------------------------------------------------------ set-up
    def _prepare_policy_kwargs(self, base_agent: str | TinyAgent | pathlib.Path | None) -> None:
        """Put the tokenizer and model config into ``policy_kwargs`` (they travel in saved files)
        and fetch the initial weights."""
        kw = dict(self.policy_kwargs)
        tok = kw.get("tokenizer")
        if tok is None:
            tok = self._default_tokenizer(free_text=not kw.get("call_grammar") and not kw.get("legal_calls"))
        elif isinstance(tok, dict):
            tok = tokenizer_from_dict(tok)
        if kw.get("model") is not None or kw.get("hf_config") is not None:
            base_agent = self._hf_base_agent(kw, base_agent)  # None: the HF model's own weights
        if isinstance(base_agent, TinyAgent):
            self._base_model = base_agent
        elif base_agent == "auto":
            make = self._env_default("base_agent", required=False)
            if make is not None and self._is_own_tokenizer(tok):
                raise ValueError("base_agent='auto' is the env's own base agent, made for the env's own tokenizer; "
                                 "with a tokenizer of your own pass base_agent=None (random init), a TinyAgent or "
                                 "a .pt path")
            self._base_model = None if make is None else make(tok, verbose=self.verbose)
        elif isinstance(base_agent, (str, pathlib.Path)):
            self._base_model = checkpoint.load_state_dict_file(base_agent)
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
        if kw.get("call_grammar") is not None:
            kw["call_grammar"] = list(kw["call_grammar"])
        self.policy_kwargs = kw

    def _default_tokenizer(self, free_text: bool = False) -> TokenizerLike:
        """The env's advertised tokenizer, else a character-level one of its ``Text`` spaces' charset (said once,
        as a warning, which with ``free_text``, no call grammar, also says that random weights seldom spell a
        rewarded call letter by letter), else a one-line error."""
        make = self._env_default("tokenizer", required=False)
        if make is not None:
            return make()
        tok = CharTokenizer.for_spaces(self.observation_space, self.action_space)
        if tok is None:
            raise ValueError("the env advertises no default tokenizer (metadata['agent_defaults']) and has no Text "
                             "space to build a character-level one from: pass policy_kwargs=dict(tokenizer=...)")
        grammar = ("; from random weights (base_agent=None) free text seldom spells a rewarded call, so nothing is "
                   "learnt: give the env's calls as policy_kwargs=dict(call_grammar=[...]) (docs/ppo.md)"
                   ) if free_text else ""
        warnings.warn(f"the env advertises no tokenizer: using a character-level one of its Text spaces' "
                      f"{len(tok.words) - len(SPECIALS)} characters (pass policy_kwargs=dict(tokenizer=...) for "
                      f"another){grammar}", stacklevel=4)
        return tok

    @staticmethod
    def _hf_base_agent(kw: dict[str, Any], base_agent: Any) -> None:
        """With an HF model (``policy_kwargs["model"]``), its weights are the initial ones: the base agent
        must be ``"auto"`` or None. Its config goes into ``policy_kwargs["hf_config"]`` (saved with the model)."""
        if base_agent not in ("auto", None):
            raise ValueError("base_agent is a TinyAgent's weights; with an HF model (policy_kwargs['model']) pass "
                             "base_agent=None: the HF model's own weights are the initial ones")
        if kw.get("model_config") is not None:
            raise ValueError("model_config gives a TinyAgent's sizes; with an HF model (policy_kwargs['model']) "
                             "leave it out: the HF model's config gives its sizes")
        if kw.get("model") is not None:
            kw["hf_config"] = config_dict(kw["model"])
        kw.pop("model_config", None)

    def _is_own_tokenizer(self, tok: TokenizerLike) -> bool:
        """Whether ``tok`` is not the env's advertised default tokenizer (or the env advertises none)."""
        make = self._env_default("tokenizer", required=False)
        return make is None or make() != tok

    def _env_default(self, key: str, required: bool = True) -> Any:
        """What the env advertises as its agents' default ``key`` (``"tokenizer"``: a function of no
        argument; ``"base_agent"``: a function of the tokenizer and ``verbose``; ``"episode_summary"``:
        ``(infos, rewards) -> statistics`` of finished episodes, logged as ``rollout/*``), as an entry point
        ``"module:name"`` in ``env.metadata["agent_defaults"]``; None if it has none and not ``required``."""
        metadata = self.env.get_attr("metadata", [0])[0] if self.env is not None else {}
        entry_point = (metadata or {}).get("agent_defaults", {}).get(key)
        if entry_point is None and required:
            raise ValueError(f"the env advertises no default {key} (metadata['agent_defaults']): pass "
                             f"policy_kwargs=dict({key}=...)")
        return None if entry_point is None else load_entry_point(entry_point, f"default {key}")

    def _env_advertised(self, key: str, default: Any) -> Any:
        """A plain value the env advertises to its agents in ``metadata["agent_defaults"]`` (not an entry point:
        ``"logged_stats"``, the keys of its episode summary logged as ``rollout/<key>``), else ``default``."""
        metadata = self.env.get_attr("metadata", [0])[0] if self.env is not None else {}
        return (metadata or {}).get("agent_defaults", {}).get(key, default)

    def _after_initial_weights(self) -> None:
        """Hook: the policy holds its initial weights (TokenPPO copies them into its reference model)."""

    def _setup_model(self) -> None:
        if "tokenizer" not in self.policy_kwargs:  # built without __init__'s preparation
            self._prepare_policy_kwargs(None)
        self.policy_kwargs = dict(self.policy_kwargs, max_call_tokens=self._max_call_tokens(self.policy_kwargs))
        if "foresight_words" not in self.policy_kwargs and self._env_advertised("foresight", None) is not None:
            self.policy_kwargs["foresight_words"] = dict(self._env_advertised("foresight", None))  # saved with it
        self.rollout_buffer_kwargs = dict(self.rollout_buffer_kwargs)
        self.rollout_buffer_kwargs.setdefault("pad_id", tokenizer_from_dict(self.policy_kwargs["tokenizer"]).pad_id)
        for name in ("scale_rewards", "turn_gamma", "step_advantage_weight", "mask_truncated_completions",
                     "episode_baseline"):
            self.rollout_buffer_kwargs.setdefault(name, getattr(self.config, name))
        super()._setup_model()
        self.policy.torch_threads = getattr(self, "torch_threads", "auto")  # predict() runs under it too
        # the sampler's own generator: seeded by `seed`, else drawn from torch's global RNG (no reseeding)
        seed = self.seed if self.seed is not None else int(th.randint(0, 2**62, (1,)))
        self.sample_generator = th.Generator().manual_seed(seed)
        self.sampler: EpisodeSampler | None = self._make_sampler(self.env)

    def _max_call_tokens(self, policy_kwargs: dict[str, Any]) -> int:
        """The policy's call limit: the config's ``max_call_tokens`` (a model file keeps it in ``policy_kwargs``
        too; another value there is a one-line error, not a silent winner)."""
        given = policy_kwargs.get("max_call_tokens", self.config.max_call_tokens)
        if given != self.config.max_call_tokens:
            raise ValueError(f"policy_kwargs['max_call_tokens']={given!r} differs from the setting max_call_tokens="
                             f"{self.config.max_call_tokens!r}: give it once, as the setting")
        return int(self.config.max_call_tokens)

    def _make_sampler(self, env: VecEnv | None) -> EpisodeSampler | None:
        if env is None:
            return None
        cfg = self.config
        groups = GroupSampling(cfg.group_size, cfg.drop_zero_variance_groups, cfg.max_resample_rounds)
        return EpisodeSampler(env, self.policy.tokenizer, asynchronous=cfg.async_envs, groups=groups,
                              warn_unknown_words=self._env_default("tokenizer", required=False) is None,
                              **self.policy.sampler_kwargs())

    @staticmethod
    def _wrap_env(env: GymEnv, verbose: int = 0, monitor_wrapper: bool = True) -> VecEnv:
        """SB3's wrapping; a text env whose ``Text`` space has no shape (gymnasium's own ``Text``)
        goes into a :class:`~agents.rollout.vec_env.TextDummyVecEnv`, which stores strings."""
        if not isinstance(env, VecEnv) and is_unshaped_text(env.observation_space):
            warnings.warn(TEXT_SPACE_ADVICE, stacklevel=3)
            env = _patch_env(env)
            if monitor_wrapper and not _is_monitored(env):
                env = Monitor(env)
            instance = env
            return TextDummyVecEnv([lambda: instance])
        return BaseAlgorithm._wrap_env(env, verbose, monitor_wrapper)

    def set_env(self, env: GymEnv, force_reset: bool = True) -> None:
        """SB3's ``set_env``; the sampler then plays the new env (episodes in progress are dropped)."""
        super().set_env(env, force_reset=force_reset)
        self.sampler = self._make_sampler(self.env)

    def learn(self: SelfTokenAlgorithm, total_timesteps: int, callback: MaybeCallback = None, log_interval: int = 1,
              tb_log_name: str | None = None, reset_num_timesteps: bool = True,
              progress_bar: bool = False) -> SelfTokenAlgorithm:
        """SB3's ``learn``, run under :attr:`torch_threads`; TensorBoard runs are named after the
        algorithm (``TokenPPO_1``) unless ``tb_log_name`` is given."""
        with use_threads(self.torch_threads, self.device):
            return super().learn(total_timesteps, callback=callback, log_interval=log_interval,
                                 tb_log_name=tb_log_name or type(self).__name__,
                                 reset_num_timesteps=reset_num_timesteps, progress_bar=progress_bar)

    def _setup_learn(self, total_timesteps: int, callback: MaybeCallback = None, reset_num_timesteps: bool = True,
                     tb_log_name: str = "run", progress_bar: bool = False) -> tuple[int, BaseCallback]:
        last_obs = self._last_obs
        out = super()._setup_learn(total_timesteps, callback, reset_num_timesteps, tb_log_name, progress_bar)
        if self.sampler is None:
            self.sampler = self._make_sampler(self.env)
        assert self.sampler is not None
        if self._last_obs is not last_obs and not self.config.fresh_batches:  # SB3 reset the env
            self.sampler.restart(self._last_obs)
        return out

    # ------------------------------------------------------------------ rollouts
    def collect_rollouts(self, env: VecEnv, callback: BaseCallback, rollout_buffer: TokenRolloutBuffer,
                         n_rollout_steps: int) -> bool:
        """Play ``self.env`` until at least ``n_rollout_steps`` (= ``n_episodes``) episodes have
        finished (or ``total_timesteps`` is reached) and store them in ``rollout_buffer``.

        :return: False if a callback asked to stop training
        """
        assert self.sampler is not None and self.sampler.venv is env, "the sampler plays another env than self.env"
        rollout_buffer.reset()
        callback.on_rollout_start()
        budget = getattr(self, "_total_timesteps", 0) - self.num_timesteps
        keep_going = True

        def on_step(dones: np.ndarray, infos: list[dict], rewards: np.ndarray, recorded: np.ndarray) -> bool:
            nonlocal keep_going
            self.num_timesteps += len(dones)
            callback.update_locals({"dones": dones, "infos": infos, "rewards": rewards, "env": env})
            if not callback.on_step():
                keep_going = False
                return False
            # rollout/ep_rew_mean: the episodes of the batch (the Monitor files keep every episode)
            self._update_info_buffer([i for i, r in zip(infos, recorded) if r], dones[recorded])
            return True

        self.policy.set_training_mode(False)
        t0 = time.perf_counter()
        trajs = self.sampler.collect(self.policy.model, n_rollout_steps, fresh=self.config.fresh_batches,
                                     generator=self.sample_generator,
                                     temperature=self.config.temperature, max_env_steps=budget if budget > 0 else None,
                                     on_step=on_step)
        sample_s = time.perf_counter() - t0
        if not keep_going:
            return False
        self._record_groups()
        if trajs:
            rollout_buffer.add(trajs)
            self.total_policy_tokens += rollout_buffer.n_policy_tokens
            self._record_rollout(trajs, rollout_buffer.n_policy_tokens, sample_s)
        callback.update_locals({"trajectories": trajs})
        callback.on_rollout_end()
        return True

    def _record_rollout(self, trajs: list[Trajectory], n_tokens: int, sample_s: float) -> None:
        stats = rollout_stats(trajs, self._env_default("episode_summary", required=False))
        for key in (*ALWAYS_LOGGED, *self._env_advertised("logged_stats", ())):  # SB3's info_keywords pattern
            if key in stats:
                self.logger.record(f"rollout/{key}", stats[key])
        self.logger.record("rollout/episodes", len(trajs))
        self.logger.record("rollout/policy_tokens", n_tokens)
        self.logger.record("time/policy_tokens", self.total_policy_tokens)
        self.logger.record("time/sample_s", sample_s, exclude="stdout")
        self._last_rollout = dict(stats, episodes=len(trajs), policy_tokens=n_tokens, sample_s=sample_s)

    def _record_groups(self) -> None:
        """With groups, the last batch's share of groups whose returns are all equal and the groups played
        to replace dropped ones (logged even when dynamic sampling left the batch empty)."""
        stats = self.sampler.group_stats if self.sampler is not None and self.config.group_size > 1 else None
        if stats is not None:
            self.logger.record("rollout/zero_variance_groups", stats["zero_variance_groups"])
            self.logger.record("rollout/resampled_groups", stats["resampled_groups"])

    def sample_episodes(self, n: int | None = None, *, env: VecEnv | None = None,
                        generator: th.Generator | None = None, temperature: float | None = None,
                        deterministic: bool = False) -> list[Trajectory]:
        """``n`` (default ``n_episodes``) episodes of the current policy (no grad) in ``env`` (default
        ``self.env`` itself, stepped as training does), for experiments. Episodes of given BugFix
        tasks: :func:`agents.bugfix.evaluation.sample_episodes`.

        :param n: number of episodes
        :param env: the vector env to play
        :param generator: seeds the sampling (default: the algorithm's own sampler generator)
        :param temperature: sampling temperature (default the config's ``temperature``)
        :param deterministic: greedy decoding
        """
        gen = self.sample_generator if generator is None else generator
        temp = self.config.temperature if temperature is None else temperature
        self.policy.set_training_mode(False)
        if env is None or env is self.env:
            if self.sampler is None:
                raise ValueError("this model has no environment: pass env= to the constructor, load() or set_env()")
            sampler = self.sampler
        else:
            sampler = self._make_sampler(env)
            assert sampler is not None
        with use_threads(self.torch_threads, self.device):
            return sampler.collect(self.policy.model, n or self.config.n_episodes, fresh=self.config.fresh_batches,
                                   generator=gen, temperature=temp, deterministic=deterministic)

    # ------------------------------------------------------------------ training progress
    @property
    def iteration(self) -> int:
        """The updates (PPO iterations / REINFORCE steps) done so far."""
        return int(self._iteration)

    def training_progress(self) -> dict[str, Any]:
        """How far training has come, as JSON data: the training counters (:data:`TRAINING_COUNTERS`)
        and the algorithm's own state (:meth:`_extra_state`). A model file and a run's snapshot keep it."""
        return {"counters": {key: int(getattr(self, attr)) for key, attr in TRAINING_COUNTERS.items()},
                "state": self._extra_state()}

    def set_training_progress(self, progress: dict[str, Any]) -> None:
        """Put back what :meth:`training_progress` returned."""
        for key, attr in TRAINING_COUNTERS.items():
            setattr(self, attr, int(progress["counters"][key]))
        self._set_extra_state(progress.get("state") or {})

    def sampling_state(self) -> dict[str, Any]:
        """The sampler's episodes in progress and the random generators of sampling and of the
        minibatches (TokenPPO's), as JSON data: with the envs' own state, what a resumed run needs."""
        shuffle_rng = getattr(self, "_shuffle_rng", None)  # TokenPPO's minibatch generator
        return {"sampler": self.sampler.get_state() if self.sampler is not None else None,
                "sample_generator": self.sample_generator.get_state().tolist(),
                "shuffle_rng": shuffle_rng.bit_generator.state if shuffle_rng is not None else None}

    def set_sampling_state(self, state: dict[str, Any]) -> None:
        """Put back what :meth:`sampling_state` returned; the next ``learn`` continues the restored
        episodes (it does not reset the envs, whose state the caller has put back)."""
        assert self.sampler is not None and self.env is not None, "set_sampling_state needs the model's env"
        self.sampler.set_state(state["sampler"])
        self.sample_generator.set_state(th.tensor(state["sample_generator"], dtype=th.uint8))
        if state["shuffle_rng"] is not None:
            rng = np.random.default_rng()
            rng.bit_generator.state = state["shuffle_rng"]
            self._shuffle_rng = rng
        self._last_obs = np.zeros(self.env.num_envs, dtype=object)  # SB3 must not reset the envs in learn()

    def _extra_state(self) -> dict[str, Any]:
        """Training state beyond weights and counters that a saved model keeps (JSON data)."""
        return {}

    def _set_extra_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`_extra_state` returned."""

    # ------------------------------------------------------------------ files
    def saved_arguments(self) -> dict[str, Any]:
        """The constructor arguments a model file keeps (:meth:`saved_settings`), as JSON data."""
        return {name: checkpoint.saved_value(value, name) for name, value in self.saved_settings().items()}

    @classmethod
    def arguments_from_saved(cls, saved: dict[str, Any], where: str) -> dict[str, Any]:
        """Constructor arguments from a model file's saved ones, older files' in today's names
        (:meth:`upgrade_saved_args`).

        :param saved: the file's ``args``
        :param where: the file's name, for messages
        """
        args = cls.upgrade_saved_args(dict(saved))
        unknown = sorted(set(args) - set(cls.config_class.saved_names()))
        if unknown:
            raise checkpoint.ModelFileError(f"{where}: unknown argument {unknown[0]!r} for {cls.__name__} (an older "
                                            "file's setting is read by the upgrade a module registers: "
                                            "register_saved_settings_upgrade; import that module first)")
        return args

    def model_file_contents(self) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        """What :meth:`save` writes, as SB3's ``save`` assembles it: the plain ``data`` (algorithm,
        arguments, seed, policy kwargs, spaces, training progress) and the state dicts (``params``)."""
        data = {"algorithm": type(self).__name__, "args": self.saved_arguments(), "seed": self.seed,
                "policy_kwargs": checkpoint.policy_kwargs_to_json(  # an HF model travels as hf_config + weights
                    {k: v for k, v in self.policy_kwargs.items() if k != "model"}),
                "spaces": {"observation": checkpoint.space_to_json(self.observation_space),
                           "action": checkpoint.space_to_json(self.action_space)},
                **self.training_progress()}
        params = {"policy": self.policy.state_dict(), "policy.optimizer": self.policy.optimizer.state_dict()}
        ref = getattr(self, "ref_model", None)  # TokenPPO's reference model, with a KL penalty
        if ref is not None:
            params["ref_model"] = ref.state_dict()
        return data, params

    def save(self, path: str | pathlib.Path | Any, exclude: Any = None, include: Any = None) -> None:
        """Save to SB3's zip layout without any pickled entry (:func:`agents.files.checkpoint.write`)."""
        checkpoint.write(path, *self.model_file_contents())

    @classmethod
    def load(cls: type[SelfTokenAlgorithm], path: str | pathlib.Path | Any, env: GymEnv | None = None,
             device: th.device | str = "cpu", custom_objects: dict[str, Any] | None = None,
             print_system_info: bool = False, force_reset: bool = True, **kwargs: Any) -> SelfTokenAlgorithm:
        """Load a model saved by :meth:`save`; nothing in the file is unpickled (:func:`agents.files.checkpoint.read`).

        :param path: the model file
        :param env: the env to continue with (its spaces must match the saved ones), or None
        :param device: torch device
        :param kwargs: constructor arguments that replace the saved ones
        :raises FileNotFoundError: no such file
        :raises ValueError: a corrupt, oversized, foreign or unsafe file (one line)
        """
        model_file = checkpoint.read(path)
        data, where = model_file.data, model_file.name
        if data["algorithm"] != cls.__name__:
            saved = printable(data["algorithm"], 40)
            raise checkpoint.ModelFileError(f"{where} holds a {saved!r} model; load it with {saved}.load")
        args = dict(cls.arguments_from_saved(dict(data["args"]), where), **kwargs)
        saved_spaces = [checkpoint.space_from_json(data["spaces"].get(key)) for key in ("observation", "action")]
        if env is not None:
            env = cls._wrap_env(env, int(args.get("verbose", 0)))
            if [env.observation_space, env.action_space] != saved_spaces:
                raise ValueError(f"the env's spaces ({env.observation_space}, {env.action_space}) differ from the "
                                 f"saved model's ({saved_spaces[0]}, {saved_spaces[1]})")
        try:
            model = cls("TinyAgentPolicy", env=None, base_agent=None, seed=data.get("seed"), device=device,
                        policy_kwargs=cls._upgrade_policy_kwargs(
                            checkpoint.policy_kwargs_from_json(data["policy_kwargs"], where)),
                        _init_setup_model=False, **args)
            model._set_up_from_file(model_file, saved_spaces, 1 if env is None else env.num_envs)
        except checkpoint.ModelFileError:
            raise
        except ImportError as e:  # an HF tokenizer or model in a venv without transformers
            raise checkpoint.ModelFileError(f"{where}: {printable(str(e), 200)}") from None
        except Exception as e:  # noqa: BLE001 - any field the classes refuse (a ZeroDivisionError of a 0 as much)
            raise checkpoint.ModelFileError(f"{where} does not fit {cls.__name__}: {type(e).__name__}: "
                                            f"{printable(str(e).splitlines()[0], 200) if str(e) else ''}") from None
        if env is not None:
            model.set_env(env)
        return model

    def _set_up_from_file(self, model_file: checkpoint.ModelFile, saved_spaces: list[spaces.Space | None],
                          n_envs: int) -> None:
        """Build the networks for the saved spaces, then load the file's weights and training progress."""
        self.observation_space, self.action_space = saved_spaces
        self.n_envs = n_envs
        self._setup_model()
        params = model_file.params
        self.policy.load_state_dict(params["policy"])
        if "policy.optimizer" in params:
            self.policy.optimizer.load_state_dict(params["policy.optimizer"])
        ref = getattr(self, "ref_model", None)
        if ref is not None and "ref_model" in params:
            ref.load_state_dict(params["ref_model"])
        self.set_training_progress({"counters": model_file.data["counters"], "state": model_file.data.get("state")})

    def set_parameters(self, load_path_or_dict: str | dict[str, Any], exact_match: bool = True,
                       device: th.device | str = "auto") -> None:
        """SB3's ``set_parameters``; a path is read with :func:`agents.files.checkpoint.read` (no unpickling)."""
        if not isinstance(load_path_or_dict, dict):
            load_path_or_dict = checkpoint.read(load_path_or_dict).params
        super().set_parameters(load_path_or_dict, exact_match=exact_match, device=device)

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "sampler", "sample_generator", "_base_model", "_last_rollout",
                "first_update_dump"]


# ---------------------------------------------------------------------- helpers
def register_saved_settings_upgrade(algorithm: str) -> Callable[[Upgrade], Upgrade]:
    """Decorator: ``algorithm``'s (a class name) model files are read through this function of their saved
    settings, which returns them in today's names (:data:`SAVED_SETTINGS_UPGRADES`)."""
    def add(upgrade: Upgrade) -> Upgrade:
        SAVED_SETTINGS_UPGRADES.setdefault(algorithm, []).append(upgrade)
        return upgrade

    return add


def register_saved_policy_upgrade(upgrade: Upgrade) -> Upgrade:
    """Decorator: every model file's ``policy_kwargs`` are read through this function, which returns them in
    today's form (:data:`SAVED_POLICY_UPGRADES`)."""
    SAVED_POLICY_UPGRADES.append(upgrade)
    return upgrade


def _is_monitored(env: gym.Env) -> bool:
    from stable_baselines3.common.env_util import is_wrapped

    return is_wrapped(env, Monitor)
