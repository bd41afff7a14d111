"""TRL's ``GRPOConfig`` option names, translated into our settings with TRL's semantics.

Read off TRL's ``grpo_trainer.py`` (``_compute_loss``) and ``grpo_config.py``:

* ``loss_type``: how per-token losses become one number. ``grpo``: mean within a sequence, then
  over sequences (``seq_mean_token_mean``); ``bnpo``: mean over the tokens of the local (mini)batch
  (``token_mean``); ``dapo``: every minibatch's sum over the token count of the whole generated batch
  (``token_mean`` with ``n_minibatches=1``, where the minibatch is the whole batch); ``dr_grpo``: sum
  over ``B * max_completion_length`` (``seq_mean_token_sum_norm`` with ``loss_norm_const =
  max_completion_length``); ``cispo``: the ``cispo`` policy loss, aggregated as ``dapo``.
* ``epsilon`` / ``epsilon_high``: the ratio clip ``[1 - epsilon, 1 + epsilon_high]`` (``clip_range``,
  ``clip_range_high``; ``epsilon_high`` None = ``epsilon``). Under ``loss_type='cispo'`` TRL reads
  ``epsilon_high`` alone, as an ABSOLUTE cap on the weight (``max_is_weight``; None falls back to
  ``epsilon``, as TRL's, so ``cispo`` wants an explicit ``epsilon_high`` such as 5).
* ``importance_sampling_level``: ``token`` (PPO's ratio, ``ppo_clip``) or ``sequence`` (GSPO:
  ``policy_loss='gspo'``).
* ``beta``: the coefficient of TRL's per-token k3 KL to the reference model (``kl_coef``, ``kl_estimator='k3'``).
* ``num_iterations``: passes over each batch (``n_epochs``).
* ``scale_rewards``: ``group`` / ``batch`` / ``none`` (``True`` / ``False`` as TRL reads them).
* ``mask_truncated_completions``: a truncated episode gets no loss (the same name here).

TRL's PPO clip has no dual clip; its std eps is 1e-4 (ours 1e-6).
"""
from __future__ import annotations

from typing import Any, Optional

from agents.algorithms.registry import check_choice

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
#: TRL's option -> the setting it becomes (besides the special cases of loss_type and epsilon_high)
_RENAMED = {"epsilon": "clip_range", "num_iterations": "n_epochs", "scale_rewards": "scale_rewards",
            "mask_truncated_completions": "mask_truncated_completions"}
#: TRL's option -> the setting whose values it takes (its bounds and choices: ``bugfix-gym train``'s flags read them)
TRL_SETTINGS = dict(_RENAMED, epsilon_high="clip_range_high", beta="kl_coef")
#: TRL's loss_type -> our loss aggregation (the one table; bugfix_gym's conformance checker, which cannot import
#: agents, keeps its own formulas, and tests/test_conformance_dump.py holds the two to the same aggregations)
LOSS_TYPE_AGGREGATION = {"grpo": "seq_mean_token_mean", "bnpo": "token_mean", "dr_grpo": "seq_mean_token_sum_norm",
                         "dapo": "token_mean", "cispo": "token_mean"}
LOSS_TYPES = tuple(LOSS_TYPE_AGGREGATION)


def from_trl(loss_type: Optional[str] = None, scale_rewards: Any = None,
             importance_sampling_level: Optional[str] = None, epsilon: Optional[float] = None,
             epsilon_high: Optional[float] = None, beta: Optional[float] = None,
             num_iterations: Optional[int] = None, mask_truncated_completions: Optional[bool] = None,
             max_completion_length: Optional[int] = None, policy_loss: Optional[str] = None) -> dict[str, Any]:
    """Our settings for the TRL options given (None: not given, the algorithm's own setting stays).

    :param loss_type: ``grpo``, ``bnpo``, ``dr_grpo``, ``dapo`` or ``cispo``
    :param scale_rewards: ``group``, ``batch``, ``none``, True (``group``) or False (``none``)
    :param importance_sampling_level: ``token`` or ``sequence`` (GSPO)
    :param epsilon: the lower clip (and the upper one unless ``epsilon_high``)
    :param epsilon_high: the upper clip; with ``cispo`` the absolute cap on the IS weight
    :param beta: the k3 KL coefficient
    :param num_iterations: passes over each batch
    :param mask_truncated_completions: no loss on truncated episodes
    :param max_completion_length: ``dr_grpo``'s constant (TRL's; ours is the most policy tokens an
        episode may have, derived from the env when left out)
    :param policy_loss: the policy loss the options change (the algorithm's own): a ``loss_type`` other than
        ``cispo`` turns ``cispo`` into TRL's ratio clip (``ppo_clip``), ``importance_sampling_level='token'``
        turns ``gspo`` into it; other losses (``gmpo``) keep their own
    :raises ValueError: a value TRL does not take, or a pair we do not support (one line)
    """
    given = dict(epsilon=epsilon, num_iterations=num_iterations, mask_truncated_completions=mask_truncated_completions,
                 scale_rewards={True: "group", False: "none"}.get(scale_rewards, scale_rewards))
    out: dict[str, Any] = {_RENAMED[key]: value for key, value in given.items() if value is not None}
    if loss_type is not None:
        check_choice("loss_type", loss_type, LOSS_TYPES)
        out["loss_mode"] = LOSS_TYPE_AGGREGATION[loss_type]
        if loss_type in ("dapo", "cispo"):  # the whole batch's token count: the batch is one minibatch
            out["n_minibatches"] = 1
    if loss_type == "cispo":
        out["policy_loss"] = "cispo"
        cap = epsilon_high if epsilon_high is not None else epsilon
        if cap is not None:
            out["max_is_weight"] = cap
        out.pop("clip_range", None)  # TRL's cispo reads no lower clip
    else:
        if epsilon_high is not None:
            out["clip_range_high"] = epsilon_high
        if loss_type is not None and policy_loss == "cispo":
            out["policy_loss"] = "ppo_clip"
    if loss_type == "dr_grpo" and max_completion_length is not None:
        out["loss_norm_const"] = float(max_completion_length)
    if importance_sampling_level is not None:
        check_choice("importance_sampling_level", importance_sampling_level, IMPORTANCE_SAMPLING_LEVELS)
        if importance_sampling_level == "sequence":
            if loss_type == "cispo":
                raise ValueError("importance_sampling_level='sequence' is GSPO's ratio clip; loss_type='cispo' "
                                 "has no sequence form here: pick one")
            out["policy_loss"] = "gspo"
        elif out.get("policy_loss", policy_loss) == "gspo":
            out["policy_loss"] = "ppo_clip"
    if beta is not None:
        out.update(kl_coef=beta, kl_estimator="k3")
    return out


#: the TRL options :func:`from_trl` reads, in its order
TRL_OPTIONS = ("loss_type", "scale_rewards", "importance_sampling_level", "epsilon", "epsilon_high", "beta",
               "num_iterations", "mask_truncated_completions")
