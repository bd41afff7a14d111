"""``bugfix-gym eval MODEL``: sample episodes with a saved model, print a table or one JSON object."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from agents.cli.flags import UNSET, usage_error
from agents.cli.evaluate_v1 import cmd_eval_v1, eval_env
from agents.cli.report import jsonable, per_task_table, table

if TYPE_CHECKING:
    from agents.algorithms.on_policy import TokenOnPolicyAlgorithm
    from agents.decoding.grammar import CallGrammar


def cmd_eval(args: argparse.Namespace) -> int:
    """Evaluate ``args.model`` on the tasks the flags choose; returns the exit status.

    :param args: ``bugfix-gym eval``'s parsed command line
    """
    import torch

    from bugfix_gym.core.env import HIDEABLE

    from agents.algorithms.presets import trained_by
    from agents.bugfix.evaluation import evaluate

    torch.set_num_threads(1)
    model = load_model(args.model)
    if eval_env(args, model) == "BugFix-v1":
        return cmd_eval_v1(args, model)
    tasks, what, episodes = _tasks(args)
    override_decoding(model, args)
    env_kwargs = dict(hide_outputs=list(HIDEABLE)) if args.hide_outputs else None
    stats = evaluate(model, tasks, episodes, seed=args.seed, env_kwargs=env_kwargs, per_task=args.pack is not None)
    if args.json:
        print(json.dumps(jsonable(dict(stats, model=str(args.model), **trained_by(model), tasks=what,
                                       episodes_per_task=episodes,
                                       call_mask=model.policy.call_mask_key,
                                       foresight=None if model.policy.foresight is None
                                       else model.policy.foresight.threshold))))
    else:
        print(table({f"{args.model.name} on {what}": stats}))
        if "per_task" in stats:
            print(per_task_table(stats["per_task"]))
    return 0


def load_model(path: Path, command: str = "eval") -> TokenOnPolicyAlgorithm:
    """The model saved at ``path`` as the class it was saved from (TokenPPO or Reinforce), or a one-line
    error (missing, corrupt or unsafe file).

    :param path: the model file
    :param command: the sub-command the error names (``eval``, ``serve``)
    """
    from agents.algorithms.presets import load_algorithm
    from agents.bugfix import aux_losses  # noqa: F401 (registers the upgrade of older files' settings)

    try:
        return load_algorithm(path)
    except FileNotFoundError:
        raise usage_error(command, f"no model file at {path}") from None
    except ValueError as e:
        raise usage_error(command, str(e)) from None


def _tasks(args: argparse.Namespace) -> tuple[list, str, int]:
    """The tasks of ``--pack``, ``--generated`` or ``--split`` (default: the book's heldout split).

    :param args: the parsed command line
    :return: the tasks, what they are in words, and the episodes per task
    """
    from bugfix_gym import TaskPackError, generate_tasks, load_task_pack, make_tasks

    if args.pack is not None:
        try:
            tasks = load_task_pack(args.pack)
        except TaskPackError as e:
            raise usage_error("eval", str(e)) from None
        return tasks, f"pack {args.pack}", args.episodes or 8
    if args.generated is not None:
        tasks = generate_tasks(args.generated, args.n, seed=args.gen_seed)
        return tasks, f"generated {args.generated} (n={args.n}, gen-seed {args.gen_seed})", args.episodes or 1
    split = args.split or "heldout"
    return make_tasks(split), f"{split} split", args.episodes or 8


def override_decoding(model: TokenOnPolicyAlgorithm, args: argparse.Namespace, command: str = "eval") -> None:
    """``--call-mask`` and ``--foresight`` replace the model's own (they need a model with a call grammar).

    :param model: the loaded model, changed in place
    :param args: the parsed command line
    :param command: the sub-command the errors name (``eval``, ``serve``)
    """
    from bugfix_gym.core.env import BugFixEnv

    if args.call_mask is not None:
        _grammar(model, "--call-mask", command)
        model.policy.call_mask_key = None if args.call_mask == "none" else args.call_mask
    if args.foresight is not UNSET:
        _grammar(model, "--foresight", command)
        if model.policy.foresight_words is None:  # a file saved before the env advertised foresight's words
            model.policy.foresight_words = dict(BugFixEnv.metadata["agent_defaults"]["foresight"])
        try:
            model.policy.foresight = None if args.foresight is None else model.policy.make_foresight(args.foresight)
        except ValueError as e:  # a tokenizer foresight cannot read (a Hugging Face one)
            raise usage_error(command, f"--foresight: {e} (drop --foresight)") from None


def _grammar(model: TokenOnPolicyAlgorithm, flag: str, command: str) -> CallGrammar:
    """The model's call grammar, or a one-line error: ``flag`` needs one (this model writes free text).

    :param model: the loaded model
    :param flag: the flag given, as typed
    :param command: the sub-command the error names
    """
    if model.policy.grammar is None:
        raise usage_error(command, f"{flag} needs a model with a call grammar; this one writes free text")
    return model.policy.grammar
