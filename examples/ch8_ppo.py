"""Book §8.4-8.5: PPO with a critic (TokenPPO) from the base agent; per-epoch diagnostics;
early stopping on a KL target.

Runs (each ``TokenPPO("TinyAgentPolicy", gym.make("BugFix-v0"), ...).learn(...)`` from the
behaviour-cloned base agent, seed 0, Adam 3e-4 (``--lr``), the class defaults otherwise: eps 0.2,
dual clip 3, value clip 0.2, critic warm-up on the first batch, advantage whitening):

1. lambda = 1 and lambda = 0.95: ``--iterations`` (30) x 64 episodes, 4 epochs x 4 minibatches;
   train pass rate (last five batches, and 320 fresh episodes), held-out pass rate (160 fresh
   episodes), critic explained variance (measured on each new batch before the critic sees it).
2. The lambda = 1 run's per-epoch diagnostics, averaged over its iterations (book §8.5 table).
3. lambda = 1 with ``target_kl=0.02, target_kl_mode="epoch"`` (the book's per-epoch rule):
   gradient steps used vs the fixed-epoch run, train and held-out pass rate.
4. Figure 8.3 -> docs/fig8_3_epochs.png: clip fraction and approx KL per epoch for the
   training run and for one 320-episode batch updated for 16 epochs (as in ch8_reuse.py).

Run: ``.venv/bin/python examples/ch8_ppo.py`` (full) or ``--iterations 3`` (a quick check);
``--lr 1e-3`` (TokenPPO's own default) for the learning-rate check in docs/chapter8.md.
"""
import argparse
import pathlib
import tempfile
import time

import ch8_common

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from stable_baselines3.common.callbacks import BaseCallback  # noqa: E402


from ch8_common import (DOCS, base_agent, heldout_tasks, old_batch, one_batch_update, pass_rate, ppo,  # noqa: E402
                        sample, train_tasks)

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--iterations", type=int, default=30, help="PPO iterations per run (book: 30)")
parser.add_argument("--lr", type=float, default=ch8_common.LR,
                    help="Adam learning rate (default 3e-4; TokenPPO's own default is 1e-3)")
parser.add_argument("--no-figure", action="store_true", help="skip the 16-epoch batch and figure 8.3")
args = parser.parse_args()
ch8_common.PPO_OVERRIDES["learning_rate"] = args.lr
start = time.perf_counter()


class StopAfterIterations(BaseCallback):
    """Stops ``learn`` once ``n`` rollouts have been trained on (SB3's callback protocol): the
    (n+1)-th rollout's first ``on_step`` returns False, before any update on it."""

    def __init__(self, n: int):
        super().__init__()
        self.n, self.rollouts = n, 0

    def _on_rollout_start(self) -> None:
        self.rollouts += 1

    def _on_step(self) -> bool:
        return self.rollouts <= self.n


def run(name: str, **kw) -> dict:
    t0 = time.perf_counter()
    model = ppo(**kw)
    model.learn(total_timesteps=10**9, callback=StopAfterIterations(args.iterations))
    diag = model.diagnostics
    agent = model.policy.model
    out = dict(
        name=name, diag=diag, wall=time.perf_counter() - t0,
        batch_pass=[d["rollout"]["pass_rate"] for d in diag],
        ev=float(np.nanmean([d["explained_variance"] for d in diag])),  # NaN: a batch with one return
        grad_steps=int(sum(d["grad_steps"] for d in diag)),
        epochs_run=[d["epochs_run"] for d in diag],
        train_pass=pass_rate(sample(agent, train_tasks, 16, seed=1001)),  # 320 fresh episodes
        heldout_pass=pass_rate(sample(agent, heldout_tasks, 16, seed=1002)),  # 160 fresh episodes
    )
    print(f"{name}: {len(diag)} iterations in {out['wall']:.0f} s; batch pass "
          + " ".join(f"{p:.2f}" for p in out["batch_pass"]), flush=True)
    print("  policy-token entropy (first epoch of every 5th iteration): "
          + " ".join(f"{d['epochs'][0]['entropy']:.2f}" for d in diag[::5]), flush=True)
    return out


print(f"TokenPPO learning rate: {args.lr:g}")
print("base agent: train pass %.3f, held-out pass %.3f (160 / 320 fresh episodes; book 0.12-0.19)" % (
    pass_rate(sample(base_agent(), train_tasks, 16, seed=1001)),
    pass_rate(sample(base_agent(), heldout_tasks, 16, seed=1002))))
lam1 = run("lambda=1", gae_lambda=1.0)
lam95 = run("lambda=0.95", gae_lambda=0.95)
early = run("lambda=1, target_kl 0.02/epoch", gae_lambda=1.0, target_kl=0.02, target_kl_mode="epoch")

# ------------------------------------------------------------------ §8.4 table
n = args.iterations
print(f"\n§8.4: PPO, {n} iterations x 64 episodes, 4 epochs x 4 minibatches (ours | book at 30 iterations)")
print(f"{'run':<32}{'train (last 5 batches)':>23}{'train (320 new)':>16}{'held-out (160)':>15}{'critic EV':>10}"
      f"{'wall s':>7} | book train / held-out / EV")
book = {"lambda=1": "~0.9 / 0.31 / 12%", "lambda=0.95": "~0.9 / 0.33 / 26%",
        "lambda=1, target_kl 0.02/epoch": "0.91 / 0.21 / -"}
for r in (lam1, lam95, early):
    print(f"{r['name']:<32}{np.mean(r['batch_pass'][-5:]):>23.3f}{r['train_pass']:>16.3f}{r['heldout_pass']:>15.3f}"
          f"{r['ev']:>10.0%}{r['wall']:>7.0f} | {book[r['name']]}")

# ------------------------------------------------------------------ §8.5 per-epoch table
keys = ("clip_fraction", "approx_kl", "ratio_min", "ratio_max", "entropy")


def per_epoch(diag, n_epochs):
    """Mean over iterations of each epoch's statistics (iterations that ran that epoch)."""
    table = []
    for e in range(n_epochs):
        rows = [d["epochs"][e] for d in diag if len(d["epochs"]) > e]
        table.append({k: float(np.mean([r[k] for r in rows])) for k in keys} | {"n": len(rows)})
    return table


ep = per_epoch(lam1["diag"], 4)
print(f"\n§8.5: per-epoch diagnostics of the lambda=1 run, mean over its {n} iterations (ours | book)")
print(f"{'epoch':>5}{'clip frac':>10}{'approx KL':>11}{'KL / ep1':>9}{'ratio min':>10}{'ratio max':>10}{'entropy':>9}"
      " | book")
book_ep = {1: "clip 1.3%, KL 0.005", 4: "clip 9%, KL x21, ratio min/max 0.12 / 7.0"}
for i, e in enumerate(ep, 1):
    print(f"{i:>5}{e['clip_fraction']:>10.1%}{e['approx_kl']:>11.4f}{e['approx_kl'] / ep[0]['approx_kl']:>9.1f}"
          f"{e['ratio_min']:>10.2f}{e['ratio_max']:>10.2f}{e['entropy']:>9.3f} | {book_ep.get(i, '')}")

# ------------------------------------------------------------------ early stop
hist = np.bincount(early["epochs_run"], minlength=5)[1:]
print(f"\n§8.5: KL early stop at 0.02 (after an epoch whose mean approx KL exceeds it)")
print(f"epochs run per iteration: " + ", ".join(f"{k + 1}: {c}" for k, c in enumerate(hist)))
print(f"gradient steps {early['grad_steps']} vs {lam1['grad_steps']} fixed -> "
      f"{early['grad_steps'] / lam1['grad_steps']:.0%} (book ~63%)")
print(f"train pass (320 new) {early['train_pass']:.3f} vs {lam1['train_pass']:.3f} fixed (book 0.91 both); "
      f"held-out {early['heldout_pass']:.3f} vs {lam1['heldout_pass']:.3f} (book 0.21 vs 0.31)")

# ------------------------------------------------------------------ figure 8.3
if not args.no_figure:
    _, ep16 = one_batch_update(old_batch(base_agent()), n_epochs=16, n_minibatches=4)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, key, title in ((axes[0], "clip_fraction", "clip fraction"), (axes[1], "approx_kl", "approx KL (k3)")):
        ax.plot(range(1, 5), [e[key] for e in ep], "o-", label=f"training run, lambda=1 (mean of {n} iterations)")
        ax.plot(range(1, len(ep16) + 1), [e[key] for e in ep16], "s-", ms=4, label="one 320-episode batch, 16 epochs")
        if key == "approx_kl":
            ax.axhline(0.02, color="grey", ls="--", lw=1, label="early-stop target 0.02")
        if key == "approx_kl":
            ax.set_yscale("log")
        ax.set_xlabel("epoch")
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.suptitle("Figure 8.3 (ours): per-epoch PPO diagnostics", fontsize=10)
    fig.tight_layout()
    name = "fig8_3_epochs" if args.lr == ch8_common.LR else f"fig8_3_epochs_lr{args.lr:g}"
    if args.iterations != 30:  # a quick check must not overwrite the documented full-run figure
        name += f"_{args.iterations}it"
    out = (DOCS if args.iterations == 30 else pathlib.Path(tempfile.gettempdir())) / f"{name}.png"
    fig.savefig(out, dpi=120)
    print(f"\nsaved {out}")
print(f"\nwall time {time.perf_counter() - start:.1f} s")
