"""BugFix for TRL's ``GRPOTrainer``: an ``environment_factory`` class and the dataset its rows come from.

::

    from trl import GRPOConfig, GRPOTrainer
    from bugfix_gym.integrations.trl import BugFixToolEnv, make_dataset

    trainer = GRPOTrainer(model, args=GRPOConfig(...), train_dataset=make_dataset("train", n=64),
                          environment_factory=BugFixToolEnv, processing_class=tokenizer)

TRL's contract for ``environment_factory`` (``trl/trainer/grpo_trainer.py``): the factory is called with
no argument, once per concurrent rollout, and each instance is reused across batches; before each rollout
TRL calls ``reset(**row)`` with every column of the dataset row, and a returned string is appended to the
row's last user message (the prompt and every tool answer have their control-token look-alikes escaped,
:func:`~bugfix_gym.integrations.chat.escape_control_tokens`: TRL renders them with the model's own template);
every public method other than ``reset`` and ``get_reward`` becomes a tool, described to the model from its
type hints and its Google-style docstring (which is why the five tool methods below use ``Args:`` /
``Returns:`` sections rather than this project's ``:param:``); after the rollout TRL calls ``get_reward()``,
an extra reward source of weight 1.

A GRPO group's G rollouts are G resets on the same row, so :meth:`BugFixToolEnv.reset` derives the task
from the row alone (its ``tasks``, ``task``, ``seed`` columns), never from a generator it carries between
resets: the G members of a group play one task. A row never holds the answer: no defect kind or fix op
is in a row or a prompt.

This module imports no TRL: :func:`make_dataset` imports ``datasets`` when called.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.env import BugFixEnv
from .chat import escape_control_tokens
from ..tasks.generator import GENERATED_SPLITS
from ..tasks.library import make_tasks

SOURCES = ("book", "generated", "pack")
ENDED = "the episode has ended : no more calls"
SUBMITTED = "submitted"


class ToolEnvCalls:
    """What BugFix's TRL tool envs share: the episode's env, its ``info``, the reward and the late calls, and the
    one way a tool plays its call (:meth:`_call`).

    :param max_turns: the env's turn budget; a call after the episode ended (``submit`` or the budget)
        answers :data:`ENDED` and changes nothing
    """

    def __init__(self, max_turns: int):
        self.max_turns = max_turns
        self.env: Any = None
        self.info: dict[str, Any] = {}
        """the env's ``info`` after the last reset or call (what a scripted policy reads)"""
        self.reward = 0.0
        self.late_calls = 0
        """tool calls made after the episode ended (each answered :data:`ENDED`), since the last reset"""

    def _call(self, action: str) -> str:
        """Play one call's text (what every tool does); the output has its control-token look-alikes escaped."""
        if self.env is None:
            raise RuntimeError("call reset(**row) before a tool (TRL does this before every rollout)")
        if self.env.stop is not None:
            self.late_calls += 1
            return ENDED
        obs, reward, terminated, truncated, self.info = self.env.step(action)
        if self.info["hidden_pass"]:
            self.reward = 1.0
        return escape_control_tokens(obs)

    def get_reward(self) -> float:
        """The hidden tests' verdict: 1.0 if the episode submitted a source that passes them all, else 0.0."""
        return self.reward


class BugFixToolEnv(ToolEnvCalls):
    """One BugFix episode behind TRL's tool-calling loop: five tools, ``reset(**row)`` and ``get_reward()``.

    :param max_turns: the env's turn budget; a call after the episode ended (``submit`` or the budget)
        answers :data:`ENDED` and changes nothing
    :param show_verdict: ``submit`` answers the hidden tests' verdict, as ``BugFix-v0`` does; with False it
        answers :data:`SUBMITTED` whatever the verdict (the reward still comes from :meth:`get_reward`). TRL's
        loop samples one more model turn after every tool answer, so after a shown verdict the model's
        final EOS sits in a context that differs between passing and failing episodes, and GRPO pushes it
        down after every failure until the model stops stopping; after ``SUBMITTED`` the two cancel.
    """

    def __init__(self, max_turns: int = 6, show_verdict: bool = True):
        super().__init__(max_turns)
        self.show_verdict = show_verdict
        self._envs: dict[tuple[str, str], BugFixEnv] = {}

    def reset(self, tasks: str = "book", task: str = "", seed: int = 0, split: str = "train", pack: str = "",
              **row: Any) -> str:
        """Start the episode the dataset row names; returns the env's prompt (TRL appends it to the row's prompt).

        :param tasks: ``"book"`` (``task`` is a book task's name), ``"generated"`` (``seed`` draws a task from
            the generator's ``split``) or ``"pack"`` (``task`` names a task of the pack file ``pack``)
        :param task: the task's name (book and pack rows)
        :param seed: the reset seed (generated rows; the same seed is the same task)
        :param split: the generator split of a generated row
        :param pack: the task pack file of a pack row
        :param row: the row's other columns (``prompt``, ...), ignored
        """
        self.env, self.info, self.reward, self.late_calls = None, {}, 0.0, 0  # a reset that fails keeps nothing
        if tasks not in SOURCES:
            raise ValueError(f"a BugFix row's 'tasks' must be one of {', '.join(SOURCES)}, got {str(tasks)[:40]!r}")
        env = self._env_for(tasks, split, pack)
        if tasks == "generated":
            obs, info = env.reset(seed=int(seed))
        else:
            obs, info = env.reset(seed=int(seed), options={"task": task})
        self.env, self.info = env, info
        return escape_control_tokens(obs)

    def _env_for(self, tasks: str, split: str, pack: str) -> BugFixEnv:
        key = (tasks, split if tasks == "generated" else pack)
        if key not in self._envs:
            if tasks == "generated":
                self._envs[key] = BugFixEnv(generated=split, max_turns=self.max_turns)
            elif tasks == "pack":
                from ..tasks.packs import load_task_pack

                self._envs[key] = BugFixEnv(tasks=load_task_pack(pack), max_turns=self.max_turns)
            else:
                self._envs[key] = BugFixEnv(split="all", max_turns=self.max_turns)
        return self._envs[key]

    def read(self) -> str:
        """Show the function's current source code.

        Returns:
            The current source.
        """
        return self._call("read")

    def test(self) -> str:
        """Run the visible tests on the current source.

        Returns:
            How many visible tests passed, and the first failure.
        """
        return self._call("test")

    def edit(self, op: str) -> str:
        """Apply one edit operation to the current source.

        Args:
            op: one of fix_comparison, add_zero_guard, swap_minmax, fix_range_end, fix_init

        Returns:
            The line it changed, or no change.
        """
        return self._call(f"edit {op}" if isinstance(op, str) else f"edit <{type(op).__name__}>")

    def revert(self) -> str:
        """Restore the original source.

        Returns:
            A confirmation.
        """
        return self._call("revert")

    def submit(self) -> str:
        """Run the hidden tests on the current source; this ends the episode.

        Returns:
            Whether every hidden test passed.
        """
        verdict = self._call("submit")
        return verdict if self.show_verdict or verdict == ENDED else SUBMITTED


def dataset_rows(split: str = "train", n: int | None = None, seed: int = 0, tasks: str = "book",
                 pack: str = "") -> list[dict[str, Any]]:
    """The rows of :func:`make_dataset` as plain dicts (no ``datasets`` needed); the arguments are its own."""
    if tasks not in SOURCES:
        raise ValueError(f"tasks must be one of {', '.join(SOURCES)}, got {tasks!r}")
    rng = np.random.default_rng(seed)
    if tasks == "generated":
        if split not in GENERATED_SPLITS:
            raise ValueError(f"generated tasks come from split {', '.join(GENERATED_SPLITS)}, got {split!r}")
        seeds = rng.integers(0, 2**31 - 1, size=64 if n is None else n)
        return [_row("generated", "", int(s), split, "") for s in seeds]
    if tasks == "pack":
        if not pack:
            raise ValueError("tasks='pack' needs pack=PATH, a task pack file (docs/environment.md)")
        from ..tasks.packs import load_task_pack

        names = [t.name for t in load_task_pack(pack)]
    else:
        names = [t.name for t in make_tasks(split)]
    count = len(names) if n is None else n
    if count < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    order = [names[i] for i in rng.permutation(len(names))]
    return [_row(tasks, order[k % len(order)], int(rng.integers(0, 2**31 - 1)), split, pack) for k in range(count)]


def _row(tasks: str, task: str, seed: int, split: str, pack: str) -> dict[str, Any]:
    return {"prompt": [{"role": "user", "content": ""}], "tasks": tasks, "task": task, "seed": seed,
            "split": split, "pack": pack}


def make_dataset(split: str = "train", n: int | None = None, seed: int = 0, tasks: str = "book",
                 pack: str = "") -> Any:
    """A ``datasets.Dataset`` of BugFix rows for ``GRPOTrainer(train_dataset=..., environment_factory=BugFixToolEnv)``.

    Each row has a conversational ``prompt`` (one empty user message: :meth:`BugFixToolEnv.reset` returns the
    task's prompt, which TRL appends to it) and the columns ``reset`` reads: ``tasks``, ``task``, ``seed``,
    ``split``, ``pack``. No row holds a defect kind or a fix op.

    :param split: book split (``"train"``, ``"heldout"``, ``"all"``) or, with ``tasks="generated"``, generator
        split (``"train"``, ``"heldout"``, ``"test"``)
    :param n: rows; book and pack tasks cycle through the tasks in a seeded order (default: each task once),
        generated rows each get their own reset seed (default 64)
    :param seed: the same arguments always give the same rows
    :param tasks: ``"book"``, ``"generated"`` or ``"pack"``
    :param pack: the task pack file, with ``tasks="pack"``
    """
    try:
        from datasets import Dataset
    except ImportError:
        raise ImportError("make_dataset needs the datasets package: make trl-venv (docs/llm_trainers.md); "
                          "dataset_rows gives the same rows as dicts") from None
    return Dataset.from_list(dataset_rows(split, n, seed, tasks, pack))
