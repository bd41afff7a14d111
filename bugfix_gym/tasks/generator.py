"""Procedural tasks: templates x defects x renamed identifiers, with disjoint splits.

Each template (its data is in :mod:`bugfix_gym.tasks.templates`) is a *correct* function written with
placeholder identifiers, the edit ops whose defect it can carry, and an input generator.
:func:`generate_tasks` picks a template of the split, a defect, fresh function and variable
names from word lists, and random inputs; the buggy source comes from
:func:`bugfix_gym.edits.ops.inject_defect` and the expected values from running the correct function
(:func:`bugfix_gym.tasks.library.task_from_correct`).
A candidate is kept only if :func:`bugfix_gym.tasks.library.task_problems` finds nothing wrong
(the oracle's op repairs it, the buggy source fails the hidden tests, visible tests are a
strict subset of hidden ones); otherwise another is drawn.

The ``train``, ``heldout`` and ``test`` splits use disjoint template sets, so an agent
cannot score on held-out tasks by remembering function names or shapes seen in training.
Every split covers all five defect kinds. Function names end in a short hash of the task's
content, so they are unique and the same name always means the same task; generated tasks
are registered so the scripted oracle finds them by name.

:func:`draw_task` makes one task per episode (``BugFixEnv(generated=split)``); those are
registered only while they are among the ``RECENT_LIMIT`` most recent, so millions of
resets do not grow the registry.
"""

from __future__ import annotations

import ast
import copy
import hashlib
from collections import OrderedDict
from dataclasses import replace
from typing import Sequence

import numpy as np

from ..edits.ops import FIX_OPS, apply_op, describe_change, inject_defect
from .library import REGISTRY, Task, make_tasks, register, task_from_correct, task_problems
from .templates import AMBIGUOUS, NOUNS, TEMPLATES, VERBS, WORDS, Template  # noqa: F401 (importable here too)

GENERATED_SPLITS = ("train", "heldout", "test")
RECENT_LIMIT = 1024  # per-episode tasks kept registered (by name and uid), oldest dropped first
MAX_DRAWS = 100  # candidates tried for one per-episode task before giving up


def _name(rng: np.random.Generator, content: str) -> str:
    digest = hashlib.sha1(content.encode()).hexdigest()[:6]
    return f"{VERBS[int(rng.integers(len(VERBS)))]}_{NOUNS[int(rng.integers(len(NOUNS)))]}_{digest}"


def make_task(template: Template, fix_op: str, rng: np.random.Generator, split: str) -> Task:
    """One task from ``template`` with defect ``fix_op``, identifiers and inputs drawn from ``rng``."""
    if fix_op not in template.ops:
        raise ValueError(f"template {template.key!r} carries only {', '.join(template.ops)}, not {fix_op!r}")
    names = {role: str(pool[int(rng.integers(len(pool)))]) for role, pool in WORDS.items()}
    inputs, seen = [], set()
    for args in template.inputs(rng):  # drop repeated inputs, keep the first of each in order
        if repr(args) not in seen:
            seen.add(repr(args))
            inputs.append(args)
    content = f"{template.key}|{fix_op}|{sorted(names.items())}|{inputs!r}"
    names["f"] = _name(rng, content)
    statement = template.statement
    if not isinstance(statement, str):  # several phrasings: draw one (only then is rng used, so
        statement = statement[int(rng.integers(len(statement)))]  # one-phrasing templates draw as before)
    return task_from_correct(names["f"], statement.format(**names), template.source.format(**names),
                             fix_op, inputs, split=split, template=template.key)


def _candidate(templates: Sequence[Template], split: str, fix_op: str, rng: np.random.Generator) -> Task | None:
    """One checked task with defect ``fix_op`` from a random one of ``templates``, or None on a bad draw."""
    options = [t for t in templates if fix_op in t.ops]
    template = options[int(rng.integers(len(options)))]
    try:
        task = make_task(template, fix_op, rng, split)
    except Exception:  # noqa: BLE001 - a template/input mismatch; the caller draws another
        return None
    return None if task_problems(task) else task


def _name_free(task: Task) -> bool:
    """No other task is registered under this task's name (the same task may be)."""
    known = REGISTRY.get(task.name)
    return known is None or known == task


def generate_tasks(split: str = "train", n: int = 100, seed: int = 0, templates: Sequence[str] | None = None
                   ) -> list[Task]:
    """``n`` procedurally generated, checked and registered tasks from the split's templates.

    :param split: ``"train"``, ``"heldout"`` or ``"test"`` (disjoint template sets)
    :param n: how many tasks; names are unique within the result
    :param seed: the same ``(split, n, seed)`` always gives the same tasks
    :param templates: only these template keys of the split (default: all); the defect kinds cycle
        over those the chosen templates carry
    :return: tasks cycling through the five defect kinds, usable as ``BugFixEnv(tasks=...)``
    """
    if split not in TEMPLATES:
        raise ValueError(f"unknown generator split {split!r}; use one of {', '.join(GENERATED_SPLITS)}")
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    chosen = _chosen_templates(split, templates)
    rng = np.random.default_rng([seed, GENERATED_SPLITS.index(split)] + ([] if templates is None else [1]))
    ops = [op for op in FIX_OPS if any(op in t.ops for t in chosen)]
    tasks: list[Task] = []
    names: set[str] = set()
    attempts = 0
    while len(tasks) < n:
        attempts += 1
        if attempts > 20 * n + 100:
            raise RuntimeError(f"could not generate {n} valid {split} tasks (made {len(tasks)})")
        task = _candidate(chosen, split, ops[len(tasks) % len(ops)], rng)
        if task is None or task.name in names or not _name_free(task):
            continue
        names.add(task.name)
        tasks.append(task)
    return register(tasks)


def _chosen_templates(split: str, keys: Sequence[str] | None) -> tuple[Template, ...]:
    if keys is None:
        return TEMPLATES[split]
    wanted = set(keys)
    unknown = wanted - {t.key for t in TEMPLATES[split]}
    if unknown or not keys:
        raise ValueError(f"unknown {split} template(s) {sorted(unknown)}; see bugfix_gym.tasks.generator.TEMPLATES")
    return tuple(t for t in TEMPLATES[split] if t.key in wanted)


_RECENT: OrderedDict[str, Task] = OrderedDict()  # name -> per-episode task registered by draw_task, oldest first


def draw_task(split: str, rng: np.random.Generator, templates: Sequence[str] | None = None) -> Task:
    """One fresh checked task for one episode: a defect kind drawn uniformly, then a template of
    ``split`` carrying it, names and inputs, all from ``rng`` (so the same generator state gives
    the same task). It stays registered by name while it is among the ``RECENT_LIMIT`` most
    recently drawn tasks, so the scripted oracle finds it during its episode.

    :param split: ``"train"``, ``"heldout"`` or ``"test"``
    :param rng: the env's ``np_random``
    :param templates: only these template keys of the split (default: all), e.g. :data:`AMBIGUOUS`
    """
    if split not in TEMPLATES:
        raise ValueError(f"unknown generator split {split!r}; use one of {', '.join(GENERATED_SPLITS)}")
    chosen = _chosen_templates(split, templates)
    ops = [op for op in FIX_OPS if any(op in t.ops for t in chosen)]
    for _ in range(MAX_DRAWS):
        task = _candidate(chosen, split, ops[int(rng.integers(len(ops)))], rng)
        if task is not None and _name_free(task):
            return _register_recent(task)
    raise RuntimeError(f"could not generate a valid {split} task in {MAX_DRAWS} draws")


def _register_recent(task: Task) -> Task:
    """Register a per-episode task, dropping the oldest such registration beyond ``RECENT_LIMIT``."""
    if task.name in _RECENT:
        _RECENT.move_to_end(task.name)
        return _RECENT[task.name]
    if task.name in REGISTRY:  # registered for good (generate_tasks made the same task)
        return task
    REGISTRY[task.uid] = REGISTRY[task.name] = task
    _RECENT[task.name] = task
    while len(_RECENT) > RECENT_LIMIT:
        name, old = _RECENT.popitem(last=False)
        if REGISTRY.get(old.uid) is old:  # not re-registered for good since
            del REGISTRY[old.uid]
            if REGISTRY.get(name) is old:
                del REGISTRY[name]
    return task


def with_inert_line(task: Task, rng: np.random.Generator) -> Task:
    """``task`` with one statement that does nothing added to its function's top-level body:
    ``<noun> = <parameter>`` between two statements drawn from ``rng``. It holds
    no site any edit op looks for, so every op changes the same code as before, and the tests
    and the fix are the same. ``task`` itself comes back where there is no place for such a line
    (a source that is not one function of two statements or more with a parameter) or where the
    result would change an op's site or fail the task check."""
    try:
        func = ast.parse(task.source).body[0]
    except (SyntaxError, ValueError, IndexError):
        return task
    if not isinstance(func, ast.FunctionDef):
        return task
    params = [a.arg for a in func.args.args]
    used = {n.id for n in ast.walk(func) if isinstance(n, ast.Name)} | set(params)
    nouns = [w for w in NOUNS if w not in used]
    if not params or not nouns or len(func.body) < 2:
        return task
    before = func.body[1 + int(rng.integers(len(func.body) - 1))]  # after the first (a guard's place)
    lines = task.source.splitlines(keepends=True)
    indent = lines[before.lineno - 1][: before.col_offset]
    line = f"{indent}{nouns[int(rng.integers(len(nouns)))]} = {params[int(rng.integers(len(params)))]}\n"
    noisy = replace(task, source="".join(lines[: before.lineno - 1] + [line] + lines[before.lineno - 1:]))
    same_sites = all((apply_op(task.source, op) == task.source) == (apply_op(noisy.source, op) == noisy.source)
                     for op in FIX_OPS)
    return noisy if same_sites and not task_problems(noisy) else task


def recombined_function(rng: np.random.Generator, split: str = "train", max_statements: int = 4) -> str:
    """A function made of statements of ``split``'s templates, recombined at random: for learning
    what the edit ops do to code, not a task (it has no statement, tests or defect). ``split``
    is a generated split, or ``"book"``: the book's 20 train tasks, as given or repaired.

    Three templates (or book functions) are drawn, with fresh names and half of them with a
    defect injected. The body takes 0 .. ``max_statements - 1`` statements other than ``return``
    drawn from any depth of them (a loop or ``if`` keeps its own body or, half the time, gets one
    drawn from all their statements) and ends with a drawn ``return``. The parameters
    are those of one drawn template, so the names need not agree: the source parses, but may
    not run. Mixing statements breaks the tie between an op's site and a template's shape,
    which an agent otherwise learns instead of the site itself.
    """
    if split not in GENERATED_SPLITS + ("book",):
        raise ValueError(f"unknown split {split!r}; use one of {', '.join(GENERATED_SPLITS)} or 'book'")
    stmts: list[ast.stmt] = []
    params: list[ast.arg] = []
    for _ in range(3):
        func = _book_function(rng) if split == "book" else _drawn_function(TEMPLATES[split], rng)
        params = params or func.args.args
        stmts += [n for n in ast.walk(func) if isinstance(n, ast.stmt) and n is not func]
    returns = [n for n in stmts if isinstance(n, ast.Return)]
    others = [n for n in stmts if not isinstance(n, ast.Return)] or stmts
    body = [_recombined(others, rng, depth=1, inner=stmts) for _ in range(int(rng.integers(max_statements)))]
    body.append(returns[int(rng.integers(len(returns)))] if returns else ast.Return(value=ast.Constant(0)))
    module = ast.parse(f"def f({', '.join(a.arg for a in params)}):\n    pass\n")
    module.body[0].body = body  # type: ignore[attr-defined]
    return ast.unparse(module) + "\n"


def _drawn_function(templates: Sequence[Template], rng: np.random.Generator) -> ast.FunctionDef:
    """A drawn template's function with names drawn from :data:`WORDS`, with a defect injected half the time."""
    template = templates[int(rng.integers(len(templates)))]
    names = {role: str(pool[int(rng.integers(len(pool)))]) for role, pool in WORDS.items()}
    source = template.source.format(f="f", **names)
    if rng.random() < 0.5:
        source = inject_defect(source, template.ops[int(rng.integers(len(template.ops)))])
    return _function(source)


def _book_function(rng: np.random.Generator) -> ast.FunctionDef:
    """A drawn book train task's function: as given (buggy) or repaired, half the time each."""
    tasks = make_tasks("train")
    task = tasks[int(rng.integers(len(tasks)))]
    return _function(task.source if rng.random() < 0.5 else apply_op(task.source, task.fix_op))


def _function(source: str) -> ast.FunctionDef:
    """The one function a template or task source defines."""
    func = ast.parse(source).body[0]
    assert isinstance(func, ast.FunctionDef)
    return func


def _recombined(stmts: list[ast.stmt], rng: np.random.Generator, depth: int,
                inner: list[ast.stmt] | None = None) -> ast.stmt:
    """A copy of a statement drawn from ``stmts``; a compound one gets a body drawn from ``inner``
    (default ``stmts``) half the time, until ``depth`` is 0."""
    inner = stmts if inner is None else inner
    stmt = copy.deepcopy(stmts[int(rng.integers(len(stmts)))])
    if isinstance(stmt, (ast.For, ast.While, ast.If)) and depth > 0 and rng.random() < 0.5:
        stmt.body = [_recombined(inner, rng, depth - 1) for _ in range(int(rng.integers(1, 3)))]
        stmt.orelse = []
    return stmt


def edit_practice(rng: np.random.Generator, n_edits: int = 3, split: str = "train") -> list[tuple[str, str]]:
    """A recombined function (:func:`recombined_function`) and ``n_edits`` distinct ops applied to it
    in turn: ``[(call, answer), ...]`` with ``("read", source)`` first and each edit's answer as the
    env words it (``no change`` or the first line it changed)."""
    source = recombined_function(rng, split)
    out = [("read", source)]
    for k in rng.permutation(len(FIX_OPS))[:n_edits]:
        op = FIX_OPS[int(k)]
        new = apply_op(source, op)
        out.append((f"edit {op}", describe_change(source, new)))
        source = new
    return out
