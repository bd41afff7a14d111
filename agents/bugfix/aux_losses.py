"""BugFix's auxiliary losses for TokenPPO (``TokenPPO(..., aux_losses=[...])``, :mod:`agents.algorithms.auxiliary`).

* :class:`ToolOutputLoss`: the model also learns to predict the tool outputs of the batch's own
  episodes (with ``calls=["edit"]``, only what each edit answered: ``no change`` or the line it
  changed), scored in the minibatch's one forward pass.
* :class:`EditPracticeLoss`: the model also learns the edits' answers on edit-practice
  transcripts (:class:`agents.bugfix.practice.EditPractice`), one minibatch of them per PPO minibatch.
* :class:`ForesightDistillLoss`: the policy learns the ops foresight let it choose, scored without
  foresight, so a model trained with foresight can decode without it.

:func:`aux_losses_from_settings` builds them from the recipes' settings (``tool_coef``,
``tool_calls``, ``practice``, ``practice_tasks``, ``distill``), the first four of which are also the
arguments of TokenPPO files saved before auxiliary losses were plug-ins.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import torch

from bugfix_gym.contract.tokenizer import Tokenizer
from bugfix_gym.contract.tokens import OWNER_POLICY
from bugfix_gym.core.env import BugFixEnv
from bugfix_gym.core.tools import CALLS

from agents.algorithms.auxiliary import register_aux_loss
from agents.algorithms.on_policy import register_saved_policy_upgrade, register_saved_settings_upgrade
from agents.algorithms.losses import masked_mean, tool_output_mask
from agents.bugfix.practice import EditPractice, check_practice_tasks
from agents.model.tinyagent import TinyAgent

#: the settings :func:`aux_losses_from_settings` reads (a recipe's, and old TokenPPO files' arguments)
AUX_SETTINGS = ("tool_coef", "tool_calls", "practice", "practice_tasks", "distill")
#: the first words of BugFix's calls (``read``, ``edit``, ...)
CALL_WORDS = tuple(sorted({call.split()[0] for call in CALLS}))


def _check_weight(setting: str, weight: Any, low: float = 0.0) -> None:
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or \
            not weight > low:
        raise ValueError(f"{setting} must be a finite number > {low:g}, got {weight!r}")


def _check_calls(calls: Any) -> None:
    if calls is not None and (isinstance(calls, str) or not set(calls) <= set(CALL_WORDS)):
        raise ValueError(f"tool_calls must be a list of call words from {list(CALL_WORDS)} or None, got {calls!r}")


def _check_count(setting: str, n: Any, low: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < low:
        raise ValueError(f"{setting} must be an integer >= {low} (transcripts), got {n!r}")


@register_aux_loss
class ToolOutputLoss:
    """Cross-entropy of the tool outputs the minibatch's episodes received.

    :param weight: its coefficient in the loss (> 0)
    :param calls: only the outputs answering these calls (e.g. ``["edit"]``); None = every tool output
    """

    name = "tool"

    def __init__(self, weight: float, calls: Optional[Sequence[str]] = None):
        _check_weight("tool_coef", weight)
        _check_calls(calls)
        self.weight = weight
        self.calls = None if calls is None else list(calls)
        self._call_ids: Optional[list[int]] = None

    def setup(self, tokenizer: Tokenizer, seed: int) -> None:
        self._call_ids = None if self.calls is None else [_word_ids(tokenizer, "tool_calls")[c] for c in self.calls]

    def target_mask(self, ids: torch.Tensor, owner: torch.Tensor) -> Optional[torch.Tensor]:
        return tool_output_mask(ids, owner, self._call_ids)  # [b, T-1]

    def loss(self, model: TinyAgent, logp: torch.Tensor, target: Optional[torch.Tensor], batch_size: int
             ) -> torch.Tensor:
        assert target is not None
        return -masked_mean(logp, target)  # tool positions: unconstrained next-token log-probs

    def spec(self) -> dict[str, Any]:
        return {"entry_point": f"{__name__}:ToolOutputLoss", "kwargs": {"weight": self.weight, "calls": self.calls}}


@register_aux_loss
class EditPracticeLoss:
    """Cross-entropy of the edits' answers on ``n`` edit-practice transcripts, drawn with the
    algorithm's seed and built on the first update; one minibatch of them (as many as the PPO
    minibatch has trajectories) per PPO minibatch.

    :param weight: its coefficient in the loss (> 0)
    :param n: number of transcripts
    :param tasks: whose code the practice recombines: ``"generated"`` or ``"book"`` train code
    """

    name = "practice"

    def __init__(self, weight: float, n: int, tasks: str = "generated"):
        _check_weight("the practice weight", weight)
        _check_count("practice", n, 1)
        check_practice_tasks(tasks)
        self.weight, self.n, self.tasks = weight, n, tasks
        self._tokenizer: Optional[Tokenizer] = None
        self._seed = 0
        self._practice: Optional[EditPractice] = None

    def setup(self, tokenizer: Tokenizer, seed: int) -> None:
        self._tokenizer, self._seed, self._practice = tokenizer, seed, None

    def practice(self) -> EditPractice:
        """The transcripts (built once, seeded by the algorithm's seed)."""
        if self._practice is None:
            if self._tokenizer is None:
                raise RuntimeError("EditPracticeLoss.setup() was not called: pass it to TokenPPO(aux_losses=[...])")
            self._practice = EditPractice(self._tokenizer, self.n, seed=self._seed, tasks=self.tasks)
        return self._practice

    def target_mask(self, ids: torch.Tensor, owner: torch.Tensor) -> Optional[torch.Tensor]:
        return None

    def loss(self, model: TinyAgent, logp: torch.Tensor, target: Optional[torch.Tensor], batch_size: int
             ) -> torch.Tensor:
        return self.practice().loss(model, batch_size)

    def spec(self) -> dict[str, Any]:
        return {"entry_point": f"{__name__}:EditPracticeLoss",
                "kwargs": {"weight": self.weight, "n": self.n, "tasks": self.tasks}}


def edit_op_mask(ids: torch.Tensor, owner: torch.Tensor, edit_id: int) -> torch.Tensor:
    """Float 0/1 mask ``[B, T-1]``: 1 where the target ``ids[t+1]`` is the op the policy wrote after ``edit``.

    :param ids: token ids ``[B, T]``
    :param owner: owner codes ``[B, T]``
    :param edit_id: the id of ``edit``
    """
    policy = owner == OWNER_POLICY  # [B, T]
    return (policy[:, :-1] & policy[:, 1:] & (ids[:, :-1] == edit_id)).float()


@register_aux_loss
class ForesightDistillLoss:
    """Foresight distilled into the policy: the cross-entropy of the ops the policy wrote after ``edit``,
    in episodes sampled with foresight that only teaches (``TinyAgentPolicy(foresight_teach=True)``),
    so the op is scored under the grammar alone. Its minimum over the policy is the distribution
    foresight sampled from: the policy's own, without the ops its own model expects to answer
    ``no change``. It learns from nothing but the agent's own model and samples.

    :param weight: its coefficient in the loss (> 0)
    """

    name = "distill"

    def __init__(self, weight: float):
        _check_weight("the distillation weight", weight)
        self.weight = weight
        self._edit_id = -1

    def setup(self, tokenizer: Tokenizer, seed: int) -> None:
        self._edit_id = _word_ids(tokenizer, "the foresight distillation loss")["edit"]

    def target_mask(self, ids: torch.Tensor, owner: torch.Tensor) -> Optional[torch.Tensor]:
        return edit_op_mask(ids, owner, self._edit_id)  # [b, T-1] policy positions already scored

    def loss(self, model: TinyAgent, logp: torch.Tensor, target: Optional[torch.Tensor], batch_size: int
             ) -> torch.Tensor:
        assert target is not None
        return -masked_mean(logp, target)  # the ops' log-probs under the grammar alone

    def spec(self) -> dict[str, Any]:
        return {"entry_point": f"{__name__}:ForesightDistillLoss", "kwargs": {"weight": self.weight}}


@register_aux_loss
def aux_losses_from_settings(tool_coef: float = 0.0, tool_calls: Optional[Sequence[str]] = None, practice: int = 0,
                             practice_tasks: str = "generated", distill: float = 0.0) -> list:
    """The auxiliary losses of these settings: the tool-output loss with weight ``tool_coef`` (0 = off),
    ``practice`` edit-practice transcripts (0 = off) with the same weight, and foresight's
    distillation with weight ``distill`` (0 = off).

    :raises ValueError: practice without ``tool_coef``, or a bad setting (one line)
    """
    if tool_coef != 0:
        _check_weight("tool_coef", tool_coef)
    _check_calls(tool_calls)
    _check_count("practice", practice, 0)
    check_practice_tasks(practice_tasks)
    if practice and not tool_coef:
        raise ValueError("practice needs tool_coef > 0: it is a loss on the edits' answers")
    losses: list = [ToolOutputLoss(tool_coef, tool_calls)] if tool_coef else []
    if practice:
        losses.append(EditPracticeLoss(tool_coef, practice, practice_tasks))
    if distill != 0:
        losses.append(ForesightDistillLoss(distill))
    return losses


def _word_ids(tokenizer: Tokenizer, what: str) -> dict[str, int]:
    """``tokenizer.ids`` (word -> id), which only bugfix_gym's own Tokenizer has; else a one-line error."""
    words = getattr(tokenizer, "ids", None)
    if not isinstance(words, dict):
        raise ValueError(f"{what} finds calls by their words, which only bugfix_gym's own Tokenizer names; "
                         f"with {type(tokenizer).__name__} leave it off")
    return words


#: the settings of TokenPPO files saved before auxiliary losses were plug-ins (4e10e0a and earlier)
LEGACY_AUX_SETTINGS = ("tool_coef", "tool_calls", "practice", "practice_tasks")


@register_saved_settings_upgrade("TokenPPO")
def legacy_aux_settings(args: dict[str, Any]) -> dict[str, Any]:
    """Files saved before auxiliary losses were plug-ins hold BugFix's tool-output loss and edit practice as
    settings (:data:`LEGACY_AUX_SETTINGS`): they become one spec of :func:`aux_losses_from_settings`."""
    old = {name: args.pop(name) for name in LEGACY_AUX_SETTINGS if name in args}
    if old:
        args["aux_losses"] = [{"entry_point": f"{__name__}:aux_losses_from_settings", "kwargs": old}]
    return args


@register_saved_policy_upgrade
def foresight_words(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Files saved with foresight before BugFix-v0 advertised foresight's words (its only foresight then) get
    them: the env's ``metadata["agent_defaults"]["foresight"]``."""
    if kwargs.get("foresight") is not None and "foresight_words" not in kwargs:
        kwargs = dict(kwargs, foresight_words=dict(BugFixEnv.metadata["agent_defaults"]["foresight"]))
    return kwargs
