"""BugFixEnv: repair one small buggy Python function with text tool calls."""

from __future__ import annotations

import string
from typing import Any, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from . import tools
from .execution import run_tests
from .ops import apply_op, describe_change
from .tasks import Task, get_task, make_tasks

CHARSET = string.printable  # explicit: gymnasium's Text default is alphanumeric only
MAX_ACTION_CHARS = 64
MAX_OBS_CHARS = 4096
MAX_KEPT_ACTION_CHARS = 256  # info["actions"] and the transcript keep at most this much of one action
OWNER_PAD, OWNER_PROMPT, OWNER_POLICY, OWNER_TOOL = 0, 1, 2, 3
BLANK_OUTPUT = "hidden"  # what read and test answer under blank_tools=True (a vocabulary word)


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
    ``Text(max_length=64, min_length=0, charset=string.printable)``: the call as text, one of
    the nine legal calls in ``bugfix_gym.CALLS``. Any other string (including longer ones or
    unicode) is an *invalid call*: it costs the turn, the observation says why and
    ``info["n_invalid"]`` counts it. A non-string action raises ``TypeError``; use
    ``bugfix_gym.wrappers.DiscreteCalls`` for integer actions.

    ## Observation Space
    ``Text(max_length=4096, min_length=0, charset=string.printable)``. After ``reset``: the
    prompt (function name, statement, call menu). After each step: that call's tool output.
    ``env.unwrapped.transcript`` holds the episode as ``(owner, text)`` segments (prompt 1,
    policy 2, tool 3); :class:`bugfix_gym.wrappers.TokenObservation` turns it into arrays.

    ## Rewards
    ``1.0`` on the ``submit`` step if every hidden test passes, else ``0.0``. Optional:
    ``call_cost`` is subtracted on every step, ``edit_penalty`` on every ``edit`` step,
    ``invalid_cost`` on every invalid call.

    ## Starting State
    A task drawn uniformly from the split with ``self.np_random``, or the one given by
    ``reset(options={"task": name_or_Task})``.

    ## Episode End
    Terminated on ``submit``. Truncated when the turn budget (6) runs out (``info["stop"]
    == "budget"``, reward 0); the budget is part of the task and the turn count is visible to
    an agent that keeps its history.

    ## Info
    ``task``, ``turn`` (= ``n_turns``), ``actions`` (calls so far, as written), ``ops`` (edit
    ops applied), ``n_invalid``, ``valid`` (this call), ``submitted``, ``hidden_pass``,
    ``stop`` (``"submit"``, ``"budget"`` or ``None``), ``call_mask`` (bool[9]: which calls
    are legal now; ``revert`` is legal only after the source changed).

    ## Arguments
    ``gym.make("BugFix-v0", split="train", tasks=None, max_turns=6, call_cost=0.0,
    edit_penalty=0.0, invalid_cost=0.0, blank_tools=False, render_mode=None)``. ``blank_tools``
    (an ablation) answers ``read`` and ``test`` with ``hidden`` instead of the source and
    the test report; everything else is unchanged. ``split`` is ``"train"``, ``"heldout"`` or
    ``"all"``; ``tasks`` (a list of :class:`Task`, e.g. from ``generate_tasks`` or
    ``load_task_pack``) overrides it. ``render_mode="ansi"`` returns the transcript as text.

    ## Version History
    * v0: initial release.
    """

    metadata = {"render_modes": ["ansi", "human"], "render_fps": 4}

    def __init__(self, split: str = "train", tasks: Sequence[Task] | None = None, max_turns: int = 6,
                 call_cost: float = 0.0, edit_penalty: float = 0.0, render_mode: str | None = None,
                 invalid_cost: float = 0.0, blank_tools: bool = False):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}")
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        self.tasks: list[Task] = list(tasks) if tasks is not None else make_tasks(split)
        if not self.tasks:
            raise ValueError("BugFixEnv needs at least one task")
        self.split = split if tasks is None else "custom"
        self.max_turns = int(max_turns)
        self.call_cost = float(call_cost)
        self.edit_penalty = float(edit_penalty)
        self.invalid_cost = float(invalid_cost)
        self.blank_tools = bool(blank_tools)
        self.render_mode = render_mode
        self.action_space = spaces.Text(max_length=MAX_ACTION_CHARS, min_length=0, charset=CHARSET)
        self.observation_space = spaces.Text(max_length=MAX_OBS_CHARS, min_length=0, charset=CHARSET)
        self.task: Task | None = None
        self.source = ""
        self.transcript: list[tuple[int, str]] = []
        self._done = True

    # ------------------------------------------------------------------ gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        chosen = (options or {}).get("task")
        if chosen is None:
            self.task = self.tasks[int(self.np_random.integers(len(self.tasks)))]
        elif isinstance(chosen, (int, np.integer)):
            self.task = self.tasks[int(chosen)]
        else:
            self.task = get_task(chosen) if not isinstance(chosen, Task) else chosen
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
        obs = tools.prompt(self.task)
        self.transcript = [(OWNER_PROMPT, obs)]
        if self.render_mode == "human":
            self.render()
        return obs, self._info()

    def step(self, action: str):
        if not isinstance(action, str):
            raise TypeError(f"BugFix-v0 actions are call strings such as 'read' or 'edit fix_init', got "
                            f"{type(action).__name__}; wrap the env in bugfix_gym.wrappers.DiscreteCalls "
                            "for integer actions")
        if self._done:
            raise RuntimeError("the episode has ended; call reset() before step()")
        self.turn += 1
        self.actions.append(action[:MAX_KEPT_ACTION_CHARS])
        reward = 0.0 - self.call_cost  # not -0.0 when there is no cost
        terminated = False
        call = tools.parse_call(action)
        if call is not None and call[0] == "revert" and self.source == self.task.source:
            call, obs = None, "invalid call : nothing to revert"
        else:
            obs = None
        self.valid = call is not None
        if call is None:
            self.n_invalid += 1
            obs = obs or tools.why_invalid(action)
            reward -= self.invalid_cost
        elif call[0] == "read":
            obs = self.source
        elif call[0] == "test":
            report = run_tests(self.task, self.source, "visible")
            obs = f"visible tests : {report.passed} / {report.total} passed"
            if report.first_failure:
                obs += f" . first failure : {report.first_failure}"
        elif call[0] == "edit":
            new = apply_op(self.source, call[1])
            obs = describe_change(self.source, new)
            self.source = new
            self.ops.append(call[1])
            reward -= self.edit_penalty
        elif call[0] == "revert":
            self.source = self.task.source
            obs = "reverted to the original source"
        else:  # submit
            report = run_tests(self.task, self.source, "hidden")
            self.submitted, self.hidden_pass = True, report.ok
            self.stop, terminated = "submit", True
            reward += 1.0 if report.ok else 0.0
            obs = "hidden tests passed" if report.ok else f"hidden tests failed : {report.passed} / {report.total}"
        if self.blank_tools and call is not None and call[0] in ("read", "test"):
            obs = BLANK_OUTPUT
        truncated = not terminated and self.turn >= self.max_turns
        if truncated:
            self.stop = "budget"
        self._done = terminated or truncated
        obs = obs[:MAX_OBS_CHARS]
        self.transcript.append((OWNER_POLICY, action[:MAX_KEPT_ACTION_CHARS]))
        self.transcript.append((OWNER_TOOL, obs))
        if self.render_mode == "human":
            self.render()
        return obs, float(reward), bool(terminated), bool(truncated), self._info()

    def render(self):
        text = self.render_text()
        if self.render_mode == "human":
            print(text, end="\n\n")
            return None
        return text

    # ------------------------------------------------------------------ helpers
    def call_mask(self) -> np.ndarray:
        """bool[9] over ``CALLS``: which calls are legal now (``revert`` only after a change)."""
        mask = np.ones(len(tools.CALLS), dtype=bool)
        if self.task is None or self.source == self.task.source:
            mask[tools.REVERT] = False
        return mask

    def render_text(self) -> str:
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

    def _info(self) -> dict[str, Any]:
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
        }
