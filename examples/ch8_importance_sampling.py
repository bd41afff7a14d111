"""Book §8.1: off-policy reuse. Exact trajectory importance weights collapse; the per-token
surrogate is right near pi_old and drifts away from the measured improvement as the policy moves.

The old batch is 320 base-agent episodes (16 per train task, seed 0). A copy of the base agent
takes k REINFORCE steps (the §6.7 trainer, ``agents.algorithms.reinforce.Reinforce``
on 64 train envs, one fresh episode per env per step, Adam ``--lr`` 2e-3, EMA baseline started at
the base agent's measured train pass rate, token_mean, seed 1). After k = 0, 1, 3, 10, 30 updates (a callback
measures at the start of the next rollout) we reweight the old batch to the moved policy with
eq. (8.1), ``log w = sum_i m_i (log pi_k - log pi_old)``, and report:

* std of log w and the ESS fraction ``(sum w)^2 / sum w^2 / N``;
* the IS estimate ``mean(w R)`` of the new pass rate vs the pass rate measured on 320 new samples
  of the moved policy (16 per train task, seed 1, the same seed for every k);
* the surrogate's improvement ``(1/N) sum_n sum_i m_i (rho_ni - 1)(R_n - mean R)`` vs the measured
  improvement (new-sample pass rate at k minus the one at k = 0);
* after 10 updates, the spread of log w by the episode's number of policy tokens.

Figure 8.1: ``fig8_1_ess.png`` in ``--out`` (default ``runs/figures``). In this setting (no call
grammar, no invalid-call cost) REINFORCE at the book's rate drifts into invalid calls from the
project's base agent; docs/chapter8.md §8.1 shows it next to ``--lr 1e-3``.

Run: ``python examples/ch8_importance_sampling.py`` (``--out docs`` to update the documented figure).
"""
from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
from matplotlib.figure import Figure
from stable_baselines3.common.callbacks import BaseCallback

from agents.algorithms.callbacks import StopAfterIterations
from agents.model.tinyagent import TinyAgent
from agents.algorithms.reinforce import Reinforce
from agents.rollout.trajectory import Trajectory, collate
from agents.bugfix.evaluation import evaluate
from ch8_common import (FIGURES, base_agent, batch_logp, book_vs_ours, old_batch, pass_rate, sample, set_threads,
                        tok, train_env, train_tasks)

KS = (0, 1, 3, 10, 30)
NEW_SAMPLE_SEED = 1
BOOK = {  # k: (log-w std, ESS fraction, IS estimate, new-sample pass rate, surrogate, measured improvement)
    0: ("0", "100%", "0.119", "0.159", "0", "0"),
    1: ("0.8", "78%", "", "", "within 0.005 of measured", ""),
    3: ("", "~33%", "", "", "within 0.005 of measured", ""),
    10: ("", "", "0.256", "0.469", "0.258", "0.309"),
    30: ("17", "~10%", "0.431", "0.700", "", ""),
}


class AfterUpdates(BaseCallback):
    """Calls ``fn(k)`` at the start of a rollout when ``k`` updates are done and ``k`` is in ``ks``.

    :param ks: the update counts to stop at
    :param fn: what to run there (the model has taken exactly ``k`` updates)
    """

    def __init__(self, ks: tuple[int, ...], fn: Callable[[int], None]):
        super().__init__()
        self.ks, self.fn, self.done = set(ks), fn, set()

    def _on_rollout_start(self) -> None:
        k = len(self.model.diagnostics)
        if k in self.ks and k not in self.done:
            self.done.add(k)
            self.fn(k)

    def _on_step(self) -> bool:
        return True


class Reweighting:
    """The old batch, frozen under pi_old, and what the moved policy's weights say about it.

    :param old: the old batch (sampled by ``base``)
    :param base: pi_old, the base agent
    """

    def __init__(self, old: list[Trajectory], base: TinyAgent):
        self.old = old
        self.batch = collate(old, tok.pad_id)
        self.mask = self.batch["policy_mask"]  # [N, T-1]
        self.R = self.batch["rewards"]  # [N]
        self.n_tokens = self.mask.sum(1)  # [N] policy tokens per episode
        self.old_logp = batch_logp(base, self.batch)  # [N, T-1] pi_old, recomputed once by the trainer
        self.rows: dict[int, dict[str, Any]] = {}
        self.log_w: dict[int, np.ndarray] = {}

    def measure(self, k: int, model: TinyAgent) -> dict[str, Any]:
        """Weights of the old batch under ``model`` (k updates), and the pass rate of new samples."""
        mask, R, old = self.mask, self.R, self.old
        log_ratio = (batch_logp(model, self.batch) - self.old_logp) * mask  # [N, T-1] log rho on policy tokens
        log_w = log_ratio.sum(1).double()  # [N] eq. (8.1)
        w = log_w.exp()
        p_new = pass_rate(sample(model, train_tasks, 16, NEW_SAMPLE_SEED))
        top = int(w.argmax())
        row = dict(k=k, std=float(log_w.std()), ess=float(w.sum() ** 2 / (w ** 2).sum()) / len(w),
                   max_log_w=float(log_w.max()), top_share=float(w.max() / w.sum()),
                   top_desc=f"{old[top].task}, {int(self.n_tokens[top])} tokens, R={old[top].reward:g}, "
                            f"calls {old[top].info['actions']}",
                   is_est=float((w * R.double()).mean()), p_new=p_new,
                   surrogate=float(((log_ratio.exp() - 1) * mask).sum(1).mul(R - R.mean()).mean()),
                   measured=p_new - self.rows[0]["p_new"] if self.rows else 0.0,
                   tok_std=float(log_ratio[mask > 0].std()))
        self.rows[k] = row
        self.log_w[k] = log_w.numpy()
        return row


def train_and_measure(rw: Reweighting, base: TinyAgent, lr: float, seed: int, start: float) -> None:
    """k REINFORCE updates from ``base`` in one ``learn`` call; ``rw`` measures after each k in KS."""
    baseline_init = evaluate(base, train_tasks, 16, seed, tokenizer=tok)["pass_rate"]
    trainer = Reinforce("TinyAgentPolicy", train_env(64, seed), base_agent=copy.deepcopy(base),
                        policy_kwargs=dict(tokenizer=tok), n_episodes=64, learning_rate=lr, seed=seed,
                        baseline_init=baseline_init)
    print(f"REINFORCE: lr {lr:g}, seed {seed}, 64 fresh episodes per step, EMA baseline from {baseline_init:.3f}")

    def at(k: int) -> None:
        rw.measure(k, trainer.policy.model)
        last = trainer.diagnostics[-1]["rollout"] if trainer.diagnostics else None
        print(f"k = {k:2d} done ({time.perf_counter() - start:.0f} s); last batch pass "
              f"{last['pass_rate'] if last else float('nan'):.2f}, valid calls "
              f"{last['valid_calls'] if last else float('nan'):.2f}", flush=True)

    trainer.learn(10**9, callback=[StopAfterIterations(max(KS)), AfterUpdates(KS, at)])


def print_tables(rw: Reweighting) -> None:
    rows = [rw.rows[k] for k in KS]
    print("\nimportance weights of the old batch after k REINFORCE updates (ours | book)")
    print(f"{'k':>3}{'std log w':>10}{'ESS':>7}{'IS est.':>9}{'new pass':>10}{'tok std':>9} | "
          f"{'std log w':>9}{'ESS':>6}{'IS est.':>8}{'new pass':>9}")
    for r in rows:
        b = BOOK[r["k"]]
        print(f"{r['k']:>3}{r['std']:>10.2f}{r['ess']:>7.1%}{r['is_est']:>9.3f}{r['p_new']:>10.3f}"
              f"{r['tok_std']:>9.3f} | {b[0]:>9}{b[1]:>6}{b[2]:>8}{b[3]:>9}")
    print("(tok std: std of the per-token log ratio over policy tokens)")
    print("\nthe heaviest weight at each k (its share of sum w decides the ESS)")
    for r in rows[1:]:
        print(f"  k={r['k']:>2}: max log w {r['max_log_w']:+.2f}, share of sum w {r['top_share']:.0%}: {r['top_desc']}")

    print("\nsurrogate vs measured improvement of the pass rate (ours | book)")
    print(f"{'k':>3}{'surrogate':>11}{'measured':>10}{'error':>8} | book")
    for r in rows:
        b = BOOK[r["k"]]
        book = f"{b[4]} vs {b[5]}" if b[5] else b[4]
        print(f"{r['k']:>3}{r['surrogate']:>11.3f}{r['measured']:>10.3f}{r['surrogate'] - r['measured']:>+8.3f} | "
              f"{book}")

    lw10, L = rw.log_w[10], rw.n_tokens.numpy()
    print("\nspread of log w after 10 updates, by policy tokens per episode")
    book_b = {"< 8": "1.42", "8-15": "", ">= 16": "3.46"}
    print(f"{'tokens':<8}{'episodes':>9}{'std log w':>11}{'mean log w':>12} | book std")
    for name, sel in [("< 8", L < 8), ("8-15", (L >= 8) & (L < 16)), (">= 16", L >= 16)]:
        std = f"{lw10[sel].std(ddof=1):.2f}" if sel.sum() > 1 else "-"
        mean = f"{lw10[sel].mean():.2f}" if sel.sum() else "-"
        print(f"{name:<8}{int(sel.sum()):>9}{std:>11}{mean:>12} | {book_b[name]}")
    sigma = rw.rows[10]["tok_std"]
    print(f"independent-token model sigma*sqrt(L): sigma {sigma:.2f} -> "
          + ", ".join(f"L={n}: {sigma * np.sqrt(n):.2f}" for n in (4, 8, 16)))


def figure_8_1(rw: Reweighting, out: Path) -> None:
    fig = Figure(figsize=(9, 3.6))
    axes = fig.subplots(1, 2)
    ax = axes[0]
    ax.plot(KS, [100 * rw.rows[k]["ess"] for k in KS], "o-", label="ours")
    ax.plot([1, 3, 30], [78, 33, 10], "x--", color="grey", label="book (text)")
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xticks(KS)
    ax.set_xticklabels([str(k) for k in KS])
    ax.set_xlabel("REINFORCE updates k")
    ax.set_ylabel(f"ESS, % of {len(rw.old)} episodes")
    ax.set_ylim(0, 105)
    ax.legend(fontsize=8)
    ax.set_title("effective sample size of the old batch")
    ax = axes[1]
    L = rw.n_tokens.numpy()
    jitter = np.random.default_rng(0).uniform(-0.25, 0.25, len(L))
    ax.scatter(L + jitter, rw.log_w[10], s=8, alpha=0.5, c=rw.R.numpy(), cmap="coolwarm", vmin=0, vmax=1)
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xlabel("policy tokens in the episode")
    ax.set_ylabel("log w after 10 updates")
    ax.set_title("log weight vs episode length (red: passed)")
    fig.suptitle(f"Figure 8.1 (ours): {len(rw.old)} base-agent episodes reweighted to the policy after k updates",
                 fontsize=10)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "fig8_1_ess.png", dpi=120)
    print(f"\nsaved {out / 'fig8_1_ess.png'}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, default=2e-3, help="REINFORCE Adam learning rate (book: 2e-3)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the REINFORCE batches")
    parser.add_argument("--out", type=Path, default=FIGURES, help="folder of figure 8.1 (default runs/figures)")
    args = parser.parse_args(argv)
    set_threads()
    start = time.perf_counter()
    base = base_agent()
    rw = Reweighting(old_batch(base), base)
    print(f"old batch: {len(rw.old)} episodes, pass rate {rw.R.mean():.3f} (book 0.119), "
          f"{rw.n_tokens.mean():.1f} policy tokens per episode (book ~12)")
    train_and_measure(rw, base, args.lr, args.seed, start)
    print_tables(rw)
    figure_8_1(rw, args.out)
    r1, r3, r10, r30 = (rw.rows[k] for k in (1, 3, 10, 30))
    print("\nsummary")
    book_vs_ours([
        ("ESS after 1 / 3 / 30 updates", f"{r1['ess']:.1%} / {r3['ess']:.1%} / {r30['ess']:.1%}", "78% / ~33% / ~10%"),
        ("std log w after 1 -> 30", f"{r1['std']:.2f} -> {r30['std']:.1f}", "0.8 -> 17"),
        ("IS vs new pass, k=10", f"{r10['is_est']:.3f} vs {r10['p_new']:.3f}", "0.256 vs 0.469"),
        ("IS vs new pass, k=30", f"{r30['is_est']:.3f} vs {r30['p_new']:.3f}", "0.431 vs 0.700"),
        ("surrogate vs measured, k=10", f"{r10['surrogate']:.3f} vs {r10['measured']:.3f}", "0.258 vs 0.309"),
    ])
    print(f"\nwall time {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
