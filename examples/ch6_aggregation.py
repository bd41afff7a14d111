"""Book §6.6: loss aggregation sets every token's weight.

1. The weights table, read off with autograd, for trajectories of 4, 8 and 24 policy tokens.
2. Push up / push down on the base agent's probe batch (240 episodes) with advantages
   R - mean(R): successes are pushed up, failures down, and the mode decides how hard.

Run: ``python examples/ch6_aggregation.py``
"""
from __future__ import annotations

import argparse
import time

import torch

from agents.algorithms.losses import aggregate_loss, reinforce_loss
from agents.rollout.trajectory import collate
from ch6_common import base_agent, probe, set_threads, tok

MODES = ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "constant")
BOOK_WEIGHTS = {"token_mean": ("0.0278 0.0278 0.0278", "0.111 0.222 0.667"),
                "seq_mean_token_sum": ("0.3333 0.3333 0.3333", "1.333 2.667 8.000"),
                "seq_mean_token_mean": ("0.0833 0.0417 0.0139", "0.333 0.333 0.333"),
                "constant": ("0.0139 0.0139 0.0139", "0.056 0.111 0.333")}
BOOK_PUSH = {"token_mean": (0.132, 0.157, 1.00), "seq_mean_token_sum": (1.435, 1.712, 1.00),
             "seq_mean_token_mean": (0.152, 0.152, 0.33)}


def weights_table() -> None:
    """Per-token weight and trajectory total of each mode for L = 4, 8, 24 (the book's inputs)."""
    lengths = torch.tensor([4, 8, 24])
    mask = (torch.arange(24)[None] < lengths[:, None]).float()  # [3, 24]
    per_token = torch.zeros(3, 24, requires_grad=True)
    print("per-token weight and trajectory total for L = 4, 8, 24 (constant: C = 3 * 24);")
    print("the book's inputs, so the numbers must match")
    for mode in MODES:
        loss = aggregate_loss(per_token, mask, mode, norm_const=3 * 24)
        weight = torch.autograd.grad(loss, per_token)[0]  # [3, 24] dL / d(per-token term)
        w = " ".join(f"{x:.4f}" for x in weight[:, 0].tolist())
        tot = " ".join(f"{x:.3f}" for x in weight.sum(-1).tolist())
        print(f"{mode:<20} ours {w} | {tot}    book {BOOK_WEIGHTS[mode][0]} | {BOOK_WEIGHTS[mode][1]}")


def push_table() -> None:
    """Push up / push down on the probe batch, advantages R - mean(R)."""
    batch = collate(probe(base_agent(), seed=3), tok.pad_id)
    mask, adv = batch["policy_mask"], batch["rewards"] - batch["rewards"].mean()  # [B, T-1], [B]
    length = mask.sum(-1)  # [B]
    success = batch["rewards"] > 0
    long = ~success & (length > length[~success].median())  # the longer half of failures
    short_fail = ~success & ~long
    print(f"\npolicy tokens: successes {length[success].mean():.1f} | short failures {length[short_fail].mean():.1f} "
          f"| long failures {length[long].mean():.1f}   (book: 9.4 | 6.4 | 19.6)")
    print(f"{'mode':<20}{'push up':>9}{'push down':>11}{'long/short':>12} | {'book up':>8}{'down':>7}{'l/s':>6}")
    logp = torch.zeros_like(mask, requires_grad=True)
    for mode in MODES[:3]:
        weight = torch.autograd.grad(reinforce_loss(logp, adv, mask, mode), logp)[0]  # [B, T-1] = -A * w per token
        push_up, push_down = -weight[success].sum().item(), weight[~success].sum().item()
        per_tok = weight.sum(-1) / length  # [B] push on each token of a trajectory
        ratio = (per_tok[long].mean() / per_tok[short_fail].mean()).item()
        bu, bd, br = BOOK_PUSH[mode]
        print(f"{mode:<20}{push_up:>9.3f}{push_down:>11.3f}{ratio:>12.2f} | {bu:>8.3f}{bd:>7.3f}{br:>6.2f}")


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    set_threads()
    start = time.perf_counter()
    weights_table()
    push_table()
    print(f"\nwall time {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
