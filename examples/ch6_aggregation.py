"""Book §6.6: loss aggregation sets every token's weight.

1. The weights table, read off with autograd, for trajectories of 4, 8 and 24 policy tokens.
2. Push up / push down on the base agent's probe batch (240 episodes) with advantages
   R - mean(R): successes are pushed up, failures down, and the mode decides how hard.

Run: ``.venv/bin/python examples/ch6_aggregation.py``
"""
import time

import torch

from agents.losses import aggregate_loss, reinforce_loss
from agents.rollout import collate
from ch6_common import base_agent, probe, tok

start = time.perf_counter()
lengths = torch.tensor([4, 8, 24])
mask = (torch.arange(24)[None] < lengths[:, None]).float()  # [3, 24]
per_token = torch.zeros(3, 24, requires_grad=True)
book = {"token_mean": ("0.0278 0.0278 0.0278", "0.111 0.222 0.667"),
        "seq_mean_token_sum": ("0.3333 0.3333 0.3333", "1.333 2.667 8.000"),
        "seq_mean_token_mean": ("0.0833 0.0417 0.0139", "0.333 0.333 0.333"),
        "constant": ("0.0139 0.0139 0.0139", "0.056 0.111 0.333")}
print("per-token weight and trajectory total for L = 4, 8, 24 (constant: C = 3 * 24);")
print("the book's inputs, so the numbers must match")
for mode in ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "constant"]:
    loss = aggregate_loss(per_token, mask, mode, norm_const=3 * 24)
    weight = torch.autograd.grad(loss, per_token)[0]  # dL / d(per-token term)
    w = " ".join(f"{x:.4f}" for x in weight[:, 0].tolist())
    tot = " ".join(f"{x:.3f}" for x in weight.sum(-1).tolist())
    print(f"{mode:<20} ours {w} | {tot}    book {book[mode][0]} | {book[mode][1]}")

base = base_agent()
probe_batch = collate(probe(base, seed=3), tok.pad_id)
mask, adv = probe_batch["action_mask"], probe_batch["rewards"] - probe_batch["rewards"].mean()
length = mask.sum(-1)
success = probe_batch["rewards"] > 0
long = ~success & (length > length[~success].median())  # the longer half of failures
short_fail = ~success & ~long
print(f"\npolicy tokens: successes {length[success].mean():.1f} | short failures {length[short_fail].mean():.1f} "
      f"| long failures {length[long].mean():.1f}   (book: 9.4 | 6.4 | 19.6)")
book = {"token_mean": (0.132, 0.157, 1.00), "seq_mean_token_sum": (1.435, 1.712, 1.00),
        "seq_mean_token_mean": (0.152, 0.152, 0.33)}
print(f"{'mode':<20}{'push up':>9}{'push down':>11}{'long/short':>12} | {'book up':>8}{'down':>7}{'l/s':>6}")
logp = torch.zeros_like(mask, requires_grad=True)
for mode in ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"]:
    weight = torch.autograd.grad(reinforce_loss(logp, adv, mask, mode), logp)[0]  # = -A * w per token [B, T-1]
    push_up, push_down = -weight[success].sum().item(), weight[~success].sum().item()
    per_tok = weight.sum(-1) / length  # push on each token of a trajectory
    ratio = (per_tok[long].mean() / per_tok[short_fail].mean()).item()
    bu, bd, br = book[mode]
    print(f"{mode:<20}{push_up:>9.3f}{push_down:>11.3f}{ratio:>12.2f} | {bu:>8.3f}{bd:>7.3f}{br:>6.2f}")
print(f"\nwall time {time.perf_counter() - start:.1f} s")
