"""The base agent (book §6.2): seeded behaviour cloning that lands in the book's ranges."""

from __future__ import annotations

import torch
from agents_fixtures import base_agent, tok  # noqa: F401  (pytest fixtures)

import bugfix_gym
from agents.base_agent import make_base_agent
from agents.rollout import rollout_batch, rollout_stats


def test_same_call_same_weights_and_seed_matters(tok):  # noqa: F811
    kw = dict(episodes_per_task=1, steps=3, batch_size=4)
    a, b = make_base_agent(tok, seed=7, **kw), make_base_agent(tok, seed=7, **kw)
    c = make_base_agent(tok, seed=8, **kw)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)


def test_base_agent_lands_in_the_books_ranges(base_agent, tok):  # noqa: F811
    """Book: valid calls 0.98, submit 0.78-0.83, pass 0.12-0.19 on both splits (16 episodes per task)."""
    for split in ("train", "heldout"):
        tasks = [t for t in bugfix_gym.make_tasks(split) for _ in range(16)]
        trajs = rollout_batch(base_agent, [bugfix_gym.BugFixEnv() for _ in tasks], tasks, tok,
                              generator=torch.Generator().manual_seed(0))
        stats = rollout_stats(trajs)
        assert stats["valid_calls"] >= 0.90, (split, stats)
        assert 0.65 <= stats["submit_rate"] <= 0.95, (split, stats)
        assert 0.06 <= stats["pass_rate"] <= 0.30, (split, stats)
        assert 2.0 <= stats["turns"] <= 4.5, (split, stats)
