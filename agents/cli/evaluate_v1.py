"""``bugfix-gym eval MODEL --env BugFix-v1``: a TinyAgent trained on BugFix-v1 (legal-call grammar, byte tokens)
on one task of each function of a HumanEval split, or on a v1 task pack; a table or one JSON object."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from agents.cli.flags import UNSET, usage_error
from agents.cli.report import jsonable, per_task_table

if TYPE_CHECKING:
    from agents.algorithms.on_policy import TokenOnPolicyAlgorithm

V1_KEYS = (("pass_rate", "pass rate"), ("mean_calls", "calls / episode"), ("mean_test_calls", "test calls / ep."),
           ("valid_calls", "valid calls"), ("context_cut", "context cut"))


def eval_env(args: argparse.Namespace, model: TokenOnPolicyAlgorithm) -> str:
    """The env ``eval`` plays: ``--env``, else the one the model writes calls for; a one-line error when the model
    cannot play it or a flag does not apply to it.

    :param args: ``bugfix-gym eval``'s parsed command line
    :param model: the loaded model
    """
    v1_model = bool(getattr(model.policy, "legal_calls", False))
    env = getattr(args, "env", None) or ("BugFix-v1" if v1_model else "BugFix-v0")
    if v1_model != (env == "BugFix-v1"):
        trained = "BugFix-v1 (legal-call grammar)" if v1_model else "BugFix-v0"
        raise usage_error("eval", f"{args.model} writes {trained} calls; evaluate it with --env "
                                  f"{'BugFix-v1' if v1_model else 'BugFix-v0'}")
    if env == "BugFix-v0" and args.split == "test":
        raise usage_error("eval", "--split test is BugFix-v1's HumanEval split; the book has train, heldout, all")
    if env == "BugFix-v1":
        given = [flag for flag, on in (("--generated", args.generated is not None), ("--hide-outputs",
                 args.hide_outputs), ("--call-mask", args.call_mask is not None),
                 ("--foresight", args.foresight is not UNSET)) if on]
        if given:
            raise usage_error("eval", f"{given[0]} is BugFix-v0's; with --env BugFix-v1 use --split or --pack")
        if args.pack is not None and (args.tasks_per_function or args.bugs):
            raise usage_error("eval", "--tasks-per-function and --bugs choose split tasks; a --pack plays its own")
    else:
        given = [flag for flag, on in (("--tasks-per-function", args.tasks_per_function), ("--bugs", args.bugs),
                                       ("--baselines", args.baselines), ("--greedy", args.greedy)) if on]
        if given:
            raise usage_error("eval", f"{given[0]} is BugFix-v1's (--env BugFix-v1)")
    return env


def cmd_eval_v1(args: argparse.Namespace, model: TokenOnPolicyAlgorithm) -> int:
    """Evaluate a BugFix-v1 model on ``--split`` (default test) or ``--pack``; returns the exit status.

    :param args: ``bugfix-gym eval``'s parsed command line
    :param model: the loaded model (:func:`eval_env` said it plays BugFix-v1)
    """
    from agents.algorithms.presets import trained_by
    from agents.bugfix.v1 import baseline_v1, evaluate_v1

    tasks, what = _v1_tasks(args)
    episodes = args.episodes or (1 if (args.tasks_per_function or 1) > 1 else 8)
    stats = evaluate_v1(model, tasks, episodes, seed=args.seed, per_task=args.pack is not None, greedy=args.greedy)
    baselines = {kind: baseline_v1(kind, tasks, per_task=args.pack is not None)
                 for kind in (BASELINES if args.baselines else ())}
    if args.json:
        extra = dict(baselines=baselines) if baselines else {}
        print(json.dumps(jsonable(dict(stats, model=str(args.model), **trained_by(model), env="BugFix-v1",
                                       tasks=what, n_tasks=len(tasks), episodes_per_task=episodes,
                                       call_mask="legal_calls",
                                       decoding="legal-call grammar, greedy" if args.greedy else
                                       "legal-call grammar", foresight=None, **extra))))
        return 0
    print(v1_table(f"{args.model.name} on {what}{', greedy' if args.greedy else ''}", stats, baselines))
    if "per_task" in stats:
        print(per_task_table(stats["per_task"]))
    return 0


BASELINES = ("debugger", "brute_force")
"""The scripted baselines ``--baselines`` plays beside the model (bugfix_gym/core/scripted_v1.py)."""


def _v1_tasks(args: argparse.Namespace) -> tuple[list[Any], str]:
    """One task of each function of ``--split`` (default test), or of each function of ``--pack`` (a pack of
    correct functions gets one injected bug each); the tasks and what they are in words."""
    from bugfix_gym import TaskPackError, load_task_pack
    from bugfix_gym.core.env_v1 import BugFixEnvV1

    from agents.bugfix.v1 import one_task_per_problem

    if args.pack is not None:
        try:
            loaded = load_task_pack(args.pack)
            tasks = BugFixEnvV1(tasks=loaded).tasks
        except (TaskPackError, ValueError, TypeError) as e:
            raise usage_error("eval", f"--pack {args.pack}: {_first_line(e)} (BugFix-v1 "
                                      "plays v1 packs)") from None
        return one_task_per_problem(tasks), f"pack {args.pack}"
    split, k, bugs = args.split or "test", args.tasks_per_function or 1, args.bugs or 1
    if k == 1:
        tasks = one_task_per_problem(BugFixEnvV1(split=split, bugs=bugs).tasks)
    else:
        from agents.bugfix.repair_v1 import tasks_per_function

        tasks = tasks_per_function(split, k, bugs)
    return tasks, (f"BugFix-v1 {split} split ({k} {'-'.join(['one', 'two'][bugs - 1:bugs])}-bug task"
                   f"{'s' if k > 1 else ''} per function)")


def v1_table(column: str, stats: dict[str, Any], baselines: dict[str, dict[str, Any]] | None = None) -> str:
    """The v1 statistics, the pass rate after k test calls and per defect class as a plain-text table; with
    ``baselines``, a column for each beside the model's."""
    cols = {"model": stats, **(baselines or {})}
    head = "".ljust(36) + "".join(name.rjust(12) for name in cols)
    lines = [column, head]
    lines += [label.ljust(36) + "".join((f"{s[key]:.3f}" if key in s else "-").rjust(12) for s in cols.values())
              for key, label in V1_KEYS]
    lines += [f"passed within {k} test calls".ljust(36) + "".join(
        f"{s['pass_after_test_calls'][k]:.3f}".rjust(12) for s in cols.values())
        for k in stats["pass_after_test_calls"]]
    lines += ["", "defect class (pass rate)".ljust(36) + "".join(name.rjust(12) for name in cols)
              + "episodes".rjust(10)]
    lines += [name.ljust(36) + "".join(f"{s['per_class'][name]['pass_rate']:.3f}".rjust(12) for s in cols.values())
              + f"{row['episodes']}".rjust(10) for name, row in stats["per_class"].items()]
    return "\n".join(lines)


def _first_line(error: Exception) -> str:
    """An error's message, one line, without the quotes a ``KeyError`` adds."""
    text = str(error).splitlines()[0].strip("'\"") if str(error) else ""
    return text or type(error).__name__
