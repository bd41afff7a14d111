"""Auxiliary losses: terms an env's layer adds to TokenPPO's minibatch loss (``TokenPPO(aux_losses=[...])``).

TokenPPO knows no env: an auxiliary loss brings its own targets. Per minibatch it may name extra
positions to score in the minibatch's one forward pass (:meth:`AuxLoss.target_mask`, e.g. the
tool outputs the model should learn to predict), then adds ``weight * loss`` to the PPO loss, in
the order of the list, and its value is logged as ``train/<name>_loss``. The policy terms are
computed on the policy mask alone, so they (and the first ratio) do not change.

A saved model keeps each auxiliary loss as a JSON spec, ``{"entry_point": "module:Class",
"kwargs": {...}}`` (gymnasium's ``entry_point`` convention): :func:`build_aux_losses` rebuilds it.
Only classes registered with :func:`register_aux_loss` can be named, so a model file never
calls anything else.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Protocol, Sequence, TypeVar, runtime_checkable

import torch

from bugfix_gym.contract.tokenizer import Tokenizer

from agents.algorithms.registry import Registry, load_entry_point
from agents.model.tinyagent import TinyAgent


F = TypeVar("F", bound=Callable[..., Any])


@runtime_checkable
class AuxLoss(Protocol):
    """What TokenPPO asks of an auxiliary loss.

    :ivar name: logged as ``train/<name>_loss``
    :ivar weight: its coefficient in the loss
    """

    name: str
    weight: float

    def setup(self, tokenizer: Tokenizer, seed: int) -> None:
        """Called once when the algorithm builds its policy: the tokenizer and the algorithm's seed."""

    def target_mask(self, ids: torch.Tensor, owner: torch.Tensor) -> Optional[torch.Tensor]:
        """``[b, T-1]`` float 0/1: positions of the minibatch ``ids`` / ``owner`` ``[b, T]`` that the
        minibatch's forward pass must also score (unconstrained by the call grammar), or None."""

    def loss(self, model: TinyAgent, logp: torch.Tensor, target: Optional[torch.Tensor], batch_size: int
             ) -> torch.Tensor:
        """The scalar loss, from the minibatch's log-probs ``logp`` ``[b, T-1]`` (with grad, scored at
        the policy mask and every aux loss's target mask), this loss's ``target`` mask and the
        minibatch's number of trajectories; ``model`` to score anything else."""

    def spec(self) -> dict[str, Any]:
        """JSON spec to rebuild it: ``{"entry_point": "module:Class", "kwargs": {...}}``."""


def build_aux_losses(items: Sequence[AuxLoss | Mapping[str, Any]]) -> list[AuxLoss]:
    """The auxiliary losses of a list of them or of their specs (:meth:`AuxLoss.spec`); a spec's
    entry point gives one auxiliary loss or a list of them.

    :raises ValueError: not a list, a spec that is not ``{"entry_point": "module:Class", "kwargs": {...}}``
        or whose entry point cannot be imported, or two losses of one name (one line)
    """
    if isinstance(items, (str, Mapping)) or not isinstance(items, Sequence):
        raise ValueError(f"aux_losses must be a list of auxiliary losses, got {str(items)[:80]!r}")
    out: list[AuxLoss] = []
    for item in items:
        built = item if isinstance(item, AuxLoss) else _from_spec(item)
        out += built if isinstance(built, list) else [built]
    if not all(isinstance(aux, AuxLoss) for aux in out):
        raise ValueError("an aux loss entry point gave something that is not an AuxLoss")
    names = [aux.name for aux in out]
    if len(set(names)) != len(names):
        raise ValueError(f"aux_losses must have distinct names (each is logged as train/<name>_loss), got {names}")
    return out


#: the classes and functions a spec may name, by entry point: a saved file can only rebuild these
#: (it never calls an arbitrary callable it names)
AUX_LOSS_FACTORIES: Registry[Callable[..., Any]] = Registry("aux loss entry point")


def register_aux_loss(factory: F) -> F:
    """Decorator: let specs name this auxiliary-loss class (or function giving a list of them)."""
    AUX_LOSS_FACTORIES.register(f"{factory.__module__}:{factory.__qualname__}")(factory)
    return factory


def _from_spec(spec: Any) -> Any:
    if not isinstance(spec, Mapping) or "entry_point" not in spec:
        raise ValueError(f"an aux loss is an AuxLoss or {{'entry_point': 'module:Class', 'kwargs': {{...}}}}, "
                         f"got {str(spec)[:80]!r}")
    entry_point = spec["entry_point"]
    if entry_point not in AUX_LOSS_FACTORIES and isinstance(entry_point, str) and entry_point.startswith("agents."):
        load_entry_point(entry_point, "aux loss")  # importing the module registers its auxiliary losses
    if entry_point not in AUX_LOSS_FACTORIES:
        raise ValueError(f"aux loss entry point {str(entry_point)[:80]!r} cannot be loaded: not a registered "
                         "auxiliary loss (agents.algorithms.auxiliary.register_aux_loss)")
    return AUX_LOSS_FACTORIES.get(entry_point)(**dict(spec.get("kwargs") or {}))


def check_aux_losses(name: str, value: Any) -> None:
    """A list of auxiliary losses (or their specs) with distinct names; one ``ValueError`` otherwise."""
    build_aux_losses(value)
