"""Book §6.4: baselines keep the estimator unbiased and change only its variance.

Part 1 (our exact repair MDP, 400 batches x 64 episodes): the mean estimate with each
baseline stays within Monte-Carlo noise of the exact gradient; per-batch variances differ.
Part 2 (the base agent, 240 probe episodes = 12 per train task): the trace of the covariance
of per-episode gradient estimates (R - b) * grad log p(tau) over all TinyAgent parameters,
for no baseline, the mean reward, the optimal constant b*, a per-task mean measured on a
separate batch, and the constants 0.5 and 1.0.

Run: ``python examples/ch6_baselines.py``
"""
from __future__ import annotations

import argparse
import time

import torch

from agents.algorithms.advantages import optimal_constant_baseline, per_task_baseline
from ch6_common import base_agent, episode_scores, probe, sample, set_threads, total_variance, train_tasks
from repair_mdp import make_repair_mdp, policy_evaluation, sample_repair

BOOK_MDP = {"none": (0.033, 0.034, 0.0071), "exact J": (0.028, 0.030, 0.0057),
            "batch mean": (0.038, 0.030, 0.0056), "constant 1": (0.080, 0.056, 0.0191)}
BOOK_AGENT = {"none": (0.000, 44.7), "mean reward": (0.188, 40.9), "b* (optimal constant)": (0.123, 39.3),
              "per-task mean": (None, 40.8), "constant 0.5": (0.5, 91.9), "constant 1.0": (1.0, 322.9)}


def exact_mdp(batches: int = 400, size: int = 64) -> None:
    """Part 1: each baseline's mean estimate against the exact gradient of our repair MDP."""
    P, R = make_repair_mdp()
    torch.manual_seed(0)
    theta = (0.5 * torch.randn(7, 4, dtype=torch.float64)).requires_grad_()  # [S, A] policy logits
    J = policy_evaluation(P, R, torch.softmax(theta, -1), gamma=1.0)[0]
    exact = torch.autograd.grad(J, theta)[0]  # [S, A]
    policy = torch.softmax(theta, -1).detach()  # [S, A]
    visits, returns = sample_repair(P, R, policy, batches * size, torch.Generator().manual_seed(1))
    score = visits - visits.sum(-1, keepdim=True) * policy  # [N, S, A] d log p(tau) / d theta
    score, returns = score.view(batches, size, 7, 4), returns.view(batches, size)
    print("part 1: our repair MDP, 400 batches x 64 episodes (book: chapter 2's MDP)")
    print(f"{'baseline':<12}{'rel. error of mean':>19}{'noise':>7}{'var/batch':>11} | {'book err':>9}{'noise':>7}"
          f"{'var/batch':>10}")
    for name, b in [("none", 0.0), ("exact J", J.item()), ("batch mean", returns.mean(1, keepdim=True)),
                    ("constant 1", 1.0)]:
        per_batch = ((returns - b)[..., None, None] * score).mean(1)  # [batches, S, A]
        error = ((per_batch.mean(0) - exact).norm() / exact.norm()).item()
        noise = ((per_batch.var(0).sum() / batches).sqrt() / exact.norm()).item()  # Monte Carlo scale
        e, z, v = BOOK_MDP[name]
        print(f"{name:<12}{error:>19.3f}{noise:>7.3f}{per_batch.var(0).sum():>11.4f} | {e:>9.3f}{z:>7.3f}{v:>10.4f}")


def base_agent_variances() -> None:
    """Part 2: total variance of the per-episode estimates on the base agent's probe batch."""
    base = base_agent()
    trajs = probe(base, seed=3)
    scores = episode_scores(base, trajs)  # [N, n_params]
    rewards = torch.tensor([t.reward for t in trajs])  # [N]
    print(f"\npart 2: base agent, scores {tuple(scores.shape)} | mean reward {rewards.mean():.3f} "
          "(book: (240, 157244) | 0.188)")
    b_star = optimal_constant_baseline(rewards, scores.pow(2).sum(-1))
    other = sample(base, train_tasks, 12, seed=4)  # a separate batch: fixed before the probe's actions
    per_task = per_task_baseline([t.task for t in trajs], [o.task for o in other], [o.reward for o in other])
    print(f"{'baseline':<22}{'b':>8}{'total variance':>16} | {'book b':>7}{'book var':>9}")
    for name, b in [("none", 0.0), ("mean reward", rewards.mean().item()), ("b* (optimal constant)", b_star),
                    ("per-task mean", per_task), ("constant 0.5", 0.5), ("constant 1.0", 1.0)]:
        shown = f"{b:.3f}" if isinstance(b, float) else "varies"
        bb, bv = BOOK_AGENT[name]
        book_b = f"{bb:.3f}" if bb is not None else "varies"
        variance = total_variance((rewards - b)[:, None] * scores)
        print(f"{name:<22}{shown:>8}{variance:>16.1f} | {book_b:>7}{bv:>9.1f}")


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    set_threads()
    start = time.perf_counter()
    exact_mdp()
    base_agent_variances()
    print(f"\nwall time {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
