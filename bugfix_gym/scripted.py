"""Scripted policies: baselines and the demonstrations the base agent imitates.

Each is a callable ``(observation, info) -> action_text``. ``oracle`` and ``noisy_oracle``
look the task up by ``info["task"]`` (a privileged reference, documented as such); the
others never look at the task.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .ops import FIX_OPS
from .tasks import get_task
from .tools import CALLS

Policy = Callable[[str, dict], str]
KINDS = ("random", "blind", "oracle", "noisy_oracle")


def scripted_policy(kind: str, seed: int = 0, p: float = 0.5) -> Policy:
    """A scripted policy: ``'random' | 'blind' | 'oracle' | 'noisy_oracle'``.

    :param kind: ``random`` (uniform over the legal calls), ``blind`` (one guessed edit,
        then submit), ``oracle`` (read, the right edit, submit), ``noisy_oracle`` (read,
        the right edit with probability ``p`` else a wrong one, submit)
    :param seed: seeds the policy's own generator
    :param p: the noisy oracle's probability of choosing the right op
    """
    rng = np.random.default_rng(seed)
    if kind == "random":
        def random_policy(observation: str, info: dict[str, Any]) -> str:
            legal = np.flatnonzero(info["call_mask"])
            return CALLS[int(rng.choice(legal))]
        return random_policy
    if kind == "blind":
        def blind(observation: str, info: dict[str, Any]) -> str:
            if not info["ops"]:
                return f"edit {FIX_OPS[int(rng.integers(len(FIX_OPS)))]}"
            return "submit"
        return blind
    if kind in ("oracle", "noisy_oracle"):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be a probability, got {p}")
        right_prob = 1.0 if kind == "oracle" else p

        def oracle(observation: str, info: dict[str, Any]) -> str:
            if info["turn"] == 0:
                return "read"
            if not info["ops"]:
                fix_op = get_task(info["task"]).fix_op
                if rng.random() >= right_prob:
                    fix_op = str(rng.choice([op for op in FIX_OPS if op != fix_op]))
                return f"edit {fix_op}"
            return "submit"
        return oracle
    raise ValueError(f"unknown scripted policy {kind!r}; use one of {', '.join(KINDS)}")
