"""Shared set-up of the chapter-6 examples: tokenizer, task splits, the (cached) base agent,
seeded sampling, the per-episode score gradients used by §6.4, §6.5 and §6.8, and for the §6.7
REINFORCE run a held-out evaluation callback.

The base agent is ``make_base_agent(tok, seed=0)`` with the project's default recipe, built
once and cached by :func:`agents.bugfix.base_agent.cached_base_agent` (keyed by a hash of the recipe),
so every example uses the same weights without retraining (the chapter-8 examples too).

Importing this module changes nothing: each script calls :func:`set_threads` in its ``main``.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Sequence

import torch
from stable_baselines3.common.callbacks import BaseCallback

from agents.bugfix.base_agent import cached_base_agent
from agents.model.tinyagent import TinyAgent, sequence_log_probs
from agents.rollout.trajectory import Trajectory
from agents.bugfix.evaluation import evaluate, sample_episodes
from bugfix_gym import build_tokenizer, make_tasks, parse_call

tok = build_tokenizer(make_tasks("all"))
train_tasks, heldout_tasks = make_tasks("train"), make_tasks("heldout")
FIX_OP = {t.name: t.fix_op for t in train_tasks + heldout_tasks}
RUNS = Path("runs")  # everything the examples write goes under ./runs unless a flag says otherwise


def set_threads() -> None:
    """One torch thread (the tiny model gains nothing from more on the shared 2-core machine);
    ``BUGFIX_THREADS`` overrides it."""
    torch.set_num_threads(int(os.environ.get("BUGFIX_THREADS", "1")))


def base_agent(seed: int = 0, steps: int | None = None, verbose: bool = True) -> TinyAgent:
    """The base agent ``make_base_agent(tok, seed=seed)`` (project default recipe), or with
    ``steps`` behaviour-cloning steps; cached on disk by ``agents.bugfix.base_agent.cached_base_agent``
    (the same weights the chapter-8 examples use)."""
    kwargs = {} if steps is None else dict(steps=steps)
    start = time.perf_counter()
    model = cached_base_agent(tok, seed=seed, **kwargs)
    if verbose and time.perf_counter() - start > 5:
        print(f"(built the base agent in {time.perf_counter() - start:.1f} s; now cached)")
    return model


def sample(model: TinyAgent, tasks: Sequence, n_per_task: int, seed: int, **env_kwargs: Any) -> list[Trajectory]:
    """``n_per_task`` episodes of each task, sampled at temperature 1 in lockstep, in task order (book §6.2)."""
    return sample_episodes(model, tasks, n_per_task, seed, tokenizer=tok, env_kwargs=env_kwargs or None)


def short(action: str) -> str:
    """' edit fix_init ' -> 'fix_init'; ' read ' -> 'read'."""
    call = parse_call(action)
    return (call[1] or call[0]) if call else "malformed"


def episode_gradient(model: TinyAgent, traj: Trajectory, weights: torch.Tensor) -> torch.Tensor:
    """Flattened gradient of sum_i weights_i * log pi(y_i | c_i) for one trajectory -> [n_params] (book §6.4)."""
    logp = sequence_log_probs(model, traj.ids[None])[0]  # [T-1]
    params = list(model.parameters())
    grads = torch.autograd.grad((weights * logp).sum(), params, allow_unused=True)  # the value head is unused
    return torch.cat([(g if g is not None else torch.zeros_like(p)).flatten() for g, p in zip(grads, params)])


def episode_scores(model: TinyAgent, trajs: Sequence[Trajectory]) -> torch.Tensor:
    """Per-episode scores grad sum_i m_i log pi(y_i | c_i) -> [N, n_params]."""
    return torch.stack([episode_gradient(model, t, t.policy_mask) for t in trajs])


def total_variance(per_episode: torch.Tensor) -> float:
    """Trace of the covariance of per-episode gradient estimates [N, n_params]."""
    return per_episode.var(0).sum().item()


def probe(model: TinyAgent, seed: int = 3) -> list[Trajectory]:
    """The book's probe: 12 episodes of each train task (240)."""
    return sample(model, train_tasks, 12, seed=seed)


class HeldOutEval(BaseCallback):
    """Held-out pass rate every ``every`` updates (book §6.7: 8 episodes per held-out task,
    seed ``100 + update``), measured at the start of each rollout, i.e. after ``k`` updates. In one
    callback list with :class:`agents.algorithms.callbacks.StopAfterIterations` (n), the state after the last
    update ``n`` is evaluated too: that rollout starts before the stop.

    :param tasks: the held-out tasks
    :param every: evaluation period in updates
    :param episodes_per_task: episodes per task
    """

    def __init__(self, tasks: Sequence, every: int = 10, episodes_per_task: int = 8):
        super().__init__()
        self.tasks, self.every, self.episodes_per_task = list(tasks), every, episodes_per_task
        self.pass_rate: dict[int, float] = {}  # updates done -> held-out pass rate
        self.seconds = 0.0  # time spent evaluating

    def _on_rollout_start(self) -> None:
        updates = len(self.model.diagnostics)
        if updates % self.every == 0 and updates not in self.pass_rate:
            start = time.perf_counter()
            stats = evaluate(self.model, self.tasks, self.episodes_per_task, seed=100 + updates)
            self.pass_rate[updates] = stats["pass_rate"]
            self.seconds += time.perf_counter() - start

    def _on_step(self) -> bool:
        return True
