"""``bugfix-gym``: train, evaluate and play from the command line.

    bugfix-gym train                      # the demo: TokenPPO from the base agent, before/after table
    bugfix-gym train --timesteps 2000 --out runs/quick
    bugfix-gym eval runs/<run>/tokenppo.zip --split heldout
    bugfix-gym play --task clamp          # type the calls yourself

Bad arguments, a missing or corrupt model file: one line on stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Sequence

EVAL_KEYS = (("pass_rate", "pass rate"), ("valid_calls", "valid calls"), ("submit_rate", "submit rate"),
             ("read_rate", "read rate"), ("edits_per_episode", "edits / episode"), ("turns", "turns / episode"))


class UsageError(Exception):
    """A one-line command-line error (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    """argparse, but errors are one line (no usage dump) and exit with status 2."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{self.prog}: error: {message} (see --help)")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="bugfix-gym", description="Train and evaluate token-level agents on BugFix-v0.")
    sub = parser.add_subparsers(dest="command", metavar="{train,eval,play}", parser_class=_Parser)

    train = sub.add_parser("train", help="train TokenPPO from the base agent (the demo)",
                           description="Train TokenPPO from the behaviour-cloned base agent on the train split, "
                                       "print a before/after table (train and held-out), save the model and a "
                                       "learning-curve PNG.")
    train.add_argument("--timesteps", type=int, default=6000,
                       help="environment steps (tool calls) to train for (default: 6000, ~30 iterations of 64 "
                            "episodes)")
    train.add_argument("--n-episodes", type=int, default=64, help="episodes per PPO iteration (default: 64)")
    train.add_argument("--n-epochs", type=int, default=4, help="epochs per batch (default: 4)")
    train.add_argument("--n-minibatches", type=int, default=4, help="minibatches per epoch (default: 4)")
    train.add_argument("--learning-rate", type=float, default=None, help="Adam learning rate (default: TokenPPO's)")
    train.add_argument("--gae-lambda", type=float, default=1.0, help="GAE lambda (default: 1)")
    train.add_argument("--target-kl", type=float, default=0.02,
                       help="KL early-stop target; 0 turns early stopping off (default: 0.02)")
    train.add_argument("--target-kl-mode", default="minibatch", choices=("minibatch", "epoch"),
                       help="early-stop rule: SB3's per-minibatch 1.5x rule or the book's per-epoch one "
                            "(default: minibatch)")
    train.add_argument("--seed", type=int, default=0, help="seed (default: 0)")
    train.add_argument("--eval-episodes", type=int, default=8,
                       help="episodes per task for the before/after table (default: 8)")
    train.add_argument("--out", type=Path, default=None, help="output folder (default: runs/tokenppo-<time>)")
    train.add_argument("--tensorboard", action="store_true", help="also write TensorBoard logs under the output folder")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")

    ev = sub.add_parser("eval", help="evaluate a saved TokenPPO model",
                        description="Sample episodes of every task of a split with a saved model and print the "
                                    "pass rate and behaviour statistics.")
    ev.add_argument("model", type=Path, help="a TokenPPO .zip file (from `bugfix-gym train` or model.save)")
    ev.add_argument("--split", default="heldout", choices=("train", "heldout", "all"),
                    help="task split (default: heldout)")
    ev.add_argument("--episodes", type=int, default=8, help="episodes per task (default: 8)")
    ev.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")

    sub.add_parser("play", help="play BugFix-v0 yourself in the terminal (bugfix_gym.play)", add_help=False)
    return parser


def evaluate_model(model, split: str, episodes_per_task: int = 8, seed: int = 0) -> dict[str, float]:
    """Sample ``episodes_per_task`` episodes of every task of ``split`` (seeded, temperature 1)."""
    import torch

    from bugfix_gym import BugFixEnv, episode_stats

    from .vec_env import TextDummyVecEnv

    env = TextDummyVecEnv([lambda: BugFixEnv(split=split)])
    tasks = [t for t in env.get_attr("tasks")[0] for _ in range(episodes_per_task)]
    trajs = model.sample_episodes(env=env, tasks=tasks, generator=torch.Generator().manual_seed(seed))
    return episode_stats([t.info for t in trajs], [t.reward for t in trajs])


def _table(rows: dict[str, dict[str, float]]) -> str:
    """Columns of evaluation results -> a plain-text table."""
    cols = list(rows)
    width = max(len(c) for c in cols) + 2
    lines = ["".ljust(18) + "".join(c.rjust(width) for c in cols)]
    for key, label in EVAL_KEYS:
        lines.append(label.ljust(18) + "".join(f"{rows[c][key]:.3f}".rjust(width) for c in cols))
    return "\n".join(lines)


def _plot(diagnostics: list[dict[str, Any]], path: Path, held: tuple[float, float] | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    it = [d["iteration"] for d in diagnostics if "rollout" in d]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    ax1.plot(it, [d["rollout"]["pass_rate"] for d in diagnostics if "rollout" in d], label="train batch pass rate")
    ax1.plot(it, [d["rollout"]["valid_calls"] for d in diagnostics if "rollout" in d], label="valid calls", alpha=0.6)
    if held is not None:
        ax1.scatter([it[0], it[-1]], list(held), color="C3", zorder=3, label="held-out pass rate (before / after)")
    ax1.set_xlabel("PPO iteration")
    ax1.set_ylim(0, 1.02)
    ax1.legend(loc="lower right", fontsize=8)
    ax1.set_title("TokenPPO on BugFix-v0")
    ax2.plot(it, [d["epochs"][0]["clip_fraction"] if d["epochs"] else float("nan") for d in diagnostics
                  if "rollout" in d], label="clip fraction, epoch 1")
    ax2.plot(it, [d["epochs"][-1]["clip_fraction"] if d["epochs"] else float("nan") for d in diagnostics
                  if "rollout" in d], label="clip fraction, last epoch")
    ax2.plot(it, [d["epochs"][-1]["approx_kl"] if d["epochs"] else float("nan") for d in diagnostics
                  if "rollout" in d], label="approx KL, last epoch")
    ax2.set_xlabel("PPO iteration")
    ax2.legend(fontsize=8)
    ax2.set_title("per-epoch diagnostics")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cmd_train(args: argparse.Namespace) -> int:
    import gymnasium as gym

    import bugfix_gym  # noqa: F401  (registers BugFix-v0)

    from .ppo import TokenPPO

    import torch

    torch.set_num_threads(1)  # a ~150k-parameter model: one thread beats two on a small, shared CPU
    for name in ("timesteps", "n_episodes", "n_epochs", "n_minibatches", "eval_episodes"):
        if getattr(args, name) < 1:
            raise UsageError(f"bugfix-gym train: error: --{name.replace('_', '-')} must be at least 1")
    out = args.out or Path("runs") / time.strftime("tokenppo-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    print("setting up: base agent (behaviour cloning, cached after the first run) ...", flush=True)
    kwargs: dict[str, Any] = dict(n_episodes=args.n_episodes, n_epochs=args.n_epochs,
                                  n_minibatches=args.n_minibatches, gae_lambda=args.gae_lambda,
                                  target_kl=args.target_kl or None, target_kl_mode=args.target_kl_mode, seed=args.seed)
    if args.learning_rate is not None:
        kwargs["learning_rate"] = args.learning_rate
    if args.tensorboard:
        kwargs["tensorboard_log"] = str(out / "tb")
    model = TokenPPO("TinyAgentPolicy", gym.make("BugFix-v0"), **kwargs)
    print(f"  ready in {time.perf_counter() - t0:.0f} s; evaluating the base agent ...", flush=True)
    before = {s: evaluate_model(model, s, args.eval_episodes, args.seed) for s in ("train", "heldout")}
    t1 = time.perf_counter()
    print(f"training TokenPPO for {args.timesteps} env steps ({args.n_episodes} episodes per iteration) ...",
          flush=True)
    model.learn(args.timesteps, progress_bar=not args.no_progress)
    train_s = time.perf_counter() - t1
    after = {s: evaluate_model(model, s, args.eval_episodes, args.seed) for s in ("train", "heldout")}
    n_iter = len(model.diagnostics)
    print(f"\n{n_iter} iterations, {model.num_timesteps} env steps, {model.total_policy_tokens} policy tokens "
          f"in {train_s:.0f} s\n")
    print(_table({"base train": before["train"], "PPO train": after["train"],
                  "base held-out": before["heldout"], "PPO held-out": after["heldout"]}))
    model_path = out / "tokenppo.zip"
    model.save(model_path)
    png = out / "learning_curve.png"
    _plot(model.diagnostics, png, (before["heldout"]["pass_rate"], after["heldout"]["pass_rate"]))
    print(f"\nsaved {model_path} and {png}  (total {time.perf_counter() - t0:.0f} s)")
    print(f"evaluate again with: bugfix-gym eval {model_path} --split heldout")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    import torch

    from .ppo import TokenPPO

    torch.set_num_threads(1)
    if args.episodes < 1:
        raise UsageError("bugfix-gym eval: error: --episodes must be at least 1")
    try:
        model = TokenPPO.load(args.model)
    except FileNotFoundError:
        raise UsageError(f"bugfix-gym eval: error: no model file at {args.model}") from None
    except ValueError as e:
        raise UsageError(f"bugfix-gym eval: error: {e}") from None
    stats = evaluate_model(model, args.split, args.episodes, args.seed)
    print(_table({f"{args.model.name} on {args.split}": stats}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``bugfix-gym`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "play":
        from bugfix_gym.play import main as play_main

        return int(play_main(argv[1:], prog="bugfix-gym play") or 0)
    try:
        args = _parser().parse_args(argv)
        if args.command is None:
            _parser().print_help()
            return 2
        return cmd_train(args) if args.command == "train" else cmd_eval(args)
    except UsageError as e:
        print(str(e), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bugfix-gym: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
