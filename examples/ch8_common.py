"""Shared set-up of the chapter-8 examples: tokenizer, splits, the base agent TokenPPO starts
from, seeded sampling, the "old batch", per-token log-probs of a batch, and a TokenPPO subclass
that records what the chapter's tables need.

Everything reuses the project's own pieces (``agents.*``): no loss, GAE, sampler or model is
re-implemented here.

* The base agent is ``agents.bugfix.base_agent.cached_base_agent(tok, seed=0)``, the same weights
  ``TokenPPO(..., base_agent="auto")`` loads, cached under ``~/.cache/bugfix_gym``.
* The old batch (book §8.1) is 320 base-agent episodes: 16 per train task, seed 0, in task order,
  so its first 64 episodes are the first four train tasks' (the §8.3 minibatch).
* PPO runs step ``make_vec_env("BugFix-v0", n_envs=64, seed=seed)``: each env draws its train
  tasks with its own seeded generator, and a batch holds at least ``n_episodes`` whole episodes.

Importing this module changes nothing: each script calls :func:`set_threads` in its ``main``.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import VecEnv

import bugfix_gym  # noqa: F401  (registers BugFix-v0)
from agents.bugfix.base_agent import cached_base_agent
from agents.algorithms.buffers import TokenRolloutBuffer, TokenRolloutBufferSamples
from agents.algorithms.losses import kl_estimate, masked_mean
from agents.model.tinyagent import TinyAgent, score_tokens
from agents.algorithms.ppo import TokenPPO
from agents.rollout.trajectory import Trajectory
from agents.bugfix.evaluation import sample_episodes
from bugfix_gym import build_tokenizer, make_tasks

tok = build_tokenizer()
train_tasks, heldout_tasks = make_tasks("train"), make_tasks("heldout")
RUNS = Path("runs")  # everything the examples write goes under ./runs unless a flag says otherwise
FIGURES = RUNS / "figures"
OLD_BATCH_SEED = 0
# The book does not state PPO's learning rate. We use 3e-4 (SB3 PPO's default) and every script
# takes --lr to change it; docs/chapter8.md ("learning rate") compares it with TokenPPO's own 1e-3.
LR = 3e-4


def set_threads() -> None:
    """One torch thread (the tiny model gains nothing from more on the shared 2-core machine);
    ``BUGFIX_THREADS`` overrides it."""
    torch.set_num_threads(int(os.environ.get("BUGFIX_THREADS", "1")))


def base_agent() -> TinyAgent:
    """The behaviour-cloned base agent (``make_base_agent(tok, seed=0)``, cached)."""
    return cached_base_agent(tok, seed=0)


def sample(model: TinyAgent, tasks: Sequence, n_per_task: int, seed: int) -> list[Trajectory]:
    """``n_per_task`` episodes of each task at temperature 1, in lockstep, seeded, in task order."""
    return sample_episodes(model, tasks, n_per_task, seed, tokenizer=tok)


def old_batch(model: TinyAgent) -> list[Trajectory]:
    """The book's old batch: 320 episodes, 16 per train task, in task order."""
    return sample(model, train_tasks, 16, OLD_BATCH_SEED)


def pass_rate(trajs: Sequence[Trajectory]) -> float:
    return float(np.mean([bool(t.info["submitted"] and t.info["hidden_pass"]) for t in trajs]))


@torch.no_grad()
def batch_logp(model: TinyAgent, batch: dict[str, torch.Tensor], chunk: int = 64) -> torch.Tensor:
    """Trainer log-probs of a collated batch -> [N, T-1] (0 off the policy mask), scored as TokenPPO
    scores (:func:`agents.model.tinyagent.score_tokens`, length-sorted chunks of ``chunk`` episodes)."""
    was_training = model.training
    model.eval()
    lengths = (batch["owner"] > 0).sum(1)  # [N]
    logp, _, _ = score_tokens(model, batch["ids"], batch["policy_mask"], lengths=lengths, chunk=chunk)  # [N, T-1]
    model.train(was_training)
    return logp


def k3_kl(old_logp: torch.Tensor, new_logp: torch.Tensor, mask: torch.Tensor) -> float:
    """k3 estimate of KL(pi_old || pi_new) from pi_old's tokens: mean of rho - 1 - log rho over the mask."""
    return float(masked_mean(kl_estimate(old_logp, new_logp, "k3"), mask))


def train_env(n_envs: int = 64, seed: int = 0) -> VecEnv:
    """``n_envs`` BugFix-v0 train envs (``render_mode=None``: SB3's ``make_vec_env`` would ask for rgb_array)."""
    return make_vec_env("BugFix-v0", n_envs=n_envs, seed=seed, env_kwargs=dict(render_mode=None))


class RecordingPPO(TokenPPO):
    """TokenPPO that keeps every minibatch's statistics (in order) and the last buffer it trained
    on, for the per-minibatch and per-token tables of §8.6."""

    def train_on_buffer(self, buffer: TokenRolloutBuffer) -> list[dict[str, float]]:
        self.last_buffer = buffer
        self.minibatch_stats: list[dict] = []
        return super().train_on_buffer(buffer)

    def _minibatch_loss(self, sample: TokenRolloutBufferSamples, clip_low: float, clip_high: float
                        ) -> tuple[torch.Tensor, dict[str, float]]:
        loss, stats = super()._minibatch_loss(sample, clip_low, clip_high)
        self.minibatch_stats.append(dict(stats))
        return loss, stats


def ppo(cls: type[RecordingPPO] = RecordingPPO, lr: float = LR, n_envs: int = 64, **kw: Any) -> RecordingPPO:
    """A TokenPPO (``cls``) from the base agent with the book's §8.4 settings and Adam at ``lr``;
    everything else is TokenPPO's default (eps 0.2, dual clip 3, value clip 0.2, critic warm-up,
    whitening, token_mean), except ``target_kl=None``: every epoch runs unless a run asks for
    early stopping. ``kw`` overrides any of it."""
    args: dict[str, Any] = dict(n_episodes=64, n_epochs=4, n_minibatches=4, gamma=1.0, gae_lambda=1.0, seed=0,
                                learning_rate=lr, target_kl=None, base_agent=base_agent(),
                                policy_kwargs=dict(tokenizer=tok))
    args.update(kw)
    return cls("TinyAgentPolicy", train_env(n_envs, args["seed"]), **args)


def one_batch_update(trajs: Sequence[Trajectory], seed: int = 0, cls: type[RecordingPPO] = RecordingPPO,
                     lr: float = LR, **kw: Any) -> tuple[RecordingPPO, list[dict]]:
    """A fresh TokenPPO from the base agent trained on one given batch (critic warm-up first, as in
    the first iteration of a run); returns the trainer and its per-epoch statistics. The minibatch
    shuffle is seeded by ``seed``."""
    kw.setdefault("n_episodes", len(trajs))
    model = ppo(cls, lr=lr, n_envs=1, seed=seed, **kw)  # the env is never stepped here
    epochs = model.train_on_batch(list(trajs))
    return model, epochs


def minibatch_size(n_episodes: int, n_minibatches: int) -> int:
    """Trajectories per minibatch when TokenPPO splits ``n_episodes`` into ``n_minibatches``."""
    return math.ceil(n_episodes / n_minibatches)


def book_vs_ours(rows, header=("quantity", "ours", "book")) -> None:
    """Print a two-column comparison table."""
    w = max(len(str(r[0])) for r in rows + [header]) + 2
    print(f"{header[0]:<{w}}{header[1]:>14}  {header[2]}")
    for name, ours, book in rows:
        print(f"{name:<{w}}{ours:>14}  {book}")
