"""BugFix-v1 for TRL's ``GRPOTrainer``: an ``environment_factory`` class with typed tools, and its dataset rows.

::

    from trl import GRPOConfig, GRPOTrainer
    from bugfix_gym.integrations.trl_v1 import BugFixToolEnvV1, make_dataset_v1

    trainer = GRPOTrainer(model, args=GRPOConfig(...), train_dataset=make_dataset_v1("train", n=64),
                          environment_factory=BugFixToolEnvV1, processing_class=tokenizer)

The contract is the one of :mod:`bugfix_gym.integrations.trl` (``BugFixToolEnv``, BugFix-v0): TRL calls the class
with no argument, ``reset(**row)`` before each rollout (the returned prompt is appended to the row's user
message), turns every public method but ``reset`` and ``get_reward`` into a tool described from its type hints
and its Google-style docstring, and reads ``get_reward()`` after the rollout. The tools are BugFix-v1's calls:
``read``, ``test``, ``locate``, ``edit(line, expr, mutation, arg)``, ``patch(line, code)``,
``insert(line, code)``, ``delete(line)``, ``revert``, ``submit``; each builds the call text
(:func:`bugfix_gym.integrations.chat_v1.call_text_v1`) and plays it, so a bad argument is the env's invalid call
(one line, a lost turn), never an exception. A row names its task (``task``, a name of the split's env) or only
a ``seed``; every member of a GRPO group resets from the row alone and plays the same task. No row or prompt
holds the injected bug or its repair.

This module imports no TRL; :func:`make_dataset_v1` imports ``datasets`` when called.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.env_v1 import BugFixEnvV1
from .chat import escape_control_tokens
from .chat_v1 import call_text_v1
from .trl import ENDED, ToolEnvCalls  # noqa: F401 (ENDED: what a call after the end answers, as on v0)
SPLITS_V1 = ("train", "heldout", "test", "all")


class BugFixToolEnvV1(ToolEnvCalls):
    """One BugFix-v1 episode behind TRL's tool-calling loop: nine typed tools, ``reset(**row)``, ``get_reward()``.

    :param max_turns: the env's turn budget; a call after the episode ended answers :data:`ENDED`
    """

    def __init__(self, max_turns: int = 12):
        super().__init__(max_turns)
        self._envs: dict[tuple[str, int], BugFixEnvV1] = {}

    def reset(self, task: str = "", seed: int = 0, split: str = "train", bugs: int = 1, **row: Any) -> str:
        """Start the episode the dataset row names; returns the env's prompt.

        :param task: a task name of the split's env (``info["task"]`` or ``PROBLEM:NAME``); empty: ``seed`` draws one
        :param seed: the reset seed
        :param split: HumanEval split, ``"train"``, ``"heldout"``, ``"test"`` or ``"all"``
        :param bugs: 1 or 2 bugs per task
        :param row: the row's other columns (``prompt``, ...), ignored
        """
        self.env, self.info, self.reward, self.late_calls = None, {}, 0.0, 0
        if split not in SPLITS_V1:
            raise ValueError(f"a BugFix-v1 row's 'split' must be one of {', '.join(SPLITS_V1)}, "
                             f"got {str(split)[:40]!r}")
        key = (split, int(bugs))
        if key not in self._envs:
            self._envs[key] = BugFixEnvV1(split=split, bugs=int(bugs), max_turns=self.max_turns)
        env = self._envs[key]
        obs, info = env.reset(seed=int(seed), options={"task": task} if task else None)
        self.env, self.info = env, info
        return escape_control_tokens(obs)

    def read(self) -> str:
        """Show the current source with line numbers, and the names table (nK is entry K).

        Returns:
            The numbered source and the names table.
        """
        return self._call("read")

    def test(self) -> str:
        """Run the visible tests on the current source.

        Returns:
            How many visible tests passed, and the first failure.
        """
        return self._call("test")

    def locate(self) -> str:
        """Rank the lines by suspiciousness over the visible tests' line coverage (Ochiai).

        Returns:
            The most suspicious lines with their scores, then where an edit can go on them (L.K and the code).
        """
        return self._call("locate")

    def edit(self, line: int, expr: int, mutation: str, arg: str = "") -> str:
        """Apply a sited mutation at expression K of line L (e.g. line 3, expr 1, mutation op, arg <=).

        Args:
            line: the line number L, as read shows it
            expr: the site K on the line: 0 the statement, 1 and up its expressions in order
            mutation: one of op, swap, name, attr, const, plus1, minus1, unwrap, negate, wrap, extend_and,
                extend_or, extend_add, extend_sub, extend_mul, slice_from, slice_to, listify
            arg: the mutation's argument (a names-table slot nK, an operator, builtin, method or constant word,
                a position cI); empty for a mutation that takes none

        Returns:
            The changed line, or why the edit does not apply.
        """
        return self._call(call_text_v1("edit", {"line": line, "expr": expr, "mutation": mutation, "arg": arg}))

    def patch(self, line: int, code: str) -> str:
        """Replace line L by a new line of code (its indentation kept).

        Args:
            line: the line number L, as read shows it
            code: one line of Python, without its indentation

        Returns:
            The changed line, or why the patch does not apply.
        """
        return self._call(call_text_v1("patch", {"line": line, "code": code}))

    def insert(self, line: int, code: str) -> str:
        """Insert a new line of code before line L (with line L's indentation).

        Args:
            line: the line number L, as read shows it
            code: one line of Python, without its indentation

        Returns:
            The inserted line, or why it does not apply.
        """
        return self._call(call_text_v1("insert", {"line": line, "code": code}))

    def delete(self, line: int) -> str:
        """Delete line L.

        Args:
            line: the line number L, as read shows it

        Returns:
            The deleted line, or why it cannot be deleted.
        """
        return self._call(call_text_v1("delete", {"line": line}))

    def revert(self) -> str:
        """Restore the task's original source.

        Returns:
            A confirmation.
        """
        return self._call("revert")

    def submit(self) -> str:
        """Run the hidden tests on the current source; this ends the episode.

        Returns:
            Whether every hidden test passed.
        """
        return self._call("submit")


def dataset_rows_v1(split: str = "train", n: int | None = None, seed: int = 0, bugs: int = 1) -> list[dict[str, Any]]:
    """The rows of :func:`make_dataset_v1` as plain dicts (no ``datasets`` needed); the arguments are its own."""
    if split not in SPLITS_V1:
        raise ValueError(f"split must be one of {', '.join(SPLITS_V1)}, got {split!r}")
    if n is not None and n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    names = [f"{t.problem}:{t.name}" for t in BugFixEnvV1(split=split, bugs=bugs).tasks]  # reset reads this form
    rng = np.random.default_rng(seed)
    order = [names[i] for i in rng.permutation(len(names))]
    count = len(names) if n is None else n
    return [{"prompt": [{"role": "user", "content": ""}], "task": order[k % len(order)],
             "seed": int(rng.integers(0, 2**31 - 1)), "split": split, "bugs": int(bugs)} for k in range(count)]


def make_dataset_v1(split: str = "train", n: int | None = None, seed: int = 0, bugs: int = 1) -> Any:
    """A ``datasets.Dataset`` of BugFix-v1 rows for ``GRPOTrainer(environment_factory=BugFixToolEnvV1)``.

    Each row has a conversational ``prompt`` (one empty user message: ``reset`` returns the task's prompt) and the
    columns ``reset`` reads: ``task``, ``seed``, ``split``, ``bugs``. No row holds the bug or its repair.

    :param split: ``"train"``, ``"heldout"``, ``"test"`` or ``"all"`` (HumanEval's splits)
    :param n: rows, cycling through the split's tasks in a seeded order (default: each task once)
    :param seed: the same arguments always give the same rows
    :param bugs: 1 or 2 bugs per task
    """
    try:
        from datasets import Dataset
    except ImportError:
        raise ImportError("make_dataset_v1 needs the datasets package: make trl-venv (docs/llm_trainers.md); "
                          "dataset_rows_v1 gives the same rows as dicts") from None
    return Dataset.from_list(dataset_rows_v1(split, n, seed, bugs))
