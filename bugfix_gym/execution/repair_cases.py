"""BugFix-v1's test cases, the value codec that carries outcomes across the sandbox, and the judges.

Standard library only, like :mod:`bugfix_gym.execution.cases` (the only module of this package it
imports), so the contained worker child (:mod:`bugfix_gym.execution.worker_child`) loads it alone.
``tests/test_layering.py`` checks that.

Two kinds of case:

* :class:`CallCase` ``(args, expected)``: passes when ``candidate(*args) == expected`` (Python's
  ``==``, so ``True == 1``; floats within ``math.isclose`` 1e-9, see :func:`values_match`). The
  worker sends the candidate the arguments only, never the expected value, and returns the
  encoded outcome; this process compares (:func:`judge_call_case`).
* :class:`AssertCase` ``(code, setup)``: a statement of the tests run as itself (``assert
  abs(candidate(x) - y) < 1e-6``, a ``for`` loop of asserts, ...). Record / replay: the worker
  runs ``setup`` + ``code`` with ``candidate`` bound to a *recorder* around the candidate
  function, which notes each call's arguments and encoded outcome (:func:`record_assert_case`);
  this process then runs the same ``setup`` + ``code`` itself, in a fresh namespace built from the
  task's trusted ``support`` code, with ``candidate`` bound to a *replayer* that checks each
  call's arguments against the recorded ones and returns the recorded value, or raises for a
  recorded exception (:func:`replay_assert_case`). ``random.seed(0)`` precedes the case on both
  sides, and the recorder restores the random state after each candidate call, so both runs draw
  the same inputs. The case passes only if this process's run passes: nothing the candidate does
  in its own process (monkeypatching ``builtins``, ``math``, the recorder or ``AssertionError``,
  returning an object with its own ``__eq__``) can make a test pass here.

The codec (:func:`encode_value` / :func:`decode_value`) is tagged JSON: ``None``, ``bool``,
``str``, finite ``float`` and ints below 2**63 as themselves; ``["i", hex]`` for larger ints,
``["F", "nan" | "inf" | "-inf"]``, ``["l" | "t" | "s" | "f", items]`` for list, tuple, set,
frozenset (set items in a canonical order), ``["d", [[key, value], ...]]`` for a dict (any
hashable plain key, insertion order kept); anything else, or anything nested deeper than
:data:`MAX_DEPTH` or larger than :data:`MAX_VALUE_CHARS`, becomes a marker ``["?", kind, name]``
that decodes to an :class:`Unsent` (equal to nothing). Only exact built-in types are plain:
subclasses (and so any object with its own ``__eq__``) are markers.
"""

from __future__ import annotations

import builtins
import copy
import functools
import json
import math
import random
import sys
import threading
from dataclasses import dataclass
from types import CodeType
from typing import Any, Callable, Sequence

if __package__:  # imported as bugfix_gym.execution.repair_cases
    from .cases import LoopBudgetExceeded, compile_ticked, error_name, safe_name
else:  # loaded by the worker child next to its sibling leaf module ``cases`` (see worker_child.py)
    from cases import LoopBudgetExceeded, compile_ticked, error_name, safe_name  # type: ignore[no-redef]

MAX_DEPTH = 20  # containers nest at most this deep
MAX_VALUE_CHARS = 100_000  # string characters + items + int digits in one value, at most
MAX_CALLS = 10_000  # candidate calls one AssertCase may make
SMALL_INT = 1 << 63  # ints of this size or more travel as hex text (never limited by str()'s digit cap)
TEST_LOOP_TICKS = 1_000_000  # loop iterations the trusted test code of one AssertCase may run
TEXT_CHARS = 60  # a value in a failure text, at most (then "...")
CODE_CHARS = 80  # the test statement in a failure text, at most

_SCALARS = (type(None), bool, str)
_SEQUENCE_TAGS: dict[type, str] = {list: "l", tuple: "t", set: "s", frozenset: "f"}
_TAG_TYPES = {tag: kind for kind, tag in _SEQUENCE_TAGS.items()}
_MARKERS = {"type": "a value of type {}", "big": "a value too large to send back",
            "deep": "a value nested too deep to send back", "name": "a value of a type with an unprintable name"}


@dataclass(frozen=True)
class CallCase:
    """A case that passes when ``candidate(*args) == expected``.

    :param args: the positional arguments (plain values: see the module docstring)
    :param expected: the value the call must return
    """

    args: tuple
    expected: Any


@dataclass(frozen=True)
class AssertCase:
    """A statement of the tests, run as itself with ``candidate`` bound to the function under test.

    :param code: the statement (an ``assert``, a ``for`` loop of asserts, ...)
    :param setup: the statements of the test function before it (imports, ``rng = ...``, helpers)
    """

    code: str
    setup: str = ""


RepairCase = CallCase | AssertCase


class Unsent:
    """A value that did not cross the sandbox: it equals nothing (not even another ``Unsent``).

    :param why: what it was, in words (``"a value of type Foo"``)
    """

    __slots__ = ("why",)

    def __init__(self, why: str):
        self.why = why

    def __repr__(self) -> str:
        return f"<{self.why}>"

    def __eq__(self, other: object) -> bool:
        return False

    def __ne__(self, other: object) -> bool:
        return True

    __hash__ = object.__hash__


# ---------------------------------------------------------------------------------------------- the value codec
class _TooBig(Exception):
    pass


def encode_value(value: Any, budget: int = MAX_VALUE_CHARS) -> Any:
    """``value`` as tagged JSON (see the module docstring); never raises.

    :param value: any object (task code's return value, a case's arguments)
    :param budget: characters + items + digits allowed (past it the whole value is a "too large" marker)
    """
    left = [max(0, min(budget, MAX_VALUE_CHARS))]
    try:
        return _encode(value, MAX_DEPTH, left)
    except _TooBig:
        return ["?", "big", ""]
    except RecursionError:
        return ["?", "deep", ""]


def _spend(left: list[int], n: int) -> None:
    left[0] -= n
    if left[0] < 0:
        raise _TooBig


def _encode(value: Any, depth: int, left: list[int]) -> Any:
    kind = type(value)
    _spend(left, 1)
    if kind in _SCALARS:
        if kind is str:
            _spend(left, len(value))
        return value
    if kind is int:
        if -SMALL_INT < value < SMALL_INT:
            return value
        _spend(left, value.bit_length() // 4)
        return ["i", hex(value)]
    if kind is float:
        if math.isfinite(value):
            return value
        return ["F", "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")]
    if kind in _SEQUENCE_TAGS or kind is dict:
        if depth <= 0:
            return ["?", "deep", ""]
        _spend(left, len(value))
        if kind is dict:
            return ["d", [[_encode(k, depth - 1, left), _encode(v, depth - 1, left)] for k, v in value.items()]]
        items = [_encode(v, depth - 1, left) for v in value]
        if kind in (set, frozenset):
            items.sort(key=_canonical_text)  # a set's order is the hash seed's: sort so both sides agree
        return [_SEQUENCE_TAGS[kind], items]
    name = safe_name(getattr(kind, "__name__", None))
    return ["?", "type", name] if name else ["?", "name", ""]


def _canonical_text(encoded: Any) -> str:
    return json.dumps(encoded, sort_keys=True)


def decode_value(data: Any, depth: int = MAX_DEPTH + 1) -> Any:
    """The value an :func:`encode_value` result stands for; raises ``ValueError`` for anything else.

    Parsed from an untrusted answer, so checked strictly: known tags only, hashable keys and set
    items, markers rebuilt from their kind (never from free text).
    """
    kind = type(data)
    if kind in _SCALARS or kind is int or kind is float:
        if kind is float and not math.isfinite(data):
            raise ValueError("a non-finite float outside its tag")
        return data
    if kind is not list or not data or type(data[0]) is not str or depth <= 0:
        raise ValueError("not an encoded value")
    tag = data[0]
    if tag == "i" and len(data) == 2 and type(data[1]) is str and len(data[1]) <= 4 * MAX_VALUE_CHARS:
        try:
            return int(data[1], 16)
        except ValueError:
            raise ValueError("a malformed big int") from None
    if tag == "F" and len(data) == 2 and data[1] in ("nan", "inf", "-inf"):
        return float(data[1])
    if tag == "?" and len(data) == 3 and data[1] in _MARKERS and type(data[2]) is str:
        if data[1] == "type":
            name = safe_name(data[2])
            return Unsent(_MARKERS["type"].format(name)) if name else Unsent(_MARKERS["name"])
        return Unsent(_MARKERS[data[1]])
    if len(data) != 2 or type(data[1]) is not list:
        raise ValueError("not an encoded value")
    if tag == "d":
        out = {}
        for pair in data[1]:
            if type(pair) is not list or len(pair) != 2:
                raise ValueError("a malformed dict item")
            key = decode_value(pair[0], depth - 1)
            try:
                out[key] = decode_value(pair[1], depth - 1)
            except TypeError:
                raise ValueError("an unhashable dict key") from None
        return out
    if tag in _TAG_TYPES:
        items = [decode_value(v, depth - 1) for v in data[1]]
        try:
            return _TAG_TYPES[tag](items)
        except TypeError:
            raise ValueError("an unhashable set item") from None
    raise ValueError("an unknown tag")


def args_key(args: Sequence, kwargs: dict | None = None) -> str:
    """The arguments of one call as canonical JSON text: equal keys <=> the same arguments, types and all."""
    return _canonical_text(encode_value([list(args), kwargs or {}]))


def contains_unsent(value: Any, depth: int = MAX_DEPTH + 1) -> Unsent | None:
    """The first :class:`Unsent` inside a decoded value, or None."""
    if isinstance(value, Unsent):
        return value
    if depth <= 0:
        return None
    if type(value) is dict:
        value = [*value.keys(), *value.values()]
    if type(value) in _SEQUENCE_TAGS or type(value) is list:
        for item in value:
            found = contains_unsent(item, depth - 1)
            if found is not None:
                return found
    return None


# ---------------------------------------------------------------------------------------------- judging CallCases
def values_match(got: Any, expected: Any, depth: int = MAX_DEPTH + 1) -> bool:
    """``got == expected`` as a test's ``==`` decides it, with floats compared by ``math.isclose``
    (relative and absolute tolerance 1e-9) at any depth. Bools and ints compare as Python compares
    them (``True == 1``); a list never equals a tuple; an :class:`Unsent` equals nothing."""
    if isinstance(got, Unsent) or isinstance(expected, Unsent) or depth <= 0:
        return False
    numbers = (bool, int, float)
    if type(got) in numbers and type(expected) in numbers:
        if type(got) is float or type(expected) is float:
            try:
                return math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-9)
            except OverflowError:  # an int too large for a float
                return False
        return got == expected
    if type(got) in (list, tuple) and type(got) is type(expected):
        return len(got) == len(expected) and all(values_match(g, e, depth - 1) for g, e in zip(got, expected))
    if type(got) is dict and type(expected) is dict:
        return got.keys() == expected.keys() and all(values_match(got[k], expected[k], depth - 1) for k in got)
    try:
        return bool(got == expected)
    except Exception:  # noqa: BLE001 - an expected value of a type that cannot compare
        return False


def short(value: Any, limit: int = TEXT_CHARS) -> str:
    """``ascii(value)`` (printable), cut to ``limit`` characters with "..."."""
    try:
        text = ascii(value)
    except Exception:  # noqa: BLE001 - never from decoded values; a trusted expected value could
        text = "<a value that cannot be shown>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def format_call(name: str, args: Sequence, kwargs: dict | None = None) -> str:
    """``name(1, 'a', key=2)``, the arguments bounded (two values' worth of text)."""
    parts = [ascii(a) for a in args] + [f"{k}={ascii(v)}" for k, v in (kwargs or {}).items()]
    text = ", ".join(parts)
    if len(text) > 2 * TEXT_CHARS:
        text = text[: 2 * TEXT_CHARS - 3] + "..."
    return f"{name}({text})"


def describe_outcome(outcome: tuple, verb: str = "got") -> str:
    """``got 3`` / ``raised ValueError`` / ``got a value of type Foo`` / ``: why`` (a timeout, a crash, ...)."""
    kind, payload = outcome
    if kind == "value":
        return f"{verb} {payload.why}" if isinstance(payload, Unsent) else f"{verb} {short(payload)}"
    if kind == "raised":
        return "ran out of loop budget (Timeout)" if payload == "Timeout" else f"raised {payload}"
    return f": {payload}"  # ("failed", why in words)


def judge_call_case(entry: str, case: CallCase, outcome: tuple) -> tuple[bool, str]:
    """Whether ``outcome`` (``("value", decoded)`` | ``("raised", name)`` | ``("failed", why)``) passes
    ``case``, and the case in words: input, expected, got."""
    ok = outcome[0] == "value" and values_match(outcome[1], case.expected)
    return ok, f"{format_call(entry, case.args)} expected {short(case.expected)} {describe_outcome(outcome)}"


# ---------------------------------------------------------------------------------------------- AssertCases
class CaseAborted(BaseException):
    """Ends an AssertCase run: a call that cannot be replayed, a timeout, too many calls. A
    ``BaseException`` so that the test's own ``except Exception`` cannot swallow it."""


@functools.lru_cache(maxsize=256)
def _test_code(source: str, filename: str) -> CodeType:
    return compile_ticked(source, filename)


def replayed_exception(name: str) -> BaseException:
    """The exception a replayed call raises for a recorded exception name: the built-in class of that
    name when it is an ``Exception``, else a fresh ``Exception`` subclass of that name."""
    kind = getattr(builtins, name, None)
    if isinstance(kind, type) and issubclass(kind, Exception):
        return kind()
    return type(name, (Exception,), {})()


def run_assert_case(case: AssertCase, support: str, candidate: Callable) -> BaseException | None:
    """Run ``support``, ``case.setup`` and ``case.code`` in a fresh namespace with ``candidate`` bound;
    the exception that ended the run, or None when it ran to its end. The same on both sides:
    ``random.seed(0)`` first, ``print`` silenced, every loop of the test code tick-bounded
    (:data:`TEST_LOOP_TICKS` in all)."""
    counter = [0]

    def tick():
        counter[0] += 1
        if counter[0] > TEST_LOOP_TICKS:
            raise LoopBudgetExceeded

    namespace: dict[str, Any] = {"__builtins__": builtins, "__name__": "__bf_tests__", "__bf_tick__": tick,
                                 "print": lambda *args, **kwargs: None}
    random.seed(0)
    old_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old_limit, 1000))
    try:
        exec(_test_code(support, "<support>"), namespace)
        namespace["candidate"] = candidate
        exec(_test_code(case.setup, "<tests>"), namespace)
        exec(_test_code(case.code, "<tests>"), namespace)
    except (Exception, SystemExit, CaseAborted) as exc:  # noqa: BLE001 - the tests' failure, whatever it is
        return exc
    finally:
        sys.setrecursionlimit(old_limit)
    return None


Call = tuple[str, tuple]  # (args_key, outcome): outcome ("value", encoded) | ("raised", name) | ("failed", why)


def record_assert_case(case: AssertCase, support: str, func: Callable, reset: Callable[[], None],
                       budget: int = MAX_VALUE_CHARS) -> list[list]:
    """The worker's half: run the case with ``candidate`` = a recorder around ``func``; the calls it
    made as ``[args_key, outcome]`` lists (outcome ``["value", encoded]`` | ``["raised", name]`` |
    ``["failed", why]``), in order. The recorder hands the test the *decoded* copy of each value,
    as the replayer will, and restores the random state after each call (so the candidate's own
    draws never shift the test's inputs)."""
    calls: list[list] = []
    left = [budget]

    def recorder(*args, **kwargs):
        if len(calls) >= MAX_CALLS or left[0] <= 0:
            calls.append([args_key(args, kwargs), ["failed", "too many calls to record"]])
            raise CaseAborted
        key = args_key(args, kwargs)
        state = random.getstate()
        reset()
        try:
            value = func(*copy.deepcopy(args), **copy.deepcopy(kwargs))
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - task code may raise anything
            name = error_name(exc)
            calls.append([key, ["raised", name]])
            left[0] -= len(key) + 64
            random.setstate(state)
            raise CaseAborted if name == "Timeout" else replayed_exception(name) from None
        random.setstate(state)
        encoded = encode_value(value, max(0, left[0] - len(key)))
        calls.append([key, ["value", encoded]])
        left[0] -= len(key) + len(_canonical_text(encoded))
        decoded = decode_value(encoded)
        if contains_unsent(decoded) is not None:
            raise CaseAborted
        return decoded

    run_assert_case(case, support, recorder)
    return calls


_RANDOM_LOCK = threading.Lock()


class _Replayer:
    """``candidate`` on the trusted side: checks each call's arguments against the record, returns the
    recorded value or raises the recorded exception; the first thing that does not fit aborts the case."""

    def __init__(self, calls: Sequence[Call]):
        self.calls = calls
        self.used = 0
        self.aborted: str | None = None
        self.last: str | None = None

    def abort(self, why: str):
        self.aborted = self.aborted or why
        raise CaseAborted

    def __call__(self, *args, **kwargs):
        if self.aborted:
            raise CaseAborted
        if self.used >= len(self.calls):
            self.abort(f"{format_call('candidate', args, kwargs)} was not run in the sandbox (its run there ended "
                       f"earlier)")
        key, outcome = self.calls[self.used]
        self.used += 1
        if key != args_key(args, kwargs):
            self.abort("the sandbox's run of the test called candidate with other arguments")
        self.last = f"{format_call('candidate', args, kwargs)} {describe_outcome(outcome, 'returned')}"
        kind, payload = outcome
        if kind == "value":
            if contains_unsent(payload) is not None:
                self.abort(self.last)
            return copy.deepcopy(payload)
        if kind == "raised" and payload != "Timeout":
            raise replayed_exception(payload)
        self.abort(self.last)


def replay_assert_case(case: AssertCase, support: str, calls: Sequence[Call]) -> tuple[bool, str]:
    """The trusted half: run the case here against the recorded calls (values decoded); whether it
    passes, and the case in words (the test statement, and the last call with what it gave)."""
    head = case_head(case)
    replayer = _Replayer(calls)
    with _RANDOM_LOCK:  # the case seeds the random module: this process's own draws resume where they were
        state = random.getstate()
        try:
            error = run_assert_case(case, support, replayer)
        finally:
            random.setstate(state)
    if replayer.aborted is not None:
        return False, f"test {head} : {replayer.aborted}"
    if error is not None:
        if isinstance(error, AssertionError):
            why = "failed"
        elif isinstance(error, LoopBudgetExceeded):
            why = "failed (the test ran out of loop budget)"
        else:
            why = f"failed with {error_name(error)}"
        last = f" ; last call {replayer.last}" if replayer.last else " ; candidate was not called"
        return False, f"test {head} : {why}{last}"
    if replayer.used != len(calls):
        return False, f"test {head} : the sandbox's run of the test called candidate more often"
    return True, f"test {head} : passed"


def case_head(case: AssertCase) -> str:
    """The test statement in a failure text: its first line (`` ...`` when it has more), printable, bounded."""
    lines = case.code.strip().splitlines() or ["(an empty test)"]
    return short_text(lines[0] + (" ..." if len(lines) > 1 else ""), CODE_CHARS)


def short_text(text: str, limit: int) -> str:
    """``text`` made printable (``ascii`` escapes, no quotes) and cut to ``limit`` characters with "..."."""
    text = ascii(text)[1:-1]
    return text if len(text) <= limit else text[: limit - 3] + "..."
