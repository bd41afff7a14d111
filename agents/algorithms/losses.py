"""Per-token policy and value losses, shared by REINFORCE and PPO.

Every tensor here is *per predicted token* and aligned as in ``docs/CONTRACT.md``:
shape ``[B, T-1]`` (written ``[B, T]`` below), position ``t`` holds quantities of
predicting ``ids[t+1]``; ``mask`` is the float 0/1 ``policy_mask`` (1 on policy tokens).

One function per idea (book ch. 6 and 8):

* :func:`aggregate_loss` turns per-token terms into a scalar; the *mode* (a name in
  :data:`LOSS_AGGREGATIONS`) sets the weight of every policy token (book §6.6).
* :func:`reinforce_loss` is the surrogate ``-A * log pi`` (book §6.6, eq. 6.2).
* :func:`clipped_policy_loss` is PPO's clipped surrogate with clip-higher and dual
  clip (book §8.2, eq. 8.3), plus the diagnostics of §8.5.
* :func:`clipped_value_loss` is the PPO2-style clipped critic loss (book §8.4).
* :data:`POLICY_LOSSES` names the policy losses the algorithms pick by ``policy_loss``
  (``ppo_clip``, ``reinforce``, and the GRPO family's ``gspo`` (a sequence-level ratio) and
  ``cispo`` (a clipped stop-gradient weight) and ``gmpo`` (a clipped geometric mean of the token
  ratios)); :func:`register_policy_loss` adds one.
* ``seq_mean_token_sum_norm`` (Dr. GRPO's constant normaliser) is one more aggregation mode.
* :func:`kl_estimate` gives the k1 / k2 / k3 per-token KL estimators.
* :func:`tool_output_mask` marks the tool-output tokens an auxiliary loss predicts.

Entropy bonuses are left to the caller (``entropy`` comes from the model's forward).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from bugfix_gym.contract.tokens import OWNER_POLICY, OWNER_TOOL

from agents.algorithms.registry import Registry

KL_KINDS = ("k1", "k2", "k3")


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    """Mean of ``x`` where ``mask`` is 1 (book §6.2).

    :param x: values ``[B, T]`` (any shape broadcastable with ``mask``).
    :param mask: float 0/1 mask of the same shape.
    :param dim: ``None`` reduces everything to a scalar; an int reduces that dim only.
    :return: the masked mean; rows with an empty mask give 0 (not NaN).
    """
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1e-8)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1e-8)


# ---------------------------------------------------------------- loss aggregations (book §6.6)
#: ``fn(per_token [B, T], mask [B, T], norm_const) -> scalar``: the weight of every policy token
LOSS_AGGREGATIONS: Registry[Callable[[torch.Tensor, torch.Tensor, Optional[float]], torch.Tensor]] = \
    Registry("loss aggregation mode")
register_loss_agg = LOSS_AGGREGATIONS.register
get_loss_agg = LOSS_AGGREGATIONS.get


@register_loss_agg("token_mean")
def token_mean(per_token: torch.Tensor, mask: torch.Tensor, norm_const: Optional[float] = None) -> torch.Tensor:
    """Each policy token of the batch weighs ``1 / sum(mask)``."""
    return masked_mean(per_token, mask)


@register_loss_agg("seq_mean_token_sum")
def seq_mean_token_sum(per_token: torch.Tensor, mask: torch.Tensor, norm_const: Optional[float] = None
                       ) -> torch.Tensor:
    """Sum within a trajectory, mean over trajectories (eq. 6.2): each token weighs ``1 / B``."""
    return (per_token * mask).sum(-1).mean()


@register_loss_agg("seq_mean_token_mean")
def seq_mean_token_mean(per_token: torch.Tensor, mask: torch.Tensor, norm_const: Optional[float] = None
                        ) -> torch.Tensor:
    """Mean within a trajectory, then mean over trajectories: a token of row ``n`` weighs ``1 / (B * L_n)``."""
    return masked_mean(per_token, mask, dim=-1).mean()


@register_loss_agg("constant")
def constant(per_token: torch.Tensor, mask: torch.Tensor, norm_const: Optional[float] = None) -> torch.Tensor:
    """Sum over the batch divided by a fixed constant ``C`` (Dr. GRPO style): each token weighs ``1 / C``."""
    if norm_const is None:
        raise ValueError("mode='constant' needs norm_const, e.g. batch_size * max_policy_tokens")
    if norm_const <= 0:
        raise ValueError(f"norm_const must be positive, got {norm_const!r}")
    return (per_token * mask).sum() / norm_const


#: the built-in aggregation modes (:data:`LOSS_AGGREGATIONS` also holds any registered later)
AGGREGATION_MODES = LOSS_AGGREGATIONS.names()


@register_loss_agg("seq_mean_token_sum_norm")
def seq_mean_token_sum_norm(per_token: torch.Tensor, mask: torch.Tensor, norm_const: Optional[float] = None
                            ) -> torch.Tensor:
    """Dr. GRPO's normaliser (Liu et al. 2025, arXiv 2503.20783): ``sum m*l / (B * L_max)``, each
    token weighs ``1 / (B * L_max)`` with ``L_max = norm_const`` a constant (the most policy tokens an
    episode may have), so no length bias. TRL's ``loss_type='dr_grpo'`` (``B * max_completion_length``);
    verl's ``seq-mean-token-sum-norm`` divides by ``L_max`` alone (no ``B``)."""
    if norm_const is None:
        raise ValueError("mode='seq_mean_token_sum_norm' needs norm_const = L_max, the most policy tokens "
                         "an episode may have")
    if norm_const <= 0:
        raise ValueError(f"norm_const must be positive, got {norm_const!r}")
    return (per_token * mask).sum() / (per_token.shape[0] * norm_const)


def aggregate_loss(per_token: torch.Tensor, mask: torch.Tensor, mode: str = "token_mean",
                   norm_const: Optional[float] = None) -> torch.Tensor:
    """Reduce per-token terms ``[B, T]`` under ``mask`` to a scalar; ``mode`` sets each token's weight.

    With ``L_n`` the number of policy tokens of row ``n`` and ``B`` the number of rows
    (book §6.6 table):

    ==========================  ==========================  =======================
    mode                        loss                        weight of one token
    ==========================  ==========================  =======================
    ``token_mean``              sum m*l / sum_k L_k         1 / sum_k L_k
    ``seq_mean_token_sum``      (1/B) sum_n sum_i m*l       1 / B
    ``seq_mean_token_mean``     (1/B) sum_n (1/L_n) sum_i   1 / (B * L_n)
    ``constant``                sum m*l / C                 1 / C
    ==========================  ==========================  =======================

    :param per_token: per-token loss terms ``[B, T]``.
    :param mask: float 0/1 policy mask ``[B, T]``.
    :param mode: a name in :data:`LOSS_AGGREGATIONS` (the built-ins: :data:`AGGREGATION_MODES`).
    :param norm_const: the constant ``C`` for ``mode='constant'`` (e.g. batch_size * max_policy_tokens).
    :return: scalar loss.
    """
    return get_loss_agg(mode)(per_token, mask.to(per_token.dtype), norm_const)


def _per_token_advantages(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``[B]`` (one per trajectory) or ``[B, T]`` advantages -> detached ``[B, T]``-broadcastable tensor."""
    adv = advantages.detach().to(like.dtype)  # advantages are constants in the surrogate (book §6.8)
    if adv.dim() == 1:
        adv = adv[:, None]  # one advantage per trajectory -> [B, 1], broadcast over T
    if adv.dim() != 2 or adv.shape[0] != like.shape[0] or adv.shape[1] not in (1, like.shape[1]):
        raise ValueError(f"advantages must be [B], [B, 1] or {tuple(like.shape)}, got {tuple(advantages.shape)}")
    return adv


def reinforce_loss(logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                   mode: str = "token_mean", norm_const: Optional[float] = None) -> torch.Tensor:
    """REINFORCE surrogate ``-A * log pi`` on policy tokens (book §6.6).

    Its gradient is the score-function estimator (eq. 6.1 / 6.3); its *value* means nothing
    (book §6.1), so log reward and pass rate, not this.

    :param logp: log-probs of the taken tokens ``[B, T]``, with grad.
    :param advantages: ``[B]`` (one per trajectory) or ``[B, T]`` (per token); detached here.
    :param mask: policy mask ``[B, T]``.
    :param mode: aggregation mode, see :func:`aggregate_loss`.
    :param norm_const: constant for ``mode='constant'``.
    """
    adv = _per_token_advantages(advantages, logp)
    return aggregate_loss(-adv * logp, mask, mode, norm_const)


def clipped_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                        clip_low: float = 0.2, clip_high: float = 0.2, dual_clip: Optional[float] = 3.0,
                        mode: str = "token_mean", norm_const: Optional[float] = None
                        ) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate with clip-higher and dual clip (book §8.2, eq. 8.3).

    Per policy token, with ``rho = exp(logp - old_logp)``::

        obj = min(rho * A, clip(rho, 1 - clip_low, 1 + clip_high) * A)        # Schulman et al. 2017
        obj = max(obj, c * A)          where A < 0 and dual_clip=c is set   # Ye et al. 2020
        loss = aggregate(-obj)

    Clip-higher (``clip_high > clip_low``) is DAPO's (Yu et al. 2025). The dual clip puts a
    floor ``c * A`` under the objective of negative-advantage tokens, so a stale token with a
    huge ratio cannot dominate the batch (book: ratios 2, 5, 20 with A = -1 give loss 27
    unclipped, 2 + 3 + 3 = 8 with c = 3).

    :param logp: current log-probs ``[B, T]``, with grad.
    :param old_logp: log-probs under pi_old ``[B, T]`` (frozen; detached here).
    :param adv: advantages ``[B]`` or ``[B, T]`` (detached here).
    :param mask: policy mask ``[B, T]``.
    :param clip_low: epsilon_low, the lower clip is ``1 - clip_low``.
    :param clip_high: epsilon_high, the upper clip is ``1 + clip_high``.
    :param dual_clip: the constant ``c > 1`` of the dual clip, or ``None`` to turn it off.
    :param mode: aggregation mode, see :func:`aggregate_loss`.
    :param norm_const: constant for ``mode='constant'``.
    :return: ``(loss, stats)``; stats are python floats over masked tokens:
        ``clip_frac`` (share of tokens where the clipped branch is strictly smaller, i.e. the
        ratio clip zeroes the gradient), ``dual_clip_frac`` (share where the dual-clip floor
        is active), ``approx_kl`` (k3 estimate of KL(pi_old || pi_theta), E_old[rho - 1 - log rho]),
        ``ratio_min``, ``ratio_max``.
    """
    check_dual_clip(dual_clip)
    adv = _per_token_advantages(adv, logp)
    log_ratio = logp - old_logp.detach()  # [B, T]
    ratio = torch.exp(log_ratio)  # rho = pi_theta / pi_old per token
    obj, clipped, dual_active = _clipped_surrogate(ratio, adv, clip_low, clip_high, dual_clip)
    return aggregate_loss(-obj, mask, mode, norm_const), _clip_stats(ratio, log_ratio, clipped, dual_active, mask)


def _clipped_surrogate(ratio: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float,
                       dual_clip: Optional[float]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The objective of :func:`clipped_policy_loss` for any ratio ``[B, T]`` (a token's or a sequence's):
    ``(obj, clipped, dual_active)``, all ``[B, T]``."""
    surr = ratio * adv  # unclipped surrogate
    surr_clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    obj = torch.minimum(surr, surr_clipped)  # pessimistic bound (eq. 8.3)
    clipped = surr_clipped < surr  # clipped branch strictly smaller -> zero gradient
    if dual_clip is not None:
        floor = dual_clip * adv  # dual clip (Ye et al. 2020): objective >= c * A when A < 0
        dual_active = (adv < 0) & (obj < floor)
        obj = torch.where(adv < 0, torch.maximum(obj, floor), obj)
    else:
        dual_active = torch.zeros_like(clipped)
    return obj, clipped, dual_active


@torch.no_grad()
def _clip_stats(ratio: torch.Tensor, log_ratio: torch.Tensor, clipped: torch.Tensor, dual_active: torch.Tensor,
                mask: torch.Tensor) -> dict[str, float]:
    """The diagnostics of :func:`clipped_policy_loss` over masked tokens (all ``[B, T]``; book §8.5)."""
    m = mask.to(ratio.dtype)
    on = m > 0
    # k3 estimator of KL(pi_old || pi_theta) from samples of pi_old (Schulman 2020,
    # "Approximating KL divergence"): r = pi_theta / pi_old, k3 = (r - 1) - log r >= 0.
    k3 = ratio - 1.0 - log_ratio
    return dict(
        clip_frac=float(masked_mean(clipped.to(m.dtype), m)),
        dual_clip_frac=float(masked_mean(dual_active.to(m.dtype), m)),
        approx_kl=float(masked_mean(k3, m)),
        ratio_min=float(ratio[on].min()) if on.any() else 1.0,
        ratio_max=float(ratio[on].max()) if on.any() else 1.0,
    )


def check_dual_clip(dual_clip: Optional[float]) -> None:
    """The dual-clip constant is ``None`` (off) or a number ``c > 1``; else one ``ValueError``."""
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1 (typically 3) or None, got {dual_clip!r}")


# ---------------------------------------------------------------- policy losses by name
@dataclass(frozen=True)
class PolicyLossConfig:
    """What a registered policy loss may read besides the tensors.

    :param clip_low: epsilon_low of a ratio clip
    :param clip_high: epsilon_high of a ratio clip
    :param dual_clip: the dual-clip constant ``c > 1``, or None
    :param mode: the loss aggregation (a name in :data:`LOSS_AGGREGATIONS`)
    :param norm_const: the constant of ``mode='constant'`` (``L_max`` for ``seq_mean_token_sum_norm``)
    :param max_is_weight: ``cispo``'s absolute cap on the importance weight ``w = pi / pi_old``
        (TRL's ``epsilon_high`` under ``loss_type='cispo'``; verl's ``clip_ratio_high`` is relative,
        a cap of ``1 + clip_ratio_high``)
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: Optional[float] = None
    mode: str = "token_mean"
    norm_const: Optional[float] = None
    max_is_weight: float = 5.0


#: ``fn(logp [B, T], old_logp [B, T], advantages [B] or [B, T], mask [B, T], config) -> (loss, stats)``;
#: ``logp`` has grad, the rest is constant. TokenPPO reads ``clip_frac``, ``dual_clip_frac``,
#: ``approx_kl``, ``ratio_min`` and ``ratio_max`` from the stats; Reinforce reads none.
PolicyLoss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, PolicyLossConfig],
                      tuple[torch.Tensor, dict[str, float]]]
POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")
register_policy_loss = POLICY_LOSSES.register
get_policy_loss_fn = POLICY_LOSSES.get


@register_policy_loss("ppo_clip")
def ppo_clip_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                         config: PolicyLossConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate (:func:`clipped_policy_loss`), TokenPPO's default."""
    return clipped_policy_loss(logp, old_logp, advantages, mask, clip_low=config.clip_low, clip_high=config.clip_high,
                               dual_clip=config.dual_clip, mode=config.mode, norm_const=config.norm_const)


@register_policy_loss("reinforce")
def reinforce_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                          config: PolicyLossConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """The surrogate ``-A * log pi`` (:func:`reinforce_loss`; ``old_logp`` unread), Reinforce's default."""
    return reinforce_loss(logp, advantages, mask, config.mode, config.norm_const), {}


@register_policy_loss("gspo")
def gspo_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                     config: PolicyLossConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO: PPO's clip on one ratio per sequence (Zheng et al. 2025, arXiv 2507.18071), in its
    token form (GSPO-token, verl's ``compute_policy_loss_gspo``). Per episode ``n`` and policy token ``t``::

        s_n    = exp( (1 / L_n) sum_t (logp_t - old_logp_t) )        # geometric-mean ratio
        s_n,t  = sg[s_n] * pi_t / sg[pi_t]                           # value s_n, gradient s_n * grad log pi_t
        loss   = aggregate(-min(s_n,t * A, clip(s_n,t, 1 - clip_low, 1 + clip_high) * A))

    Every token of an episode shares the value and the clip of ``s_n``. With advantages constant
    per episode and ``mode='seq_mean_token_mean'`` (the paper's) the gradient equals that of the
    pure sequence objective ``-min(s_n A, clip(s_n) A)``. At the first step of a batch
    (``logp == old_logp``) ``s_n,t = 1`` and the gradient is the token ratio's: GSPO equals PPO's
    token clip while training is strictly on-policy. The paper's clip ranges are tiny
    (``clip_low=3e-4``, ``clip_high=4e-4``); the dual clip (``config.dual_clip``) applies as in
    :func:`clipped_policy_loss`.

    :return: ``(loss, stats)`` with :func:`clipped_policy_loss`'s keys; ``clip_frac`` is the share of
        policy tokens whose sequence ratio is clipped, ``approx_kl`` and the ratio range are per token.
    """
    check_dual_clip(config.dual_clip)
    adv = _per_token_advantages(advantages, logp)
    log_ratio = logp - old_logp.detach()  # [B, T]
    on_policy_tokens = torch.where(mask > 0, log_ratio, torch.zeros_like(log_ratio))  # padding cannot leak a NaN in
    seq_log_ratio = masked_mean(on_policy_tokens, mask, dim=-1).detach()  # [B] log s_n, 0 for an empty row
    log_seq_ratio = logp - logp.detach() + seq_log_ratio[:, None]  # [B, T] value log s_n, gradient of log pi_t
    seq_ratio = torch.exp(log_seq_ratio.clamp(max=10.0))  # [B, T]; the clamp keeps exp finite (verl's)
    obj, clipped, dual_active = _clipped_surrogate(seq_ratio, adv, config.clip_low, config.clip_high,
                                                   config.dual_clip)
    loss = aggregate_loss(-obj, mask, config.mode, config.norm_const)
    return loss, _clip_stats(torch.exp(log_ratio), log_ratio, clipped, dual_active, mask)


@register_policy_loss("cispo")
def cispo_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                      config: PolicyLossConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO: REINFORCE weighted by a clipped, stop-gradient importance weight (MiniMax-M1,
    arXiv 2506.13585)::

        w_t  = exp(logp_t - old_logp_t)
        loss = aggregate(-sg(min(w_t, max_is_weight)) * A * logp_t)

    Unlike PPO's clip, which zeroes the gradient of a clipped token, every token keeps the gradient
    ``-sg(w) * A * grad log pi``: the cap only bounds its weight. ``max_is_weight`` is an ABSOLUTE cap
    on ``w`` (TRL's convention: its ``epsilon_high`` under ``loss_type='cispo'``, e.g. 5); verl's
    ``clip_ratio_high`` is RELATIVE (cap ``1 + clip_ratio_high``), and verl also clips from below at
    ``1 - clip_ratio_low``; this loss has no lower clip (as TRL and the paper's experiments).
    The log-ratio is clamped to [-20, 20] before ``exp`` (verl's guard against overflow).

    :return: ``(loss, stats)`` with :func:`clipped_policy_loss`'s keys; ``clip_frac`` is the share of
        policy tokens whose weight is capped, ``dual_clip_frac`` is 0.
    """
    if not config.max_is_weight > 0:
        raise ValueError(f"max_is_weight must be positive (e.g. 5), got {config.max_is_weight!r}")
    adv = _per_token_advantages(advantages, logp)
    log_ratio = logp - old_logp.detach()  # [B, T]
    ratio = torch.exp(log_ratio.clamp(-20.0, 20.0))  # [B, T]
    weight = torch.clamp(ratio, max=config.max_is_weight).detach()  # sg(clip(w)), [B, T]
    loss = aggregate_loss(-weight * adv * logp, mask, config.mode, config.norm_const)
    capped = ratio > config.max_is_weight
    return loss, _clip_stats(ratio, log_ratio, capped, torch.zeros_like(capped), mask)


@register_policy_loss("gmpo")
def gmpo_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                     config: PolicyLossConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """GMPO: the geometric mean of the token ratios, clipped token-wise in log space (Zhao et al. 2025,
    arXiv 2507.20673). Per episode ``n`` with advantage ``A_n``, sign ``s = sgn(A_n)`` and token log-ratios
    ``l_t = logp_t - old_logp_t`` over its ``L_n`` policy tokens::

        J_n  = A_n * exp( (1 / L_n) sum_t s * min(s * l_t, s * clip(l_t, -clip_low, clip_high)) )
        loss = aggregate(-J_n on every policy token of episode n)

    The sign makes the clip pessimistic as PPO's: for ``A > 0`` a log-ratio above ``clip_high`` is
    held there, for ``A < 0`` one below ``-clip_low``; a held token has no gradient, the others get
    ``A_n * exp(mean) / L_n * grad log pi_t``. The paper's range is ``(e^-0.4, e^0.4)`` on the ratio:
    ``clip_low = clip_high = 0.4`` here, in log space. With ``mode='seq_mean_token_mean'`` the loss is
    the paper's mean of ``-J_n`` over episodes. ``A_n`` is the mean of the episode's advantages on its
    policy tokens (exact for one advantage per episode, as every outcome estimator gives). The mean
    log-ratio is clamped at 20 before ``exp`` (an overflow guard for ``A < 0``).

    :return: ``(loss, stats)`` with :func:`clipped_policy_loss`'s keys; ``clip_frac`` is the share of
        policy tokens whose log-ratio is held, the ratio range is per token, ``dual_clip_frac`` is 0.
    """
    adv = _per_token_advantages(advantages, logp)  # [B, 1] or [B, T]
    m = mask.to(logp.dtype)
    log_ratio = logp - old_logp.detach()  # [B, T]
    on_policy_tokens = torch.where(m > 0, log_ratio, torch.zeros_like(log_ratio))  # padding cannot leak a NaN in
    episode_adv = adv[:, 0] if adv.shape[1] == 1 else masked_mean(adv, m, dim=-1)  # [B] A_n
    sign = torch.sign(episode_adv)[:, None]  # [B, 1]
    held = on_policy_tokens.clamp(-config.clip_low, config.clip_high)  # [B, T] clip in log space
    kept = sign * torch.minimum(sign * on_policy_tokens, sign * held)  # [B, T] the pessimistic one
    mean_log = masked_mean(kept, m, dim=-1).clamp(max=20.0)  # [B] log of the clipped geometric mean
    objective = episode_adv * torch.exp(mean_log)  # [B] J_n
    loss = aggregate_loss((-objective)[:, None].expand_as(logp), m, config.mode, config.norm_const)
    clipped = sign * held < sign * on_policy_tokens  # [B, T] the clip holds this token
    return loss, _clip_stats(torch.exp(log_ratio), log_ratio, clipped, torch.zeros_like(clipped), m)


def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                       mask: torch.Tensor, clip: Optional[float] = 0.2, mode: str = "token_mean",
                       norm_const: Optional[float] = None) -> torch.Tensor:
    """PPO2-style clipped value loss (book §8.4), with the 0.5 factor::

        L_V = 0.5 * aggregate( max((V - R)^2, (V_old + clip(V - V_old, -eps_v, eps_v) - R)^2) )

    The max makes it pessimistic, like the min of the policy loss: it removes the incentive
    to move a value further than ``eps_v`` from ``V_old`` when that lowers the loss, it does
    not hard-limit the prediction. ``clip=None`` gives the plain ``0.5 * MSE`` (Andrychowicz
    et al. 2021 found value clipping hurts on continuous control). Convention: the 0.5 is
    inside this function, so the caller's value coefficient multiplies ``0.5 * MSE``
    (CleanRL / verl convention; SB3 uses plain MSE, i.e. twice this, times ``vf_coef``).

    :param values: current critic predictions ``[B, T]``, with grad.
    :param old_values: predictions at rollout time ``[B, T]`` (detached here).
    :param returns: value targets ``[B, T]`` (advantages + old values; detached here).
    :param mask: policy mask ``[B, T]``.
    :param clip: eps_v, or ``None`` for the unclipped loss.
    :param mode: aggregation mode, see :func:`aggregate_loss`.
    :param norm_const: constant for ``mode='constant'``.
    """
    returns = returns.detach()
    err = (values - returns) ** 2
    if clip is not None:
        old_values = old_values.detach()
        v_clipped = old_values + torch.clamp(values - old_values, -clip, clip)
        err = torch.maximum(err, (v_clipped - returns) ** 2)
    return 0.5 * aggregate_loss(err, mask, mode, norm_const)


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token estimators of KL(pi || ref) from tokens sampled from pi (Schulman 2020).

    With ``log r = ref_logp - logp`` (r = ref / pi at the sampled token):

    * ``k1 = -log r``               unbiased, high variance, can be negative;
    * ``k2 = 0.5 * (log r)^2``      biased (low bias near ref), always >= 0;
    * ``k3 = (r - 1) - log r``      unbiased (E_pi[r] = 1), always >= 0.

    The result is per token ``[B, T]``; reduce with :func:`masked_mean` or
    :func:`aggregate_loss`. Gradients flow through both arguments (detach ``ref_logp``
    yourself if the reference is frozen; it normally comes from ``torch.no_grad()``).
    """
    log_r = ref_logp - logp
    if kind == "k1":
        return -log_r
    if kind == "k2":
        return 0.5 * log_r ** 2
    if kind == "k3":
        return torch.exp(log_r) - 1.0 - log_r
    raise ValueError(f"unknown KL estimator {kind!r}; valid kinds: {', '.join(KL_KINDS)}")


def tool_output_mask(ids: torch.Tensor, owner: torch.Tensor, call_ids: Sequence[int] | None = None
                     ) -> torch.Tensor:
    """Float 0/1 mask ``[B, T-1]``: 1 where the target ``ids[t+1]`` is a tool-output token.

    With ``call_ids``, only the outputs answering a call whose first token is one of them
    (e.g. the id of ``edit``: what each edit did, ``no change`` or the line it changed).

    :param ids: token ids ``[B, T]``.
    :param owner: owner codes ``[B, T]`` (prompt 1, policy 2, tool 3, pad 0).
    :param call_ids: first tokens of the calls whose outputs count (``None``: every tool output).
    :return: the mask, aligned with the targets ``ids[:, 1:]``.
    """
    tool = owner == OWNER_TOOL  # [B, T]
    if call_ids is not None:
        policy = owner == OWNER_POLICY  # [B, T]
        starts = policy.clone()
        starts[:, 1:] &= ~policy[:, :-1]  # the first token of each call
        pos = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)  # [B, T]
        last_start = torch.where(starts, pos, torch.zeros_like(pos)).cummax(dim=1).values  # [B, T]
        first = ids.gather(1, last_start)  # [B, T] first token of the latest call
        answered = torch.isin(first, torch.as_tensor(list(call_ids), device=ids.device))
        tool &= answered & starts.cumsum(dim=1).gt(0)  # tool tokens before the first call answer none
    return tool[:, 1:].float()
