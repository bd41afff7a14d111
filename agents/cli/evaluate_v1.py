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
        trained = "BugFix-v1 (legal-call grammar, byte tokens)" if v1_model else "BugFix-v0"
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
    return env


def cmd_eval_v1(args: argparse.Namespace, model: TokenOnPolicyAlgorithm) -> int:
    """Evaluate a BugFix-v1 model on ``--split`` (default test) or ``--pack``; returns the exit status.

    :param args: ``bugfix-gym eval``'s parsed command line
    :param model: the loaded model (:func:`eval_env` said it plays BugFix-v1)
    """
    from agents.algorithms.presets import trained_by
    from agents.bugfix.v1 import evaluate_v1

    tasks, what = _v1_tasks(args)
    episodes = args.episodes or 8
    stats = evaluate_v1(model, tasks, episodes, seed=args.seed, per_task=args.pack is not None)
    if args.json:
        print(json.dumps(jsonable(dict(stats, model=str(args.model), **trained_by(model), env="BugFix-v1",
                                       tasks=what, n_tasks=len(tasks), episodes_per_task=episodes,
                                       call_mask="legal_calls",
                                       decoding="legal-call grammar", foresight=None))))
        return 0
    print(v1_table(f"{args.model.name} on {what}", stats))
    if "per_task" in stats:
        print(per_task_table(stats["per_task"]))
    return 0


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
    split = args.split or "test"
    return one_task_per_problem(BugFixEnvV1(split=split).tasks), f"BugFix-v1 {split} split (one task per function)"


def v1_table(column: str, stats: dict[str, Any]) -> str:
    """The v1 statistics and the pass rate per defect class as a plain-text table."""
    lines = [f"{column}"] + [label.ljust(22) + f"{stats[key]:.3f}".rjust(10) for key, label in V1_KEYS]
    lines += ["", "defect class".ljust(36) + "pass rate".rjust(10) + "episodes".rjust(10)]
    lines += [name.ljust(36) + f"{row['pass_rate']:.3f}".rjust(10) + f"{row['episodes']}".rjust(10)
              for name, row in stats["per_class"].items()]
    return "\n".join(lines)


def _first_line(error: Exception) -> str:
    """An error's message, one line, without the quotes a ``KeyError`` adds."""
    text = str(error).splitlines()[0].strip("'\"") if str(error) else ""
    return text or type(error).__name__
