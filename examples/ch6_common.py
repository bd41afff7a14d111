"""Shared set-up of the chapter-6 examples: tokenizer, task splits, the (cached) base agent,
seeded sampling, and the per-episode score gradients used by §6.4, §6.5 and §6.8.

The base agent is ``make_base_agent(tok, seed=0)`` with the project's default recipe,
built once and cached by ``agents.policies.cached_base_agent`` (keyed by a hash of the
recipe), so every example uses the same weights without retraining.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python examples/ch6_x.py` from a checkout
    sys.path.insert(0, str(ROOT))

from agents.model import TinyAgent, sequence_log_probs  # noqa: E402
from agents.policies import cached_base_agent  # noqa: E402
from agents.reinforce import sample_episodes  # noqa: E402
from bugfix_gym import build_tokenizer, make_tasks, parse_call  # noqa: E402

torch.set_num_threads(int(os.environ.get("BUGFIX_THREADS", "1")))  # 2 shared cores: 1 thread is fastest here

tok = build_tokenizer(make_tasks("all"))
train_tasks, heldout_tasks = make_tasks("train"), make_tasks("heldout")
FIX_OP = {t.name: t.fix_op for t in train_tasks + heldout_tasks}


def base_agent(seed: int = 0, steps: int | None = None, verbose: bool = True) -> TinyAgent:
    """The base agent ``make_base_agent(tok, seed=seed)`` (project default recipe), or with
    ``steps`` behaviour-cloning steps; cached on disk by ``agents.policies.cached_base_agent``
    (the same weights the chapter-8 examples use)."""
    kwargs = {} if steps is None else dict(steps=steps)
    start = time.perf_counter()
    model = cached_base_agent(tok, seed=seed, **kwargs)
    if verbose and time.perf_counter() - start > 5:
        print(f"(built the base agent in {time.perf_counter() - start:.1f} s; now cached)")
    return model


def sample(model, tasks, n_per_task, seed, **env_kwargs):
    """n_per_task episodes of each task, sampled at temperature 1 in lockstep (book §6.2)."""
    return sample_episodes(model, tok, tasks, n_per_task, seed, env_kwargs or None)


def show(name, stats):
    print(f"{name:<22}" + " ".join(f"{k} {v:.3f}" for k, v in stats.items()))


def short(action):
    """' edit fix_init ' -> 'fix_init'; ' read ' -> 'read'."""
    call = parse_call(action)
    return (call[1] or call[0]) if call else "malformed"


def episode_gradient(model, traj, weights):
    """Flattened gradient of sum_i weights_i * log pi(y_i | c_i) for one trajectory -> [n_params] (book §6.4)."""
    logp = sequence_log_probs(model, traj.ids[None])[0]  # [T-1]
    params = list(model.parameters())
    grads = torch.autograd.grad((weights * logp).sum(), params, allow_unused=True)  # the value head is unused
    return torch.cat([(g if g is not None else torch.zeros_like(p)).flatten() for g, p in zip(grads, params)])


def episode_scores(model, trajs):
    """Per-episode scores grad sum_i m_i log pi(y_i | c_i) -> [N, n_params]."""
    return torch.stack([episode_gradient(model, t, t.action_mask) for t in trajs])


def total_variance(per_episode):
    """Trace of the covariance of per-episode gradient estimates [N, n_params]."""
    return per_episode.var(0).sum().item()


def probe(model, seed=3):
    """The book's probe: 12 episodes of each train task (240)."""
    return sample(model, train_tasks, 12, seed=seed)
