"""The ``bugfix-gym`` argument parser: the train flags as one table (:func:`train_flags`), the
eval flags, and the sub-commands. The flags of TokenPPO's settings come from their one definition
(:class:`agents.algorithms.config.PPOConfig`): its help, its choices, and the flag type that reads
the values its check allows (:func:`ppo_flag`)."""

from __future__ import annotations

import argparse
import dataclasses
import functools
from pathlib import Path
from typing import Any, Callable

from agents.cli.flags import MAX_EVAL_EPISODES, MAX_EVAL_TASKS, MAX_N_ENVS, Number  # the size flags' bounds
from agents.cli.flags import (NON_NEGATIVE_FLOAT, NON_NEGATIVE_INT, POSITIVE_FLOAT, POSITIVE_INT, SEED, SHARE,
                              UNIT_FLOAT, UNSET, Flag, OneLineParser, add_flags, foresight_threshold,
                              threshold)

CALL_MASKS = ("none", "call_mask", "useful_calls")


def call_mask_flag(help: str, **overrides: Any) -> Flag:
    """``--call-mask``, defined once for train, eval and serve (each says what it does there)."""
    return Flag("call_mask", choices=CALL_MASKS, help=help, **overrides)


def foresight_flag(help: str) -> Flag:
    """``--foresight P|none``, defined once for train, eval and serve (each says what it does there)."""
    return Flag("foresight", type=foresight_threshold, metavar="P", default=UNSET, help=help)


def _check_types() -> dict[Callable[[str, Any], None], Any]:
    """A setting's check (agents/algorithms/config.py) -> the flag type that reads the same values from text."""
    from agents.algorithms import config

    return {config.positive_int: POSITIVE_INT, config.non_negative_int: NON_NEGATIVE_INT,
            config.positive: POSITIVE_FLOAT, config.non_negative: NON_NEGATIVE_FLOAT,
            config.unit_interval: UNIT_FLOAT}


def ppo_flag(name: str, **overrides: Any) -> Flag:
    """The flag of TokenPPO's setting ``name`` (part ``ppo``), from the setting's definition: its help,
    its choices and the type its check reads as; ``overrides`` replace what the command line does
    differently (e.g. ``--target-kl 0`` for off).

    :param name: a field of :class:`agents.algorithms.config.PPOConfig`
    :param overrides: more :class:`Flag` fields
    """
    from agents.algorithms.config import PPOConfig, choices_of

    field = {f.name: f for f in dataclasses.fields(PPOConfig)}[name]
    check = field.metadata["check"]
    check = getattr(check, "unless_none", check)  # an optional setting's flag is left out for None
    derived = dict(help=field.metadata["help"], type=_check_types().get(check), choices=choices_of(field), part="ppo")
    return Flag(name, **{**derived, **overrides})


def trl_flag(name: str, help: str) -> Flag:
    """The flag of TRL's option ``name`` (the command reads it: no part), whose values are those of the
    TokenPPO setting it becomes (:data:`agents.algorithms.trl_options.TRL_SETTINGS`): that setting's flag type
    (its check's, without its ``None``) or its choices.

    :param name: a TRL ``GRPOConfig`` option
    :param help: what it does, in TRL's words
    """
    from agents.algorithms.trl_options import TRL_SETTINGS

    derived = ppo_flag(TRL_SETTINGS[name])
    return Flag(name, help=help, type=derived.type, choices=derived.choices)


@functools.cache
def train_flags() -> tuple[Flag, ...]:
    """``bugfix-gym train``'s flags, in the order ``--help`` lists them; a flag with a part overrides
    that setting of the recipe (agents/cli/settings.py), one left out keeps the recipe's value. Built
    on first use: TokenPPO's settings import torch, which ``bugfix-gym play`` does not need."""
    return _algo_flag() + _TRAIN_FLAGS_BEFORE_PPO + (
        ppo_flag("n_episodes"), ppo_flag("n_epochs"), ppo_flag("n_minibatches"), ppo_flag("learning_rate"),
    ) + _TRAIN_FLAGS_AFTER_PPO + (
        ppo_flag("gae_lambda"), ppo_flag("ent_coef"),
        ppo_flag("target_kl", type=NON_NEGATIVE_FLOAT, off_word=0.0,
                 help="KL (k3) target for early stopping; 0 turns it off"),
        ppo_flag("target_kl_mode"), ppo_flag("group_size"),
    ) + _trl_flags() + _TRAIN_FLAGS_LAST


def _algo_flag() -> tuple[Flag, ...]:
    """``--algo``: a named algorithm of agents/algorithms/presets.py (docs/algorithms.md)."""
    from agents.algorithms.presets import ALGORITHM_NAMES

    return (Flag("algo", choices=ALGORITHM_NAMES, default="ppo", metavar="NAME",
                 help=f"the algorithm: {', '.join(ALGORITHM_NAMES)} (docs/algorithms.md; default: ppo, the "
                      "recipe's TokenPPO)"),)


def _trl_flags() -> tuple[Flag, ...]:
    """TRL's ``GRPOConfig`` option names, read through :func:`agents.algorithms.trl_options.from_trl`
    (the command reads them: no part)."""
    from agents.algorithms.trl_options import IMPORTANCE_SAMPLING_LEVELS, LOSS_TYPES

    return (
        trl_flag("scale_rewards", "TRL's scale_rewards: divide group advantages by the group's std, the batch's, "
                 "or none"),
        Flag("loss_type", choices=LOSS_TYPES, help="TRL's loss_type: the loss aggregation (grpo: per-sequence mean; "
             "bnpo, dapo: token mean; dr_grpo: B * L_max), cispo also its loss"),
        Flag("importance_sampling_level", choices=IMPORTANCE_SAMPLING_LEVELS,
             help="TRL's importance_sampling_level: token ratios (PPO's clip) or one per sequence (GSPO)"),
        trl_flag("epsilon", "TRL's epsilon: the ratio clip (lower, and upper unless --epsilon-high)"),
        trl_flag("epsilon_high", "TRL's epsilon_high: the upper ratio clip; with --loss-type cispo the ABSOLUTE cap "
                 "on the IS weight (e.g. 5)"),
        trl_flag("beta", "TRL's beta: coefficient of the k3 KL to the base agent"),
        trl_flag("num_iterations", "TRL's num_iterations: passes over each batch (n_epochs)"),
        Flag("mask_truncated_completions", switch=True, help="TRL's mask_truncated_completions: no loss on "
             "episodes that ran out of turns"),
    )


_TRAIN_FLAGS_BEFORE_PPO: tuple[Flag, ...] = (
    Flag("tasks", choices=("book", "generated"), default="book",
         help="book: the book's 20 train tasks; generated: a fresh generated task every episode "
              "(the generalisation recipe) (default: book)"),
    Flag("ablation", choices=("book-tasks", "blind-tools"),
         help="with --tasks generated: the recipe on the 20 book train tasks only (book-tasks), or "
              "with the outputs of read and test blanked (blind-tools)"),
    Flag("rl_only", switch=True,
         help="with --tasks generated: the recipe whose model decodes under the legal-call grammar only "
              "(no foresight, no useful-call mask), in training, validation and the saved file"),
    Flag("rollout_foresight", type=threshold, metavar="P",
         help="with --rl-only: roll out with the agent's own foresight at threshold P as a teacher and "
              "distil its op choices into the policy (the saved model still decodes without it)"),
    call_mask_flag(part="run", off_word="none",
                   help="which env call mask the grammar follows when it decodes a call: none, the legal calls "
                        "(call_mask), or the legal calls without those the episode has shown to be useless "
                        "(useful_calls)"),
    Flag("timesteps", type=POSITIVE_INT, part="run", group="budget",
         help="environment steps to train for (SB3's count: every vector-env step is n_envs steps)"),
    Flag("iterations", type=POSITIVE_INT, part="run", group="budget",
         help="PPO iterations to train for (the book's count)"),
    Flag("n_envs", type=Number(int, 1, MAX_N_ENVS, what="a positive integer"), part="run",
         help="environments stepped in lockstep"),
)
_TRAIN_FLAGS_AFTER_PPO: tuple[Flag, ...] = (
    Flag("lr_schedule", choices=("constant", "linear"), part="run",
         help="constant learning rate, or linear from --learning-rate down to 0 at the end of the "
              "budget (with --timesteps; the recipe's by default)"),
    Flag("average_last", type=SHARE, metavar="SHARE", part="validation",
         help="keep the mean of the weights of the latest SHARE of the validation evaluations "
              "instead of the best ones (in (0, 1]; a recipe with validation, --tasks generated)"),
    Flag("save_evaluated", switch=True,
         help="also save the weights of every validation evaluation as DIR/evaluated/iteration-N.zip "
              "(~2 MB each), to evaluate them with `bugfix-gym eval` (--tasks generated)"),
    Flag("tool_coef", type=NON_NEGATIVE_FLOAT, metavar="COEF",
         help="weight of an auxiliary loss that predicts what each edit answered (`no change` or the "
              "line it changed), in behaviour cloning and in PPO; 0 turns it off, and with it "
              "--practice and --foresight"),
    foresight_flag("before the policy picks an edit's op, close the ops its own model gives a probability above P "
                   "(in (0, 1]) of answering `no change`; 'none': off"),
    Flag("practice", type=NON_NEGATIVE_INT, metavar="N",
         help="also learn what the edits answer on N edit-practice transcripts (recombined "
              "train-template code), in behaviour cloning and in PPO; 0: off"),
    Flag("no_change_cost", type=NON_NEGATIVE_FLOAT, metavar="COST", part="env",
         help="env option of the training envs: the price of an edit that answered `no change`"),
    Flag("preset_only", switch=True,
         help="train the --algo preset as published: its class's defaults, the preset's settings and the flags "
              "given, without the recipe's additions to the loss (its KL, entropy bonus, tool-output loss, edit "
              "practice); the recipe's tasks, env, base agent and budget stay (the algorithm table's rule)"),
)
_TRAIN_FLAGS_LAST: tuple[Flag, ...] = (
    Flag("seed", type=SEED, default=0, help="seed (default: 0)"),
    Flag("eval_episodes", type=POSITIVE_INT, default=8,
         help="episodes per task for the before/after table (default: 8)"),
    Flag("out", type=Path, help="output folder (default: a new runs/tokenppo-<time>)"),
    Flag("resume", type=Path, metavar="DIR",
         help="continue the run in DIR (stopped by Ctrl-C) with the arguments it was started with"),
    Flag("tensorboard", switch=True, help="also write TensorBoard logs under the output folder"),
    Flag("dump", type=Path, metavar="FILE", help="write the conformance dump of the first update's batch to FILE "
         "(check it with `bugfix-gym conformance FILE`; docs/conformance.md)"),
    Flag("no_progress", switch=True, help="no progress bar"),
    Flag("print_config", switch=True, help="print the run's settings (the algorithm's: its defaults, then the "
         "recipe's, the --algo preset's and the flags') as JSON and exit without training"),
)

#: the flags ``--resume`` takes beside it (the run keeps the rest of its own arguments)
RESUME_FLAGS = ("--resume", "--no-progress")


def build_parser() -> argparse.ArgumentParser:
    """The ``bugfix-gym`` parser: ``train``, ``eval``, ``serve``, ``play`` (whose own parser is
    bugfix_gym.views.play's) and ``conformance``."""
    from bugfix_gym import __version__

    parser = OneLineParser(prog="bugfix-gym", description="Train and evaluate token-level agents on BugFix-v0.")
    parser.add_argument("--version", action="version", version=f"bugfix-gym {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{train,eval,serve,play,conformance}",
                                parser_class=OneLineParser)
    _add_train_command(sub)
    _add_eval_command(sub)
    _add_serve_command(sub)
    sub.add_parser("play", help="play BugFix-v0 (or --env BugFix-v1) yourself in the terminal (bugfix_gym.views.play)",
                   add_help=False)
    _add_conformance_command(sub)
    return parser


def _add_conformance_command(sub: Any) -> None:
    """``bugfix-gym conformance DUMP.jsonl``: :mod:`bugfix_gym.integrations.conformance`'s checks of a trainer's
    dump (its own arguments)."""
    from bugfix_gym.integrations import conformance

    add = sub.add_parser("conformance", help="check a trainer's batch dump: masks, ratios, prefixes, groups, "
                         "the loss normaliser (docs/conformance.md)",
                         description="One line per check (pass / FAIL / skip), naming the first offending episode "
                                     "and token; exit status 1 if any check fails, 2 if the dump cannot be read.")
    conformance.add_arguments(add)


def _add_train_command(sub: Any) -> None:
    """``bugfix-gym train``: :func:`train_flags`.

    :param sub: the parser's sub-commands (``add_subparsers``)
    """
    train = sub.add_parser("train", help="train TokenPPO (or another --algo) from the base agent (the demo)",
                           description="Train TokenPPO (or the algorithm --algo names) from the behaviour-cloned "
                                       "base agent, print a before/after "
                                       "table (train tasks, the book's held-out tasks, unseen generated templates), "
                                       "save the model and a learning-curve PNG under the output folder. Flags "
                                       "left out take the recipe's value (agents/bugfix/recipes.py). With "
                                       "--env BugFix-v1: the repair recipe on HumanEval functions, its own flags "
                                       "(bugfix-gym train --env BugFix-v1 --help).")
    train.add_argument("--env", choices=("BugFix-v0", "BugFix-v1"), default="BugFix-v0",
                       help="BugFix-v0 (this recipe, default) or BugFix-v1 (the repair recipe: see "
                            "bugfix-gym train --env BugFix-v1 --help)")
    add_flags(train, train_flags())


def _add_eval_command(sub: Any) -> None:
    """``bugfix-gym eval MODEL``: where the tasks come from, how many episodes, and decoding overrides.

    :param sub: the parser's sub-commands (``add_subparsers``)
    """
    ev = sub.add_parser("eval", help="evaluate a saved model",
                        description="Sample episodes with a saved model and print the pass rate and behaviour "
                                    "statistics, as a table or (--json) one JSON object.")
    ev.add_argument("model", type=Path, help="a model .zip file (from `bugfix-gym train` or model.save)")
    where = ev.add_mutually_exclusive_group()
    where.add_argument("--split", choices=("train", "heldout", "test", "all"),
                       help="the book's tasks (default: heldout); with --env BugFix-v1 one task of each function of "
                            "the HumanEval split (test: BugFix-v1 only)")
    where.add_argument("--pack", type=Path, metavar="FILE", help="a task pack (.json / .toml)")
    where.add_argument("--generated", choices=("train", "heldout", "test"), metavar="SPLIT",
                       help="generated tasks from the generator's train / heldout / test templates")
    ev.add_argument("--env", choices=("BugFix-v0", "BugFix-v1"), default=None,
                    help="the env the tasks are played in (default: the one the model was trained for)")
    ev.add_argument("--n", type=Number(int, 1, MAX_EVAL_TASKS, what="a positive integer"), default=200,
                    help="with --generated: number of tasks (default: 200)")
    ev.add_argument("--gen-seed", type=SEED, default=0, help="with --generated: generator seed (default: 0)")
    ev.add_argument("--episodes", type=Number(int, 1, MAX_EVAL_EPISODES, what="a positive integer"),
                    default=None,
                    help="episodes per task (default: 8, or 1 with --generated)")
    ev.add_argument("--seed", type=SEED, default=0, help="sampling seed (default: 0)")
    ev.add_argument("--hide-outputs", action="store_true",
                    help="blank the outputs of read and test (for models trained with --ablation blind-tools)")
    add_flags(ev, (call_mask_flag("decode under this env call mask instead of the model's own (a model with a call "
                                  "grammar)"),
                   foresight_flag("decode with this foresight threshold (in (0, 1]; 'none': off) instead of the "
                                  "model's own")))
    ev.add_argument("--tasks-per-function", type=Number(int, 1, 1000, what="a positive integer"), default=None,
                    help="with --env BugFix-v1 --split: this many tasks of each function (default 1; the repair "
                         "recipe's evaluation uses 4 with --episodes 1)")
    ev.add_argument("--bugs", type=int, choices=(1, 2), default=None,
                    help="with --env BugFix-v1 --split: one-bug (default) or two-bug tasks")
    ev.add_argument("--baselines", action="store_true",
                    help="with --env BugFix-v1: also play the scripted debugger and brute force on the same tasks "
                         "(one table, side by side)")
    ev.add_argument("--greedy", action="store_true",
                    help="with --env BugFix-v1: take each token the call grammar allows at its highest probability "
                         "instead of sampling (the same grammar, no other rule)")
    ev.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def _add_serve_command(sub: Any) -> None:
    """``bugfix-gym serve MODEL``: where to listen, the served name, and decoding overrides (docs/serve.md).

    :param sub: the parser's sub-commands (``add_subparsers``)
    """
    serve = sub.add_parser("serve", help="serve a saved model as an OpenAI-compatible chat server",
                           description="Serve a saved model over HTTP as an OpenAI-compatible chat completions "
                                       "endpoint (non-streaming): each request's chat is read as a BugFix "
                                       "transcript and answered with the agent's next call (docs/serve.md). "
                                       "Decodes under the call grammar alone unless --call-mask / --foresight "
                                       "say otherwise.")
    serve.add_argument("model", type=Path, help="a model .zip file (from `bugfix-gym train` or model.save), or a "
                                                "save_pretrained folder (examples/trl_grpo.py's grpo/model, a TRL "
                                                "output; needs .venv-trl)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="IP address to listen on (default: 127.0.0.1; beyond loopback needs --allow-remote)")
    serve.add_argument("--port", type=Number(int, 0, 65535, what="a port from 0 to 65535"), default=8000,
                       help="port to listen on; 0 picks a free one (default: 8000)")
    serve.add_argument("--model-name", "--served-model-name", metavar="NAME", dest="model_name",
                       help="the model name clients send as \"model\" (default: the file name without .zip, or "
                            "the folder's name)")
    serve.add_argument("--max-model-len", type=Number(int, 2, 1 << 20, what="a whole number of tokens"),
                       metavar="N", help="the context served, chat and answer together (default: the model's)")
    add_flags(serve, (call_mask_flag("decode under this env call mask, which every request then sends as a field "
                                     "of that name (9 booleans over bugfix_gym.CALLS) (default: none)"),
                      foresight_flag("decode with this foresight threshold (in (0, 1]; default: none, off)")))
    from agents.cli.serve_guard import add_guard_flags

    add_guard_flags(serve)  # --api-key, --allow-remote, the connection and request limits (docs/serve.md "Security")
