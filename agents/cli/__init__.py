"""``bugfix-gym``: train, evaluate and play from the command line.

    bugfix-gym train                                  # the demo: TokenPPO on the book's tasks
    bugfix-gym train --tasks generated --seed 0 --out runs/gen0    # the generalisation recipe
    bugfix-gym train --resume runs/gen0               # continue a run stopped by Ctrl-C
    bugfix-gym train --env BugFix-v1 --rl-only --seed 0 --out runs/repair0   # the repair recipe (docs/repair.md)
    bugfix-gym eval runs/gen0/tokenppo.zip --split heldout
    bugfix-gym eval runs/gen0/tokenppo.zip --generated test --n 200 --gen-seed 1 --json
    bugfix-gym eval runs/gen0/tokenppo.zip --pack examples/task_pack_example.json --episodes 8 --json
    bugfix-gym serve runs/gen0/tokenppo.zip --port 8000   # an OpenAI-compatible chat server (docs/serve.md)
    bugfix-gym play --task clamp                      # type the calls yourself
    bugfix-gym conformance dump.jsonl --end-ids 2     # check a trainer's batch dump (docs/conformance.md)

Bad arguments, a missing or unsafe model file, a damaged run folder: one line on stderr, exit
status 2. Ctrl-C, SIGTERM or SIGHUP during training saves the last finished iteration (exit status
128 + the signal: 130, 143, 129; a second Ctrl-C while saving does nothing); a diverged update
stops with one line and keeps the last good iteration (exit status 1). A run folder is locked
while a command uses it: a second ``train --resume`` of it refuses in one line.

The parts: ``flags`` (flags as data, one-line errors), ``parser`` (the train flags' table, the
eval and serve flags), ``settings`` (the recipe with the flags given), ``train`` (start or resume, train,
report), ``train_v1`` (``train --env BugFix-v1``),
``evaluate`` (``bugfix-gym eval``), ``serve`` (``bugfix-gym serve``), ``report`` (tables, plots,
JSON).
"""

from __future__ import annotations

import sys
from typing import Sequence

from agents.cli.evaluate import cmd_eval
from agents.cli.flags import UsageError, usage_error
from agents.cli.parser import RESUME_FLAGS, build_parser
from agents.cli.train import cmd_train
from agents.cli.train_v1 import cmd_train_v1, wants_v1

__all__ = ["main", "UsageError"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``bugfix-gym`` console script; returns the exit status.

    :param argv: the arguments after the program's name (default: ``sys.argv[1:]``)
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "play":
        from bugfix_gym.views.play import main as play_main

        return int(play_main(argv[1:], prog="bugfix-gym play") or 0)
    try:
        if argv and argv[0] == "train" and wants_v1(argv[1:]):
            return cmd_train_v1(argv[1:])
        args = build_parser().parse_args(argv)
        if args.command is None:
            build_parser().print_help()
            return 2
        if args.command == "train" and args.resume is not None:
            _check_resume_alone(argv[1:])
        if args.command == "serve":
            from agents.cli.serve import cmd_serve

            return cmd_serve(args)
        if args.command == "conformance":
            from bugfix_gym.integrations.conformance import run_command

            return run_command(args)
        return cmd_train(args) if args.command == "train" else cmd_eval(args)
    except UsageError as e:
        print(str(e), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bugfix-gym: interrupted", file=sys.stderr)
        return 130


def _check_resume_alone(train_argv: list[str]) -> None:
    """``--resume`` continues a run with the arguments it was started with: refuse any other flag.

    :param train_argv: the arguments after ``train``
    """
    given = [a for a in train_argv if a.startswith("--") and a not in RESUME_FLAGS]
    if given:
        raise usage_error("train", f"--resume continues a run with its own arguments; drop {given[0]}")
