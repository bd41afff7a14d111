"""BugFix in the shapes of three more LLM-env libraries, without importing any of them (docs/verifiers.md has a
snippet for each that registers the shim with its library):

- :class:`GemBugFix`: GEM's ``gem.Env`` (axon-rl/gem): ``reset(seed) -> (obs, info)``,
  ``step(action: str) -> (obs, reward, terminated, truncated, info)``; the action is the model's whole reply and
  the call is its last ``\\boxed{...}`` (GEM's games read their moves that way), else the reply itself.
- :class:`SkyRLBugFix`: SkyRL-gym's ``BaseTextEnv`` (``skyrl_gym.envs.base_text_env``): built with
  ``(env_config, extras)``, where ``extras`` holds a dataset row of :func:`~bugfix_gym.integrations.trl.dataset_rows`;
  ``init(prompt) -> (prompt, metadata)`` appends the env's prompt to the row's last user message;
  ``step(action: str)`` returns a ``BaseTextEnvStepOutput`` dict (``observations`` as chat messages,
  ``reward``, ``done``, ``metadata``, ``postprocessed_action``).
- :class:`OpenEnvBugFix`: the core of an OpenEnv ``Environment`` (``openenv.core.env_server``):
  ``reset(seed, episode_id, **row)`` and ``step(call)`` return the fields of an ``Observation`` (``text``,
  ``done``, ``reward``, ``metadata``), ``state`` those of a ``State`` (``episode_id``, ``step_count``).

Each episode is a :class:`~bugfix_gym.core.env.BugFixEnv` episode: the reward is 1.0 on a ``submit`` that passes the
hidden tests, else 0.0; it ends on ``submit`` or the turn budget. No row or prompt holds the answer.
"""

from __future__ import annotations

import re
from typing import Any

from ..core.env import BugFixEnv
from .trl import ENDED, BugFixToolEnv

ROW_KEYS = ("tasks", "task", "seed", "split", "pack")
"""the columns of a BugFix dataset row (:func:`bugfix_gym.integrations.trl.dataset_rows`)"""
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def call_from_reply(reply: str) -> str:
    """The call in a model's reply: its last ``\\boxed{...}``, else the whole reply, stripped.

    :param reply: the model's text
    """
    boxed = _BOXED.findall(reply)
    return (boxed[-1] if boxed else reply).strip()


def play(env: BugFixEnv | None, reply: str, start: str) -> tuple[str, float, bool, dict[str, Any]]:
    """One call on ``env``: ``(tool output, reward, episode over, {"stop", "valid", "call"})``; after the end it
    answers :data:`~bugfix_gym.integrations.trl.ENDED` and changes nothing.

    :param env: the episode's env (None before the first reset)
    :param reply: the model's reply (:func:`call_from_reply` finds the call in it)
    :param start: what to call first when there is no episode yet (the error says so)
    """
    if env is None:
        raise RuntimeError(f"{start} before the first step")
    call = call_from_reply(str(reply))
    if env.stop is not None:
        return ENDED, 0.0, True, {"stop": env.stop, "valid": False, "call": call, "hidden_pass": False}
    obs, reward, _, _, info = env.step(call)
    return obs, float(reward), env.stop is not None, {"stop": env.stop, "valid": info["valid"], "call": call,
                                                      "hidden_pass": info["hidden_pass"]}


class GemBugFix:
    """BugFix as a GEM env: ``gem.register("BugFix-v0", entry_point="bugfix_gym.integrations.shims:GemBugFix")``.

    :param split: book split, or the generator split with ``generated=True``
    :param generated: draw generated tasks (the reset seed is the task) instead of book tasks
    :param max_turns: the turn budget
    :param kwargs: ignored (``gem.make_vec`` passes ``seed``)
    """

    def __init__(self, split: str = "train", generated: bool = False, max_turns: int = 6, **kwargs: Any):
        self.env = BugFixEnv(generated=split, max_turns=max_turns) if generated else BugFixEnv(
            split=split, max_turns=max_turns)

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """A new episode: its prompt and info.

        :param seed: the same seed gives the same task (None: the next draw)
        """
        obs, info = self.env.reset(seed=seed)
        return obs, {**info, "suffix": "Write your next call, e.g. \\boxed{read}."}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Play the call in the model's reply; a reply that holds no call is an invalid turn.

        :param action: the model's reply (:func:`call_from_reply` finds the call in it)
        """
        obs, reward, terminated, truncated, info = self.env.step(call_from_reply(str(action)))
        return obs, float(reward), bool(terminated), bool(truncated), info

    def sample_random_action(self) -> str:
        """A random legal call, boxed."""
        from ..core.tools import CALLS

        return "\\boxed{" + CALLS[int(self.env.np_random.integers(len(CALLS)))] + "}"


class SkyRLBugFix:
    """BugFix as a SkyRL-gym text env (subclass it with ``skyrl_gym.envs.base_text_env.BaseTextEnv``).

    :param env_config: SkyRL's env config (unused)
    :param extras: the dataset row's extras: the BugFix row (:data:`ROW_KEYS`), at the top level or under
        ``extra_info``; ``max_turns`` optional
    """

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None):
        super().__init__()
        extras = dict(extras or {})
        info = extras.get("extra_info")
        source: dict[str, Any] = info if isinstance(info, dict) else extras
        self.row = {k: source[k] for k in ROW_KEYS if k in source}
        self.max_turns = int(extras.get("max_turns", 6))
        self.turns = 0
        self.player = BugFixToolEnv(max_turns=self.max_turns)
        self.passed = False

    def init(self, prompt: list[dict[str, str]]) -> tuple[list[dict[str, str]], dict[str, Any]]:
        """Reset from the row; the env's prompt is appended to the last user message (a new one if none).

        :param prompt: the dataset row's chat prompt
        """
        obs = self.player.reset(**self.row)
        self.turns, self.passed = 0, False
        chat = [dict(m) for m in prompt or []]
        if chat and chat[-1].get("role") == "user":
            chat[-1]["content"] = (chat[-1].get("content") or "") + obs
        else:
            chat.append({"role": "user", "content": obs})
        return chat, {}

    def step(self, action: str) -> dict[str, Any]:
        """Play the call in ``action``: the tool output as the next user message, the reward on the last step.

        :param action: the model's reply
        """
        obs, reward, done, info = play(self.player.env, action, "call init(prompt)")
        self.turns += 1
        self.passed = self.passed or bool(info.pop("hidden_pass"))
        return {"observations": [] if done else [{"role": "user", "content": obs}], "reward": reward,
                "done": done, "metadata": info, "postprocessed_action": info["call"]}

    def get_metrics(self) -> dict[str, Any]:
        """The episode's hidden-test verdict (1.0 or 0.0) and its turns."""
        return {"hidden_pass": 1.0 if self.passed else 0.0, "turns": self.turns}

    def close(self) -> None:
        """Nothing to release."""


class OpenEnvBugFix:
    """The core of an OpenEnv ``Environment`` for BugFix: plain dicts that OpenEnv's pydantic types wrap."""

    def __init__(self, max_turns: int = 6):
        self.player = BugFixToolEnv(max_turns=max_turns)
        self.episode_id: str | None = None
        self.step_count = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, **row: Any) -> dict[str, Any]:
        """Start the episode ``row`` names.

        :param seed: with no row, draws a book train task; a generated row without ``seed`` takes it
        :param episode_id: OpenEnv's episode id, echoed by :attr:`state`
        :param row: a BugFix row (:data:`ROW_KEYS`); other fields are ignored
        """
        if not row.get("task") and row.get("tasks", "book") == "book":
            from .trl import dataset_rows

            row = dataset_rows(row.get("split", "train"), 1, int(seed or 0))[0]
        row = {k: v for k, v in row.items() if k in ROW_KEYS}
        if seed is not None:
            row.setdefault("seed", seed)
        obs = self.player.reset(**row)
        self.episode_id, self.step_count = episode_id, 0
        return {"text": obs, "done": False, "reward": None, "metadata": {}}

    def step(self, call: str) -> dict[str, Any]:
        """Play one call.

        :param call: a BugFix call (``edit fix_init``), or a reply holding one in ``\\boxed{...}``
        """
        obs, reward, done, info = play(self.player.env, call, "POST /reset")
        self.step_count += 1
        return {"text": obs, "done": done, "reward": reward, "metadata": info}

    @property
    def state(self) -> dict[str, Any]:
        """The fields of OpenEnv's ``State``."""
        return {"episode_id": self.episode_id, "step_count": self.step_count}
