"""BugFixEnvV1: repair a real function (HumanEval's, v0's, a pack's) with sited edits, line patches and
fault localisation, then submit it to hidden tests."""

from __future__ import annotations

import numbers
from functools import lru_cache
from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np

from ..contract.spaces import BufferedText
from ..contract.text import printable
from ..contract.tokens import OWNER_POLICY, OWNER_PROMPT, OWNER_TOOL
from ..edits.mutations import apply_edit
from ..edits.patches import deletable_lines as _deletable_lines, delete_line, insert_line, patch_line
from ..edits.sites import ARGS, MAX_EXPRS, MAX_LINES, MUTATIONS, EditError, legal_edits, names_line, names_table
from ..execution.repair_runner import RepairReport, run_repair_tests
from ..tasks.humaneval import SPLITS, humaneval_problems
from ..tasks.mutants import mutant_task, mutants, stored_tasks
from ..tasks.problems import Problem, RepairTask
from .calls_v1 import CALL_INDEX, CALL_KINDS, MAX_ACTION_CHARS, MENU, CallError, ParsedCall, parse_call_v1
from .env import MAX_KEPT_ACTION_CHARS, MAX_OBS_CHARS, nonnegative, turn_budget
from .locate import locate_text
from .tools import CHARSET, _echo

MAX_TOOL_CHARS = 500
"""Characters of one tool output at most; a longer one is cut and says so."""
SPLITS_V1 = (*SPLITS, "all")

Tool = Callable[[ParsedCall], tuple[str, float]]
"""A tool's handler: the parsed call -> (the tool's output, its part of the step's reward)."""


class BugFixEnvV1(gym.Env):
    """Repair a real buggy Python function by calling tools, then submit it to hidden tests.

    ## Description
    Each episode is one task (:class:`~bugfix_gym.tasks.problems.RepairTask`): a function with one or two bugs
    injected into a correct one (HumanEval's 164 problems, split by problem; v0's functions; a pack's correct
    functions), or a real bug from a v1 task pack. The agent writes one tool call per step: ``read`` shows the
    numbered source and its names table, ``test`` runs the visible tests, ``locate`` ranks the lines by Ochiai
    suspiciousness over the visible tests' coverage, ``edit L.K MUTATION [ARG]`` applies a sited mutation,
    ``patch L CODE`` / ``insert L CODE`` / ``delete L`` change a line as free text, ``revert`` restores the task's
    source and ``submit`` runs the hidden tests and ends the episode. Every run of the code happens in the
    contained worker (:mod:`bugfix_gym.execution.repair_runner`).

    ## Action Space
    ``BufferedText(max_length=256, min_length=0, charset=string.printable)``: the call as text
    (:mod:`bugfix_gym.core.calls_v1`). A call that is too long, has a character outside the charset, does not
    parse, or does not apply (an edit the site does not take, a patch that does not compile, a line that is not
    there, ``revert`` of an unchanged source) is an *invalid call*: it costs the turn, the observation is one
    line saying why, ``info["n_invalid"]`` counts it and the source does not change. A non-string action raises
    ``TypeError``.

    ## Observation Space
    ``BufferedText(max_length=4096, min_length=0, charset=string.printable)``. After ``reset``: the prompt
    (function name, statement, call menu). After each step: that call's tool output, at most 500 characters
    (a longer one is cut and says so; ``read L`` shows the source from line ``L``). ``env.unwrapped.transcript``
    holds the episode as ``(owner, text)`` segments (prompt 1, policy 2, tool 3), as in BugFix-v0.

    ## Rewards
    ``1.0`` on the ``submit`` step if every hidden case passes, else ``0.0``: code that does not load, raises,
    runs out of its loop budget or time fails its cases. Optional: ``call_cost`` is subtracted on every step,
    ``invalid_cost`` on every invalid call.

    ## Starting State
    A problem drawn uniformly with ``self.np_random`` among the problems of ``env.tasks``, then one of its tasks,
    uniformly (so a function with many mutants is not drawn more often). ``reset(options={"task": ...})`` plays a
    given task: a name (``info["task"]``), an index into ``env.tasks`` or a :class:`RepairTask`.

    ## Episode End
    Terminated on ``submit``. Truncated when ``max_turns`` turns have been taken (``info["stop"] == "budget"``).

    ## Info
    ``task`` (its name in this env: the task's name, or ``problem:name`` where two problems share an entry
    name), ``turn``, ``actions`` (calls so far), ``n_invalid``, ``valid`` (this call), ``submitted``,
    ``hidden_pass``, ``stop`` (``"submit"``, ``"budget"`` or None), ``call_mask`` (bool[9] over
    :data:`~bugfix_gym.core.calls_v1.CALL_KINDS`: which kinds have a legal call now), ``line_mask``
    (bool[MAX_LINES]: entry ``i`` is line ``i + 1``, True where a sited edit is legal). The factorised heads'
    masks given earlier choices: :meth:`edit_mask`; every legal call spelled out: :meth:`legal_calls`.

    ## Arguments
    :param split: HumanEval's ``"train"``, ``"heldout"``, ``"test"`` or ``"all"`` (their committed mutants)
    :param tasks: a list of :class:`RepairTask` and :class:`Problem` (e.g. from ``load_task_pack``); a Problem
        plays its valid mutants (stored for HumanEval's, injected and validated now for any other); overrides
        ``split``
    :param bugs: 1, 2, or ``(1, 2)``: the one-bug tasks, the two-bug tasks, or both
    :param max_turns: the turn budget, an int >= 1
    :param call_cost: subtracted from the reward of every step (finite, >= 0)
    :param invalid_cost: subtracted from the reward of every invalid call (finite, >= 0)
    :param render_mode: ``"ansi"`` returns the transcript as text, ``"human"`` prints it; any other mode falls
        back to None (with a warning, except ``"rgb_array"``)

    ## Version History
    * v1: real functions (HumanEval, v0's, packs), injected bug classes, sited edits, line patches, ``locate``.
    """

    metadata = {"render_modes": ["ansi", "human"], "render_fps": 4}

    def __init__(self, split: str = "train", tasks: Sequence[RepairTask | Problem] | None = None,
                 bugs: int | tuple[int, ...] = 1, max_turns: int = 12, call_cost: float = 0.0,
                 invalid_cost: float = 0.0, render_mode: str | None = None):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            if render_mode != "rgb_array":
                gym.logger.warn(f"BugFix-v1 renders as text only ({self.metadata['render_modes']}); "
                                f"render_mode={render_mode!r} falls back to None")
            render_mode = None
        self.render_mode = render_mode
        self.max_turns = turn_budget(max_turns)
        self.bugs = _bug_counts(bugs)
        self.tasks = _resolve_tasks(split, tasks, self.bugs)
        self.split = split if tasks is None else "custom"
        self.call_cost = nonnegative("call_cost", call_cost)
        self.invalid_cost = nonnegative("invalid_cost", invalid_cost)
        self.action_space = BufferedText(MAX_ACTION_CHARS, min_length=0, charset=CHARSET)
        self.observation_space = BufferedText(MAX_OBS_CHARS, min_length=0, charset=CHARSET)
        self._names, self._by_name = _task_names(self.tasks)
        self._by_problem: dict[str, list[int]] = {}
        for i, task in enumerate(self.tasks):
            self._by_problem.setdefault(task.problem, []).append(i)
        self._problems = sorted(self._by_problem)
        self.tools: dict[str, Tool] = {"read": self._read, "test": self._test, "locate": self._locate,
                                       "edit": self._change, "patch": self._change, "insert": self._change,
                                       "delete": self._change, "revert": self._revert, "submit": self._submit}
        """The table of tools ``step`` dispatches to: a call kind -> its handler."""
        self.task: RepairTask | None = None
        self.source = ""
        self.transcript: list[tuple[int, str]] = []
        self._done = True

    # ------------------------------------------------------------------ gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.task, self.task_name = self._choose_task(options)
        self.source = self.task.source
        self.turn, self.n_invalid = 0, 0
        self.actions: list[str] = []
        self.valid, self.submitted, self.hidden_pass = True, False, False
        self.stop: str | None = None
        self._done = False
        obs = prompt_v1(self.task)
        self.transcript = [(OWNER_PROMPT, obs)]
        if self.render_mode == "human":
            self.render()
        return obs, self._info()

    def step(self, action: str):
        self._check_step(action)
        self.turn += 1
        kept = action[:MAX_KEPT_ACTION_CHARS]
        self.actions.append(kept)
        reward = 0.0 - self.call_cost
        try:
            call = parse_call_v1(action)
            obs, tool_reward = self.tools[call.kind](call)
            self.valid = True
            reward += tool_reward
        except (CallError, EditError) as exc:
            self.valid = False
            self.n_invalid += 1
            reward -= self.invalid_cost
            obs = "invalid call : " + printable(str(exc).split("\n")[0], MAX_TOOL_CHARS - 15)
        terminated = self.stop == "submit"
        truncated = not terminated and self.turn >= self.max_turns
        if truncated:
            self.stop = "budget"
        self._done = terminated or truncated
        obs = printable(cap(obs), MAX_OBS_CHARS)
        self.transcript += [(OWNER_POLICY, kept), (OWNER_TOOL, obs)]
        if self.render_mode == "human":
            self.render()
        return obs, float(reward), bool(terminated), bool(truncated), self._info()

    def _check_step(self, action: Any) -> None:
        if not isinstance(action, str):
            raise TypeError(f"BugFix-v1 actions are call strings such as 'read' or 'edit 4.1 op <=', got "
                            f"{type(action).__name__}")
        if self.task is None:
            raise RuntimeError("call reset() before step()")
        if self._done:
            raise RuntimeError("the episode has ended; call reset() before step()")

    def render(self):
        text = self.render_text()
        if self.render_mode == "human":
            print(text, end="\n\n")
            return None
        return text

    def render_text(self) -> str:
        if self.task is None:
            raise RuntimeError("call reset() before render()")
        lines = [f"[turn {self.turn}/{self.max_turns}]"]
        for owner, text in self.transcript:
            lines.append(f">>> {_echo(text, 80)[1:-1]}" if owner == OWNER_POLICY else text.rstrip("\n"))
        if self.stop:
            lines.append(f"[episode over: {self.stop}]")
        return "\n".join(lines)

    # ------------------------------------------------------------------ the tools
    def _read(self, call: ParsedCall) -> tuple[str, float]:
        """``read [L]``: the numbered source (from line ``L``) and its names table."""
        return read_text(self.source, 1 if call.line is None else call.line), 0.0

    def _visible(self, coverage: bool = False) -> RepairReport:
        assert self.task is not None
        return run_repair_tests(self.task.entry, self.task.support, self.task.visible, self.source,
                                coverage=coverage)

    def _test(self, call: ParsedCall) -> tuple[str, float]:
        """``test``: the visible tests passed, and the first failure (input, expected, actual)."""
        report = self._visible()
        obs = f"visible tests : {report.passed} / {report.total} passed"
        if report.first_failure:
            obs += f" . first failure : {report.first_failure}"
        return obs, 0.0

    def _locate(self, call: ParsedCall) -> tuple[str, float]:
        """``locate``: Ochiai over the visible tests' line coverage, the top lines with their scores and sites."""
        report = self._visible(coverage=True)
        coverage = report.coverage or tuple(frozenset() for _ in report.per_case)
        return locate_text(report.per_case, coverage, report.first_failure, source=self.source), 0.0

    def _change(self, call: ParsedCall) -> tuple[str, float]:
        """``edit`` / ``patch`` / ``insert`` / ``delete``: the new source, or EditError (nothing changes)."""
        new = apply_call(self.source, call)
        obs = describe_lines(self.source, new)
        self.source = new
        return obs, 0.0

    def _revert(self, call: ParsedCall) -> tuple[str, float]:
        assert self.task is not None
        if self.source == self.task.source:
            raise CallError("nothing to revert : the source is the task's")
        self.source = self.task.source
        return "reverted to the task's source", 0.0

    def _submit(self, call: ParsedCall) -> tuple[str, float]:
        """``submit``: the hidden tests; 1.0 iff every case passes (a total of 0 passes nothing)."""
        assert self.task is not None
        report = run_repair_tests(self.task.entry, self.task.support, self.task.hidden, self.source)
        self.submitted, self.hidden_pass, self.stop = True, report.ok, "submit"
        if report.ok:
            return f"hidden tests passed : {report.passed} / {report.total}", 1.0
        return f"hidden tests failed : {report.passed} / {report.total} passed", 0.0

    # ------------------------------------------------------------------ masks and legal calls
    def legal_calls(self) -> list[str]:
        """Every legal call now, in :data:`CALL_KINDS` order: ``read``, ``test``, ``locate``, each legal sited
        edit spelled out, ``delete L`` per deletable line, ``revert`` when the source changed, ``submit``.
        ``patch`` and ``insert`` take free text and are not listed."""
        self._require_task()
        calls = ["read", "test", "locate", *source_calls(self.source)]
        if self.source != self.task.source:  # type: ignore[union-attr]
            calls.append("revert")
        return calls + ["submit"]

    def call_mask(self) -> np.ndarray:
        """bool[9] over :data:`CALL_KINDS`: which kinds have a legal call now (``patch`` and ``insert`` always:
        some text applies)."""
        mask = np.ones(len(CALL_KINDS), dtype=bool)
        if self.task is None:
            return mask
        mask[CALL_INDEX["edit"]] = bool(self._legal())
        mask[CALL_INDEX["delete"]] = bool(deletable_lines(self.source))
        mask[CALL_INDEX["revert"]] = self.source != self.task.source
        return mask

    def edit_mask(self, line: int | None = None, expr: int | None = None, mutation: str | None = None) -> np.ndarray:
        """The mask of the next head of a sited edit, given the choices so far.

        * no choice: bool[MAX_LINES], entry ``i`` for line ``i + 1``: lines with a legal edit;
        * ``line``: bool[MAX_EXPRS]: the sites ``K`` of that line with a legal edit;
        * ``line, expr``: bool[len(MUTATIONS)]: the mutations legal there;
        * ``line, expr, mutation``: bool[len(ARGS)]: its legal arguments (all False when it takes none: the
          call ends after the mutation).

        :raises ValueError: a choice out of its head's range, or given without the ones before it
        """
        self._require_task()
        legal = self._legal()
        if line is None:
            if expr is not None or mutation is not None:
                raise ValueError("edit_mask: choose line before expr and mutation")
            mask = np.zeros(MAX_LINES, dtype=bool)
            for (l_, _) in legal:
                mask[l_ - 1] = True
            return mask
        _in_range("line", line, 1, MAX_LINES)
        if expr is None:
            if mutation is not None:
                raise ValueError("edit_mask: choose expr before mutation")
            mask = np.zeros(MAX_EXPRS, dtype=bool)
            for (l_, k) in legal:
                if l_ == line:
                    mask[k] = True
            return mask
        _in_range("expr", expr, 0, MAX_EXPRS - 1)
        at = legal.get((line, expr), {})
        if mutation is None:
            return np.array([m in at for m in MUTATIONS], dtype=bool)
        if mutation not in MUTATIONS:
            raise ValueError(f"edit_mask: unknown mutation {mutation!r:.30}; one of {' '.join(MUTATIONS)}")
        args = set(at.get(mutation, ()))
        return np.array([a in args for a in ARGS], dtype=bool)

    def _legal(self):
        try:
            return legal_edits(self.source)
        except EditError:
            return {}

    def _require_task(self) -> None:
        if self.task is None:
            raise RuntimeError("call reset() first")

    def _choose_task(self, options: dict[str, Any] | None) -> tuple[RepairTask, str]:
        """``reset(options=...)``'s task and its name: ``options["task"]`` when given, else a draw."""
        options = {} if options is None else options
        if not isinstance(options, dict):
            raise TypeError(f"reset options must be a dict such as {{'task': NAME}} or None, got "
                            f"{type(options).__name__}")
        unknown = sorted(map(repr, set(options) - {"task"}))
        if unknown:
            raise ValueError(f"unknown reset option {', '.join(unknown)}; the only option is 'task'")
        chosen = options.get("task")
        if isinstance(chosen, RepairTask):
            return chosen, chosen.name
        if chosen is None:
            problem = self._problems[int(self.np_random.integers(len(self._problems)))]
            indices = self._by_problem[problem]
            index = indices[int(self.np_random.integers(len(indices)))]
        elif isinstance(chosen, str):
            if chosen not in self._by_name:
                raise ValueError(f"options['task'] = {chosen!r:.60} is not a task of this env (split "
                                 f"{self.split!r}); use a name from info['task'] or env.unwrapped.tasks")
            index = self._by_name[chosen]
        elif isinstance(chosen, (int, np.integer)) and not isinstance(chosen, bool):
            if not 0 <= chosen < len(self.tasks):
                raise ValueError(f"options['task'] = {chosen} is out of range: this env has {len(self.tasks)} tasks")
            index = int(chosen)
        else:
            raise TypeError(f"options['task'] must be a task name, an index into env.tasks or a RepairTask, got "
                            f"{type(chosen).__name__}")
        return self.tasks[index], self._names[index]

    def _info(self) -> dict[str, Any]:
        assert self.task is not None
        return {"task": self.task_name, "turn": self.turn, "actions": list(self.actions),
                "n_invalid": self.n_invalid, "valid": self.valid, "submitted": self.submitted,
                "hidden_pass": self.hidden_pass, "stop": self.stop, "call_mask": self.call_mask(),
                "line_mask": self.edit_mask()}


# ---------------------------------------------------------------------- text
def cap(text: str, limit: int = MAX_TOOL_CHARS) -> str:
    """``text`` at most ``limit`` characters; a longer one is cut and ends by saying so."""
    if len(text) <= limit:
        return text
    note = f" ... (cut : {len(text)} characters, {limit} shown)"
    return text[: limit - len(note)] + note


def read_text(source: str, start: int = 1, limit: int = MAX_TOOL_CHARS) -> str:
    """What ``read`` shows: the names table, then the source's lines from ``start`` numbered ``  3| code``, as
    many as fit in ``limit`` characters; when lines are left out it ends saying which call shows them."""
    lines = source.splitlines()
    if not 1 <= start <= len(lines):
        raise CallError(f"line {start} is not in the source : read takes a line from 1 to {len(lines)}")
    table = names_table(source)
    head = cap(f"names : {names_line(table)}", limit // 3) + "\n" if table else ""
    out: list[str] = []
    used = len(head)
    for number in range(start, len(lines) + 1):
        row = f"{number:3d}| {lines[number - 1]}"
        reserve = 0 if number == len(lines) else len(_more(number + 1, len(lines))) + 1
        if used + len(row) + reserve > limit:
            if out:
                out.append(_more(number, len(lines)))
                break
            row = cap(row, limit - used - reserve)  # one huge line: cut it, then say where the rest starts
        out.append(row)
        used += len(row) + 1
    return head + "\n".join(out)


def _more(number: int, last: int) -> str:
    return f"... (cut : lines {number}-{last} not shown, read {number} shows them)"


def describe_lines(before: str, after: str) -> str:
    """What an edit changed: ``no change``, or the changed lines of the new source, numbered."""
    if before == after:
        return "no change"
    old, new = before.splitlines(), after.splitlines()
    start = 0
    while start < min(len(old), len(new)) and old[start] == new[start]:
        start += 1
    end = 0
    while end < min(len(old), len(new)) - start and old[-1 - end] == new[-1 - end]:
        end += 1
    changed = [f"{i + 1:3d}| {new[i]}" for i in range(start, len(new) - end)]
    removed = len(old) - start - end
    if not changed:
        return f"deleted line {start + 1} ({removed} line{'s' if removed > 1 else ''} fewer)"
    return "changed :\n" + "\n".join(changed)


def prompt_v1(task: RepairTask) -> str:
    """The reset prompt: the function's name, its statement, the call menu."""
    text = f"fix the function {task.entry} : {task.statement} . calls : {MENU}"
    return printable(text, MAX_OBS_CHARS)


@lru_cache(maxsize=1024)
def source_calls(source: str) -> tuple[str, ...]:
    """The legal calls that depend on the source only, cached by its text: each sited edit, then ``delete L`` for
    each deletable line (none for a source that does not parse)."""
    try:
        legal = legal_edits(source)
    except EditError:
        return ()
    edits = [f"edit {line}.{k} {mutation}" + ("" if arg is None else f" {arg}")
             for (line, k), muts in legal.items() for mutation, args in muts.items() for arg in args]
    return (*edits, *(f"delete {line}" for line in deletable_lines(source)))


@lru_cache(maxsize=4096)
def deletable_lines(source: str) -> tuple[int, ...]:
    """:func:`bugfix_gym.edits.patches.deletable_lines`, cached by source text (the masks ask every step)."""
    return _deletable_lines(source)


@lru_cache(maxsize=16384)
def apply_call(source: str, call: ParsedCall) -> str:
    """The source after an ``edit`` / ``patch`` / ``insert`` / ``delete`` call (cached by source and call, as v0's
    edit ops are).

    :raises EditError: the call does not apply (a one-line message)
    """
    if call.kind == "edit":
        assert call.edit is not None
        return apply_edit(source, call.edit)
    assert call.line is not None
    if call.kind == "delete":
        return delete_line(source, call.line)
    change = patch_line if call.kind == "patch" else insert_line
    return change(source, call.line, call.code or "")


# ---------------------------------------------------------------------- arguments
def _bug_counts(bugs: Any) -> tuple[int, ...]:
    counts = (bugs,) if not isinstance(bugs, (tuple, list)) else tuple(bugs)
    if not counts or any(isinstance(b, bool) or b not in (1, 2) for b in counts):
        raise ValueError(f"bugs must be 1, 2 or (1, 2), got {bugs!r:.40}")
    return tuple(sorted(set(counts)))


def _in_range(name: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not low <= int(value) <= high:
        raise ValueError(f"edit_mask: {name} must be an int from {low} to {high}, got {value!r:.30}")


def _problem_tasks(problem: Problem, bugs: tuple[int, ...]) -> list[RepairTask]:
    """A problem's valid mutants as tasks: HumanEval's stored ones, any other's injected and validated now."""
    if problem.origin == "humaneval":
        return [t for b in bugs for t in stored_tasks([problem], b)]
    return [mutant_task(problem, m) for b in bugs for m in mutants(problem, seed=0, bugs=b)]


def _resolve_tasks(split: str, tasks: Sequence[Any] | None, bugs: tuple[int, ...]) -> list[RepairTask]:
    if tasks is None:
        if split not in SPLITS_V1:
            raise ValueError(f"split must be one of {', '.join(map(repr, SPLITS_V1))}, got {split!r:.40}")
        problems = humaneval_problems(split)
        return [t for b in bugs for t in stored_tasks(problems, b)]
    if isinstance(tasks, (str, RepairTask, Problem)):
        raise TypeError(f"tasks= takes a list of RepairTask / Problem objects, got a {type(tasks).__name__}")
    out: list[RepairTask] = []
    for k, task in enumerate(tasks):
        if isinstance(task, RepairTask):
            out.append(task)
        elif isinstance(task, Problem):
            out += _problem_tasks(task, bugs)
        else:
            raise TypeError(f"tasks[{k}] is a {type(task).__name__}, not a RepairTask or Problem; build tasks with "
                            "load_task_pack or bugfix_gym.tasks.mutants.stored_tasks")
    if not out:
        raise ValueError("BugFix-v1 needs at least one task (the Problems given have no valid mutant)")
    return out


def _task_names(tasks: Sequence[RepairTask]) -> tuple[list[str], dict[str, int]]:
    """Each task's name in the env (``problem:name`` where a name is shared) and the lookup by name; both forms
    are accepted by ``reset``."""
    counts: dict[str, int] = {}
    for task in tasks:
        counts[task.name] = counts.get(task.name, 0) + 1
    names = [t.name if counts[t.name] == 1 else f"{t.problem}:{t.name}" for t in tasks]
    lookup: dict[str, int] = {}
    for i, (task, name) in enumerate(zip(tasks, names)):
        lookup.setdefault(name, i)
        lookup.setdefault(f"{task.problem}:{task.name}", i)
    return names, lookup
