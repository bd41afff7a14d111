"""Book §6.7: REINFORCE on TinyAgent from the base agent, 80 steps x 64 episodes, then what it learned.

The book's recipe through ``agents.algorithms.reinforce.Reinforce`` on ``make_vec_env("BugFix-v0", n_envs=64)``
over the train tasks (each env draws its tasks with its own seeded generator): 64 episodes per step,
advantage R - b with an EMA baseline started at the base agent's measured train pass rate (16
episodes per task), ``token_mean`` aggregation, Adam 2e-3, grad-norm clip 1.0, held-out pass rate
every 10 steps (8 episodes per held-out task, :class:`ch6_common.HeldOutEval`).

Batches: ``--batches fresh`` (default, the book's and the engine's) plays one new episode per env
per step, all under the current policy; ``--batches span`` (``fresh_batches=False``) lets an
unfinished episode continue into the next step (docs/chapter6.md has what that does here).

Invalid calls: ``--invalid-cost 0.1`` (default) charges every invalid call 0.1 (the env option
``invalid_cost``); without it (``--invalid-cost 0``, the book's env) an invalid call is a free
"not yet", and sequence-level advantages reinforce malformed calls in episodes that still pass.
Calls are sampled under the legal-call grammar (``--no-grammar``: freely, as the book does), so
every call is valid; docs/chapter6.md has the seeds of each variant.

Prints the book's table with ours beside it, saves the learning curve (default
``runs/figures/reinforce_curve.png``) and the trained model (``runs/examples/reinforce_ch6.zip``),
then the before/after table on both splits (with the grammar, also the trained weights sampled
without it: the mask is part of the policy) and the behaviour analysis (read rate, edits per
episode, first edit right, most common call sequences). Our numbers and the runs behind them:
docs/chapter6.md.

Run: ``python examples/ch6_reinforce.py`` (``--quick``: 10 steps; ``--steps``, ``--seed``, ``--lr``,
``--mode``, ``--base-steps``, ``--batches``, ``--invalid-cost``, ``--no-grammar``; ``--png
docs/reinforce_curve.png`` to update the documented figure).
"""
from __future__ import annotations

import argparse
import copy
import time
from collections import Counter
from pathlib import Path

from matplotlib.figure import Figure
from stable_baselines3.common.env_util import make_vec_env

from agents.algorithms.callbacks import StopAfterIterations
from agents.decoding.grammar import CallGrammar
from agents.model.tinyagent import TinyAgent
from agents.algorithms.reinforce import Reinforce
from agents.bugfix.evaluation import evaluate, sample_episodes
from bugfix_gym import CALLS, parse_call
from ch6_common import (FIX_OP, RUNS, HeldOutEval, base_agent, heldout_tasks, set_threads,
                        short, tok, train_tasks)

BOOK_STEPS = {0: (0.156, 0.263), 10: (0.328, 0.200), 20: (0.469, 0.375), 30: (0.531, 0.375), 40: (0.719, 0.525),
              50: (0.781, 0.537), 60: (0.828, 0.475), 70: (0.844, 0.537), 80: (None, 0.450)}
BOOK_TABLE = {("base", "train"): 0.144, ("REINFORCE", "train"): 0.775, ("base", "held-out"): 0.125,
              ("REINFORCE", "held-out"): 0.456}
BOOK_BEHAVIOUR = {"train": (0.00, 2.18, 0.50), "held-out": (0.00, 3.48, 0.23)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80, help="REINFORCE steps (book: 80)")
    parser.add_argument("--quick", action="store_true", help="10 steps (a smoke run, not the book's table)")
    parser.add_argument("--episodes", type=int, default=64, help="episodes per step and envs (book: 64)")
    parser.add_argument("--batches", choices=("fresh", "span"), default="fresh",
                        help="fresh: one new episode per env per step (the book's and the engine's default); "
                             "span: unfinished episodes continue into the next step")
    parser.add_argument("--invalid-cost", type=float, default=0.1,
                        help="reward charged for every invalid call (default 0.1; 0 = the book's env)")
    parser.add_argument("--no-grammar", dest="grammar", action="store_false",
                        help="sample calls freely (default: constrained to the legal-call grammar)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--mode", default="token_mean", help="loss aggregation mode")
    parser.add_argument("--base-seed", type=int, default=0)
    parser.add_argument("--base-steps", type=int, default=None,
                        help="behaviour-cloning steps of the base agent (default: the project's, 200)")
    parser.add_argument("--png", type=Path, default=RUNS / "figures" / "reinforce_curve.png",
                        help="learning-curve figure (default runs/figures/reinforce_curve.png)")
    parser.add_argument("--save", default=str(RUNS / "examples" / "reinforce_ch6.zip"),
                        help="trained model file ('' = none)")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps = 10
    if args.steps < 1 or args.episodes < 1:
        parser.error("--steps and --episodes must be positive")
    return args


def train(args: argparse.Namespace, base: TinyAgent) -> tuple[Reinforce, HeldOutEval, float, float]:
    """The book's run; returns the trainer, its held-out evaluations, the EMA's start and the wall time."""
    baseline_init = evaluate(base, train_tasks, 16, args.seed, tokenizer=tok)["pass_rate"]  # measured, as the book does
    env = make_vec_env("BugFix-v0", n_envs=args.episodes, seed=args.seed,
                       env_kwargs=dict(tasks=train_tasks, invalid_cost=args.invalid_cost,
                                       render_mode=None))  # None: SB3 would ask for rgb_array
    policy_kwargs = dict(tokenizer=tok, call_grammar=list(CALLS) if args.grammar else None)
    model = Reinforce("TinyAgentPolicy", env, base_agent=copy.deepcopy(base), policy_kwargs=policy_kwargs,
                      n_episodes=args.episodes, learning_rate=args.lr, loss_mode=args.mode, seed=args.seed,
                      baseline_init=baseline_init, fresh_batches=args.batches == "fresh")
    heldout = HeldOutEval(heldout_tasks, every=10)
    start = time.perf_counter()
    model.learn(10**9, callback=[StopAfterIterations(args.steps), heldout])
    return model, heldout, baseline_init, time.perf_counter() - start


def print_steps(model: Reinforce, heldout: HeldOutEval, steps: int) -> None:
    """The book's table: batch reward, held-out pass rate, loss and gradient norm every 10 steps."""
    diag = model.diagnostics
    print(f"\n{'step':>4} | {'batch reward':>12} {'held-out':>9} {'loss':>8} {'grad norm':>9} | {'book reward':>11} "
          f"{'held-out':>9}")
    for step in range(0, steps + 1, 10):
        rec = diag[step] if step < len(diag) else None
        h = heldout.pass_rate.get(step, float("nan"))
        br, bh = BOOK_STEPS.get(step, (None, None))
        cols = (f"{rec['reward']:>12.3f} {h:>9.3f} {rec['loss']:>+8.4f} {rec['grad_norm']:>9.2f}" if rec
                else f"{'':>12} {h:>9.3f} {'':>8} {'':>9}")
        book = f"{br:>11.3f} {bh:>9.3f}" if br is not None else f"{'':>11} {bh:>9.3f}" if bh is not None else ""
        print(f"{step:>4} | {cols} | {book}")


def save_curve(model: Reinforce, heldout: HeldOutEval, baseline_init: float, png: Path) -> None:
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    ax.plot([d["iteration"] - 1 for d in model.diagnostics], [d["reward"] for d in model.diagnostics], lw=1,
            label="batch reward (train)")
    ax.plot(list(heldout.pass_rate), list(heldout.pass_rate.values()), "o-", label="held-out pass rate (8 / task)")
    ax.axhline(baseline_init, color="grey", ls=":", label="base agent, train")
    ax.set_xlabel("REINFORCE step")
    ax.set_ylabel("pass rate")
    ax.set_ylim(0, 1)
    ax.set_title("REINFORCE from the base agent (book §6.7, fig. 6.3)")
    ax.legend(loc="upper left")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    print(f"learning curve saved to {png}")


def before_after(base: TinyAgent, trained: TinyAgent, grammar: CallGrammar | None) -> None:
    """Base agent vs the trained policy, 16 episodes per task, both splits (seed 7), decoding as in training;
    with a grammar, also the trained weights sampled freely (what they write without the mask)."""
    print(f"\n{'':<26}{'pass':>7}{'valid':>7}{'submit':>8}{'turns':>7}{'tokens':>8} | {'book pass':>9}")
    for name, tasks in [("train", train_tasks), ("held-out", heldout_tasks)]:
        rows = [("base", base, grammar), ("REINFORCE", trained, grammar)]
        if grammar is not None:
            rows.append(("REINFORCE, free", trained, None))
        for who, model, rule in rows:
            s = evaluate(model, tasks, 16, seed=7, tokenizer=tok, grammar=rule)
            book = BOOK_TABLE.get((who, name))
            print(f"{who + ', ' + name:<26}{s['pass_rate']:>7.3f}{s['valid_calls']:>7.3f}{s['submit_rate']:>8.3f}"
                  f"{s['turns']:>7.2f}{s['policy_tokens']:>8.2f} | " + (f"{book:>9.3f}" if book is not None else ""))


def behaviour(trained: TinyAgent, grammar: CallGrammar | None) -> None:
    """What the trained policy does (seed 8, 16 episodes per task, decoding as in training): reads,
    edits, first edit right, the most common call sequences."""
    print()
    for name, tasks in [("train", train_tasks), ("held-out", heldout_tasks)]:
        trajs = sample_episodes(trained, tasks, 16, seed=8, tokenizer=tok, grammar=grammar)
        reads = sum(any(parse_call(a) == ("read", None) for a in t.info["actions"]) for t in trajs) / len(trajs)
        edits = sum(len(t.info["ops"]) for t in trajs) / len(trajs)
        first_right = sum(bool(t.info["ops"]) and t.info["ops"][0] == FIX_OP[t.task] for t in trajs) / len(trajs)
        br, be, bf = BOOK_BEHAVIOUR[name]
        print(f"{name}: read {reads:.2f} | edits per episode {edits:.2f} | first edit is the right op "
              f"{first_right:.2f}   (book: read {br:.2f} | edits {be:.2f} | first right {bf:.2f})")
        for calls, count in Counter(" -> ".join(map(short, t.info["actions"])) for t in trajs).most_common(3):
            print(f"  {count:3d} x {calls}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    set_threads()
    base = base_agent(args.base_seed, args.base_steps)
    model, heldout, baseline_init, wall = train(args, base)
    print(f"EMA baseline started at the base agent's measured train pass rate {baseline_init:.3f} (book 0.119)")
    print_steps(model, heldout, args.steps)
    diag = model.diagnostics
    skipped = sum(d["skipped"] for d in diag)
    clipped = sum(d["grad_norm"] > 1.0 for d in diag)
    episodes = sum(d["rollout"]["episodes"] for d in diag) / len(diag)
    print(f"\nwall time: {wall:.1f} s for {len(diag)} steps ({args.batches} batches, {episodes:.1f} episodes per step "
          f"on average), of which held-out evaluation {heldout.seconds:.1f} s (book: ~7 s on its host) | skipped "
          f"steps {skipped} | steps with grad norm > 1: {clipped}")
    save_curve(model, heldout, baseline_init, args.png)
    if args.save:
        Path(args.save).parent.mkdir(parents=True, exist_ok=True)
        model.save(args.save)
        print(f"model saved to {args.save} ({type(model).__name__}.load)")
    trained = model.policy.model
    before_after(base, trained, model.policy.grammar)
    behaviour(trained, model.policy.grammar)


if __name__ == "__main__":
    main()
