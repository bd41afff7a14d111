"""Play BugFix-v0 in the terminal: type calls, read the tool output.

    python -m bugfix_gym.views.play                     # a random train task
    python -m bugfix_gym.views.play --task clamp        # a named task
    python -m bugfix_gym.views.play --split heldout --seed 3
    python -m bugfix_gym.views.play --pack examples/task_pack_example.json
    python -m bugfix_gym.views.play --generated test   # a fresh task from the generator's test templates
    python -m bugfix_gym.views.play --list             # the task names of the split (or of --pack)
    python -m bugfix_gym.views.play --env BugFix-v1    # BugFix-v1 (bugfix_gym.views.play_v1)

Each line you type is one tool call (``read``, ``test``, ``edit <fix_op>``, ``revert``,
``submit``), played exactly as an agent's action text would be. ``help`` shows the calls
and ``quit`` leaves; neither costs a turn. A line that is not a call costs its turn, as an
agent's would, and gets a "did you mean" with the closest calls. End of input (Ctrl-D) or Ctrl-C exits cleanly.
Everything shown is printable text: escape sequences in a task's statement or source are
shown as ``?``, never sent to the terminal.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import sys
from typing import Sequence, TextIO

from ..core.env import BugFixEnv
from ..tasks.generator import GENERATED_SPLITS
from ..tasks.library import SPLITS, Task, get_task, make_tasks
from ..core.tools import CALLS, parse_call
from . import play_v1
from .play_v1 import SPLITS_PLAYED


MAX_EPISODES = 100_000  # --episodes: more than anyone types, few enough to check before anything is built


ENVS = ("BugFix-v0", "BugFix-v1")


def _parser(prog: str, env: str = "BugFix-v0") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog,
                                     description="Repair a buggy Python function by typing tool calls.")
    parser.add_argument("--env", default="BugFix-v0", choices=ENVS,
                        help="BugFix-v0 (default) or BugFix-v1 (HumanEval's functions with injected bugs)")
    parser.add_argument("--task", help="task name, e.g. clamp (default: drawn from the split)")
    parser.add_argument("--split", default="train", choices=SPLITS if env == "BugFix-v0" else SPLITS_PLAYED,
                        help="task split to draw from (default: train)")
    parser.add_argument("--seed", type=int, default=None, help="seed for drawing the task")
    parser.add_argument("--pack", metavar="FILE", help="play the tasks of a .json/.toml task pack instead")
    parser.add_argument("--generated", choices=GENERATED_SPLITS,
                        help="play a freshly generated task from these generator templates instead")
    parser.add_argument("--episodes", type=int, default=1, help="episodes to play (default: 1)")
    parser.add_argument("--list", action="store_true", help="print the task names of --split (or --pack) and exit")
    return parser


def main(argv: Sequence[str] | None = None, stdin: TextIO | None = None, stdout: TextIO | None = None,
         prog: str = "python -m bugfix_gym.views.play") -> int:
    """Run the interactive game; returns the exit status (0 when the input ends normally, 130 on Ctrl-C).

    :param argv: command-line arguments (default ``sys.argv[1:]``)
    :param stdin: where calls are read from (default ``sys.stdin``)
    :param stdout: where the game is shown (default ``sys.stdout``)
    :param prog: the command's name in usage and error lines
    """
    env_arg = argparse.ArgumentParser(add_help=False)
    env_arg.add_argument("--env", default="BugFix-v0")
    parser = _parser(prog, env_arg.parse_known_args(argv)[0].env)
    args = parser.parse_args(argv)
    stdin = stdin if stdin is not None else sys.stdin
    stdout = stdout if stdout is not None else sys.stdout
    if args.episodes < 1:
        parser.error(f"--episodes must be at least 1, got {args.episodes}")
    if args.episodes > MAX_EPISODES:
        parser.error(f"--episodes must be from 1 to {MAX_EPISODES}, got {args.episodes}")
    if args.seed is not None and not 0 <= args.seed <= 2**32 - 1 - MAX_EPISODES:
        parser.error(f"--seed must be from 0 to {2**32 - 1 - MAX_EPISODES}, got {args.seed}")
    if args.generated and args.pack:
        parser.error("use either --pack or --generated, not both")
    if args.env == "BugFix-v1":
        return play_v1.run(parser, args, stdin, stdout)
    tasks, task = _chosen_tasks(parser, args)
    if args.list:
        listed = tasks if tasks is not None else make_tasks(args.split)
        _show(stdout, f"{len(listed)} tasks ({'--pack ' + args.pack if tasks is not None else args.split}): "
                      + " ".join(t.name for t in listed))
        return 0
    env = BugFixEnv(split=args.split, tasks=tasks, render_mode="ansi", generated=args.generated)
    try:
        for episode in range(args.episodes):
            seed = None if args.seed is None else args.seed + episode
            env.reset(seed=seed, options={"task": task} if task is not None else None)
            if not _play_episode(env, stdin, stdout):
                return 0
    except KeyboardInterrupt:
        _show(stdout, "")
        return 130
    return 0


def _chosen_tasks(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[list[Task] | None, Task | None]:
    """The tasks of ``--pack`` (None without it) and the task of ``--task`` (None without it); a bad pack
    or an unknown name is a usage error."""
    tasks = None
    if args.pack:
        from ..tasks.packs import TaskPackError, load_task_pack

        try:
            tasks = load_task_pack(args.pack)
        except TaskPackError as exc:
            parser.error(str(exc))
    task = None
    if args.task:
        try:
            task = next(t for t in tasks if t.name == args.task) if tasks else get_task(args.task)
        except (KeyError, StopIteration):
            parser.error(f"no task named {args.task!r}; --list {'with that --pack ' if tasks else '--split all '}"
                         "lists them")
    return tasks, task


def _play_episode(env: BugFixEnv, stdin: TextIO, stdout: TextIO) -> bool:
    """Play the episode ``env`` was just reset to, one typed line per call; False when the player left
    (``quit``, or the end of the input), True when the episode ended."""
    show = functools.partial(_show, stdout)
    show(env.render())
    show("type a call (help for the list, quit to leave)")
    while True:
        stdout.write("> ")
        stdout.flush()
        line = stdin.readline()
        if not line:  # end of input
            show("")
            return False
        line = line.rstrip("\n")
        if line.strip() in ("quit", "exit"):
            return False
        if line.strip() == "help":
            show("calls : " + " | ".join(CALLS))
            continue
        obs, reward, terminated, truncated, info = env.step(line)
        show(f"[turn {info['turn']}/{env.max_turns}] {obs}")
        if parse_call(line) is None and not (terminated or truncated):
            show(did_you_mean(line))
        if terminated or truncated:
            show(env.render())
            answer = env.task.fix_op if env.task is not None else "?"
            show(f"reward {reward:.1f} . stop : {info['stop']} . "
                 f"{'fixed' if info['hidden_pass'] else 'not fixed'} (the defect was {answer})")
            return True


def did_you_mean(line: str) -> str:
    """A hint for a line that is not a call: the closest calls of ``CALLS``, else the list."""
    close = difflib.get_close_matches(" ".join(line.split()).lower(), CALLS, n=3, cutoff=0.5)
    if close:
        return "did you mean: " + " | ".join(close) + " ?"
    return "not a call; help lists them"


def _show(stdout: TextIO, text: str) -> None:
    """Write one line of the game and flush it."""
    stdout.write(text + "\n")
    stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
