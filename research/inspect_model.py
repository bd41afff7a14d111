"""Per (template, defect) pass rates and the most common call sequences of a saved model on a generator split.

Run: .venv/bin/python research/inspect_model.py runs/e1/tokenppo.zip --split test [--n 200] [--show 2]
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bugfix_gym as bg  # noqa: E402
from agents.ppo import TokenPPO  # noqa: E402
from agents.rollout import rollout_batch  # noqa: E402
from recipe import template_of  # noqa: E402


def short(a: str) -> str:
    c = bg.parse_call(a)
    return "BAD" if c is None else (c[1].replace("fix_", "").replace("add_", "") if c[1] else c[0])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("--split", default="test")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--seed", type=int, default=123)
    ap.add_argument("--show", type=int, default=0, help="transcripts to print")
    ap.add_argument("--blank", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = TokenPPO.load(args.model)
    tasks = bg.generate_tasks(args.split, args.n, seed=args.seed)
    envs = [bg.BugFixEnv(tasks=[t], blank_tools=args.blank) for t in tasks]
    trajs = rollout_batch(model.policy.model, envs, tasks, model.policy.tokenizer,
                          generator=torch.Generator().manual_seed(0), grammar=model.policy.grammar)
    groups = defaultdict(list)
    for tr, task, env in zip(trajs, tasks, envs):
        groups[(template_of(task, args.split), task.fix_op)].append((tr, task, env))
    for (key, op), items in sorted(groups.items()):
        passed = sum(tr.info["hidden_pass"] and tr.info["submitted"] for tr, _, _ in items)
        seqs = Counter(" ".join(short(a) for a in tr.info["actions"]) + (" +" if tr.info["hidden_pass"] else " -")
                       for tr, _, _ in items)
        print(f"{key:20s} {op:15s} {passed:3d}/{len(items):3d}  " + " | ".join(f"{s} x{c}" for s, c in seqs.most_common(4)))
    shown = 0
    for tr, task, env in zip(trajs, tasks, envs):
        if shown >= args.show:
            break
        if tr.info["hidden_pass"] and any(a.split()[0] in ("read", "test") for a in tr.info["actions"]):
            print("\n" + "-" * 70 + f"\n{task.name} ({template_of(task, args.split)}, fix {task.fix_op})\n")
            print(env.render_text())
            shown += 1


if __name__ == "__main__":
    main()
