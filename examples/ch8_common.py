"""Shared set-up of the chapter-8 examples: tokenizer, splits, the base agent TokenPPO starts
from, seeded sampling, the "old batch", per-token log-probs of a batch, and a TokenPPO subclass
that records what the chapter's tables need.

Everything reuses the project's own pieces (``agents.*``): no loss, GAE, sampler or model is
re-implemented here.

* The base agent is ``agents.policies.cached_base_agent(tok, seed=0)``, the same weights
  ``TokenPPO(..., base_agent="auto")`` loads, cached under ``~/.cache/bugfix_gym``.
* The old batch (book §8.1) is 320 base-agent episodes: 16 per train task, seed 0, in task order,
  so its first 64 episodes are the first four train tasks' (the §8.3 minibatch).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python examples/ch8_x.py` from a checkout
    sys.path.insert(0, str(ROOT))

import gymnasium as gym  # noqa: E402

import bugfix_gym  # noqa: E402,F401  (registers BugFix-v0)
from agents.losses import kl_estimate, masked_mean  # noqa: E402
from agents.model import TinyAgent, sequence_log_probs  # noqa: E402
from agents.policies import cached_base_agent  # noqa: E402
from agents.ppo import TokenPPO  # noqa: E402
from agents.reinforce import sample_episodes  # noqa: E402
from agents.rollout import Trajectory, collate  # noqa: E402
from bugfix_gym import build_tokenizer, make_tasks  # noqa: E402

torch.set_num_threads(int(os.environ.get("BUGFIX_THREADS", "1")))  # 2 shared cores: 1 thread is polite

tok = build_tokenizer()
train_tasks, heldout_tasks = make_tasks("train"), make_tasks("heldout")
DOCS = ROOT / "docs"
OLD_BATCH_SEED = 0


def base_agent() -> TinyAgent:
    """The behaviour-cloned base agent (``make_base_agent(tok, seed=0)``, cached)."""
    return cached_base_agent(tok, seed=0)


def sample(model: TinyAgent, tasks: Sequence, n_per_task: int, seed: int) -> list[Trajectory]:
    """``n_per_task`` episodes of each task at temperature 1, in lockstep, seeded."""
    return sample_episodes(model, tok, tasks, n_per_task, seed)


def old_batch(model: TinyAgent) -> list[Trajectory]:
    """The book's old batch: 320 episodes, 16 per train task, in task order."""
    return sample(model, train_tasks, 16, OLD_BATCH_SEED)


def pass_rate(trajs: Sequence[Trajectory]) -> float:
    return float(np.mean([bool(t.info["submitted"] and t.info["hidden_pass"]) for t in trajs]))


@torch.no_grad()
def batch_logp(model: TinyAgent, batch: dict[str, torch.Tensor], chunk: int = 80) -> torch.Tensor:
    """Trainer log-probs of a collated batch -> [N, T-1] (0 off the action mask), in chunks."""
    was_training = model.training
    model.eval()
    out = torch.cat([sequence_log_probs(model, batch["ids"][i: i + chunk])
                     for i in range(0, batch["ids"].shape[0], chunk)])  # [N, T-1]
    model.train(was_training)
    return out * batch["action_mask"]


def k3_kl(old_logp: torch.Tensor, new_logp: torch.Tensor, mask: torch.Tensor) -> float:
    """k3 estimate of KL(pi_old || pi_new) from pi_old's tokens: mean of rho - 1 - log rho over the mask."""
    return float(masked_mean(kl_estimate(old_logp, new_logp, "k3"), mask))


def make_env():
    return gym.make("BugFix-v0")


class RecordingPPO(TokenPPO):
    """TokenPPO that keeps every minibatch's statistics (in order, with epoch and index) and the
    last buffer it trained on, for the per-minibatch and per-token tables of §8.6."""

    def train_on_buffer(self, buffer):
        self.last_buffer = buffer
        self.minibatch_stats: list[dict] = []
        return super().train_on_buffer(buffer)

    def _minibatch_loss(self, sample, clip_low, clip_high):
        loss, stats = super()._minibatch_loss(sample, clip_low, clip_high)
        self.minibatch_stats.append(dict(stats))
        return loss, stats


# The book does not state PPO's learning rate. We use 3e-4 (SB3 PPO's default): with it the
# per-epoch diagnostics land on the book's (§8.5, §8.6); TokenPPO's own default 1e-3 moves the
# policy 3-10x further per epoch and its fixed-epoch runs degrade after ~15 iterations
# (docs/chapter8.md, "learning rate"). Every script takes --lr to change it.
LR = 3e-4
PPO_OVERRIDES: dict = {}  # set by a script's command line (e.g. learning_rate), applied to every TokenPPO


def ppo(cls: type[RecordingPPO] = RecordingPPO, **kw) -> RecordingPPO:
    """A TokenPPO (``cls``) from the base agent with the book's §8.4 settings and Adam at ``LR``
    unless overridden; everything else is TokenPPO's default (eps 0.2, dual clip 3, value clip
    0.2, critic warm-up, whitening, token_mean)."""
    args = dict(n_episodes=64, n_epochs=4, n_minibatches=4, gamma=1.0, gae_lambda=1.0, seed=0, learning_rate=LR,
                target_kl=None)  # every epoch runs unless a run asks for early stopping (TokenPPO's default is 0.02)
    args.update(PPO_OVERRIDES)
    args.update(kw)
    return cls("TinyAgentPolicy", make_env(), **args)


def one_batch_update(trajs: Sequence[Trajectory], seed: int = 0, cls: type[RecordingPPO] = RecordingPPO,
                     **kw) -> tuple[RecordingPPO, list[dict]]:
    """A fresh TokenPPO from the base agent trained on one given batch (critic warm-up first, as in
    the first iteration of a run); returns the trainer and its per-epoch statistics."""
    kw.setdefault("n_episodes", len(trajs))  # minibatch size = len(trajs) / n_minibatches
    model = ppo(cls, seed=seed, **kw)
    np.random.seed(seed)  # the buffer's minibatch shuffle uses numpy's global RNG
    torch.manual_seed(seed)
    epochs = model.train_on_batch(list(trajs))
    return model, epochs


def book_vs_ours(rows, header=("quantity", "ours", "book")) -> None:
    """Print a two-column comparison table."""
    w = max(len(str(r[0])) for r in rows + [header]) + 2
    print(f"{header[0]:<{w}}{header[1]:>14}  {header[2]}")
    for name, ours, book in rows:
        print(f"{name:<{w}}{ours:>14}  {book}")
