"""Book §8.1: off-policy reuse. Exact trajectory importance weights collapse; the per-token
surrogate is right near pi_old and drifts away from the measured improvement as the policy moves.

The old batch is 320 base-agent episodes (16 per train task, seed 0). A copy of the base agent
takes k REINFORCE steps (the §6.7 trainer, ``agents.Reinforce``: 64 fresh episodes per step, Adam
``--lr`` 2e-3, EMA baseline, token_mean, seed 1). (With the older 200-step base agent, valid calls
~0.8, lr 2e-3 collapsed the valid-call rate within ten steps for seeds 0 and 1; use ``--lr 1e-3``
with such a base agent.) For k = 0, 1, 3, 10, 30 we reweight the old batch to the moved policy with eq. (8.1),
``log w = sum_i m_i (log pi_k - log pi_old)``, and report:

* std of log w and the ESS fraction ``(sum w)^2 / sum w^2 / N``;
* the IS estimate ``mean(w R)`` of the new pass rate vs the pass rate measured on 320 new samples
  of the moved policy (16 per train task, seed 1, the same seed for every k);
* the surrogate's improvement ``(1/N) sum_n sum_i m_i (rho_ni - 1)(R_n - mean R)`` vs the measured
  improvement (new-sample pass rate at k minus the one at k = 0);
* after 10 updates, the spread of log w by the episode's number of policy tokens.

Figure 8.1 -> docs/fig8_1_ess.png.

Run: ``.venv/bin/python examples/ch8_importance_sampling.py``
"""
import argparse
import copy
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from agents.reinforce import Reinforce  # noqa: E402
from agents.rollout import collate  # noqa: E402
from ch8_common import (DOCS, base_agent, batch_logp, book_vs_ours, old_batch, pass_rate, sample, tok,  # noqa: E402
                        train_tasks)

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--lr", type=float, default=2e-3, help="REINFORCE Adam learning rate (book: 2e-3)")
parser.add_argument("--seed", type=int, default=1, help="seed of the REINFORCE batches")
args = parser.parse_args()
start = time.perf_counter()
KS = (0, 1, 3, 10, 30)
NEW_SAMPLE_SEED = 1
BOOK = {  # k: (log-w std, ESS fraction, IS estimate, new-sample pass rate, surrogate, measured improvement)
    0: ("0", "100%", "0.119", "0.159", "0", "0"),
    1: ("0.8", "78%", "", "", "within 0.005 of measured", ""),
    3: ("", "~33%", "", "", "within 0.005 of measured", ""),
    10: ("", "", "0.256", "0.469", "0.258", "0.309"),
    30: ("17", "~10%", "0.431", "0.700", "", ""),
}

base = base_agent()
old = old_batch(base)
batch = collate(old, tok.pad_id)
mask = batch["action_mask"]  # [N, T-1]
R = batch["rewards"]  # [N]
n_tokens = mask.sum(1)  # [N] policy tokens per episode
old_logp = batch_logp(base, batch)  # [N, T-1] pi_old, recomputed once by the trainer
print(f"old batch: {len(old)} episodes, pass rate {R.mean():.3f} (book 0.119), "
      f"{n_tokens.mean():.1f} policy tokens per episode (book ~12)")

trainer = Reinforce(copy.deepcopy(base), tok, eval_tasks=[], eval_every=0, lr=args.lr, seed=args.seed)
print(f"REINFORCE: lr {args.lr:g}, seed {args.seed}, 64 episodes per step, EMA baseline")
rows, log_w_at = [], {}
p0_new = None
for k in KS:
    trainer.learn(k - trainer.num_steps)  # REINFORCE steps on fresh batches, up to k in total
    new_logp = batch_logp(trainer.model, batch)
    log_ratio = (new_logp - old_logp) * mask  # [N, T-1] log rho on policy tokens
    log_w = log_ratio.sum(1).double()  # [N] eq. (8.1)
    w = log_w.exp()
    ess = float(w.sum() ** 2 / (w ** 2).sum()) / len(w)
    is_est = float((w * R.double()).mean())
    p_new = pass_rate(sample(trainer.model, train_tasks, 16, NEW_SAMPLE_SEED))
    p0_new = p_new if k == 0 else p0_new
    surrogate = float(((log_ratio.exp() - 1) * mask).sum(1).mul(R - R.mean()).mean())
    top = int(w.argmax())
    rows.append(dict(k=k, std=float(log_w.std()), ess=ess, max_log_w=float(log_w.max()),
                     top_share=float(w.max() / w.sum()), top_desc=f"{old[top].task}, {int(n_tokens[top])} tokens, "
                     f"R={old[top].reward:g}, calls {old[top].info['actions']}", is_est=is_est, p_new=p_new, surrogate=surrogate,
                     measured=p_new - p0_new, tok_std=float(log_ratio[mask > 0].std())))
    log_w_at[k] = log_w.numpy()
    print(f"k = {k:2d} done ({time.perf_counter() - start:.0f} s); last batch pass "
          f"{trainer.history[-1]['pass_rate'] if trainer.history else float('nan'):.2f}, valid calls "
          f"{trainer.history[-1]['valid_calls'] if trainer.history else float('nan'):.2f}", flush=True)

print("\nimportance weights of the old batch after k REINFORCE updates (ours | book)")
print(f"{'k':>3}{'std log w':>10}{'ESS':>7}{'IS est.':>9}{'new pass':>10}{'tok std':>9} | "
      f"{'std log w':>9}{'ESS':>6}{'IS est.':>8}{'new pass':>9}")
for r in rows:
    b = BOOK[r["k"]]
    print(f"{r['k']:>3}{r['std']:>10.2f}{r['ess']:>7.1%}{r['is_est']:>9.3f}{r['p_new']:>10.3f}{r['tok_std']:>9.3f} | "
          f"{b[0]:>9}{b[1]:>6}{b[2]:>8}{b[3]:>9}")
print("(tok std: std of the per-token log ratio over policy tokens)")
print("\nthe heaviest weight at each k (its share of sum w decides the ESS)")
for r in rows[1:]:
    print(f"  k={r['k']:>2}: max log w {r['max_log_w']:+.2f}, share of sum w {r['top_share']:.0%}: {r['top_desc']}")

print("\nsurrogate vs measured improvement of the pass rate (ours | book)")
print(f"{'k':>3}{'surrogate':>11}{'measured':>10}{'error':>8} | book")
for r in rows:
    b = BOOK[r["k"]]
    book = f"{b[4]} vs {b[5]}" if b[5] else b[4]
    print(f"{r['k']:>3}{r['surrogate']:>11.3f}{r['measured']:>10.3f}{r['surrogate'] - r['measured']:>+8.3f} | {book}")

lw10 = log_w_at[10]
L = n_tokens.numpy()
print("\nspread of log w after 10 updates, by policy tokens per episode")
buckets = [("< 8", L < 8), ("8-15", (L >= 8) & (L < 16)), (">= 16", L >= 16)]
book_b = {"< 8": "1.42", "8-15": "", ">= 16": "3.46"}
print(f"{'tokens':<8}{'episodes':>9}{'std log w':>11}{'mean log w':>12} | book std")
for name, sel in buckets:
    std = f"{lw10[sel].std(ddof=1):.2f}" if sel.sum() > 1 else "-"
    mean = f"{lw10[sel].mean():.2f}" if sel.sum() else "-"
    print(f"{name:<8}{int(sel.sum()):>9}{std:>11}{mean:>12} | {book_b[name]}")
r10 = rows[KS.index(10)]
print(f"independent-token model sigma*sqrt(L): sigma {r10['tok_std']:.2f} -> "
      + ", ".join(f"L={n}: {r10['tok_std'] * np.sqrt(n):.2f}" for n in (4, 8, 16)))

# ------------------------------------------------------------------ figure 8.1
fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
ax = axes[0]
ax.plot(KS, [100 * r["ess"] for r in rows], "o-", label="ours")
ax.plot([1, 3, 30], [78, 33, 10], "x--", color="grey", label="book (text)")
ax.set_xscale("symlog", linthresh=1)
ax.set_xticks(KS)
ax.set_xticklabels([str(k) for k in KS])
ax.set_xlabel("REINFORCE updates k")
ax.set_ylabel("ESS, % of 320 episodes")
ax.set_ylim(0, 105)
ax.legend(fontsize=8)
ax.set_title("effective sample size of the old batch")
ax = axes[1]
jitter = np.random.default_rng(0).uniform(-0.25, 0.25, len(L))
ax.scatter(L + jitter, lw10, s=8, alpha=0.5, c=R.numpy(), cmap="coolwarm", vmin=0, vmax=1)
ax.axhline(0, color="grey", lw=0.5)
ax.set_xlabel("policy tokens in the episode")
ax.set_ylabel("log w after 10 updates")
ax.set_title("log weight vs episode length (red: passed)")
fig.suptitle("Figure 8.1 (ours): 320 base-agent episodes reweighted to the policy after k updates", fontsize=10)
fig.tight_layout()
fig.savefig(DOCS / "fig8_1_ess.png", dpi=120)
print(f"\nsaved {DOCS / 'fig8_1_ess.png'}")

r1, r3, r30 = (rows[KS.index(k)] for k in (1, 3, 30))
print("\nsummary")
book_vs_ours([
    ("ESS after 1 / 3 / 30 updates", f"{r1['ess']:.1%} / {r3['ess']:.1%} / {r30['ess']:.1%}", "78% / ~33% / ~10%"),
    ("std log w after 1 -> 30", f"{r1['std']:.2f} -> {r30['std']:.1f}", "0.8 -> 17"),
    ("IS vs new pass, k=10", f"{r10['is_est']:.3f} vs {r10['p_new']:.3f}", "0.256 vs 0.469"),
    ("IS vs new pass, k=30", f"{r30['is_est']:.3f} vs {r30['p_new']:.3f}", "0.431 vs 0.700"),
    ("surrogate vs measured, k=10", f"{r10['surrogate']:.3f} vs {r10['measured']:.3f}", "0.258 vs 0.309"),
])
print(f"\nwall time {time.perf_counter() - start:.1f} s")
