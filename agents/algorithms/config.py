"""One definition per setting: the hyperparameters of TokenPPO and Reinforce as config dataclasses.

Each field is one setting: its type, its default, its one-line doc (``help``), its check and, for
a setting that names something, its choices. An algorithm takes one config object
(``TokenPPO("TinyAgentPolicy", env, config=PPOConfig(clip_range=0.1))``, TRL's ``args=``) and reads
``self.config.x``; SB3-style keyword arguments (``TokenPPO(..., clip_range=0.1)``) are sugar that
builds the same object (:meth:`Config.build`). The fields marked ``saved`` travel with the model, and
:func:`argparse_kwargs` turns a field into ``ArgumentParser.add_argument`` keyword arguments.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, ClassVar, Optional, Sequence, TypeVar

import numpy as np

from agents.algorithms.advantages import ADVANTAGE_ESTIMATORS, EPISODE_BASELINES
from agents.algorithms.auxiliary import check_aux_losses
from agents.algorithms.group_advantages import SCALE_REWARDS
from agents.algorithms.losses import KL_KINDS, LOSS_AGGREGATIONS, POLICY_LOSSES, check_dual_clip
from agents.algorithms.registry import Registry, check_choice
from agents.decoding.decoder import DEFAULT_MAX_CALL_TOKENS
from agents.rollout.sampler import GroupSampling, check_groups

C = TypeVar("C", bound="Config")
#: ``check(name, value)`` raises a one-line ``ValueError`` for a bad value
Check = Callable[[str, Any], None]


def setting(default: Any, help: str, check: Check | None = None, *, choices: Sequence[str] | Registry | None = None,
            saved: bool = True) -> Any:
    """A config field: ``default`` and its ``help``, ``check`` and ``choices`` (a tuple or a registry,
    whose names are read when checked); ``saved=False`` keeps it out of saved model files."""
    return dataclasses.field(default=default, metadata=dict(help=help, check=check, choices=choices, saved=saved))


def override(config: type, name: str, default: Any, help: str | None = None) -> Any:
    """The field ``name`` of ``config`` with another default (and help), for a subclass to redeclare."""
    meta = dict(_field(config, name).metadata)
    return dataclasses.field(default=default, metadata=dict(meta, help=help or meta["help"]))


def _field(config: type, name: str) -> dataclasses.Field:
    return {field.name: field for field in dataclasses.fields(config)}[name]


# ---------------------------------------------------------------------- checks
def _is_int(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, np.integer))


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float, np.number)) and math.isfinite(value)


def positive_int(name: str, value: Any) -> None:
    if not _is_int(value) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def non_negative_int(name: str, value: Any) -> None:
    if not _is_int(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")


def positive(name: str, value: Any) -> None:
    """A finite number > 0, or an SB3 schedule (a callable of the progress remaining)."""
    if not callable(value) and (not _is_number(value) or value <= 0):
        raise ValueError(f"{name} must be a positive number, got {value!r}")


def non_negative(name: str, value: Any) -> None:
    if not _is_number(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def finite(name: str, value: Any) -> None:
    if not _is_number(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")


def unit_interval(name: str, value: Any) -> None:
    if not _is_number(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {value!r}")


def call_tokens(name: str, value: Any) -> None:
    """A call's token limit, 1 to 4096 (the policy checks it against its model's context too)."""
    if not _is_int(value) or not 1 <= value <= 4096:
        raise ValueError(f"{name} must be a whole number from 1 to 4096, got {value!r}")


def temperature(name: str, value: Any) -> None:
    """A sampling temperature from 0.001 to 100: below it float32 logits divided by it overflow (1e-300 is 0
    in float32), above it sampling is uniform noise."""
    if not _is_number(value) or not 1e-3 <= value <= 100:
        raise ValueError(f"{name} must be a number from 0.001 to 100, got {value!r}")


def dual_clip(name: str, value: Any) -> None:
    check_dual_clip(value)


def or_none(check: Check) -> Check:
    """``check``, or None."""
    def check_or_none(name: str, value: Any) -> None:
        if value is not None:
            check(name, value)

    check_or_none.__name__ = f"{check.__name__}_or_none"
    check_or_none.unless_none = check  # type: ignore[attr-defined]  # the check of a value (the flags read it)
    return check_or_none


def choices_of(field: dataclasses.Field) -> tuple[str, ...] | None:
    """The names a field may take (a registry's as registered now), or None."""
    choices = field.metadata.get("choices")
    if isinstance(choices, Registry):
        return choices.names()
    return None if choices is None else tuple(choices)


# ---------------------------------------------------------------------- the configs
@dataclasses.dataclass
class Config:
    """Base of the algorithms' configs: checks every field when built."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            choices = choices_of(field)
            if choices is not None:
                check_choice(field.name, value, choices)
            if field.metadata.get("check") is not None:
                field.metadata["check"](field.name, value)
        self.check_together()

    def check_together(self) -> None:
        """Checks that read several fields (subclasses extend it)."""

    @classmethod
    def from_kwargs(cls: type[C], owner: str, kwargs: dict[str, Any]) -> C:
        """The config of these keyword arguments; an unknown one is a one-line ``TypeError``."""
        names = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"{owner}() got an unexpected keyword argument {unknown[0]!r}")
        return cls(**kwargs)

    @classmethod
    def build(cls: type[C], owner: str, config: C | None, kwargs: dict[str, Any]) -> C:
        """``config`` (default: the defaults) with ``kwargs`` replacing its fields, checked; a config of
        another class or an unknown keyword is a one-line ``TypeError``."""
        if config is None:
            return cls.from_kwargs(owner, kwargs)
        if not isinstance(config, cls):
            raise TypeError(f"{owner}(config=...) takes a {cls.__name__}, got {type(config).__name__}")
        unknown = sorted(set(kwargs) - {field.name for field in dataclasses.fields(cls)})
        if unknown:
            raise TypeError(f"{owner}() got an unexpected keyword argument {unknown[0]!r}")
        return dataclasses.replace(config, **kwargs)

    @classmethod
    def saved_names(cls) -> tuple[str, ...]:
        """The fields saved with a model, in order."""
        return tuple(field.name for field in dataclasses.fields(cls) if field.metadata.get("saved", True))

    def as_dict(self) -> dict[str, Any]:
        """Every field by name (values as given, not copied)."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}


@dataclasses.dataclass
class OnPolicyConfig(Config):
    """What TokenPPO and Reinforce share."""

    learning_rate: Any = setting(1e-3, "Adam learning rate (a float or SB3 schedule of progress remaining)", positive)
    n_episodes: int = setting(64, "at least this many whole episodes per iteration (SB3's n_steps slot)",
                              positive_int)
    gamma: float = setting(1.0, "discount per policy token (book: 1)", unit_interval)
    max_grad_norm: float = setting(1.0, "gradient-norm clip", positive)
    temperature: float = setting(1.0, "sampling temperature of the rollouts (0.001 to 100)", temperature)
    max_call_tokens: int = setting(DEFAULT_MAX_CALL_TOKENS, "the most tokens one call may have (1 to 4096)",
                                   call_tokens)
    fresh_batches: bool = setting(True, "on-policy batches: each iteration resets the envs and every env records "
                                  "its next ceil(n_episodes / n_envs) episodes; False lets episodes run on into "
                                  "the next batch (docs/ppo.md \"The environment contract\")")
    loss_mode: str = setting("token_mean", "loss aggregation, a name in agents.algorithms.losses.LOSS_AGGREGATIONS",
                             choices=LOSS_AGGREGATIONS)
    loss_norm_const: Optional[float] = setting(None, "the constant C of loss_mode='constant'", or_none(positive))
    forward_chunk: Optional[int] = setting(4, "score minibatches in length-sorted chunks of this many trajectories, "
                                           "each trimmed to its own length (same loss, far less padding); None = one "
                                           "padded pass", or_none(positive_int))
    policy_loss: str = setting("ppo_clip", "the policy loss, a name in agents.algorithms.losses.POLICY_LOSSES",
                               choices=POLICY_LOSSES)
    adv_estimator: str = setting("gae", "the advantage estimator, a name in "
                                 "agents.algorithms.advantages.ADVANTAGE_ESTIMATORS", choices=ADVANTAGE_ESTIMATORS)
    stats_window_size: Optional[int] = setting(None, "episodes averaged by rollout/ep_rew_mean; default n_episodes",
                                               or_none(positive_int), saved=False)
    async_envs: bool = setting(False, "step each env as soon as its call is written (a vector env with send / "
                               "receive, e.g. agents.RayVecEnv); faster with slow tools, not reproducible",
                               saved=False)
    group_size: int = setting(GroupSampling.group_size, "G: episodes per group, each group's G episodes start from "
                              "one reset (the same seed, so the same task); the batch holds ceil(n_episodes / G) "
                              "groups; 1 = no groups", positive_int)
    drop_zero_variance_groups: bool = setting(GroupSampling.drop_zero_variance_groups, "dynamic sampling: drop the "
                                              "groups whose returns are all equal and play more groups until the "
                                              "batch is full (needs group_size >= 2)")
    max_resample_rounds: int = setting(GroupSampling.max_resample_rounds, "with drop_zero_variance_groups, the most "
                                       "extra plays of groups per batch; a batch still short then is trained as it "
                                       "is, with a warning",
                                       non_negative_int)
    scale_rewards: str = setting("group", "the group estimators' std (TRL's name): 'group' (each group's), 'batch' "
                                 "(the whole batch's) or 'none' (no division, Dr. GRPO's)", choices=SCALE_REWARDS)
    turn_gamma: float = setting(1.0, "discount per turn (one model call) of the per-turn estimators (rebn, gigpo)",
                                unit_interval)
    step_advantage_weight: float = setting(1.0, "GiGPO's omega: the weight of its step-level advantage", non_negative)
    episode_baseline: str = setting("episode", "GiGPO's episode-level group statistics: 'episode' (each episode "
                                    "counted once, the paper's) or 'step_rows' (each episode counted once per turn, "
                                    "verl-agent's step rows)", choices=EPISODE_BASELINES)
    mask_truncated_completions: bool = setting(False, "TRL's name: an episode that ended truncated (out of turns, "
                                               "not terminated) gets no policy loss (its tokens leave the loss "
                                               "mask; its return still counts in the advantages)")
    preset: Optional[str] = setting(None, "the named algorithm these settings came from (a name in "
                                    "agents.algorithms.presets.ALGORITHMS), or None; kept in saved files")

    def sb3_arguments(self) -> dict[str, Any]:
        """The values of SB3's own ``OnPolicyAlgorithm`` slots, which its machinery reads (the learning-rate
        schedule, the buffer's ``gamma``); no critic and no entropy term here, so those slots hold zeros."""
        return dict(learning_rate=self.learning_rate, gamma=self.gamma, max_grad_norm=self.max_grad_norm,
                    gae_lambda=1.0, ent_coef=0.0, vf_coef=0.0)

    def check_together(self) -> None:
        if self.loss_mode == "constant" and self.loss_norm_const is None:
            raise ValueError("loss_mode='constant' needs loss_norm_const, e.g. n_episodes * max_policy_tokens")
        check_groups(self.group_size, self.drop_zero_variance_groups, self.max_resample_rounds, self.async_envs)
        if self.group_size > 1 and not self.fresh_batches:
            raise ValueError(f"group_size={self.group_size} plays fresh batches only (every group starts from its "
                             "own reset): use fresh_batches=True")


@dataclasses.dataclass
class PPOConfig(OnPolicyConfig):
    """TokenPPO's settings (docs/ppo.md "Parameters")."""

    gae_lambda: float = setting(1.0, "GAE lambda (book: 1 or 0.95)", unit_interval)
    ent_coef: float = setting(0.0, "entropy bonus coefficient", non_negative)
    vf_coef: float = setting(0.5, "value-loss coefficient (the value loss already has the 0.5 factor)",
                             non_negative)
    batch_size: Optional[int] = setting(None, "trajectories per minibatch; default ceil(episodes / n_minibatches)",
                                        or_none(positive_int))
    n_epochs: int = setting(4, "passes over each batch", positive_int)
    n_minibatches: int = setting(4, "minibatches per epoch when batch_size is None", positive_int)
    clip_range: Any = setting(0.2, "epsilon_low of the ratio clip (float or schedule)", positive)
    clip_range_high: Optional[float] = setting(None, "epsilon_high (clip-higher); None = clip_range",
                                               or_none(positive))
    clip_range_vf: Optional[float] = setting(0.2, "value clip epsilon_v; None turns value clipping off",
                                             or_none(positive))
    dual_clip: Optional[float] = setting(3.0, "dual-clip constant c > 1 for negative advantages; None = off",
                                         dual_clip)
    normalize_advantage: bool = setting(True, "whiten advantages over all policy tokens of the batch")
    target_kl: Optional[float] = setting(0.02, "KL (k3) target for early stopping; None = off. The default is the "
                                         "book's 0.02 (docs/ppo.md has the runs behind it)", or_none(positive))
    target_kl_mode: str = setting("minibatch", "'minibatch' (SB3: stop before a step whose minibatch KL exceeds "
                                  "1.5 * target_kl) or 'epoch' (book: stop after an epoch whose mean KL exceeds "
                                  "target_kl)", choices=("minibatch", "epoch"))
    kl_coef: float = setting(0.0, "coefficient of the KL penalty to the frozen reference (initial) policy; 0 = off",
                             non_negative)
    kl_estimator: str = setting("k3", "'k1', 'k2' or 'k3' for that penalty", choices=KL_KINDS)
    kl_reward_coef: float = setting(0.0, "KL in the reward (verl's use_kl_in_reward, TRL RLOO's beta): coef * the "
                                    "KL of each policy token to the frozen reference policy is subtracted from its "
                                    "reward (so the episode return loses coef * the sum) before the advantage "
                                    "estimator; 0 = off", non_negative)
    kl_reward_estimator: str = setting("k1", "'k1' (the references'), 'k2' or 'k3' for the KL in the reward",
                                       choices=KL_KINDS)
    recompute_old_logp: bool = setting(True, "recompute pi_old's log-probs with one trainer pass before the update "
                                       "(True) or use the sampler's sample_logp (False)")
    critic_warmup_steps: int = setting(50, "Adam steps regressing the value head on Monte-Carlo returns of the first "
                                       "batch, before the first policy update (0 = off)", non_negative_int)
    critic_warmup_lr: float = setting(3e-3, "learning rate of that warm-up", positive)
    max_is_weight: float = setting(5.0, "cispo's ABSOLUTE cap on the importance weight pi / pi_old (TRL's "
                                   "epsilon_high under loss_type='cispo')", positive)
    aux_losses: Sequence[Any] = setting((), "auxiliary losses added to each minibatch's loss "
                                        "(agents.algorithms.auxiliary.AuxLoss objects or their specs)",
                                        check_aux_losses)

    def sb3_arguments(self) -> dict[str, Any]:
        return dict(super().sb3_arguments(), gae_lambda=self.gae_lambda, ent_coef=self.ent_coef, vf_coef=self.vf_coef)


@dataclasses.dataclass
class ReinforceConfig(OnPolicyConfig):
    """Reinforce's settings (the book's §6.7)."""

    BASELINES: ClassVar[tuple[str, ...]] = ("ema", "batch_mean", "none")

    learning_rate: Any = override(OnPolicyConfig, "learning_rate", 2e-3, "Adam learning rate (book: 2e-3)")
    forward_chunk: Optional[int] = override(OnPolicyConfig, "forward_chunk", 8)
    policy_loss: str = override(OnPolicyConfig, "policy_loss", "reinforce")
    adv_estimator: str = override(OnPolicyConfig, "adv_estimator", "return_minus_baseline")
    baseline: str = setting("ema", "'ema' (book), 'batch_mean' or 'none'", choices=BASELINES)
    baseline_init: Optional[float] = setting(None, "initial EMA value; None starts it at the first batch's mean "
                                             "return", or_none(finite))
    ema_decay: float = setting(0.9, "EMA weight of the old value (book: 0.9)", unit_interval)
    use_reward_to_go: bool = setting(False, "per-token advantages G_t - b (book §6.5) instead of R - b")
    skip_zero: bool = setting(True, "skip the optimizer step when every advantage is zero")


# ---------------------------------------------------------------------- docs and flags from the fields
def settings_doc(config: type, indent: str = "    ") -> str:
    """``:param name: help`` lines for every field of ``config`` (for a class docstring)."""
    return "\n".join(f"{indent}:param {field.name}: {field.metadata['help']} (default {field.default!r})"
                     for field in dataclasses.fields(config))


def _optional(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse_or_none(text: str) -> Any:
        return None if text.lower() == "none" else parse(text)

    parse_or_none.__name__ = getattr(parse, "__name__", "value")
    return parse_or_none


def _boolean(text: str) -> bool:
    if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError(f"not a boolean: {text!r}")
    return text.lower() in ("true", "1", "yes")


_PARSERS: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "str": str, "bool": _boolean, "Any": float}


def argparse_kwargs(config: type, name: str) -> dict[str, Any]:
    """``ArgumentParser.add_argument`` keyword arguments for the field ``name`` of ``config``: its
    ``type`` (``none`` reads as None where the field may be None), ``default``, ``help`` and ``choices``."""
    field = _field(config, name)
    kind = str(field.type)
    optional = kind.startswith("Optional[")
    parse = _PARSERS.get(kind[len("Optional["):-1] if optional else kind)
    if parse is None:
        raise ValueError(f"{name} ({kind}) is not a command-line setting")
    out: dict[str, Any] = dict(type=_optional(parse) if optional else parse, default=field.default,
                               help=field.metadata["help"])
    choices = choices_of(field)
    if choices is not None:
        out["choices"] = choices
    return out
