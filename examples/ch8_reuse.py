"""Book §8.6: design questions of reuse, measured on the old batch (320 base-agent episodes).

1. Too many epochs: one TokenPPO update of 16 epochs x 4 minibatches (80 episodes each) on the
   old batch, from the base agent; clip fraction, approx KL, max ratio and entropy per epoch.
2. Minibatch count and staleness: one epoch with 1, 2, 4, 8, 16 minibatches; the KL (k3, over
   the whole batch) after the epoch, and the KL the last minibatch saw before its step.
3. Where old_logp comes from: the sampler's ``sample_logp`` vs the trainer's recompute
   (max |diff|), and the bug reproduced: old_logp recomputed inside the update loop with the
   current weights -> every ratio exactly 1, clip fraction exactly 0, approx KL exactly 0,
   while the policy still moves (plain REINFORCE).
4. Clip-higher: positive-advantage tokens of the 16-epoch run by their pi_old probability;
   share whose final ratio is above 1 + eps_high = 1.2, and the median ratio.

TokenPPO with Adam 3e-4 (``--lr``; see ch8_common.LR) and the class defaults otherwise (eps 0.2,
dual clip 3, value clip 0.2, critic warm-up on the batch first, whitened lambda = 1 advantages), seed 0.

Run: ``python examples/ch8_reuse.py`` (``--lr 1e-3``: TokenPPO's own default, for the learning-rate check)
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from agents.algorithms.buffers import TokenRolloutBufferSamples
from agents.model.tinyagent import score_tokens
from agents.rollout.trajectory import Trajectory, collate
from ch8_common import (LR, RecordingPPO, base_agent, batch_logp, book_vs_ours, k3_kl, minibatch_size, old_batch,
                        one_batch_update, set_threads, tok)


class OldLogpInsideLoop(RecordingPPO):
    """THE BUG (do not copy): pi_old's log-probs recomputed inside the update loop, with the
    current weights, for every minibatch."""

    def _minibatch_loss(self, sample: TokenRolloutBufferSamples, clip_low: float, clip_high: float
                        ) -> tuple[torch.Tensor, dict[str, float]]:
        with torch.no_grad():  # the trainer's own scoring call (TokenPPO._score), so the rounding is the same
            current, _, _ = score_tokens(self.policy.model, sample.ids, sample.policy_mask, lengths=sample.lengths,
                                         chunk=self.forward_chunk, grammar=self.policy.grammar,
                                         grammar_state=sample.grammar_state)  # [b, T-1]
        sample = sample._replace(old_logp=current * sample.policy_mask)
        return super()._minibatch_loss(sample, clip_low, clip_high)


def too_many_epochs(old: list[Trajectory], batch: dict, old_logp: torch.Tensor, lr: float) -> RecordingPPO:
    """Part 1: 16 epochs on one batch; returns the trainer (its last buffer feeds part 4)."""
    mask = batch["policy_mask"]
    model16, ep16 = one_batch_update(old, lr=lr, n_epochs=16, n_minibatches=4)
    print("\n1. 16 epochs x 4 minibatches on the old batch (per-epoch means over minibatches, before each step)")
    print(f"{'epoch':>5}{'clip frac':>10}{'approx KL':>11}{'ratio max':>10}{'ratio min':>10}{'entropy':>9}")
    for e in ep16:
        print(f"{e['epoch']:>5}{e['clip_frac']:>10.1%}{e['approx_kl']:>11.4f}{e['ratio_max']:>10.2f}"
              f"{e['ratio_min']:>10.3f}{e['entropy']:>9.3f}")
    new16 = batch_logp(model16.policy.model, batch)  # [N, T-1]
    invalid = torch.tensor([t.info["n_invalid"] > 0 for t in old])  # [N] episodes with an invalid call
    k3 = (new16 - old_logp).exp() - 1 - (new16 - old_logp)  # [N, T-1] per-token k3
    top = k3[mask > 0].sort(descending=True).values
    print(f"where the KL sits after 16 epochs: episodes with an invalid call ({int(invalid.sum())} of {len(old)}) "
          f"KL {k3_kl(old_logp[invalid], new16[invalid], mask[invalid]):.4f}, the others "
          f"{k3_kl(old_logp[~invalid], new16[~invalid], mask[~invalid]):.4f}; the 1% most-moved tokens hold "
          f"{top[: max(1, len(top) // 100)].sum() / top.sum():.0%} of the KL")
    book_vs_ours([
        ("clip fraction epoch 1 -> 16", f"{ep16[0]['clip_frac']:.1%} -> {ep16[-1]['clip_frac']:.1%}", "4% -> 17%"),
        ("approx KL, epochs 5..16 (mean)", f"{np.mean([e['approx_kl'] for e in ep16[4:]]):.4f}", "plateau ~0.027"),
        ("max ratio, epochs 5..16 (mean)", f"{np.mean([e['ratio_max'] for e in ep16[4:]]):.2f}", "~4.3"),
        ("entropy epoch 1 -> 16", f"{ep16[0]['entropy']:.3f} -> {ep16[-1]['entropy']:.3f}", "0.52 -> 0.53"),
        ("KL of the whole batch after 16 epochs", f"{k3_kl(old_logp, new16, mask):.4f}", "-"),
    ])
    return model16


def minibatch_count(old: list[Trajectory], batch: dict, old_logp: torch.Tensor, lr: float) -> None:
    """Part 2: one epoch with m minibatches."""
    mask = batch["policy_mask"]
    print("\n2. one epoch with m minibatches (m steps) on the old batch")
    print(f"{'m':>3}{'episodes/mb':>12}{'KL after epoch':>15}{'x (m=1)':>8}{'KL seen by last mb':>19}"
          f"{'clip last mb':>13}")
    kl1 = None
    for m in (1, 2, 4, 8, 16):
        model, _ = one_batch_update(old, lr=lr, n_epochs=1, n_minibatches=m)
        kl = k3_kl(old_logp, batch_logp(model.policy.model, batch), mask)
        kl1 = kl if m == 1 else kl1
        last = model.minibatch_stats[-1]
        print(f"{m:>3}{minibatch_size(len(old), m):>12}{kl:>15.4f}{kl / kl1:>8.1f}{last['approx_kl']:>19.4f}"
              f"{last['clip_frac']:>13.1%}")
    print("(book: 0.006 with one minibatch; 3.5x with 16, above the 0.02 target)")


def old_logp_source(old: list[Trajectory], batch: dict, old_logp: torch.Tensor, lr: float) -> None:
    """Part 3: sampler vs trainer log-probs, and the inside-the-loop bug."""
    mask = batch["policy_mask"]
    diff = ((batch["sample_logp"] - old_logp) * mask).abs().max().item()
    print(f"\n3. old_logp source: max |sample_logp - trainer recompute| over {int(mask.sum())} policy tokens "
          f"= {diff:.2e} (book: within 2e-6)")
    for recompute in (True, False):
        model, _ = one_batch_update(old, lr=lr, n_epochs=1, n_minibatches=4, recompute_old_logp=recompute)
        first = model.minibatch_stats[0]
        print(f"   recompute_old_logp={recompute!s:<5}: first minibatch ratio min/max "
              f"{first['ratio_min']:.7f} / {first['ratio_max']:.7f}, approx KL {first['approx_kl']:.1e}")
    print("\n   the bug: old_logp recomputed inside the loop (4 epochs x 4 minibatches)")
    print(f"   {'':<22}{'clip frac':>10}{'approx KL':>11}{'ratio min':>11}{'ratio max':>11}{'true KL after':>14}")
    for name, cls in (("correct (frozen once)", RecordingPPO), ("bug (inside the loop)", OldLogpInsideLoop)):
        model, _ = one_batch_update(old, lr=lr, n_epochs=4, n_minibatches=4, cls=cls)
        s = model.minibatch_stats
        true_kl = k3_kl(old_logp, batch_logp(model.policy.model, batch), mask)
        print(f"   {name:<22}{np.mean([x['clip_frac'] for x in s]):>10.4f}{np.mean([x['approx_kl'] for x in s]):>11.2e}"
              f"{min(x['ratio_min'] for x in s):>11.7f}{max(x['ratio_max'] for x in s):>11.7f}{true_kl:>14.4f}")
        if cls is OldLogpInsideLoop:
            exact = all(x["ratio_min"] == 1.0 and x["ratio_max"] == 1.0 and x["clip_frac"] == 0.0
                        and x["approx_kl"] == 0.0 for x in s)
            print(f"   every ratio exactly 1, clip fraction exactly 0, approx KL exactly 0 in all {len(s)} "
                  f"minibatches: {exact}")


def clip_higher(model16: RecordingPPO) -> None:
    """Part 4: positive-advantage tokens after the 16-epoch update, by pi_old probability."""
    buf = model16.last_buffer
    m16 = buf.policy_mask > 0  # [N, T-1]
    p_old = buf.old_logp.exp()  # [N, T-1]
    rho = (batch_logp(model16.policy.model, buf.data) - buf.old_logp).exp()  # [N, T-1]
    pos = m16 & (buf.advantages > 0)
    print("\n4. positive-advantage tokens after the 16-epoch update, by pi_old probability")
    print(f"{'pi_old':<10}{'tokens':>7}{'ratio > 1.2':>12}{'median ratio':>13}{'cap 1.2 pi_old':>15} | book")
    book4 = {"< 0.1": "73%, median 1.39", "> 0.5": "6%"}
    for name, sel in (("< 0.1", p_old < 0.1), ("0.1-0.5", (p_old >= 0.1) & (p_old <= 0.5)), ("> 0.5", p_old > 0.5)):
        s = pos & sel
        r = rho[s]
        if r.numel():
            print(f"{name:<10}{int(s.sum()):>7}{(r > 1.2).float().mean().item():>12.0%}{r.median().item():>13.2f}"
                  f"{1.2 * p_old[s].mean().item():>15.3f} | {book4.get(name, '')}")
        else:
            print(f"{name:<10}{0:>7} | {book4.get(name, '')}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, default=LR,
                        help="Adam learning rate (default 3e-4; TokenPPO's own default is 1e-3)")
    args = parser.parse_args(argv)
    set_threads()
    start = time.perf_counter()
    print(f"TokenPPO learning rate: {args.lr:g}")
    base = base_agent()
    old = old_batch(base)
    batch = collate(old, tok.pad_id)
    old_logp = batch_logp(base, batch)  # [N, T-1] the trainer's pi_old
    print(f"old batch: {len(old)} episodes, pass rate {batch['rewards'].mean():.3f}, "
          f"{int(batch['policy_mask'].sum())} policy tokens")
    model16 = too_many_epochs(old, batch, old_logp, args.lr)
    minibatch_count(old, batch, old_logp, args.lr)
    old_logp_source(old, batch, old_logp, args.lr)
    clip_higher(model16)
    print(f"\nwall time {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
