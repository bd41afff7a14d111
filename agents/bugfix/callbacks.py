"""Callbacks of BugFix training (Stable-Baselines3's callback interface): keep the weights that do
best on validation tasks."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Callable

import torch
from stable_baselines3.common.callbacks import BaseCallback

from agents.bugfix.evaluation import evaluate as evaluate_on_tasks
from agents.files.checkpoint import ParameterSnapshot


class KeepBest(BaseCallback):
    """Keep the weights that do best on a validation set, and put them back when training ends.

    Every ``every`` iterations (at the end of a rollout, so the weights evaluated are the ones
    that just collected it) and once more at the end, the policy plays each validation task once
    (``evaluate``, its own seeded sampler, so the
    training stream is untouched). SB3's ``EvalCallback`` saves its best model to a file; this
    keeps a copy in memory and loads it into the policy at the end, so what ``learn`` returns is
    the best model seen. ``history`` has ``(iteration, pass_rate)`` of every evaluation.

    With ``average_last`` the result is instead the mean of the weights evaluated in the latest
    ``average_last`` share of the evaluations (stochastic weight averaging over the checkpoints
    of one run): when validation saturates, the best score no longer tells weights apart, and
    a mean depends less on the chance of one iteration. The averaged weights are evaluated
    once more (``average_pass_rate``). The evaluated weights are kept in memory until the end:
    ``n_evaluations`` copies of the policy.

    :param tasks: validation tasks (never the ones results are reported on)
    :param every: iterations between evaluations
    :param seed: seeds the evaluation's sampling
    :param env_kwargs: BugFix-v0 options of the validation envs (those of training, e.g. ``hide_outputs``)
    :param average_last: ``None`` keeps the best weights; a share in (0, 1] averages the weights
        of that share of the evaluations, the latest ones (at least one)
    :param save_dir: if given, every evaluated model is also saved there as ``iteration-NNNN.zip``
        (``model.save``), to be evaluated along training afterwards
    :param verbose: 1 prints each evaluation
    :param evaluate: the evaluator, ``evaluate(model, tasks, n_per_task, seed=, env_kwargs=)`` -> stats with
        ``pass_rate`` (default :func:`agents.bugfix.evaluation.evaluate`)
    """

    def __init__(self, tasks: list, every: int = 20, seed: int = 0, env_kwargs: dict[str, Any] | None = None,
                 average_last: float | None = None, save_dir: str | os.PathLike | None = None, verbose: int = 0, *,
                 evaluate: Callable[..., dict[str, float]] = evaluate_on_tasks):
        super().__init__(verbose)
        if every < 1:
            raise ValueError(f"every must be at least 1, got {every}")
        if average_last is not None and not 0.0 < average_last <= 1.0:
            raise ValueError(f"average_last must be in (0, 1] or None, got {average_last}")
        self.tasks, self.every, self.seed = list(tasks), int(every), seed
        self.evaluate = evaluate
        self.env_kwargs = dict(env_kwargs or {})
        self.average_last = average_last
        self.save_dir = Path(save_dir) if save_dir is not None else None
        self.averaged_iterations: list[int] = []
        self.average_pass_rate: float | None = None
        self._evaluated: list[ParameterSnapshot] = []  # with average_last: the weights of every evaluation
        self.iteration = 0
        self.history: list[tuple[int, float]] = []
        self.best_pass_rate, self.best_iteration = -1.0, -1
        self._best: ParameterSnapshot | None = None

    def _evaluate(self) -> None:
        rate = float(self.evaluate(self.model, self.tasks, 1, seed=self.seed, env_kwargs=self.env_kwargs or None)[
            "pass_rate"])
        self.history.append((self.iteration, rate))
        if self.save_dir is not None:
            self.save_dir.mkdir(parents=True, exist_ok=True)
            self.model.save(self.save_dir / f"iteration-{self.iteration:04d}.zip")
        if self.verbose:
            print(f"validation pass rate {rate:.3f} at iteration {self.iteration}")
        best = rate > self.best_pass_rate
        if not best and self.average_last is None:
            return  # these weights are neither kept nor averaged: no copy
        weights = ParameterSnapshot(self.model.policy, with_optimizer=False)
        if self.average_last is not None:
            self._evaluated.append(weights)
        if best:
            self.best_pass_rate, self.best_iteration, self._best = rate, self.iteration, weights

    def _on_training_start(self) -> None:
        # count from the updates already done, so a resumed run evaluates and names weights by
        # the run's own iterations
        self.iteration = self.model.iteration  # type: ignore[attr-defined]  # a token algorithm's updates so far

    def _on_rollout_end(self) -> None:
        if self.iteration % self.every == 0:
            self._evaluate()
        self.iteration += 1

    def _on_step(self) -> bool:
        return True

    def _on_training_end(self) -> None:
        if not self.history or self.history[-1][0] != self.iteration:
            self._evaluate()
        if self.average_last is not None:
            self._load_average()
        elif self._best is not None:
            self._best.restore()

    def restore_best(self) -> bool:
        """Load the best weights validated so far into the policy (e.g. after an interrupted ``learn``, which
        does not reach ``_on_training_end``); False when nothing was validated yet."""
        if self._best is None:
            return False
        self._best.restore()
        return True

    def _load_average(self) -> None:
        n = max(1, math.ceil(self.average_last * len(self._evaluated)))  # type: ignore[operator]
        states, self._evaluated = [w.params for w in self._evaluated[-n:]], []
        self.averaged_iterations = [it for it, _ in self.history[-n:]]
        mean = {k: torch.stack([s[k] for s in states]).mean(0) if v.is_floating_point() else v
                for k, v in states[-1].items()}
        self.model.policy.load_state_dict(mean)
        self.average_pass_rate = float(self.evaluate(
            self.model, self.tasks, 1, seed=self.seed, env_kwargs=self.env_kwargs or None)["pass_rate"])
        if self.verbose:
            print(f"validation pass rate {self.average_pass_rate:.3f} of the mean of {n} evaluated weights")
