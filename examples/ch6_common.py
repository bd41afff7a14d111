"""Shared set-up of the chapter-6 examples: tokenizer, task splits, the (cached) base agent,
seeded sampling, and the per-episode score gradients used by §6.4, §6.5 and §6.8.

The base agent is built once with ``make_base_agent(tok, seed=0)`` and cached under
``runs/`` (git-ignored), keyed by a hash of the code and tokenizer it depends on, so the
examples share the same weights without paying ~20 s each.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python examples/ch6_x.py` from a checkout
    sys.path.insert(0, str(ROOT))

from agents.base_agent import make_base_agent  # noqa: E402
from agents.model import TinyAgent, TinyAgentConfig, sequence_log_probs  # noqa: E402
from agents.reinforce import sample_episodes  # noqa: E402
from bugfix_gym import build_tokenizer, make_tasks, parse_call  # noqa: E402

torch.set_num_threads(int(os.environ.get("BUGFIX_THREADS", "1")))  # 2 shared cores: 1 thread is fastest here

tok = build_tokenizer(make_tasks("all"))
train_tasks, heldout_tasks = make_tasks("train"), make_tasks("heldout")
FIX_OP = {t.name: t.fix_op for t in train_tasks + heldout_tasks}


def _cache_key(seed: int, steps: int) -> str:
    h = hashlib.sha256()
    for rel in ("agents/base_agent.py", "agents/model.py", "agents/rollout.py", "bugfix_gym/scripted.py",
                "bugfix_gym/env.py", "bugfix_gym/tasks.py"):
        h.update((ROOT / rel).read_bytes())
    h.update(json.dumps(tok.to_dict(), sort_keys=True).encode())
    h.update(f"{seed}/{steps}".encode())
    return h.hexdigest()[:16]


def base_agent(seed: int = 0, steps: int = 200, verbose: bool = True) -> TinyAgent:
    """``make_base_agent(tok, seed=seed, steps=steps)`` (book default: 200 steps), cached under ``runs/``."""
    path = ROOT / "runs" / f"base_agent_seed{seed}_steps{steps}_{_cache_key(seed, steps)}.pt"
    if path.exists():
        data = torch.load(path, map_location="cpu", weights_only=False)
        model = TinyAgent(TinyAgentConfig(**data["config"]))
        model.load_state_dict(data["state"])
        return model
    start = time.perf_counter()
    model = make_base_agent(tok, seed=seed, steps=steps)
    if verbose:
        print(f"(built the base agent in {time.perf_counter() - start:.1f} s; cached at {path.relative_to(ROOT)})")
    path.parent.mkdir(exist_ok=True)
    torch.save(dict(config=dataclasses.asdict(model.config), state=model.state_dict()), path)
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
