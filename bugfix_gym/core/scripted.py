"""Scripted policies: baselines and the demonstrations the base agent imitates.

Each is a callable ``(observation, info) -> action_text``. ``oracle`` and ``noisy_oracle``
look the task up by ``info["task"]`` (a privileged reference, documented as such); the
others never look at the task.

``careful`` has the *shape* of careful play (look, edit, test, revert on failure, edit
again, submit) but chooses its edit ops blindly: each episode's op order is drawn from the
policy's own generator before the first call, so which op it tries never depends on the
source, the test output or the task (``tests/test_scripted.py`` checks this). It is the
demonstration a base agent may imitate without ever seeing an answer.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Sequence

import numpy as np

from ..edits.ops import FIX_OPS
from ..tasks.library import get_task
from .tools import CALLS

Policy = Callable[[str, dict], str]
KINDS = ("random", "blind", "oracle", "noisy_oracle", "careful")
_TEST_REPORT = re.compile(r"visible tests : (\d+) / (\d+) passed")


def tests_passed(observation: str) -> bool:
    """True if ``observation`` is a ``test`` report in which every visible test passed."""
    m = _TEST_REPORT.match(observation)
    return m is not None and m.group(1) == m.group(2)


def scripted_policy(kind: str, seed: int = 0, p: float = 0.5, **careful_kwargs) -> Policy:
    """A scripted policy: ``'random' | 'blind' | 'oracle' | 'noisy_oracle' | 'careful'``.

    :param kind: ``random`` (uniform over the legal calls), ``blind`` (one guessed edit,
        then submit), ``oracle`` (read, the right edit, submit), ``noisy_oracle`` (read,
        the right edit with probability ``p`` else a wrong one, submit)
    :param seed: seeds the policy's own generator
    :param p: the noisy oracle's probability of choosing the right op
    :param careful_kwargs: arguments of :func:`careful_policy` (``p_read``, ``p_test``, ...)
    """
    if kind == "careful":
        return careful_policy(seed=seed, **careful_kwargs)
    if careful_kwargs:
        raise TypeError(f"scripted_policy({kind!r}) takes no {', '.join(careful_kwargs)}")
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


def careful_policy(seed: int = 0, p_read: float = 0.6, p_test: float = 0.2, op_prior: Sequence[float] | None = None,
                   retry_on_no_change: bool = True, max_turns: int = 6) -> Policy:
    """Careful-shape, blind-op play: look, edit, test, revert on failure, edit again, submit.

    At the start of every episode (``info["turn"] == 0``) it draws, from its own generator and
    nothing else, (1) how to look first: ``read`` with probability ``p_read``, ``test`` with
    ``p_test``, else not at all; (2) the order in which it will try the five ops, sampled
    without replacement from ``op_prior`` (uniform by default). Then, turn by turn:

    * after looking (or at once): ``edit`` the next op of that order;
    * after an edit: if the tool said ``no change`` and ``retry_on_no_change``, edit the next op
      at once (nothing changed, so there is nothing to test or revert); else ``test`` if at
      least two turns are left, otherwise ``submit``;
    * after a test: ``submit`` if every visible test passed; else ``revert`` if at least three
      turns are left (revert, edit, submit) and the source changed (``info["call_mask"]``: revert
      is legal), the next op if it did not, otherwise ``submit``;
    * after a revert: ``edit`` the next op.

    What it reads from the tools decides only *whether* to test, revert, edit again or submit
    (every visible test passed? did the edit change anything?), never *which* op: the op
    sequence of an episode is fixed before the first call, so the same seed plays the same op
    sequence on every task. Every call it makes is legal (it reverts only after a change).

    :param seed: seeds the policy's generator (the look choice and op order of each episode)
    :param p_read: probability of reading first
    :param p_test: probability of testing first (``p_read + p_test <= 1``)
    :param op_prior: five weights over ``FIX_OPS`` for the op order; None = uniform
    :param retry_on_no_change: edit again at once when an edit changed nothing
    :param max_turns: the env's turn budget
    """
    prior = _op_prior(p_read, p_test, op_prior)
    rng = np.random.default_rng(seed)
    plan: dict[str, Any] = {}

    def careful(observation: str, info: dict[str, Any]) -> str:
        if info["turn"] == 0:  # a new episode: draw its whole plan now, before seeing anything
            look = rng.choice(3, p=[p_read, p_test, max(0.0, 1 - p_read - p_test)])
            n = int((prior > 0).sum())
            plan["order"] = [FIX_OPS[i] for i in rng.choice(len(FIX_OPS), size=n, replace=False, p=prior)]
            plan["last"] = None
            if look < 2:
                plan["last"] = ("read", "test")[look]
                return plan["last"]
        left = max_turns - info["turn"]  # turns left, this one included
        action = _careful_call(plan["last"], observation, info, left, retry_on_no_change)
        if action == _NEXT_EDIT:
            action = f"edit {plan['order'].pop(0)}" if plan["order"] else "submit"
        if left == 1:  # the last turn: only a submit can still pass
            action = "submit"
        plan["last"] = action
        return action
    return careful


_NEXT_EDIT = "<the next op of the episode's order>"


def _careful_call(last: str | None, observation: str, info: dict[str, Any], left: int, retry_on_no_change: bool
                  ) -> str:
    """What :func:`careful_policy` calls after ``last`` (None: nothing yet) answered ``observation``, with
    ``left`` turns left: a call, or ``_NEXT_EDIT`` for the next op of its order."""
    if last in (None, "read", "revert") or (last == "test" and not info["ops"]):
        return _NEXT_EDIT
    assert last is not None
    if last.startswith("edit"):
        if observation == "no change" and retry_on_no_change and left >= 2:
            return _NEXT_EDIT  # nothing changed, so there is nothing to test or revert
        return "test" if left >= 2 else "submit"
    if last == "test":
        if tests_passed(observation) or left < 3:
            return "submit"
        # revert the failed fix; if nothing changed (revert illegal), just try the next op
        return "revert" if info["call_mask"][CALLS.index("revert")] else _NEXT_EDIT
    return "submit"


def _op_prior(p_read: float, p_test: float, op_prior: Sequence[float] | None) -> np.ndarray:
    """:func:`careful_policy`'s weights over ``FIX_OPS`` (normalised), its arguments checked."""
    if not (0 <= p_read and 0 <= p_test and p_read + p_test <= 1):
        raise ValueError(f"p_read and p_test must be probabilities with p_read + p_test <= 1, got {p_read}, {p_test}")
    prior = np.full(len(FIX_OPS), 1 / len(FIX_OPS)) if op_prior is None else np.asarray(op_prior, dtype=float)
    if prior.shape != (len(FIX_OPS),) or (prior < 0).any() or prior.sum() <= 0:
        raise ValueError(f"op_prior must be {len(FIX_OPS)} non-negative weights over {', '.join(FIX_OPS)}")
    return prior / prior.sum()
