"""Book §6.5: causality. With a 0.1 cost per call, reward-to-go drops past costs from each
token's weight and lowers the variance of the estimator.

The 240 probe episodes of the base agent (12 per train task) are played in ``BugFixEnv(call_cost=0.1)``:
the env puts -0.1 on every step and the hidden-test reward on ``submit``; the sampler places each
step's reward on the position predicting that call's last token (docs/CONTRACT.md). The book
instead re-weights cost-free probe episodes after the fact; the rewards per token are the same.

Run: ``python examples/ch6_reward_to_go.py``
"""
from __future__ import annotations

import argparse
import time

import torch

from agents.algorithms.advantages import reward_to_go
from agents.rollout.trajectory import Trajectory
from ch6_common import base_agent, episode_gradient, sample, set_threads, short, total_variance, train_tasks


def show_episode(traj: Trajectory) -> None:
    """Each call's reward-to-go at its first token, for one episode."""
    m, r = traj.policy_mask, traj.token_rewards  # [T-1]
    to_go = reward_to_go(r[None], m[None])[0]  # [T-1] G_i = sum_{j >= i} r_j over policy tokens
    starts = (m * (1 - torch.cat([torch.zeros(1), m[:-1]]))).nonzero().flatten()  # first token of each call
    print(f"return of the episode: {r.sum().item():+.2f} (the weight of every token without causality)")
    for action, j in zip(traj.info["actions"], starts.tolist()):
        print(f"  {short(action):<15} reward-to-go at its first token {to_go[j].item():+.2f}")
    print("book: return +0.60; add_zero_guard +0.60, swap_minmax +0.70, fix_range_end +0.80, submit +0.90")


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    set_threads()
    start = time.perf_counter()
    base = base_agent()
    probe = sample(base, train_tasks, 12, seed=3, call_cost=0.1)
    # one successful episode with at least three calls, as in the book
    show_episode(next(t for t in probe if t.info["hidden_pass"] and t.info["n_turns"] >= 3))

    # variance of the two estimators over the 240 episodes (one backward per episode each)
    total = torch.stack([t.token_rewards.sum() for t in probe])  # [N] episode returns
    scores = torch.stack([episode_gradient(base, t, t.policy_mask) for t in probe])  # [N, n_params]
    var_total = total_variance(total[:, None] * scores)
    to_go_grads = torch.stack([episode_gradient(base, t, reward_to_go(t.token_rewards[None], t.policy_mask[None])[0])
                               for t in probe])  # [N, n_params]
    var_to_go = total_variance(to_go_grads)
    print(f"\n{'':<14}{'total return':>14}{'reward-to-go':>14}{'reduction':>11}")
    print(f"{'ours':<14}{var_total:>14.1f}{var_to_go:>14.1f}{1 - var_to_go / var_total:>11.0%}")
    print(f"{'book':<14}{104.9:>14.1f}{60.2:>14.1f}{0.43:>11.0%}")
    print(f"\nwall time {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
