"""Book §6.2: the base agent. Untrained TinyAgent vs the behaviour-cloned base agent.

Builds the tokenizer and the base agent exactly as the book does (``make_base_agent(tok)``),
samples 16 episodes per task at temperature 1 on the train and held-out splits, and prints our
numbers beside the book's; then three sampled episodes of the first train task.

Run: ``python examples/ch6_base_agent.py`` (``--quick``: load the cached base agent instead of
timing its training).
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Sequence

import torch

import bugfix_gym as bg
from agents.bugfix.base_agent import cached_base_agent, make_base_agent
from agents.model.tinyagent import TinyAgent
from agents.rollout.trajectory import Trajectory, rollout_stats
from agents.bugfix.evaluation import sample_episodes

BOOK = {
    "untrained, train": dict(reward=0.000, pass_rate=0.000, valid_calls=0.000, submit_rate=0.000, turns=6.000,
                             policy_tokens=35.681),
    "base agent, train": dict(reward=0.119, pass_rate=0.119, valid_calls=0.979, submit_rate=0.781, turns=3.134,
                              policy_tokens=11.312),
    "base agent, held-out": dict(reward=0.138, pass_rate=0.138, valid_calls=0.988, submit_rate=0.825, turns=3.013,
                                 policy_tokens=10.706),
}
BOOK_EPISODES = [
    "reward 0 | stop submit    | submit",
    "reward 0 | stop submit    | add_zero_guard -> submit",
    "reward 0 | stop budget    | add_zero_guard -> test -> swap_minmax -> fix_range_end -> test -> fix_range_end",
]


KEYS = ("reward", "pass_rate", "valid_calls", "submit_rate", "turns", "policy_tokens")


def sample(model: TinyAgent, tok: bg.Tokenizer, tasks: Sequence, n_per_task: int, seed: int, **kw: Any
           ) -> list[Trajectory]:
    """n_per_task episodes of each task, sampled at temperature 1 in lockstep, in task order."""
    return sample_episodes(model, tasks, n_per_task, seed, tokenizer=tok, **kw)


def short(action: str) -> str:
    """' edit fix_init ' -> 'fix_init'; ' read ' -> 'read'."""
    call = bg.parse_call(action)
    return (call[1] or call[0]) if call else "malformed"


def show(name: str, stats: dict, book: dict | None) -> None:
    print(f"{name:<24}" + " ".join(f"{k} {stats[k]:6.3f}" for k in KEYS))
    if book:
        print(f"{'  book':<24}" + " ".join(f"{k} {v:6.3f}" for k, v in book.items()))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="load the cached base agent (the same weights) instead of training and timing it")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # a tiny model: one thread is as fast, and polite on a shared machine
    tok = bg.build_tokenizer(bg.make_tasks("all"))
    train_tasks, heldout_tasks = bg.make_tasks("train"), bg.make_tasks("heldout")
    t0 = time.perf_counter()
    base = cached_base_agent(tok) if args.quick else make_base_agent(tok)
    build_s = time.perf_counter() - t0
    torch.manual_seed(0)
    untrained = TinyAgent(tok.vocab_size)
    print(f"TinyAgent: {untrained.num_params():,} parameters (book 157,244); vocabulary {tok.vocab_size} words")
    if args.quick:
        print(f"base agent loaded from the cache in {build_s:.1f} s (--quick: its training is not timed)\n")
    else:
        print(f"make_base_agent: {build_s:.1f} s (book: about 5 s on its host)\n")
    show("untrained, train", rollout_stats(sample(untrained, tok, train_tasks, 16, seed=0)), BOOK["untrained, train"])
    show("untrained, cap 6", rollout_stats(sample(untrained, tok, train_tasks, 16, seed=0, max_call_tokens=6)), None)
    show("base agent, train", rollout_stats(sample(base, tok, train_tasks, 16, seed=0)), BOOK["base agent, train"])
    show("base agent, held-out", rollout_stats(sample(base, tok, heldout_tasks, 16, seed=0)),
         BOOK["base agent, held-out"])
    print("\n(policy_tokens is the book's action_tokens. Untrained: our calls are capped at max_call_tokens=8"
          "\n tokens; the book's 35.7 over six turns matches a cap of 6, shown in the 'cap 6' row. Our calls are"
          "\n ~2.5 tokens ('edit fix_init <eoc>'), so the base agent writes fewer tokens per turn than the book's.)")

    print(f"\nthree episodes of {train_tasks[0].name} (book: clamp)")
    for traj in sample(base, tok, train_tasks[:1], 3, seed=1):
        calls = " -> ".join(map(short, traj.info["actions"]))
        print(f"reward {traj.reward:.0f} | stop {traj.info['stop']:<9} | {calls}")
    print("book:")
    for line in BOOK_EPISODES:
        print(line)


if __name__ == "__main__":
    main()
