"""Play BugFix-v1 in the terminal: ``bugfix-gym play --env BugFix-v1`` (or ``python -m bugfix_gym.views.play --env
BugFix-v1``).

    bugfix-gym play --env BugFix-v1                       # a random task of HumanEval's train split
    bugfix-gym play --env BugFix-v1 --split test --seed 3
    bugfix-gym play --env BugFix-v1 --task has_close_elements~0
    bugfix-gym play --env BugFix-v1 --pack my_v1_pack.json
    bugfix-gym play --env BugFix-v1 --list               # the task names of the split (or of --pack)

Each line typed is one call, played exactly as an agent's text would be: ``read [L]``, ``test``, ``locate``,
``edit L.K MUTATION [ARG]``, ``patch L CODE``, ``insert L CODE``, ``delete L``, ``revert``, ``submit``. ``help``
shows the call menu and ``legal`` the legal sited edits of a line (``legal 4``); ``quit`` leaves; none of these
costs a turn. A line that is not a call costs its turn with the env's one-line reason. At the end the injected
bug and its repair are shown. Everything shown is printable text (the env's own observations are).
"""

from __future__ import annotations

import argparse
import difflib
from typing import Any, TextIO

from ..core.calls_v1 import CALL_KINDS, MENU
from ..core.env_v1 import BugFixEnvV1

SPLITS_PLAYED = ("train", "heldout", "test", "all")


def run(parser: argparse.ArgumentParser, args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
    """The game on BugFix-v1, from ``bugfix_gym.views.play``'s parsed arguments; returns the exit status.

    :param parser: for one-line usage errors
    :param args: ``--task``, ``--split``, ``--seed``, ``--pack``, ``--episodes``, ``--list``
    :param stdin: where calls are read from
    :param stdout: where the game is shown
    """
    if args.generated:
        parser.error("--generated plays BugFix-v0's generator; BugFix-v1 plays --split or --pack")
    if args.split not in SPLITS_PLAYED:
        parser.error(f"--split of BugFix-v1 is one of {', '.join(SPLITS_PLAYED)}, got {args.split!r}")
    tasks = _pack(parser, args.pack) if args.pack else None
    env = BugFixEnvV1(split=args.split, tasks=tasks, render_mode="ansi")
    if args.list:
        names = [f"{t.problem}:{t.name}" for t in env.tasks]
        _show(stdout, f"{len(names)} tasks ({'--pack ' + args.pack if args.pack else args.split}): " + " ".join(names))
        return 0
    try:
        for episode in range(args.episodes):
            seed = None if args.seed is None else args.seed + episode
            try:
                env.reset(seed=seed, options={"task": args.task} if args.task else None)
            except ValueError as exc:
                parser.error(f"{exc}; --list shows the names")
            if not _play_episode(env, stdin, stdout):
                return 0
    except KeyboardInterrupt:
        _show(stdout, "")
        return 130
    return 0


def _pack(parser: argparse.ArgumentParser, path: str) -> list[Any]:
    from ..tasks.packs import TaskPackError, load_task_pack

    try:
        return load_task_pack(path)
    except TaskPackError as exc:
        parser.error(str(exc))
    raise AssertionError("parser.error exits")


def _play_episode(env: BugFixEnvV1, stdin: TextIO, stdout: TextIO) -> bool:
    """One episode, one typed line per call; False when the player left, True when the episode ended."""
    _show(stdout, env.render_text())
    _show(stdout, "type a call (help for the menu, legal L for line L's sited edits, quit to leave)")
    while True:
        stdout.write("> ")
        stdout.flush()
        line = stdin.readline()
        if not line:
            _show(stdout, "")
            return False
        line = line.rstrip("\n")
        words = line.split()
        if words in (["quit"], ["exit"]):
            return False
        if words == ["help"]:
            _show(stdout, "calls : " + MENU)
            continue
        if words[:1] == ["legal"]:
            _show(stdout, legal_at(env, words[1:]))
            continue
        obs, reward, terminated, truncated, info = env.step(line)
        _show(stdout, f"[turn {info['turn']}/{env.max_turns}] {obs}")
        if not info["valid"] and words and words[0] not in CALL_KINDS:
            _show(stdout, did_you_mean(words[0]))
        if terminated or truncated:
            _show(stdout, env.render_text())
            _show(stdout, f"reward {reward:.1f} . stop : {info['stop']} . "
                          f"{'fixed' if info['hidden_pass'] else 'not fixed'} . {the_bugs(env)}")
            return True


def legal_at(env: BugFixEnvV1, words: list[str]) -> str:
    """The legal sited edits of one line (``legal 4``), a line at a time so the list stays readable."""
    if len(words) != 1 or not words[0].isdigit():
        return "write legal L, e.g. legal 3"
    prefix = f"edit {int(words[0])}."
    calls = [c for c in env.legal_calls() if c.startswith(prefix)]
    if not calls:
        return f"no legal sited edit on line {int(words[0])}"
    shown = " | ".join(calls[:40])
    return shown + (f" | ... ({len(calls) - 40} more)" if len(calls) > 40 else "")


def the_bugs(env: BugFixEnvV1) -> str:
    """What was wrong: each injected bug's family and its repair (a real bug of a pack has none to show)."""
    bugs = env.task.bugs if env.task is not None else ()
    if not bugs:
        return "(a real bug: no injected repair to show)"
    return " ; ".join(f"the bug was {b.family} (repair : {b.repair})" for b in bugs)


def did_you_mean(word: str) -> str:
    """A hint for a first word that is no call kind: the closest kinds, else the menu."""
    close = difflib.get_close_matches(word.lower(), CALL_KINDS, n=3, cutoff=0.5)
    return "did you mean: " + " | ".join(close) + " ?" if close else "not a call; help shows the menu"


def _show(stdout: TextIO, text: str) -> None:
    stdout.write(text + "\n")
    stdout.flush()
