"""Book §8.2-8.3: the clipped surrogate, per sign; the dual clip; clipping as a soft trust region.

Part 1 (§8.2): six tokens with ratios 0.5 .. 2.0 under A = +1 and A = -1, eps = 0.2, one row
aggregated with ``seq_mean_token_sum`` so each token's gradient is its raw weight. We print the
ascent direction d(objective)/d(log pi_i) read off with autograd, and the clip fraction.
Part 2 (§8.2): the dual clip, ratios 2, 5, 20 with A = -1: loss 27 without, 8 with c = 3.
Figure 8.2: ``fig8_2_clip.png`` in ``--out`` (default ``runs/figures``).
Part 3 (§8.3): 40 Adam steps on one 64-episode minibatch (the old batch's episodes of the first
four train tasks), clipped (eps 0.2) vs unclipped (eps = inf), then KL, max ratio and the share
of ratios outside [0.8, 1.2].

The book does not state the learning rate; we use the chapter's PPO rate 3e-4 (``--lr`` to change).

Run: ``python examples/ch8_clipping.py`` (``--out docs`` to update the documented figure).
"""
from __future__ import annotations

import argparse
import copy
import math
import time
from pathlib import Path

import torch
from matplotlib.figure import Figure

from agents.algorithms.losses import clipped_policy_loss
from agents.model.tinyagent import sequence_log_probs
from agents.rollout.trajectory import collate
from ch8_common import FIGURES, LR, base_agent, batch_logp, book_vs_ours, k3_kl, old_batch, set_threads, tok


def sign_table() -> None:
    """Part 1: per-token ascent direction under A = +1 and A = -1."""
    # The text names 0.5, 0.79, 1.3 and 2.0 and says two of six are clipped in each row, so the
    # middle two lie inside [0.8, 1.2]; we take 0.9 and 1.0.
    ratios = torch.tensor([0.5, 0.79, 0.9, 1.0, 1.3, 2.0])
    print("part 1: per-token ascent direction d obj / d log pi (eps 0.2, seq_mean_token_sum, one row)")
    print("ratio    " + "".join(f"{r:>8.2f}" for r in ratios.tolist()) + "   clip frac | book clip frac")
    for A in (+1.0, -1.0):
        logp = ratios.log()[None].clone().requires_grad_()  # [1, 6], old_logp = 0 so rho = ratio
        loss, stats = clipped_policy_loss(logp, torch.zeros(1, 6), torch.full((1, 6), A), torch.ones(1, 6),
                                          clip_low=0.2, clip_high=0.2, dual_clip=None, mode="seq_mean_token_sum")
        loss.backward()
        ascent = [0.0 - g for g in logp.grad[0].tolist()]  # the loss is -objective (0.0 - g: no '-0.00')
        print(f"A = {A:+.0f}   " + "".join(f"{g:>8.2f}" for g in ascent) + f"   {stats['clip_frac']:>9.2f} | 0.33")
    print("(book: A=+1 -> 1.3 and 2.0 get nothing, 0.5 and 0.79 pushed up; A=-1 -> 0.5 and 0.79 left alone,\n"
          " 2.0 pushed down hardest; unclipped ascent is rho * A since d rho / d log pi = rho)")


def dual_clip_table() -> None:
    """Part 2: the dual clip bounds the loss of a negative-advantage token with a large ratio."""
    print("\npart 2: dual clip, A = -1, ratios 2, 5, 20 (seq_mean_token_sum)")
    for c in (None, 3.0):
        logp = torch.tensor([[2.0, 5.0, 20.0]]).log().requires_grad_()  # [1, 3]
        loss, _ = clipped_policy_loss(logp, torch.zeros(1, 3), torch.full((1, 3), -1.0), torch.ones(1, 3),
                                      dual_clip=c, mode="seq_mean_token_sum")
        loss.backward()
        name = "without dual clip" if c is None else f"dual clip c = {c:g}"
        book = "27, grads 2 5 20" if c is None else "8, grads 2 0 0"
        grads = [round(g + 0.0, 2) for g in logp.grad[0].tolist()]
        print(f"{name:<20} loss {loss.item():5.1f}   descent grads {grads}   | book: loss {book}")


def objective(rho: torch.Tensor, A: float, dual_clip: float | None = None, eps: float = 0.2) -> list[float]:
    """Per-token clipped objective at each ratio, through clipped_policy_loss (one token per call)."""
    out = []
    for r in rho.tolist():
        loss, _ = clipped_policy_loss(torch.tensor([[math.log(r)]]), torch.zeros(1, 1), torch.tensor([[A]]),
                                      torch.ones(1, 1), clip_low=eps, clip_high=eps, dual_clip=dual_clip,
                                      mode="seq_mean_token_sum")
        out.append(-loss.item())
    return out


def figure_8_2(out: Path) -> None:
    grid = torch.linspace(0.01, 4.0, 400)
    fig = Figure(figsize=(9, 3.6))
    axes = fig.subplots(1, 2)
    for ax, A in zip(axes, (+1.0, -1.0)):
        ax.plot(grid, (grid * A).tolist(), "k--", lw=1, label=r"unclipped $\rho A$")
        ax.plot(grid, objective(grid, A), "C0", lw=2, label=r"clipped, $\epsilon=0.2$")
        if A < 0:
            ax.plot(grid, objective(grid, A, dual_clip=3.0), "C3", lw=1.5, ls=":", label="dual clip c = 3")
        for x in (0.8, 1.2):
            ax.axvline(x, color="grey", lw=0.5)
        ax.set_xlabel(r"ratio $\rho = \pi_\theta / \pi_{old}$")
        ax.set_title(f"A = {A:+.0f}")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("per-token objective")
    fig.suptitle("Figure 8.2 (ours): clipped surrogate per sign; flat parts have zero gradient", fontsize=10)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "fig8_2_clip.png", dpi=120)
    print(f"\nsaved {out / 'fig8_2_clip.png'}")


def trust_region(lr: float) -> None:
    """Part 3: 40 Adam steps on one minibatch, clipped vs unclipped."""
    base = base_agent()
    trajs = old_batch(base)[:64]  # the old batch is in task order: 16 episodes of each of the first 4 tasks
    print(f"\npart 3: 40 Adam steps (lr {lr:g}, token_mean, A = R - mean R, dual clip off) on 64 episodes of "
          f"{sorted({t.task for t in trajs})}")
    batch = collate(trajs, tok.pad_id)
    mask = batch["policy_mask"]  # [64, T-1]
    old_logp = batch_logp(base, batch)  # [64, T-1] pi_old frozen once, by the trainer
    rewards = batch["rewards"]  # [64]
    adv = rewards - rewards.mean()  # [64] one advantage per trajectory, as in §8.1's surrogate
    print(f"minibatch: mean reward {rewards.mean():.3f}, {int(mask.sum())} policy tokens")
    results = {}
    for name, eps in (("clipped", 0.2), ("unclipped", math.inf)):
        model = copy.deepcopy(base)
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        for _ in range(40):
            logp = sequence_log_probs(model, batch["ids"])  # [64, T-1]
            loss, _ = clipped_policy_loss(logp, old_logp, adv, mask, clip_low=eps, clip_high=eps, dual_clip=None)
            opt.zero_grad()
            loss.backward()
            opt.step()
        new_logp = batch_logp(model, batch)  # [64, T-1]
        rho = (new_logp - old_logp).exp()[mask > 0]  # [N policy tokens]
        results[name] = dict(kl=k3_kl(old_logp, new_logp, mask), max_ratio=rho.max().item(),
                             outside=((rho < 0.8) | (rho > 1.2)).float().mean().item())
    c, u = results["clipped"], results["unclipped"]
    book_vs_ours([
        ("KL (k3), clipped", f"{c['kl']:.3f}", "0.24"),
        ("KL (k3), unclipped", f"{u['kl']:.3f}", "5.9"),
        ("KL ratio unclipped/clipped", f"{u['kl'] / c['kl']:.0f}x", "25x"),
        ("max ratio, clipped", f"{c['max_ratio']:.1f}", "12"),
        ("max ratio, unclipped", f"{u['max_ratio']:.3g}", "~2900"),
        ("outside [0.8,1.2], clipped", f"{c['outside']:.0%}", "41%"),
        ("outside [0.8,1.2], unclipped", f"{u['outside']:.0%}", "47%"),
    ])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, default=LR, help="Adam learning rate of the 40-step run (default 3e-4)")
    parser.add_argument("--out", type=Path, default=FIGURES, help="folder of figure 8.2 (default runs/figures)")
    args = parser.parse_args(argv)
    set_threads()
    start = time.perf_counter()
    sign_table()
    dual_clip_table()
    figure_8_2(args.out)
    trust_region(args.lr)
    print(f"\nwall time {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
