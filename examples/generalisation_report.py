"""What a trained agent does on functions it has never seen: behaviour statistics and transcripts.

Loads a model saved by ``bugfix-gym train`` (e.g. ``--tasks generated``), plays one episode on
each of ``--n`` tasks from the generator's unseen ``test`` templates (generator seed
``--gen-seed``), decoding as in training (the model's grammar, call mask and temperature), and prints

1. the behaviour report: pass rate, valid calls, read rate, test rate, revert use, edits per
   episode, first edit right (scored against each task's answer, which only the evaluator
   knows), and the pass rate of the episodes that read, that tested, and that did neither;
2. the pass rate per test template;
3. ``--transcripts`` transcripts of passed episodes that looked first (read or test before the
   first edit), preferring ones that reverted, then ones that tested, then more edits — the
   whole episode as the env renders it.

Run: ``python examples/generalisation_report.py runs/gen/s0/tokenppo.zip`` (``--n``, ``--gen-seed``,
``--seed``, ``--transcripts``, ``--hide-outputs`` for models trained with ``--ablation blind-tools``,
``--statement TEXT`` to give every task that statement instead of its own: a probe of how much the
agent picks its edit from the wording rather than from the code). Prints only; writes nothing.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import sys
from pathlib import Path

import torch

from agents.algorithms.ppo import TokenPPO
from agents.bugfix.evaluation import sample_episodes
from bugfix_gym import episode_stats, generate_tasks, parse_call
from bugfix_gym.core.env import HIDEABLE
from bugfix_gym.views.text_wrappers import make_bugfix_env

REPORT = (("pass_rate", "pass rate"), ("valid_calls", "valid calls"), ("read_rate", "read rate"),
          ("test_rate", "test rate"), ("revert_rate", "revert use"), ("edits_per_episode", "edits / episode"),
          ("first_edit_right", "first edit right"), ("pass_if_read", "pass | read"),
          ("pass_if_tested", "pass | tested"), ("pass_if_blind", "pass | neither"))


def looked_first(actions: list[str]) -> bool:
    """Read or test before the first edit (and at least one edit)."""
    kinds = [(parse_call(a) or ("invalid",))[0] for a in actions]
    return "edit" in kinds and any(k in ("read", "test") for k in kinds[: kinds.index("edit")])


def interest(actions: list[str]) -> tuple[bool, bool, int]:
    """How much of careful play an episode shows: reverted, tested, number of edits (sort key)."""
    kinds = [(parse_call(a) or ("invalid",))[0] for a in actions]
    return "revert" in kinds, "test" in kinds, kinds.count("edit")


def transcript(task, actions: list[str], env_kwargs: dict) -> str:
    """Replay ``actions`` on ``task`` (tool outputs are deterministic) and render the episode."""
    env = make_bugfix_env(tasks=[task], render_mode="ansi", **env_kwargs)
    env.reset(options={"task": task})
    for action in actions:
        env.step(action)
    return env.render()


def per_template(tasks, trajs) -> dict[str, list[bool]]:
    """Pass (hidden tests passed on submit) of each episode, grouped by the task's template, in first-seen order."""
    out: dict[str, list[bool]] = collections.defaultdict(list)
    for task, t in zip(tasks, trajs):
        out[task.template].append(bool(t.info["submitted"] and t.info["hidden_pass"]))
    return dict(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, help="a model .zip from bugfix-gym train")
    parser.add_argument("--n", type=int, default=200, help="unseen generated test tasks (default 200)")
    parser.add_argument("--gen-seed", type=int, default=123, help="generator seed (default 123)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument("--transcripts", type=int, default=2, help="transcripts to print (default 2)")
    parser.add_argument("--hide-outputs", action="store_true", help="blank the outputs of read and test")
    parser.add_argument("--statement", help="give every task this statement instead of its own (a probe)")
    args = parser.parse_args(argv)
    if args.n < 1 or args.transcripts < 0:
        parser.error("--n must be positive and --transcripts >= 0")
    torch.set_num_threads(1)
    try:
        model = TokenPPO.load(args.model)
    except (FileNotFoundError, ValueError) as e:
        print(f"generalisation_report.py: error: {e}", file=sys.stderr)
        return 2
    env_kwargs = dict(hide_outputs=list(HIDEABLE)) if args.hide_outputs else {}
    tasks = generate_tasks("test", args.n, seed=args.gen_seed)
    if args.statement is not None:
        tasks = [dataclasses.replace(task, statement=args.statement) for task in tasks]
    trajs = sample_episodes(model, tasks, 1, args.seed, env_kwargs=env_kwargs or None)
    stats = episode_stats([t.info for t in trajs], [t.reward for t in trajs], [t.fix_op for t in tasks])
    print(f"{args.model} on {args.n} unseen generated test tasks (gen-seed {args.gen_seed}, sampling seed "
          f"{args.seed}, one episode each)")
    for key, label in REPORT:
        print(f"  {label:<18}{stats[key]:.3f}")
    print("  pass rate per template: " + ", ".join(
        f"{key} {sum(ok) / len(ok):.2f} ({len(ok)})" for key, ok in per_template(tasks, trajs).items()))
    passed = [(task, t) for task, t in zip(tasks, trajs) if t.info["submitted"] and t.info["hidden_pass"]]
    looked = [(task, t) for task, t in passed if looked_first(t.info["actions"])]
    looked.sort(key=lambda pair: interest(pair[1].info["actions"]), reverse=True)  # stable: task order otherwise
    print(f"\n{len(looked)} of {len(passed)} passed episodes read or tested before their first edit")
    for task, t in looked[: args.transcripts]:
        print(f"\n--- {task.name} (template {task.template}; the answer, {task.fix_op}, is the evaluator's) ---")
        print(transcript(task, t.info["actions"], env_kwargs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
