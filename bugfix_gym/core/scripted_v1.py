"""Baseline policies for BugFix-v1: what a learned repairer's score means something against.

Every policy plays only through the env's calls: it answers ``(observation, info, legal) -> call text``, where
``observation`` and ``info`` are what the last ``reset`` / ``step`` returned and ``legal()`` is
``env.unwrapped.legal_calls()`` (every legal call now, each sited edit spelled out). :func:`play_episode` plays
one episode and counts its calls.

* ``oracle``: ``read``, the task's known repair calls (``task.bugs``), ``submit``. It **reads the answer**: a
  reference (how many tasks the calls can repair), never a policy to train on.
* ``brute_force``: generate and validate. ``read``, then every legal single edit in :func:`brute_force_order`,
  ``test`` after each, ``revert`` after a failing one, ``submit`` after the first passing test.
* ``random``: uniform over ``legal()`` plus ``submit``.
* ``debugger``: a scripted careful debugger. ``read``, ``test``, ``locate``, then edits on the suspicious lines
  in :func:`debugger_order` (``locate``'s printed scores times :func:`mutation_prior`), tested, reverted and
  submitted as brute force does.

``brute_force`` and ``debugger`` share one loop (:class:`EditSearch`): with ``left`` turns left (this one
included) they start a new edit only if ``left >= 3`` (edit, test, submit), and ``submit`` on the last turn
whatever the state. With ``max_turns=None`` they try every candidate (the env must then allow ``3 n + 2``
turns): how many test calls brute force needs.

The debugger never reads ``task.bugs`` or ``task.fixed_source``: it sees the tools' text and the legal calls,
and its only knowledge of bugs is :func:`mutation_prior`, counted from the **train** split's stored one-bug
mutants' repair calls (``tests/test_scripted_v1.py`` checks both).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .locate import SITES_MARK

__all__ = ("KINDS_V1", "Episode", "EditSearch", "Legal", "PolicyV1", "brute_force_order", "debugger_order",
           "locate_scores", "make_policy", "mutation_prior", "play_episode", "prior_counts", "tests_passed")

KINDS_V1 = ("oracle", "brute_force", "random", "debugger")
SEARCH_CALLS = ("edit ", "delete ")
"""The legal calls brute force and the debugger try: sited edits and line deletions (no free-text code)."""
TEST_CALLS = ("test", "locate")
"""Calls that run the visible tests (counted as test calls)."""


def is_test_call(call: str) -> bool:
    """True for a ``test`` or ``locate`` call as the env takes it (the bare word, blanks around it allowed): what
    every table of BugFix-v1 counts as a test call, the baselines' and a model's evaluation alike."""
    return call.strip() in TEST_CALLS


Legal = Callable[[], Sequence[str]]
"""``env.unwrapped.legal_calls``: every legal call in the current state."""

_TEST_REPORT = re.compile(r"visible tests\s*:\s*(\d+)\s*/\s*(\d+)\s*passed")
_LOCATE_LINE = re.compile(r"line (\d+) ([0-9]+(?:\.[0-9]+)?)")


def tests_passed(observation: str) -> bool:
    """True if ``observation`` is a ``test`` report in which every visible test passed."""
    m = _TEST_REPORT.search(observation)
    return m is not None and m.group(1) == m.group(2) and int(m.group(2)) > 0


def locate_scores(observation: str) -> dict[int, float]:
    """The ``{line: score}`` a ``locate`` answer prints (empty when it scored no line; its site lists are not
    read)."""
    if not observation.startswith("suspicious lines"):
        return {}
    scored = observation.split(SITES_MARK, 1)[0]
    return {int(line): float(score) for line, score in _LOCATE_LINE.findall(scored)}


# ---------------------------------------------------------------------------------------------- the prior
PRIOR_FILE = "debugger_prior_v1.json"
"""The committed prior counts, under ``bugfix_gym/tasks/data/`` (``python -m bugfix_gym.core.scripted_v1 --write``)."""
PRIOR_FORMAT = "bugfix-gym/debugger-prior-v1"
PRIOR_SMOOTHING = (0.5, 10.0)
"""``(a, b)`` of the prior's rate ``(repairs + a) / (legal + b)``."""


def _kind_and_arg(call: str) -> tuple[str, str | None]:
    """``edit 4.1 op <=`` -> ``("op", "<=")``, ``insert 6 x = 1`` -> ``("insert", None)``."""
    words = call.split()
    if words[0] == "edit":
        return words[2], (words[3] if len(words) > 3 else None)
    return words[0], None


def prior_counts() -> dict[str, Any]:
    """Count, over the **train** split's stored one-bug HumanEval mutants, each ``(mutation, arg)``'s repair calls
    and its legal calls (sited edits of the buggy source; ``("delete", None)`` per deletable line): the data of
    :func:`mutation_prior`. Reads nothing of the heldout or test splits. About 20 s."""
    from ..edits.patches import deletable_lines
    from ..edits.sites import edit_list
    from ..tasks.humaneval import humaneval_problems
    from ..tasks.mutants import stored_tasks

    repairs: Counter[tuple[str, str | None]] = Counter()
    legal: Counter[tuple[str, str | None]] = Counter()
    tasks = stored_tasks(humaneval_problems("train"), bugs=1)
    for task in tasks:
        repairs.update(_kind_and_arg(bug.repair) for bug in task.bugs)
        legal.update((e.mutation, e.arg) for e in edit_list(task.source))
        legal[("delete", None)] += len(deletable_lines(task.source))
    return {"format": PRIOR_FORMAT, "split": "train", "bugs": 1, "tasks": len(tasks),
            "repairs": sorted(([k, a, n] for (k, a), n in repairs.items()), key=_sort_key),
            "legal": sorted(([k, a, n] for (k, a), n in legal.items()), key=_sort_key)}


def prior_text(counts: Mapping[str, Any]) -> str:
    """:func:`prior_counts`'s table as the committed JSON text: one row a line."""
    head = {k: v for k, v in counts.items() if k not in ("repairs", "legal")}
    parts = [json.dumps(head)[:-1]]
    for key in ("repairs", "legal"):
        rows = ",\n  ".join(json.dumps(row) for row in counts[key])
        parts.append(f'"{key}": [\n  {rows}\n ]')
    return ",\n ".join(parts) + "\n}\n"


def _sort_key(row: list[Any]) -> tuple[str, str, int]:
    return row[0], "" if row[1] is None else row[1], row[2]


@lru_cache(maxsize=1)
def mutation_prior() -> Mapping[tuple[str, str | None], float]:
    """The debugger's fixed prior: for each ``(mutation, arg)`` (``("delete", None)`` for ``delete L``), how often
    a legal call of that kind was the repair in the train split's one-bug mutants,
    ``(repairs + 0.5) / (legal + 10)`` (:data:`PRIOR_SMOOTHING`), from the committed counts (:data:`PRIOR_FILE`,
    made by :func:`prior_counts`). A kind missing from the table (never legal in train) gets ``0.5 / 10``.
    """
    from importlib import resources

    data = json.loads(resources.files("bugfix_gym.tasks").joinpath("data", PRIOR_FILE).read_text())
    if data.get("format") != PRIOR_FORMAT:
        raise ValueError(f"{PRIOR_FILE} is not {PRIOR_FORMAT} : regenerate it with python -m "
                         f"bugfix_gym.core.scripted_v1 --write")
    return _rates(data)


def _rates(data: Mapping[str, Any]) -> dict[tuple[str, str | None], float]:
    """``(repairs + a) / (legal + b)`` per ``(mutation, arg)`` of a :func:`prior_counts` table."""
    a, b = PRIOR_SMOOTHING
    repairs = {(k, arg): n for k, arg, n in data["repairs"]}
    legal = {(k, arg): n for k, arg, n in data["legal"]}
    return {key: (repairs.get(key, 0) + a) / (legal.get(key, 0) + b) for key in {*repairs, *legal}}


# ---------------------------------------------------------------------------------------------- candidate orders
def brute_force_order(legal: Sequence[str]) -> list[str]:
    """Brute force's candidates: the ``edit`` and ``delete`` calls of ``legal``, in ``legal``'s order (the env
    lists them by line, site, mutation in ``MUTATIONS`` order, argument in ``ARGS`` order)."""
    return [call for call in legal if call.startswith(SEARCH_CALLS)]


def _call_line(call: str) -> int:
    """The line an ``edit L.K ...`` or ``delete L`` call acts on."""
    return int(call.split()[1].split(".")[0])


def debugger_order(legal: Sequence[str], scores: Mapping[int, float]) -> list[str]:
    """The debugger's candidates: :func:`brute_force_order`'s, the ones on a line ``locate`` scored first, by
    ``score(line) * prior(mutation, arg)`` (highest first); then the rest by the prior alone; ties keep
    ``legal``'s order.

    :param legal: the legal calls of the task's source
    :param scores: ``locate``'s printed ``{line: score}``
    """
    prior = mutation_prior()
    unseen = PRIOR_SMOOTHING[0] / PRIOR_SMOOTHING[1]

    def key(item: tuple[int, str]) -> tuple[float, float, int]:
        index, call = item
        p = prior.get(_kind_and_arg(call), unseen)
        return -scores.get(_call_line(call), 0.0) * p, -p, index

    return [call for _, call in sorted(enumerate(brute_force_order(legal)), key=key)]


# ---------------------------------------------------------------------------------------------- policies
class PolicyV1:
    """A BugFix-v1 baseline: ``reset(seed)`` before each episode, then ``policy(observation, info, legal)``
    per turn, returning the call text."""

    kind = ""

    def reset(self, seed: int) -> None:
        """Start an episode; ``seed`` seeds whatever the policy draws."""

    def __call__(self, observation: str, info: Mapping[str, Any], legal: Legal) -> str:
        raise NotImplementedError


class EditSearch(PolicyV1):
    """Look (``opening`` calls), then try candidate edits one by one: edit, ``test``, ``revert`` if it failed,
    ``submit`` after the first passing test.

    :param max_turns: the env's turn budget (``None``: try every candidate)
    """

    opening: tuple[str, ...] = ("read",)

    def __init__(self, max_turns: int | None = 12) -> None:
        self.max_turns = max_turns
        self.reset(0)

    def reset(self, seed: int) -> None:
        self.last: str | None = None
        self.opened = 0
        self.todo: list[str] | None = None
        self.outputs: dict[str, str] = {}

    def candidates(self, legal: Sequence[str]) -> list[str]:
        """The edits to try, in order (given the opening calls' outputs in ``self.outputs``)."""
        return brute_force_order(legal)

    def __call__(self, observation: str, info: Mapping[str, Any], legal: Legal) -> str:
        if self.last in self.opening:
            self.outputs[self.last] = observation
        left = None if self.max_turns is None else self.max_turns - info["turn"]
        call = "submit" if left is not None and left <= 1 else self._next(observation, left, legal)
        self.last = call
        return call

    def _next(self, observation: str, left: int | None, legal: Legal) -> str:
        """The call after ``self.last`` answered ``observation``, with ``left`` turns left."""
        if self.last == "test" and tests_passed(observation):
            return "submit"
        if self.opened < len(self.opening):
            self.opened += 1
            return self.opening[self.opened - 1]
        if self.last is not None and self.last.startswith(SEARCH_CALLS):
            return "test"
        if self.last == "test" and self.todo is not None:
            return "revert"
        if self.todo is None:
            self.todo = self.candidates(legal())
        if not self.todo or (left is not None and left < 3):
            return "submit"
        return self.todo.pop(0)


class BruteForce(EditSearch):
    """Generate and validate: ``read``, then every legal single edit in :func:`brute_force_order`."""

    kind = "brute_force"


class Debugger(EditSearch):
    """A scripted careful debugger: ``read``, ``test``, ``locate``, then edits on the suspicious lines in
    :func:`debugger_order`. It sees only the tools' text and the legal calls."""

    kind = "debugger"
    opening = ("read", "test", "locate")

    def candidates(self, legal: Sequence[str]) -> list[str]:
        return debugger_order(legal, locate_scores(self.outputs.get("locate", "")))


class RandomLegal(PolicyV1):
    """Uniform over the legal calls plus ``submit``, drawn from the policy's own generator."""

    kind = "random"

    def __init__(self) -> None:
        self.reset(0)

    def reset(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def __call__(self, observation: str, info: Mapping[str, Any], legal: Legal) -> str:
        calls = list(legal())
        if "submit" not in calls:
            calls.append("submit")
        return calls[int(self.rng.integers(len(calls)))]


class Oracle(PolicyV1):
    """The known repair: ``read``, each of ``task.bugs``' repair calls in order, ``submit``. **An oracle**: it
    reads the injected bugs, so it measures how many tasks the calls can repair, never a policy to train on.

    :param repairs: per task name, its repair calls (:func:`oracle_repairs`)
    """

    kind = "oracle"

    def __init__(self, repairs: Mapping[str, Sequence[str]]) -> None:
        self.repairs = repairs
        self.reset(0)

    def reset(self, seed: int) -> None:
        self.todo: list[str] | None = None

    def __call__(self, observation: str, info: Mapping[str, Any], legal: Legal) -> str:
        if self.todo is None:
            self.todo = list(self.repairs.get(info["task"], ()))
            return "read"
        return self.todo.pop(0) if self.todo else "submit"


def oracle_repairs(tasks: Sequence[Any]) -> dict[str, tuple[str, ...]]:
    """The oracle's answer key: each task's repair calls in order (its ``bugs``; none for a real bug), under its
    name and under ``problem:name`` (what the env calls a task whose name another task shares)."""
    key: dict[str, tuple[str, ...]] = {}
    for task in tasks:
        calls = tuple(bug.repair for bug in task.bugs)
        key[f"{task.problem}:{task.name}"] = calls
        key.setdefault(task.name, calls)
    return key


def make_policy(kind: str, tasks: Sequence[Any] = (), max_turns: int | None = 12) -> PolicyV1:
    """A baseline by name (:data:`KINDS_V1`).

    :param kind: ``oracle`` | ``brute_force`` | ``random`` | ``debugger``
    :param tasks: the tasks the oracle's answer key comes from (only the oracle reads them)
    :param max_turns: the env's turn budget for the search policies (``None``: unbounded)
    """
    if kind == "oracle":
        return Oracle(oracle_repairs(tasks))
    if kind == "brute_force":
        return BruteForce(max_turns)
    if kind == "debugger":
        return Debugger(max_turns)
    if kind == "random":
        return RandomLegal()
    raise ValueError(f"unknown baseline {kind!r}; use one of {', '.join(KINDS_V1)}")


# ---------------------------------------------------------------------------------------------- one episode
@dataclass(frozen=True)
class Episode:
    """One played episode.

    :param task: the task's name
    :param reward: the episode's return
    :param passed: the hidden tests all passed (``info["hidden_pass"]`` on submit)
    :param calls: steps taken
    :param test_calls: ``test`` and ``locate`` calls (each runs the visible tests)
    :param invalid: invalid calls
    :param stop: why it ended (``info["stop"]``)
    """

    task: str
    reward: float
    passed: bool
    calls: int
    test_calls: int
    invalid: int
    stop: str


def play_episode(env: Any, policy: PolicyV1, task: str, seed: int = 0) -> Episode:
    """Play ``task`` with ``policy`` on a BugFix-v1 ``env`` until it ends; ``seed`` seeds both."""
    observation, info = env.reset(seed=seed, options={"task": task})
    policy.reset(seed)
    legal = env.unwrapped.legal_calls
    reward, calls, tests = 0.0, 0, 0
    while True:
        call = policy(observation, info, legal)
        observation, r, terminated, truncated, info = env.step(call)
        reward += float(r)
        calls += 1
        tests += is_test_call(call) and bool(info.get("valid", True))
        if terminated or truncated:
            break
    return Episode(task, reward, bool(info.get("hidden_pass")), calls, tests, int(info.get("n_invalid", 0)),
                   str(info.get("stop", "")))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bugfix_gym.core.scripted_v1 --check | --write FILE``: recount the debugger's prior from the
    train split and compare it with the committed file, or write it."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--check", action="store_true", help="recount and compare with the committed file")
    group.add_argument("--write", metavar="FILE", help="recount and write FILE")
    args = parser.parse_args(argv)
    counts = prior_counts()
    text = prior_text(counts)
    if args.write:
        with open(args.write, "w") as f:
            f.write(text)
        print(f"wrote {args.write} : {len(counts['repairs'])} repair kinds over {counts['tasks']} train tasks")
        return 0
    from importlib import resources

    same = resources.files("bugfix_gym.tasks").joinpath("data", PRIOR_FILE).read_text() == text
    print(f"{PRIOR_FILE} {'matches' if same else 'differs from'} the train split's counts")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
