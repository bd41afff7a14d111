"""Book §6.1: the score-function (REINFORCE) estimator against the exact gradient on a small MDP.

The book uses chapter 2's repair MDP (not available here); ``examples/repair_mdp.py`` is our
own 7-state x 4-action repair MDP with exact, differentiable policy evaluation, so the
numbers differ from the book's while the checks are the same: the Monte-Carlo estimate
from 20,000 episodes agrees with autograd's exact gradient, the environment's P never
enters the differentiated expression, and shifting the returns changes the surrogate's
value arbitrarily but not its expected gradient.

Run: ``python examples/ch6_score_function.py``
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from repair_mdp import make_repair_mdp, policy_evaluation, sample_repair

BOOK = {"J exact": 0.1323, "mean return": 0.1264, "relative error": 0.068, "cosine to exact": 0.9988}
BOOK_SHIFT = {"0": (-0.8342, 0.9988), "-J": (-0.4056, 0.9992), "5": (-17.0281, 0.7833)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=20_000, help="Monte-Carlo episodes (book: 20,000)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    start = time.perf_counter()
    P, R = make_repair_mdp()
    torch.manual_seed(0)
    theta = (0.5 * torch.randn(7, 4, dtype=torch.float64)).requires_grad_()  # [S, A] policy logits
    J = policy_evaluation(P, R, torch.softmax(theta, -1), gamma=1.0)[0]
    exact = torch.autograd.grad(J, theta)[0]  # [S, A]
    n = args.episodes
    visits, returns = sample_repair(P, R, torch.softmax(theta, -1).detach(), n, torch.Generator().manual_seed(0))
    log_pi = torch.log_softmax(theta, -1)  # [S, A]; P is not in it
    surrogate = (returns[:, None, None] * visits * log_pi).sum() / n  # mean of R(tau) * log p(tau)
    estimate = torch.autograd.grad(surrogate, theta)[0]  # [S, A]
    cos = F.cosine_similarity(estimate.flatten(), exact.flatten(), dim=0).item()
    rel = ((estimate - exact).norm() / exact.norm()).item()

    print(f"§6.1 score-function estimator, {n:,} episodes (ours: our 7x4 repair MDP; book: chapter 2's, 20,000)")
    print(f"{'':<26}{'ours':>10}{'book':>10}")
    for name, ours, digits in [("J exact", J.item(), 4), ("mean return", returns.mean().item(), 4),
                               ("relative error", rel, 3), ("cosine to exact", cos, 4)]:
        print(f"{name:<26}{ours:>10.{digits}f}{BOOK[name]:>10.{digits}f}")

    print("\nsurrogate value vs gradient under a return shift (a constant baseline)")
    print(f"{'shift':<10}{'surrogate':>12}{'cosine':>9} | {'book surrogate':>15}{'book cosine':>12}")
    for key, shift in [("0", 0.0), ("-J", -J.item()), ("5", 5.0)]:
        surrogate = ((returns + shift)[:, None, None] * visits * torch.log_softmax(theta, -1)).sum() / n
        grad = torch.autograd.grad(surrogate, theta)[0]  # [S, A]
        c = F.cosine_similarity(grad.flatten(), exact.flatten(), dim=0).item()
        book_surrogate, book_cos = BOOK_SHIFT[key]
        print(f"{shift:<+10.3f}{surrogate.item():>12.4f}{c:>9.4f} | {book_surrogate:>15.4f}{book_cos:>12.4f}")
    print(f"\nwall time {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
