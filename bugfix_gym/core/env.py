"""BugFixEnv: repair one small buggy Python function with text tool calls."""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np

from . import tools
from ..tasks.generator import AMBIGUOUS, GENERATED_SPLITS, draw_task
from ..edits.ops import FIX_OPS, apply_op, describe_change
from ..execution.runner import run_tests
from .saved_state import check_episode
from ..contract.spaces import BufferedText
from ..tasks.library import Task, get_task, make_tasks, task_to_data
from ..contract.text import printable
from ..contract.tokens import OWNER_PAD, OWNER_POLICY, OWNER_PROMPT, OWNER_TOOL  # noqa: F401 (env.OWNER_* still works)
from .tools import CHARSET, HIDEABLE, MAX_ACTION_CHARS  # noqa: F401 (bugfix_gym.core.env.HIDEABLE still works)

MAX_OBS_CHARS = 4096
MAX_KEPT_ACTION_CHARS = 256  # info["actions"] and the transcript keep at most this much of one action
WRAPPER_OPTIONS = {"statement_dropout": "StatementDropout", "inert_lines": "InertLines",
                   "hide_outputs": "HideOutputs", "tool_latency_s": "ToolLatency"}
"""``gym.make("BugFix-v0")`` options that are wrappers (:mod:`bugfix_gym.views.text_wrappers`), not env arguments."""

Tool = Callable[[str | None], tuple[str, float]]
"""A tool's handler: the call's argument (the op of an ``edit``, else None) -> (the tool's output, its part of
the step's reward)."""


class BugFixEnv(gym.Env):
    """Repair a small buggy Python function by calling tools, then submit it to hidden tests.

    ## Description
    Each episode is one task: a function with exactly one injected defect (wrong comparison,
    missing zero guard, ``min``/``max`` swapped, off-by-one range end, wrong initial value).
    The agent writes one tool call per step. ``read`` shows the current source, ``test``
    runs the visible tests, ``edit <fix_op>`` applies one of five deterministic source
    transformations, ``revert`` restores the original, ``submit`` runs the hidden tests and
    ends the episode. This is the environment of the book's chapters 4-8.

    ## Action Space
    ``BufferedText(max_length=64, min_length=0, charset=string.printable)`` (a gymnasium ``Text``
    with ``shape == ()`` and object dtype, see :mod:`bugfix_gym.contract.spaces`): the call as text, one of
    the nine legal calls in ``bugfix_gym.CALLS``. A call is valid only if it lies inside the
    action space and parses; any other string (longer than 64 characters, a character outside
    the charset such as a unicode space, or text that does not parse) is an *invalid call*: it
    costs the turn, the observation says why and ``info["n_invalid"]`` counts it. The length is
    checked before anything else, so a huge action costs no more than a short one. A
    non-string action raises ``TypeError``; use ``bugfix_gym.views.wrappers.DiscreteCalls`` for
    integer actions.

    ## Observation Space
    ``BufferedText(max_length=4096, min_length=0, charset=string.printable)``, so SB3's vector
    envs, ``evaluate_policy`` and ``EvalCallback`` hold it as a string per env. After ``reset``: the
    prompt (function name, statement, call menu). After each step: that call's tool output.
    Every observation lies inside the space: it is cut at 4096 characters (a prompt keeps its
    call menu, cutting the statement), a CR LF line end becomes a newline and every character
    other than printable ASCII, newline and tab becomes ``?``, so no escape sequence from a
    task reaches the agent or a terminal.
    ``env.unwrapped.transcript`` holds the episode as ``(owner, text)`` segments (prompt 1,
    policy 2, tool 3); :class:`bugfix_gym.views.wrappers.TokenObservation` turns it into arrays.

    ## Rewards
    ``1.0`` on the ``submit`` step if every hidden test passes, else ``0.0``. Optional:
    ``call_cost`` is subtracted on every step, ``edit_penalty`` on every ``edit`` step,
    ``no_change_cost`` on every ``edit`` that answered ``no change`` and ``invalid_cost`` on every
    invalid call, always on the step the agent took.

    ## Starting State
    A task drawn uniformly from ``env.tasks`` with ``self.np_random``; with ``generated`` set,
    a freshly generated task (see Arguments). ``reset(options={"task": ...})`` plays a given
    task instead: a name, an index into ``env.tasks`` or a :class:`Task`.

    ## Episode End
    Terminated on ``submit``. Truncated when the turn budget (6) runs out (``info["stop"]
    == "budget"``, reward 0); the budget is part of the task and the turn count is visible to
    an agent that keeps its history.

    ## Info
    ``task``, ``turn`` (= ``n_turns``), ``actions`` (calls so far, as written), ``ops`` (edit
    ops applied), ``n_invalid``, ``valid`` (this call), ``submitted``, ``hidden_pass``,
    ``stop`` (``"submit"``, ``"budget"`` or ``None``), ``call_mask`` (bool[9]: which calls
    are legal now; ``revert`` is legal only after the source changed), ``useful_calls``
    (bool[9]: ``call_mask`` without the calls this episode has already shown to be useless:
    an edit that answered "no change" on the current source, an edit whose result failed a
    visible test, and ``submit`` of a source that failed a visible test (visible tests are
    hidden tests too); only test reports the agent saw count, and the env does not enforce it).

    ## Arguments
    ``BugFixEnv(split="train", tasks=None, max_turns=6, call_cost=0.0, edit_penalty=0.0,
    render_mode=None, generated=None, invalid_cost=0.0, ambiguous_share=0.0, no_change_cost=0.0)``.
    ``gym.make("BugFix-v0", ...)`` takes these and four more, ``statement_dropout=0.0``,
    ``inert_lines=0.0``, ``hide_outputs=()`` and ``tool_latency_s=0.0``, which apply the wrappers of
    :mod:`bugfix_gym.views.text_wrappers` (:class:`~bugfix_gym.views.text_wrappers.StatementDropout`,
    :class:`~bugfix_gym.views.text_wrappers.InertLines`, :class:`~bugfix_gym.views.text_wrappers.HideOutputs`,
    :class:`~bugfix_gym.views.text_wrappers.ToolLatency`): the env does the dynamics, they do the rest.

    :param split: the book's task set, ``"train"``, ``"heldout"`` or ``"all"``
    :param tasks: a fixed list of :class:`Task` (e.g. from ``generate_tasks`` or
        ``load_task_pack``); overrides ``split``; anything else in it is a ``TypeError`` here, not at
        ``reset``
    :param max_turns: the turn budget, an int >= 1
    :param call_cost: subtracted from the reward of every step (a finite number >= 0)
    :param edit_penalty: subtracted from the reward of every ``edit`` step (finite, >= 0)
    :param no_change_cost: subtracted from the reward of every ``edit`` whose op does not apply to
        the current source (the tool answers ``no change``; finite, >= 0), so trying ops blindly is
        no longer free: what the agent read tells it which ops apply
    :param render_mode: ``"ansi"`` returns the transcript as text, ``"human"`` prints it;
        ``"rgb_array"`` (what SB3's ``make_vec_env`` asks every env for) falls back to ``None``
        silently, and any other mode the env does not have warns and falls back to ``None``
    :param generated: a generator split (``"train"``, ``"heldout"`` or ``"test"``): every
        ``reset`` draws a fresh task from that split's templates (new identifiers and inputs,
        a defect kind drawn uniformly) with ``self.np_random`` only, so ``reset(seed=s)``
        gives the same task again. There is no fixed pool: ``env.tasks`` is empty, ``env.task``
        is the current task, and an index in ``options["task"]`` is refused (a name or a
        :class:`Task` still works). The most recent generated tasks stay registered by name,
        a bounded number (``bugfix_gym.tasks.generator.RECENT_LIMIT``), so the scripted oracle
        finds the task of a running episode in the same process. Not with ``tasks``.
    :param ambiguous_share: with ``generated="train"``: the share of episodes (in [0, 1]) drawn
        only from the train templates whose code carries two plausible defects
        (``bugfix_gym.tasks.generator.AMBIGUOUS``), where reading narrows the choice and a test decides it
    :param invalid_cost: subtracted from the reward of every invalid call (finite, >= 0),
        so an invalid call is no longer a free "not yet"
    :param wrapper_options: none is taken; naming one of the four wrapper options above is a
        ``TypeError`` that names its wrapper

    ## Version History
    * v0: initial release; ``statement_dropout``, ``inert_lines``, ``hide_outputs`` and ``tool_latency_s``
      moved from the env's arguments to wrappers applied by ``gym.make`` (same episodes).
    """

    metadata = {"render_modes": ["ansi", "human"], "render_fps": 4,
                # the defaults of the agents trained on it, as entry points (names: bugfix_gym imports no agent)
                "agent_defaults": {"tokenizer": "bugfix_gym.core.vocabulary:build_tokenizer",
                                   "base_agent": "agents.bugfix.recipes:default_base_agent",
                                   "episode_summary": "bugfix_gym.core.episode_stats:episode_stats",
                                   # the summary's keys an agent logs (as rollout/<key>), beside the return and turns
                                   "logged_stats": ("pass_rate", "valid_calls", "submit_rate", "read_rate",
                                                    "test_rate", "edits_per_episode"),
                                   # foresight's words: the calls whose op it chooses, and the first words
                                   # of a tool answer that mean the op changed nothing
                                   "foresight": {"op_prefix": "edit", "no_change": ("no",)}}}

    def __init__(self, split: str = "train", tasks: Sequence[Task] | None = None, max_turns: int = 6,
                 call_cost: float = 0.0, edit_penalty: float = 0.0, render_mode: str | None = None,
                 generated: str | None = None, invalid_cost: float = 0.0, ambiguous_share: float = 0.0,
                 no_change_cost: float = 0.0, **wrapper_options: Any):
        _no_wrapper_options(wrapper_options)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            # gymnasium only warns here too; SB3's make_vec_env asks for "rgb_array" whatever the user wants,
            # so that one is not worth a warning in every make_vec_env snippet
            if render_mode != "rgb_array":
                gym.logger.warn(f"BugFix-v0 renders as text only ({self.metadata['render_modes']}); "
                                f"render_mode={render_mode!r} falls back to None")
            render_mode = None
        self.max_turns = turn_budget(max_turns)
        if isinstance(tasks, (str, Task)):
            raise TypeError(f"tasks= takes a list of Task objects, got a {type(tasks).__name__}; "
                            "use split= for a split")
        tasks = list(tasks) if tasks is not None else None
        for k, task in enumerate(tasks or ()):
            if not isinstance(task, Task):
                raise TypeError(f"tasks[{k}] is a {type(task).__name__}, not a bugfix_gym.Task; build tasks with "
                                "make_tasks, generate_tasks or load_task_pack")
        self.tasks: list[Task] = tasks if tasks is not None else make_tasks(split)
        if not self.tasks:
            raise ValueError("BugFixEnv needs at least one task")
        self.split = split if tasks is None else "custom"
        self.generated = _generator_split(generated, tasks)
        if self.generated:  # no fixed pool: every reset draws a new task
            self.tasks, self.split = [], "generated"
        self.ambiguous_share = _ambiguous_share(ambiguous_share, self.generated)
        self.call_cost = nonnegative("call_cost", call_cost)
        self.edit_penalty = nonnegative("edit_penalty", edit_penalty)
        self.invalid_cost = nonnegative("invalid_cost", invalid_cost)
        self.no_change_cost = nonnegative("no_change_cost", no_change_cost)
        self.render_mode = render_mode
        self.action_space = BufferedText(MAX_ACTION_CHARS, min_length=0, charset=CHARSET)
        self.observation_space = BufferedText(MAX_OBS_CHARS, min_length=0, charset=CHARSET)
        self.tools: dict[str, Tool] = {"read": self._read, "test": self._test, "edit": self._edit,
                                       "revert": self._revert, "submit": self._submit}
        """The table of tools ``step`` dispatches to: a call's name -> its handler."""
        self.task: Task | None = None
        self.source = ""
        self.transcript: list[tuple[int, str]] = []
        self._edits: dict[tuple[str, str], str] = {}  # (source, op) -> the source that edit made from it
        self._failed: set[str] = set()  # sources whose visible test report (shown, not hidden) had a failure
        self._done = True

    # ------------------------------------------------------------------ gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.task = self._choose_task(options)
        self.source = self.task.source
        self.turn = 0
        self.actions: list[str] = []
        self.ops: list[str] = []
        self.n_invalid = 0
        self.valid = True
        self.submitted = False
        self.hidden_pass = False
        self.stop: str | None = None
        self._done = False
        self._edits = {}
        self._failed = set()
        obs = prompt_observation(self.task, self.task.statement)
        self.transcript = [(OWNER_PROMPT, obs)]
        if self.render_mode == "human":
            self.render()
        return obs, self._info()

    def step(self, action: str):
        self._check_step(action)
        self.turn += 1
        kept = action[:MAX_KEPT_ACTION_CHARS]
        self.actions.append(kept)
        reward = 0.0 - self.call_cost  # not -0.0 when there is no cost
        call, why = self._legal_call(action)
        self.valid = call is not None
        if call is None:
            self.n_invalid += 1
            obs = why
            reward -= self.invalid_cost
        else:
            obs, tool_reward = self.tools[call[0]](call[1])
            reward += tool_reward
        terminated = self.stop == "submit"
        truncated = not terminated and self.turn >= self.max_turns
        if truncated:
            self.stop = "budget"
        self._done = terminated or truncated
        obs = _printable(obs)
        self.transcript += [(OWNER_POLICY, kept), (OWNER_TOOL, obs)]
        if self.render_mode == "human":
            self.render()
        return obs, float(reward), bool(terminated), bool(truncated), self._info()

    def _check_step(self, action: Any) -> None:
        """One clear error for a step the env cannot take: a non-string action, or no episode running."""
        if not isinstance(action, str):
            raise TypeError(f"BugFix-v0 actions are call strings such as 'read' or 'edit fix_init', got "
                            f"{type(action).__name__}; wrap the env in bugfix_gym.views.wrappers.DiscreteCalls "
                            "for integer actions")
        if self.task is None:
            raise RuntimeError("call reset() before step()")
        if self._done:
            raise RuntimeError("the episode has ended; call reset() before step()")

    def _legal_call(self, action: str) -> tuple[tuple[str, str | None] | None, str]:
        """``(call, "")`` for a legal call, ``(None, why)`` for an invalid one (``revert`` is legal only
        after the source changed)."""
        assert self.task is not None
        call = tools.parse_call(action)
        if call is None:
            return None, tools.why_invalid(action)
        if call[0] == "revert" and self.source == self.task.source:
            return None, "invalid call : nothing to revert"
        return call, ""

    # ------------------------------------------------------------------ the tools
    def _read(self, arg: str | None) -> tuple[str, float]:
        """``read``: the current source."""
        return self.source, 0.0

    def _test(self, arg: str | None) -> tuple[str, float]:
        """``test``: the visible tests' report; a source with a failure is remembered (useful_calls)."""
        assert self.task is not None
        report = run_tests(self.task, self.source, "visible")
        obs = f"visible tests : {report.passed} / {report.total} passed"
        if report.first_failure:
            obs += f" . first failure : {report.first_failure}"
        if report.passed < report.total:
            self._failed.add(self.source)
        return obs, 0.0

    def _edit(self, op: str | None) -> tuple[str, float]:
        """``edit <op>``: apply the op; costs ``edit_penalty``, plus ``no_change_cost`` if nothing changed."""
        new = apply_op(self.source, str(op))
        obs = describe_change(self.source, new)
        self._edits[(self.source, str(op))] = new
        cost = self.edit_penalty + (self.no_change_cost if new == self.source else 0.0)
        self.source = new
        self.ops.append(str(op))
        return obs, -cost

    def _revert(self, arg: str | None) -> tuple[str, float]:
        """``revert``: back to the task's original source."""
        assert self.task is not None
        self.source = self.task.source
        return "reverted to the original source", 0.0

    def _submit(self, arg: str | None) -> tuple[str, float]:
        """``submit``: run the hidden tests and end the episode; 1.0 if every one passes."""
        assert self.task is not None
        report = run_tests(self.task, self.source, "hidden")
        self.submitted, self.hidden_pass = True, report.ok
        self.stop = "submit"
        if report.ok:
            return "hidden tests passed", 1.0
        return f"hidden tests failed : {report.passed} / {report.total}", 0.0

    def render(self):
        text = self.render_text()
        if self.render_mode == "human":
            print(text, end="\n\n")
            return None
        return text

    # ------------------------------------------------------------------ checkpointing
    def get_state(self) -> dict[str, Any]:
        """The env's state as plain (JSON-able) data: the episode in progress and the random
        generator, so a training run can stop between two steps and resume with the same results."""
        episode = None
        if self.task is not None:
            episode = dict(task=task_to_data(self.task), source=self.source, turn=self.turn, actions=list(self.actions),
                           ops=list(self.ops), n_invalid=self.n_invalid, valid=self.valid, submitted=self.submitted,
                           hidden_pass=self.hidden_pass, stop=self.stop, done=self._done,
                           transcript=[list(seg) for seg in self.transcript],
                           edits=[[src, op, new] for (src, op), new in self._edits.items()],
                           failed=sorted(self._failed))
        return {"episode": episode, "np_random": self.np_random.bit_generator.state}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`get_state` returned, read as data (:mod:`bugfix_gym.core.saved_state`): a task
        not registered here comes back sandboxed, a source its actions do not make is refused, the
        transcript is made printable; anything damaged is one ``ValueError`` line."""
        if type(state) is not dict or set(state) != {"episode", "np_random"}:
            raise ValueError("a saved env state is an object with 'episode' and 'np_random'; the state is damaged")
        generator = np.random.Generator(np.random.PCG64())
        try:
            generator.bit_generator.state = state["np_random"]
        except (TypeError, ValueError, KeyError, OverflowError):
            raise ValueError("the saved random generator state is damaged; start a new run") from None
        episode = state["episode"]
        task = None if episode is None else check_episode(episode)
        self._np_random = generator
        if episode is None or task is None:
            self.task, self.source, self.transcript, self._done = None, "", [], True
            return
        self.task = task
        self.source, self.turn = episode["source"], episode["turn"]
        self.actions, self.ops = list(episode["actions"]), list(episode["ops"])
        self.n_invalid, self.valid = episode["n_invalid"], episode["valid"]
        self.submitted, self.hidden_pass = episode["submitted"], episode["hidden_pass"]
        self.stop = episode.get("stop") if episode.get("stop") in (None, "submit", "budget") else None
        self._done = episode["done"]
        self.transcript = [(owner, printable(text)) for owner, text in episode["transcript"]]
        self._edits = {(src, op): new for src, op, new in episode.get("edits", [])}
        self._failed = set(map(str, episode.get("failed", [])))

    # ------------------------------------------------------------------ helpers
    def call_mask(self) -> np.ndarray:
        """bool[9] over ``CALLS``: which calls are legal now (``revert`` only after a change)."""
        mask = np.ones(len(tools.CALLS), dtype=bool)
        if self.task is None or self.source == self.task.source:
            mask[tools.REVERT] = False
        return mask

    def useful_calls(self) -> np.ndarray:
        """bool[9] over ``CALLS``: :meth:`call_mask` without the calls this episode has already shown to be
        useless: an edit that answered "no change" on the current source or made a source that failed a
        visible test, and ``submit`` of a source that failed a visible test (the visible tests are among
        the hidden ones, so it cannot pass). Only what the agent was shown counts: the edit's answer, and
        a test report that was not hidden."""
        mask = self.call_mask()
        if self.source in self._failed:
            mask[tools.CALL_INDEX["submit"]] = False
        for op in FIX_OPS:
            made = self._edits.get((self.source, op))
            if made is not None and (made == self.source or made in self._failed):
                mask[tools.CALL_INDEX[f"edit {op}"]] = False
        return mask

    def render_text(self) -> str:
        if self.task is None:
            raise RuntimeError("call reset() before render()")
        lines = [f"[turn {getattr(self, 'turn', 0)}/{self.max_turns}]"]
        for owner, text in self.transcript:
            if owner == OWNER_PROMPT:
                lines.append(text)
            elif owner == OWNER_POLICY:
                lines.append(f">>> {tools._echo(text, 60)[1:-1]}")
            else:
                lines.append(text.rstrip("\n"))
        if self.stop:
            lines.append(f"[episode over: {self.stop}]")
        return "\n".join(lines)

    def _choose_task(self, options: dict[str, Any] | None) -> Task:
        """The task of ``reset(options=...)``: the one named in ``options["task"]``, else a draw."""
        if options is None:
            options = {}
        if not isinstance(options, dict):
            raise TypeError(f"reset options must be a dict such as {{'task': 'clamp'}} or None, got "
                            f"{type(options).__name__}")
        unknown = sorted(map(repr, set(options) - {"task"}))
        if unknown:
            raise ValueError(f"unknown reset option {', '.join(unknown)}; the only option is 'task'")
        chosen = options.get("task")
        if chosen is None:
            if self.generated:
                if self.ambiguous_share and self.np_random.random() < self.ambiguous_share:
                    return draw_task(self.generated, self.np_random, templates=AMBIGUOUS)
                return draw_task(self.generated, self.np_random)
            return self.tasks[int(self.np_random.integers(len(self.tasks)))]
        if isinstance(chosen, Task):
            return chosen
        if isinstance(chosen, str):
            return get_task(chosen)
        if isinstance(chosen, (int, np.integer)) and not isinstance(chosen, bool):
            if not self.tasks:
                raise ValueError(f"options['task'] = {chosen}: a generated={self.generated!r} env has no task list "
                                 "to index; pass a task name or a Task")
            if not 0 <= chosen < len(self.tasks):
                raise ValueError(f"options['task'] = {chosen} is out of range: this env has {len(self.tasks)} tasks, "
                                 f"use an index from 0 to {len(self.tasks) - 1}, a name or a Task")
            return self.tasks[int(chosen)]
        raise TypeError(f"options['task'] must be a task name, an index into env.tasks or a Task, got "
                        f"{type(chosen).__name__}")

    def _info(self) -> dict[str, Any]:
        assert self.task is not None
        return {
            "task": self.task.name,
            "turn": self.turn,
            "n_turns": self.turn,
            "actions": list(self.actions),
            "ops": list(self.ops),
            "n_invalid": self.n_invalid,
            "valid": self.valid,
            "submitted": self.submitted,
            "hidden_pass": self.hidden_pass,
            "stop": self.stop,
            "call_mask": self.call_mask(),
            "useful_calls": self.useful_calls(),
        }


def _printable(text: str) -> str:
    """An observation inside the space: cut at ``MAX_OBS_CHARS``, ``\\r\\n`` -> ``\\n``, any other
    character outside printable ASCII, ``\\n`` and ``\\t`` -> ``?`` (only the kept prefix is read)."""
    return printable(text, MAX_OBS_CHARS)


def prompt_observation(task: Task, statement: str) -> str:
    """The reset prompt showing ``statement`` (:func:`bugfix_gym.core.tools.prompt`) inside the observation space:
    a huge statement is cut, the call menu kept."""
    text = tools.prompt(task, statement)
    if len(text) > MAX_OBS_CHARS:
        menu = " . calls : " + tools.MENU  # how tools.prompt ends
        text = text[: MAX_OBS_CHARS - len(menu) - 4] + " ..." + menu
    return _printable(text)


def turn_budget(max_turns: Any) -> int:
    """``max_turns`` checked: an int >= 1 (BugFix-v0 and -v1 share it)."""
    if isinstance(max_turns, bool) or not isinstance(max_turns, numbers.Integral):
        raise TypeError(f"max_turns must be an int >= 1, got {type(max_turns).__name__} {max_turns!r:.40}")
    if max_turns < 1:
        raise ValueError(f"max_turns must be at least 1, got {max_turns}")
    return int(max_turns)


def nonnegative(name: str, value: Any) -> float:
    """A finite number >= 0 (a cost, a share, seconds), else a one-line error naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a finite number >= 0, got {type(value).__name__} {value!r:.40}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0 (e.g. 0.1), got {value!r}")
    return float(value)


def _generator_split(generated: Any, tasks: Sequence[Task] | None) -> str | None:
    if generated is None:
        return None
    if not isinstance(generated, str) or generated not in GENERATED_SPLITS:
        raise ValueError(f"generated must be one of {', '.join(map(repr, GENERATED_SPLITS))} or None, "
                         f"got {generated!r:.40}")
    if tasks is not None:
        raise ValueError("pass either tasks= (a fixed list) or generated= (a fresh task every reset), not both")
    return generated


def _ambiguous_share(share: Any, generated: str | None) -> float:
    share = nonnegative("ambiguous_share", share)
    if share > 1:
        raise ValueError(f"ambiguous_share is a share of episodes in [0, 1], got {share!r}")
    if share and generated != "train":
        raise ValueError("ambiguous_share needs generated='train' (the ambiguous templates are train templates)")
    return share


def _no_wrapper_options(options: dict[str, Any]) -> None:
    """One clear error for a ``BugFixEnv`` argument that is a wrapper now, or that does not exist."""
    for name in options:
        if name in WRAPPER_OPTIONS:
            raise TypeError(f"{name} is a wrapper, not a BugFixEnv argument: use gym.make('BugFix-v0', {name}=...) "
                            f"or wrap the env in bugfix_gym.views.text_wrappers.{WRAPPER_OPTIONS[name]}")
        raise TypeError(f"BugFixEnv.__init__() got an unexpected keyword argument {name!r}")  # as Python words it
