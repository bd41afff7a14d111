"""Book §8.4-8.5: PPO with a critic (TokenPPO) from the base agent; per-epoch diagnostics;
early stopping on a KL target.

Runs (each ``TokenPPO("TinyAgentPolicy", make_vec_env("BugFix-v0", n_envs=64, seed=0), ...)`` from
the behaviour-cloned base agent, trained with ``learn`` until :class:`agents.algorithms.callbacks.StopAfterIterations`;
Adam 3e-4 (``--lr``), the class defaults otherwise: eps 0.2, dual clip 3, value clip 0.2, critic
warm-up on the first batch, advantage whitening):

1. lambda = 1 and lambda = 0.95: ``--iterations`` (30) x at least 64 episodes, 4 epochs x 4
   minibatches; train pass rate (last five batches, and 320 fresh episodes), held-out pass rate
   (160 fresh episodes), critic explained variance (measured on each new batch before the critic
   sees it).
2. The lambda = 1 run's per-epoch diagnostics, averaged over its iterations (book §8.5 table).
3. lambda = 1 with ``target_kl=0.02, target_kl_mode="epoch"`` (the book's per-epoch rule):
   gradient steps used vs the fixed-epoch run, train and held-out pass rate.
4. Figure 8.3 (``fig8_3_epochs.png`` in ``--out``, default ``runs/figures``): clip fraction and approx
   KL per epoch for the training run and for one 320-episode batch updated for 16 epochs (as in
   ch8_reuse.py).

Run: ``python examples/ch8_ppo.py`` (full), ``--quick`` (3 iterations, no figure: a smoke run);
``--lr 1e-3`` (TokenPPO's own default) for the learning-rate check in docs/chapter8.md;
``--out docs`` to update the documented figure.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from agents.algorithms.callbacks import StopAfterIterations
from ch8_common import (FIGURES, LR, base_agent, heldout_tasks, old_batch, one_batch_update, pass_rate, ppo, sample,
                        set_threads, train_tasks)

EPOCH_KEYS = ("clip_frac", "approx_kl", "ratio_min", "ratio_max", "entropy")
BOOK_RUNS = {"lambda=1": "~0.9 / 0.31 / 12%", "lambda=0.95": "~0.9 / 0.33 / 26%",
             "lambda=1, target_kl 0.02/epoch": "0.91 / 0.21 / -"}
BOOK_EPOCHS = {1: "clip 1.3%, KL 0.005", 4: "clip 9%, KL x21, ratio min/max 0.12 / 7.0"}


def run(name: str, iterations: int, lr: float, **kw: Any) -> dict[str, Any]:
    """One training run of ``iterations`` PPO iterations and its fresh-sample evaluation."""
    t0 = time.perf_counter()
    model = ppo(lr=lr, **kw)
    model.learn(10**9, callback=StopAfterIterations(iterations))
    diag = model.diagnostics
    agent = model.policy.model
    out = dict(
        name=name, diag=diag, wall=time.perf_counter() - t0,
        batch_pass=[d["rollout"]["pass_rate"] for d in diag],
        episodes=[d["rollout"]["episodes"] for d in diag],
        ev=float(np.nanmean([d["explained_variance"] for d in diag])),  # NaN: a batch with one return
        grad_steps=int(sum(d["grad_steps"] for d in diag)),
        epochs_run=[d["epochs_run"] for d in diag],
        train_pass=pass_rate(sample(agent, train_tasks, 16, seed=1001)),  # 320 fresh episodes
        heldout_pass=pass_rate(sample(agent, heldout_tasks, 16, seed=1002)),  # 160 fresh episodes
    )
    print(f"{name}: {len(diag)} iterations ({np.mean(out['episodes']):.1f} episodes per batch) in "
          f"{out['wall']:.0f} s; batch pass " + " ".join(f"{p:.2f}" for p in out["batch_pass"]), flush=True)
    print("  policy-token entropy (first epoch of every 5th iteration): "
          + " ".join(f"{d['epochs'][0]['entropy']:.2f}" for d in diag[::5]), flush=True)
    return out


def per_epoch(diag: list[dict], n_epochs: int) -> list[dict[str, float]]:
    """Mean over iterations of each epoch's statistics (iterations that ran that epoch)."""
    table = []
    for e in range(n_epochs):
        rows = [d["epochs"][e] for d in diag if len(d["epochs"]) > e]
        table.append({k: float(np.mean([r[k] for r in rows])) for k in EPOCH_KEYS} | {"n": len(rows)})
    return table


def print_runs(runs: list[dict], iterations: int) -> None:
    print(f"\n§8.4: PPO, {iterations} iterations x at least 64 episodes, 4 epochs x 4 minibatches "
          "(ours | book at 30 iterations)")
    print(f"{'run':<32}{'train (last 5 batches)':>23}{'train (320 new)':>16}{'held-out (160)':>15}{'critic EV':>10}"
          f"{'wall s':>7} | book train / held-out / EV")
    for r in runs:
        print(f"{r['name']:<32}{np.mean(r['batch_pass'][-5:]):>23.3f}{r['train_pass']:>16.3f}"
              f"{r['heldout_pass']:>15.3f}{r['ev']:>10.0%}{r['wall']:>7.0f} | {BOOK_RUNS[r['name']]}")


def print_epochs(ep: list[dict], iterations: int) -> None:
    print(f"\n§8.5: per-epoch diagnostics of the lambda=1 run, mean over its {iterations} iterations (ours | book)")
    print(f"{'epoch':>5}{'clip frac':>10}{'approx KL':>11}{'KL / ep1':>9}{'ratio min':>10}{'ratio max':>10}"
          f"{'entropy':>9} | book")
    for i, e in enumerate(ep, 1):
        print(f"{i:>5}{e['clip_frac']:>10.1%}{e['approx_kl']:>11.4f}{e['approx_kl'] / ep[0]['approx_kl']:>9.1f}"
              f"{e['ratio_min']:>10.2f}{e['ratio_max']:>10.2f}{e['entropy']:>9.3f} | {BOOK_EPOCHS.get(i, '')}")


def print_early_stop(early: dict, fixed: dict) -> None:
    hist = np.bincount(early["epochs_run"], minlength=5)[1:]
    print("\n§8.5: KL early stop at 0.02 (after an epoch whose mean approx KL exceeds it)")
    print("epochs run per iteration: " + ", ".join(f"{k + 1}: {c}" for k, c in enumerate(hist)))
    print(f"gradient steps {early['grad_steps']} vs {fixed['grad_steps']} fixed -> "
          f"{early['grad_steps'] / fixed['grad_steps']:.0%} (book ~63%)")
    print(f"train pass (320 new) {early['train_pass']:.3f} vs {fixed['train_pass']:.3f} fixed (book 0.91 both); "
          f"held-out {early['heldout_pass']:.3f} vs {fixed['heldout_pass']:.3f} (book 0.21 vs 0.31)")


def figure_8_3(ep: list[dict], iterations: int, lr: float, out: Path) -> None:
    """Per-epoch clip fraction and KL of the run next to one batch updated for 16 epochs."""
    _, ep16 = one_batch_update(old_batch(base_agent()), lr=lr, n_epochs=16, n_minibatches=4)
    fig = Figure(figsize=(9, 3.6))
    axes = fig.subplots(1, 2)
    for ax, key, title in ((axes[0], "clip_frac", "clip fraction"), (axes[1], "approx_kl", "approx KL (k3)")):
        ax.plot(range(1, len(ep) + 1), [e[key] for e in ep], "o-",
                label=f"training run, lambda=1 (mean of {iterations} iterations)")
        ax.plot(range(1, len(ep16) + 1), [e[key] for e in ep16], "s-", ms=4, label="one 320-episode batch, 16 epochs")
        if key == "approx_kl":
            ax.axhline(0.02, color="grey", ls="--", lw=1, label="early-stop target 0.02")
            ax.set_yscale("log")
        ax.set_xlabel("epoch")
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.suptitle("Figure 8.3 (ours): per-epoch PPO diagnostics", fontsize=10)
    fig.tight_layout()
    name = "fig8_3_epochs" if lr == LR else f"fig8_3_epochs_lr{lr:g}"
    if iterations != 30:  # a shorter run is named apart from the book-length one
        name += f"_{iterations}it"
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / f"{name}.png", dpi=120)
    print(f"\nsaved {out / f'{name}.png'}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=30, help="PPO iterations per run (book: 30)")
    parser.add_argument("--quick", action="store_true", help="3 iterations per run and no figure (a smoke run)")
    parser.add_argument("--lr", type=float, default=LR,
                        help="Adam learning rate (default 3e-4; TokenPPO's own default is 1e-3)")
    parser.add_argument("--no-figure", action="store_true", help="skip the 16-epoch batch and figure 8.3")
    parser.add_argument("--out", type=Path, default=FIGURES, help="folder of figure 8.3 (default runs/figures)")
    args = parser.parse_args(argv)
    if args.quick:
        args.iterations, args.no_figure = 3, True
    if args.iterations < 1:
        parser.error("--iterations must be positive")
    set_threads()
    start = time.perf_counter()
    n = args.iterations
    print(f"TokenPPO learning rate: {args.lr:g}")
    base = base_agent()
    print("base agent: train pass %.3f, held-out pass %.3f (320 / 160 fresh episodes; book 0.12-0.19)" % (
        pass_rate(sample(base, train_tasks, 16, seed=1001)), pass_rate(sample(base, heldout_tasks, 16, seed=1002))))
    lam1 = run("lambda=1", n, args.lr, gae_lambda=1.0)
    lam95 = run("lambda=0.95", n, args.lr, gae_lambda=0.95)
    early = run("lambda=1, target_kl 0.02/epoch", n, args.lr, gae_lambda=1.0, target_kl=0.02,
                target_kl_mode="epoch")
    print_runs([lam1, lam95, early], n)
    ep = per_epoch(lam1["diag"], 4)
    print_epochs(ep, n)
    print_early_stop(early, lam1)
    if not args.no_figure:
        figure_8_3(ep, n, args.lr, args.out)
    print(f"\nwall time {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
