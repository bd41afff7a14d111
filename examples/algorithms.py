"""Any named algorithm (docs/algorithms.md) trained briefly on the book's tasks, with the pass rate before and after.

``make_algorithm(NAME, "TinyAgentPolicy", env)`` on ``make_vec_env("BugFix-v0", n_envs=...)`` over the
book's 20 train tasks, from the behaviour-cloned base agent, calls under the legal-call grammar,
``--iterations`` updates of ``--n-episodes`` episodes (a preset with groups plays them as groups of
``group_size``), a fixed seed. Prints the pass rate on the train and held-out tasks (8 episodes per
task) before and after, and saves the model as ``runs/examples/algorithms-NAME.zip``; load it with
``agents.algorithms.presets.load_algorithm`` or ``bugfix-gym eval``.

Run: ``python examples/algorithms.py`` (``--algo NAME``, default grpo; ``--iterations``, ``--n-episodes``,
``--seed``; ``--quick``: 2 iterations of 16 episodes, a smoke run).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from stable_baselines3.common.env_util import make_vec_env

import bugfix_gym
from agents.algorithms.callbacks import StopAfterIterations
from agents.algorithms.presets import ALGORITHM_NAMES, make_algorithm
from agents.bugfix.evaluation import evaluate

RUNS = Path("runs/examples")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", choices=ALGORITHM_NAMES, default="grpo", help="the algorithm (default: grpo)")
    parser.add_argument("--iterations", type=int, default=10, help="updates (default: 10)")
    parser.add_argument("--n-episodes", type=int, default=64, help="episodes per update (default: 64)")
    parser.add_argument("--seed", type=int, default=0, help="seed (default: 0)")
    parser.add_argument("--quick", action="store_true", help="2 iterations of 16 episodes (a smoke run)")
    return parser.parse_args(argv)


def pass_rates(model, seed: int) -> dict[str, float]:
    """The model's pass rate on the book's train and held-out tasks, 8 episodes per task."""
    return {split: evaluate(model, bugfix_gym.make_tasks(split), 8, seed=seed)["pass_rate"]
            for split in ("train", "heldout")}


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    args = parse_args(argv)
    torch.set_num_threads(1)
    iterations, n_episodes = (2, 16) if args.quick else (args.iterations, args.n_episodes)
    env = make_vec_env("BugFix-v0", n_envs=min(n_episodes, 64), seed=args.seed,
                       env_kwargs=dict(split="train", invalid_cost=0.1, render_mode=None))
    model = make_algorithm(args.algo, "TinyAgentPolicy", env, seed=args.seed, n_episodes=n_episodes,
                           policy_kwargs=dict(call_grammar=list(bugfix_gym.CALLS)))
    before = pass_rates(model, args.seed)
    started = time.perf_counter()
    model.learn(10**12, callback=StopAfterIterations(iterations))
    seconds = time.perf_counter() - started
    after = pass_rates(model, args.seed)
    print(f"{args.algo} ({type(model).__name__}): {iterations} iterations of {n_episodes} episodes, "
          f"{model.num_timesteps} env steps in {seconds:.0f} s, seed {args.seed}")
    print(f"{'pass rate':<10} {'before':>7} {'after':>7}")
    for split in ("train", "heldout"):
        print(f"{split:<10} {before[split]:>7.3f} {after[split]:>7.3f}")
    RUNS.mkdir(parents=True, exist_ok=True)
    path = RUNS / f"algorithms-{args.algo}.zip"
    model.save(path)
    print(f"saved {path}")
    return {"before": before, "after": after}


if __name__ == "__main__":
    main()
