"""Command-line flags as data: how a flag's text is read (:class:`Number`), what a flag is
(:class:`Flag`), and the one-line errors of the ``bugfix-gym`` command (:class:`UsageError`).

A :class:`Flag` holds what a setting's definition holds (its name, type, bounds, choices,
default, help) plus where the recipe keeps its value, so a table of flags can be written out
by hand or built from a config dataclass's fields.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Callable, NoReturn

from agents.files.runs import MAX_N_ENVS  # noqa: F401 - train --n-envs's bound, run.json's too


def program() -> str:
    """How to run this ``bugfix-gym`` again from the working directory, for the commands it prints:
    ``bugfix-gym`` where that name on ``PATH`` is this program, else the path it was started by
    (``.venv/bin/bugfix-gym`` after ``make demo``), else ``python -m agents.cli`` with this Python."""
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if script is None or script.name != "bugfix-gym":
        return f"{_from_here(Path(sys.executable))} -m agents.cli"
    found = shutil.which("bugfix-gym")
    if found is not None and Path(found).resolve() == script.resolve():
        return "bugfix-gym"
    return _from_here(script)


def _from_here(path: Path) -> str:
    """``path`` as typed from the working directory: relative below it (``./`` for a bare name), else absolute."""
    relative = os.path.relpath(path.absolute())
    if relative.startswith(".."):
        return str(path.absolute())
    return relative if os.sep in relative else f".{os.sep}{relative}"


class UsageError(Exception):
    """A one-line command-line error (exit status 2)."""


def usage_error(command: str, message: str) -> UsageError:
    """The one-line error of ``bugfix-gym <command>``: ``bugfix-gym train: error: <message>``.

    :param command: the sub-command (``train``, ``eval``)
    :param message: what is wrong and what to do instead
    """
    return UsageError(f"bugfix-gym {command}: error: {message}")


class OneLineParser(argparse.ArgumentParser):
    """argparse, but errors are one line (no usage dump) and exit with status 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: error: {message}{_did_you_mean(message)} (see --help)")


def _did_you_mean(message: str) -> str:
    """``; did you mean 'train'?`` for argparse's ``invalid choice: 'trian' (choose from ...)``, else ''."""
    import difflib
    import re

    found = re.match(r"argument .*: invalid choice: '([^']*)' \(choose from (.*)\)$", message)
    if found is None:
        return ""
    close = difflib.get_close_matches(found.group(1), re.findall(r"'([^']*)'", found.group(2)), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


@dataclasses.dataclass(frozen=True)
class Number:
    """An argparse type: a finite number of ``kind`` within bounds, else a one-line error.

    :param kind: ``int`` or ``float``
    :param low: the smallest value allowed (None: no lower bound)
    :param high: the largest value allowed (None: no upper bound)
    :param strict_low: ``low`` itself is out of bounds
    :param what: what the error says was expected, e.g. ``"a positive integer"`` (default: the kind's name)
    """

    kind: type
    low: float | None = None
    high: float | None = None
    strict_low: bool = False
    what: str = ""

    def __call__(self, text: str) -> Any:
        try:
            value = self.kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {self.what or self.kind.__name__}, got {text!r}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        if self.low is not None and (value < self.low or (self.strict_low and value == self.low)):
            raise argparse.ArgumentTypeError(f"must be {'>' if self.strict_low else '>='} {self.low}, got {text}")
        if self.high is not None and value > self.high:
            raise argparse.ArgumentTypeError(f"must be <= {self.high}, got {text}")
        return value


POSITIVE_INT = Number(int, 1, what="a positive integer")
# size flags checked before any env or task is built (the memory estimate needs the model first)
MAX_EVAL_TASKS = 100_000  # eval --n (generated tasks)
MAX_EVAL_EPISODES = 10_000  # eval --episodes (per task)
NON_NEGATIVE_INT = Number(int, 0, what="an integer >= 0")
SEED = Number(int, 0, 2**32 - 1, what="a seed (0 to 2**32 - 1)")
POSITIVE_FLOAT = Number(float, 0.0, strict_low=True, what="a positive number")
NON_NEGATIVE_FLOAT = Number(float, 0.0, what="a number >= 0")
UNIT_FLOAT = Number(float, 0.0, 1.0, what="a number in [0, 1]")
SHARE = Number(float, 0.0, 1.0, strict_low=True, what="a number in (0, 1]")

UNSET = object()  # the default of a flag for which None is a value ('none'): the flag was not given


def foresight_threshold(text: str) -> float | None:
    """``--foresight``: a threshold foresight takes, or ``none`` (off: None)."""
    return None if text == "none" else threshold(text)


def threshold(text: str) -> float:
    """``--rollout-foresight``, ``--foresight``: a threshold foresight takes (its bound is foresight's own,
    :func:`agents.decoding.foresight.check_threshold`)."""
    from agents.decoding.foresight import check_threshold

    value = Number(float, what="a number")(text)
    try:
        check_threshold(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


@dataclasses.dataclass(frozen=True)
class Flag:
    """One flag of a command, as data.

    :param name: the setting it sets (``n_episodes``); the flag is ``--n-episodes``
    :param help: the help line
    :param type: how its text is read (a :class:`Number`, ``Path``, ...; None: kept as text)
    :param choices: the values allowed
    :param default: the value when the flag is left out (None: the recipe's)
    :param metavar: the value's name in the help
    :param switch: a flag without a value (``store_true``)
    :param part: where the recipe keeps the setting: ``"ppo"`` (TokenPPO's arguments), ``"env"``
        (the training envs' options), ``"validation"``, ``"run"`` (the recipe's top level); None: the
        command reads it itself
    :param group: flags with the same group exclude each other
    :param off_word: the value that turns the setting off (stored as None): a choice, or a number (0)
    """

    name: str
    help: str
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    default: Any = None
    metavar: str | None = None
    switch: bool = False
    part: str | None = None
    group: str | None = None
    off_word: Any = None

    @property
    def option(self) -> str:
        """The flag as typed: ``--n-episodes``."""
        return "--" + self.name.replace("_", "-")

    def argparse_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``parser.add_argument(self.option, ...)``."""
        if self.switch:
            return dict(action="store_true", help=self.help)
        return dict(type=self.type, choices=self.choices, default=self.default, metavar=self.metavar, help=self.help)

    def setting(self, value: Any) -> Any:
        """The setting a given value stands for: None for :attr:`off_word`, else the value."""
        return None if self.off_word is not None and value == self.off_word else value


def add_flags(parser: argparse.ArgumentParser, flags: tuple[Flag, ...]) -> None:
    """Add ``flags`` to ``parser`` in order, those of one :attr:`Flag.group` as a mutually exclusive group."""
    groups: dict[str, Any] = {}
    for flag in flags:
        where: Any = parser
        if flag.group is not None:
            if flag.group not in groups:
                groups[flag.group] = parser.add_mutually_exclusive_group()
            where = groups[flag.group]
        where.add_argument(flag.option, **flag.argparse_kwargs())


def set_given(part: dict[str, Any], args: argparse.Namespace, flags: tuple[Flag, ...], name: str) -> None:
    """Copy into ``part`` the flags of recipe part ``name`` that were given (one left out keeps the recipe's value).

    :param part: the recipe's part, changed in place
    :param args: the parsed command line
    :param flags: the command's flag table
    :param name: the part's name (:attr:`Flag.part`)
    """
    for flag in flags:
        value = getattr(args, flag.name)
        if flag.part == name and value is not None:
            part[flag.name] = flag.setting(value)
