"""Wrappers of the text env that keep its spaces: training augmentations and benchmark knobs.

:class:`BugFixEnv` does the dynamics; these do the rest, as Gymnasium's ``TimeLimit`` does for its
envs:

* :class:`StatementDropout` (a training augmentation): at ``reset`` each word of the statement is left
  out of the prompt with probability ``p``;
* :class:`InertLines` (a training augmentation): at ``reset``, with probability ``p``, the task's function
  gains one statement that does nothing;
* :class:`HideOutputs` (an ablation): the named tools (``read``, ``test``) answer ``output hidden``;
* :class:`ToolLatency` (a benchmark knob): a sleep on every valid ``test`` and ``submit`` call.

``gym.make("BugFix-v0", statement_dropout=..., inert_lines=..., hide_outputs=..., tool_latency_s=...)``
applies them (:func:`make_bugfix_env`, the entry point of ``BugFix-v0``), each only where its argument
is not the default; ``BugFixEnv(...)`` itself takes none of the four. The augmentations draw from the
env's ``np_random`` in the env's own order (task, then inert line, then dropped words), so a seed gives
the same episodes with the wrappers as without them when ``p`` is 0, and the same as ever otherwise.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import gymnasium as gym

from ..core.env import BugFixEnv, nonnegative, prompt_observation
from ..tasks.generator import with_inert_line
from ..contract.tokens import OWNER_PROMPT
from ..core.tools import HIDDEN_OUTPUT, HIDEABLE, parse_call

LATENCY_TOOLS = ("test", "submit")
"""The tools :class:`ToolLatency` sleeps on (those that run tests)."""


class _TextEnvWrapper(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Common part: the wrapped env must be the text env (a :class:`BugFixEnv`, text spaces)."""

    def __init__(self, env: gym.Env, **constructor_args: Any):
        gym.utils.RecordConstructorArgs.__init__(self, **constructor_args)  # env.spec can rebuild the stack
        gym.Wrapper.__init__(self, env)
        if not isinstance(env.unwrapped, BugFixEnv) or not isinstance(env.observation_space, gym.spaces.Text):
            raise TypeError(f"{type(self).__name__} wraps the text env BugFix-v0 (apply it before the array views "
                            f"of bugfix_gym.views.wrappers), got {env}")

    @property
    def text_env(self) -> BugFixEnv:
        """The :class:`BugFixEnv` inside."""
        return self.env.unwrapped  # type: ignore[return-value]


class StatementDropout(_TextEnvWrapper):
    """At each ``reset``, every word of the task's statement is left out of the prompt with probability
    ``statement_dropout`` (drawn with the env's ``np_random``, after the task), so a policy cannot lean on
    the exact wording of the statements it trains on. The task, its tests, the tools and the rewards are
    unchanged; the transcript holds the prompt as shown. Evaluate without it.

    With ``render_mode="human"`` the env prints its prompt before the words are left out.

    :param env: the text env
    :param statement_dropout: the probability, in [0, 1)
    """

    def __init__(self, env: gym.Env, statement_dropout: float):
        super().__init__(env, statement_dropout=statement_dropout)
        self.statement_dropout = probability("statement_dropout", statement_dropout, one=False)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        if not self.statement_dropout:  # draws nothing, so the env's random stream is as without the wrapper
            return obs, info
        env = self.text_env
        assert env.task is not None
        words = env.task.statement.split()
        keep = env.np_random.random(len(words)) >= self.statement_dropout
        obs = prompt_observation(env.task, " ".join(w for w, k in zip(words, keep) if k))
        env.transcript[0] = (OWNER_PROMPT, obs)
        return obs, info


class InertLines(_TextEnvWrapper):
    """At each ``reset``, with probability ``inert_lines`` (drawn with the env's ``np_random``, after the
    task), the task's function gains one statement that does nothing (``<noun> = <parameter>``) between
    two of its top-level statements (:func:`bugfix_gym.tasks.generator.with_inert_line`), and the episode is
    played on that task (a second ``reset`` with ``options={"task": ...}``, which draws nothing). A
    template's code is then not always the same shape; every op still changes the same code, and the
    tests and the fix are unchanged. Evaluate without it. Apply it inside :class:`StatementDropout`, whose
    draw comes after this one, and inside wrappers that count episodes at ``reset`` (SB3's ``Monitor``).

    With ``render_mode="human"`` the env prints the prompt of both resets.

    :param env: the text env
    :param inert_lines: the probability, in [0, 1]
    """

    def __init__(self, env: gym.Env, inert_lines: float):
        super().__init__(env, inert_lines=inert_lines)
        self.inert_lines = probability("inert_lines", inert_lines)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        env = self.text_env
        if self.inert_lines and env.np_random.random() < self.inert_lines:
            assert env.task is not None
            task = with_inert_line(env.task, env.np_random)
            if task is not env.task:
                obs, info = self.env.reset(options={"task": task})
        return obs, info


class HideOutputs(_TextEnvWrapper):
    """An ablation: the named tools (``"read"``, ``"test"``) answer ``"output hidden"`` instead of their
    output. The wrapper puts a handler that answers so in the env's table of tools (``env.tools``), so a
    hidden tool does not run: a hidden test report marks nothing as useless in ``info["useful_calls"]``.
    Validity, rewards and episode end are unchanged.

    :param env: the text env
    :param hide_outputs: the tools to hide, a list drawn from ``"read"`` and ``"test"``
    """

    def __init__(self, env: gym.Env, hide_outputs: Sequence[str] = HIDEABLE):
        super().__init__(env, hide_outputs=hide_outputs)
        self.hide_outputs = hideable(hide_outputs)
        for name in self.hide_outputs:
            self.text_env.tools[name] = hidden_output


def hidden_output(arg: str | None) -> tuple[str, float]:
    """The handler of a hidden tool: ``"output hidden"``, nothing to the reward."""
    return HIDDEN_OUTPUT, 0.0


class ToolLatency(_TextEnvWrapper):
    """A benchmark knob: sleeps ``tool_latency_s`` seconds on every valid ``test`` and ``submit`` call, a
    stand-in for running the tests in a container (to measure scale-out, docs/scale_out.md). The attribute
    may be changed while the env runs (``env.set_wrapper_attr("tool_latency_s", 0.02)``).

    :param env: the text env
    :param tool_latency_s: seconds, a finite number >= 0
    """

    def __init__(self, env: gym.Env, tool_latency_s: float = 0.0):
        super().__init__(env, tool_latency_s=tool_latency_s)
        self.tool_latency_s = nonnegative("tool_latency_s", tool_latency_s)

    def step(self, action: str):
        call = parse_call(action) if isinstance(action, str) else None
        result = self.env.step(action)
        if self.tool_latency_s and call is not None and call[0] in LATENCY_TOOLS:
            time.sleep(self.tool_latency_s)  # the env answered; the container would have taken this long
        return result


def make_bugfix_env(statement_dropout: float = 0.0, inert_lines: float = 0.0, hide_outputs: Sequence[str] = (),
                    tool_latency_s: float = 0.0, **env_kwargs: Any) -> gym.Env:
    """The entry point of ``BugFix-v0``: ``BugFixEnv(**env_kwargs)`` in the wrappers these arguments ask for,
    each applied only where its argument is not the default (so the default env is a bare ``BugFixEnv``).

    :param statement_dropout: :class:`StatementDropout`'s probability
    :param inert_lines: :class:`InertLines`' probability
    :param hide_outputs: :class:`HideOutputs`' tools
    :param tool_latency_s: :class:`ToolLatency`'s seconds
    :param env_kwargs: :class:`BugFixEnv` arguments
    """
    statement_dropout = probability("statement_dropout", statement_dropout, one=False)
    inert_lines = probability("inert_lines", inert_lines)
    hidden = hideable(hide_outputs)
    tool_latency_s = nonnegative("tool_latency_s", tool_latency_s)
    env: gym.Env = BugFixEnv(**env_kwargs)
    if hidden:
        env = HideOutputs(env, list(hidden))
    if tool_latency_s:
        env = ToolLatency(env, tool_latency_s)
    if inert_lines:  # inside StatementDropout: the inert line is drawn first, as the task is
        env = InertLines(env, inert_lines)
    if statement_dropout:
        env = StatementDropout(env, statement_dropout)
    return env


def probability(name: str, p: Any, one: bool = True) -> float:
    """A finite ``p`` in [0, 1] (in [0, 1) without ``one``), else a one-line error naming ``name``."""
    p = nonnegative(name, p)
    if p > 1 or (p == 1 and not one):
        raise ValueError(f"{name} is a probability in [0, {'1]' if one else '1)'}, got {p!r}")
    return p


def hideable(hide_outputs: Any) -> tuple[str, ...]:
    """``hide_outputs`` as a tuple of tool names drawn from :data:`HIDEABLE`, in its order, else a one-line error."""
    if isinstance(hide_outputs, str) or not isinstance(hide_outputs, (list, tuple, set, frozenset)):
        raise TypeError(f"hide_outputs must be a list of tool names such as ['read', 'test'], got "
                        f"{type(hide_outputs).__name__} {hide_outputs!r:.40}")
    unknown = [name for name in hide_outputs if name not in HIDEABLE]
    if unknown:
        raise ValueError(f"hide_outputs can name only {', '.join(map(repr, HIDEABLE))}, got {unknown[0]!r:.40}")
    return tuple(name for name in HIDEABLE if name in hide_outputs)
