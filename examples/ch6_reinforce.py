"""Book §6.7: REINFORCE on TinyAgent from the base agent, 80 steps x 64 episodes, then what it learned.

The book's recipe through ``agents.reinforce.Reinforce``: episodes from random train tasks
(seeded generator), advantage R - b with an EMA baseline started at the base agent's
measured train pass rate, ``token_mean`` aggregation, Adam 2e-3, grad-norm clip 1.0,
held-out pass rate every 10 steps (8 episodes per held-out task). Prints the book's table
with ours beside it, saves the learning curve to ``docs/reinforce_curve.png``, then the
before/after table on both splits and the behaviour analysis (read rate, edits per
episode, first edit right, most common call sequences).

Run: ``.venv/bin/python examples/ch6_reinforce.py`` (options: ``--steps``, ``--seed``, ``--lr``,
``--mode``, ``--png``).
"""
import argparse
import copy
import time
from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from agents.reinforce import Reinforce  # noqa: E402
from agents.rollout import rollout_stats  # noqa: E402
from bugfix_gym import parse_call  # noqa: E402
from ch6_common import FIX_OP, ROOT, base_agent, heldout_tasks, sample, short, tok, train_tasks  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=80)
parser.add_argument("--episodes", type=int, default=64)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--lr", type=float, default=2e-3)
parser.add_argument("--mode", default="token_mean")
parser.add_argument("--base-seed", type=int, default=0)
parser.add_argument("--base-steps", type=int, default=None,
                    help="behaviour-cloning steps of the base agent (default: the project's, 800)")
parser.add_argument("--png", default=str(ROOT / "docs" / "reinforce_curve.png"))
parser.add_argument("--save", default=str(ROOT / "runs" / "reinforce_ch6.pt"), help="checkpoint path ('' = none)")
args = parser.parse_args()

BOOK_STEPS = {0: (0.156, 0.263), 10: (0.328, 0.200), 20: (0.469, 0.375), 30: (0.531, 0.375), 40: (0.719, 0.525),
              50: (0.781, 0.537), 60: (0.828, 0.475), 70: (0.844, 0.537), 80: (None, 0.450)}

base = base_agent(args.base_seed, args.base_steps)
agent = Reinforce(copy.deepcopy(base), tok, train_tasks=train_tasks, eval_tasks=heldout_tasks,
                  episodes_per_step=args.episodes, lr=args.lr, mode=args.mode, seed=args.seed)
start = time.perf_counter()
agent.learn(args.steps)
wall = time.perf_counter() - start
print(f"EMA baseline started at the base agent's measured train pass rate {agent.baseline_init_value:.3f} "
      f"(book 0.119)")
evals = dict(agent.evals)
print(f"\n{'step':>4} | {'batch reward':>12} {'held-out':>9} {'loss':>8} {'grad norm':>9} | {'book reward':>11} "
      f"{'held-out':>9}")
for step in range(0, args.steps + 1, 10):
    rec = agent.history[step] if step < len(agent.history) else None
    br, bh = BOOK_STEPS.get(step, (None, None))
    cols = (f"{rec['reward']:>12.3f} {evals.get(step, float('nan')):>9.3f} {rec['loss']:>+8.4f} "
            f"{rec['grad_norm']:>9.2f}" if rec else f"{'':>12} {evals.get(step, float('nan')):>9.3f} {'':>8} {'':>9}")
    book = f"{br:>11.3f} {bh:>9.3f}" if br is not None else f"{'':>11} {bh:>9.3f}" if bh is not None else ""
    print(f"{step:>4} | {cols} | {book}")
skipped = sum(h["skipped"] for h in agent.history)
clipped = sum(h["grad_norm"] > 1.0 for h in agent.history)
print(f"\nwall time: {wall:.1f} s for {args.steps} steps x {args.episodes} episodes, of which held-out evaluation "
      f"{agent.eval_time:.1f} s (book: ~7 s on its host) | skipped steps {skipped} | steps with grad norm > 1: "
      f"{clipped}")

# learning curve
fig, ax = plt.subplots(figsize=(7, 4))
ax.plot([h["step"] for h in agent.history], [h["reward"] for h in agent.history], lw=1, label="batch reward (train)")
ax.plot(list(evals), list(evals.values()), "o-", label="held-out pass rate (8 / task)")
ax.axhline(agent.baseline_init_value, color="grey", ls=":", label="base agent, train")
ax.set_xlabel("REINFORCE step (64 episodes each)")
ax.set_ylabel("pass rate")
ax.set_ylim(0, 1)
ax.set_title("REINFORCE from the base agent (book §6.7, fig. 6.3)")
ax.legend(loc="upper left")
fig.tight_layout()
Path(args.png).parent.mkdir(exist_ok=True)
fig.savefig(args.png, dpi=120)
print(f"learning curve saved to {args.png}")
if args.save:
    agent.save(args.save)
    print(f"trainer saved to {args.save} (Reinforce.load)")

# before / after, 16 episodes per task, both splits
BOOK_TABLE = {("base", "train"): 0.144, ("REINFORCE", "train"): 0.775, ("base", "held-out"): 0.125,
              ("REINFORCE", "held-out"): 0.456}
print(f"\n{'':<22}{'pass':>7}{'valid':>7}{'submit':>8}{'turns':>7}{'tokens':>8} | {'book pass':>9}")
for name, tasks in [("train", train_tasks), ("held-out", heldout_tasks)]:
    for who, model in [("base", base), ("REINFORCE", agent.model)]:
        s = rollout_stats(sample(model, tasks, 16, seed=7))
        print(f"{who + ', ' + name:<22}{s['pass_rate']:>7.3f}{s['valid_calls']:>7.3f}{s['submit_rate']:>8.3f}"
              f"{s['turns']:>7.2f}{s['action_tokens']:>8.2f} | {BOOK_TABLE[(who, name)]:>9.3f}")

# behaviour analysis (seed 8, 16 per task)
BOOK_BEHAVIOUR = {"train": (0.00, 2.18, 0.50), "held-out": (0.00, 3.48, 0.23)}
print()
for name, tasks in [("train", train_tasks), ("held-out", heldout_tasks)]:
    trajs = sample(agent.model, tasks, 16, seed=8)
    reads = sum(any(parse_call(a) == ("read", None) for a in t.info["actions"]) for t in trajs) / len(trajs)
    edits = sum(len(t.info["ops"]) for t in trajs) / len(trajs)
    first_right = sum(bool(t.info["ops"]) and t.info["ops"][0] == FIX_OP[t.task] for t in trajs) / len(trajs)
    br, be, bf = BOOK_BEHAVIOUR[name]
    print(f"{name}: read {reads:.2f} | edits per episode {edits:.2f} | first edit is the right op {first_right:.2f}"
          f"   (book: read {br:.2f} | edits {be:.2f} | first right {bf:.2f})")
    for calls, count in Counter(" -> ".join(map(short, t.info["actions"])) for t in trajs).most_common(3):
        print(f"  {count:3d} x {calls}")
