"""Book §6.8: how noisy is one batch's gradient? Cosine between estimates from independent batches.

The 240 base-agent probe episodes (12 per train task) give per-episode contributions
(R_n - mean R) * grad log p(tau_n) over all TinyAgent parameters; 20 random disjoint pairs of
batches of 8, 32 and 120 episodes are compared by cosine similarity. Then how much of the summed
squared norms the five largest contributions hold, which episodes they are, and the cosines
without them.

Run: ``python examples/ch6_gradient_noise.py``
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from agents.rollout.trajectory import Trajectory
from ch6_common import base_agent, episode_scores, probe, set_threads, short

BOOK = {8: -0.092, 32: 0.165, 120: 0.418}


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    set_threads()
    start = time.perf_counter()
    base = base_agent()
    trajs = probe(base, seed=3)
    scores = episode_scores(base, trajs)  # [N, n_params]
    rewards = torch.tensor([t.reward for t in trajs])  # [N]
    centered = (rewards - rewards.mean())[:, None] * scores  # [N, n_params]
    print(f"{'batch size':<12}{'mean cosine (ours)':>20}{'std':>7}{'book':>8}")
    for size, cos_t in zip([8, 32, 120], pair_cosines(centered, [8, 32, 120])):
        print(f"{size:<12}{cos_t.mean().item():>20.3f}{cos_t.std().item():>7.3f}{BOOK[size]:>8.3f}")
    print(f"(probe mean reward {rewards.mean():.3f}; book 0.188)")
    heavy_tail(centered, trajs)
    print(f"\nwall time {time.perf_counter() - start:.1f} s")


def pair_cosines(centered: torch.Tensor, sizes: list[int], pairs: int = 20) -> list[torch.Tensor]:
    """Cosine between the mean contributions of ``pairs`` random disjoint pairs of batches, per size."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for size in sizes:
        cos = []
        for _ in range(pairs):
            order = torch.randperm(len(centered), generator=gen)
            first, second = centered[order[:size]].mean(0), centered[order[size:2 * size]].mean(0)
            cos.append(F.cosine_similarity(first, second, dim=0).item())
        out.append(torch.tensor(cos))
    return out


def heavy_tail(centered: torch.Tensor, trajs: list[Trajectory], k: int = 5) -> None:
    """How much of the batch's gradient a few episodes carry, which episodes, and the cosine without them."""
    sq = centered.pow(2).sum(1)  # [N] squared norm of each episode's contribution
    top = sq.argsort(descending=True)
    rest = centered[top[k:].sort().values]  # [N-k, n_params], probe order kept
    half = len(rest) // 2
    cos = [c.mean().item() for c in pair_cosines(rest, [8, 32, half])]
    print(f"the {k} largest of {len(sq)} episode contributions hold {sq[top[:k]].sum() / sq.sum():.0%} of the "
          f"summed squared norms (the largest {sq[top[0]] / sq.sum():.0%}); without them the mean cosine at "
          f"8 / 32 / {half} is " + " / ".join(f"{c:.3f}" for c in cos))
    for i in top[:k].tolist():
        t = trajs[i]
        calls = " -> ".join(map(short, t.info["actions"]))
        print(f"  R {t.reward:.0f}, {int(t.policy_mask.sum())} policy tokens: {calls}")


if __name__ == "__main__":
    main()
