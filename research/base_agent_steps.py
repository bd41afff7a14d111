"""Base agent (book recipe: random + blind play on the 20 book train tasks) vs behaviour-cloning steps.

Run: .venv/bin/python research/base_agent_steps.py --steps 100 200 400 800 --seeds 0 1 2
Prints pass / valid / submit on the book's train and held-out splits (16 episodes per task, temperature 1).
"""
from __future__ import annotations

import argparse
import json
import time

import torch

import bugfix_gym as bg
from agents.base_agent import make_base_agent
from agents.rollout import rollout_batch, rollout_stats


def sample(model, tok, tasks, n_per_task, seed):
    batch = [t for t in tasks for _ in range(n_per_task)]
    return rollout_batch(model, [bg.BugFixEnv() for _ in batch], batch, tok,
                         generator=torch.Generator().manual_seed(seed))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, nargs="+", default=[200])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--batch-size", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(1)
    tok = bg.build_tokenizer(bg.make_tasks("all"))
    for steps in args.steps:
        for seed in args.seeds:
            t0 = time.perf_counter()
            model = make_base_agent(tok, seed=seed, steps=steps, lr=args.lr, batch_size=args.batch_size)
            build = time.perf_counter() - t0
            row = dict(steps=steps, seed=seed, lr=args.lr, batch_size=args.batch_size, build_s=round(build, 1))
            for split in ("train", "heldout"):
                s = rollout_stats(sample(model, tok, bg.make_tasks(split), 16, seed=0))
                row[split] = {k: round(s[k], 3) for k in ("pass_rate", "valid_calls", "submit_rate", "turns")}
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
