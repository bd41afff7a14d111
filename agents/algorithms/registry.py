"""Variants by name: the registries of loss aggregations, policy losses and advantage estimators.

REINFORCE and PPO pick each part of their update by name (``loss_mode``, ``policy_loss``,
``adv_estimator``), so a new variant is one function plus one registration, e.g.::

    from agents.algorithms.losses import register_policy_loss

    @register_policy_loss("my_loss")
    def my_loss(logp, old_logp, advantages, mask, config):
        ...
        return loss, {}

    TokenPPO("TinyAgentPolicy", env, policy_loss="my_loss")

The registries themselves live next to the functions they hold: aggregations and policy losses
in :mod:`agents.algorithms.losses`, advantage estimators in :mod:`agents.algorithms.advantages`.
docs/ppo.md "Adding a variant" has the signatures.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Generic, TypeVar

F = TypeVar("F", bound=Callable)


def check_choice(setting: str, value: object, choices: tuple[str, ...]) -> None:
    """One ``ValueError`` unless ``value`` is one of ``choices`` (the message lists them)."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{setting} must be one of {', '.join(choices)}, got {value!r}")


class Registry(Generic[F]):
    """Functions of one kind, by name.

    :param kind: what the functions are, for error messages (e.g. ``"policy loss"``)
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._functions: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator: register the function under ``name`` (a name is registered once)."""
        def add(function: F) -> F:
            if name in self._functions:
                raise ValueError(f"{self.kind} {name!r} is already registered; pick another name")
            self._functions[name] = function
            return function

        return add

    def unregister(self, name: str) -> None:
        """Remove ``name`` (e.g. a test's toy variant)."""
        self.check(name)
        del self._functions[name]

    def get(self, name: str) -> F:
        """The function registered under ``name``.

        :raises ValueError: an unknown name (the message lists the registered ones)
        """
        self.check(name)
        return self._functions[name]

    def check(self, name: object, setting: str | None = None) -> None:
        """Raise a one-line ``ValueError`` unless ``name`` is registered.

        :param name: the name to check
        :param setting: the argument that holds it, for the message (default: the registry's kind)
        """
        check_choice(setting or self.kind, name, self.names())

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._functions)

    def __contains__(self, name: object) -> bool:
        return name in self._functions


def load_entry_point(entry_point: object, what: str) -> Any:
    """The object an entry point ``"module:name"`` names (gymnasium's convention), imported now.

    :param entry_point: the ``"module:name"`` string
    :param what: what it should give, for the error message (e.g. ``"aux loss"``)
    :raises ValueError: not such a string, or it cannot be imported (one line)
    """
    if not isinstance(entry_point, str) or ":" not in entry_point:
        raise ValueError(f"a {what} entry point is 'module:name', got {str(entry_point)[:80]!r}")
    module, _, name = entry_point.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"{what} entry point {entry_point!r} cannot be loaded ({e})") from None
