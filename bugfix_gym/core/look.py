"""LookThenAnswer-v0: the smallest tool-use task, a second text environment that is not BugFix.

A box holds one of a few colours. The agent can ``look`` (the observation says which colour)
and ``answer <colour>``, which ends the episode: reward 1 if it looked and named the colour,
else 0 (an answer given without looking never counts, so guessing cannot compete with looking).
It exists to show that the token agents train
on *any* Gymnasium environment with text observations and text actions (it uses gymnasium's
own ``Text`` spaces, without a shape), and as a fast known-answer check of a trainer.
"""

from __future__ import annotations

import string
from typing import Any, Sequence

import gymnasium as gym
from gymnasium import spaces

COLOURS = ("red", "green", "blue", "yellow", "purple", "orange", "black", "white")


class LookThenAnswerEnv(gym.Env):
    """Look into a box, then name the colour it holds.

    ## Description
    At reset a colour is drawn with ``self.np_random``. The prompt says what the box is and
    lists the calls. ``look`` answers ``the box holds <colour>``; ``answer <colour>`` ends the
    episode. Anything else is an invalid call that costs the turn.

    ## Action Space
    ``Text(max_length=32, min_length=0, charset=string.printable)``: the call as text.

    ## Observation Space
    ``Text(max_length=256, min_length=0, charset=string.printable)``: the prompt after
    ``reset``, the tool output after each step.

    ## Rewards
    ``1.0`` for the right answer after a ``look``, else ``0.0``.

    ## Episode End
    Terminated on ``answer``; truncated after ``max_turns`` calls.

    ## Arguments
    ``gym.make("LookThenAnswer-v0", colours=COLOURS, max_turns=3)``.

    ## Version History
    * v0: initial release.
    """

    metadata = {"render_modes": []}

    def __init__(self, colours: Sequence[str] = COLOURS, max_turns: int = 3, render_mode: str | None = None):
        colours = tuple(colours)
        if len(colours) < 2 or any(not c.isidentifier() for c in colours) or len(set(colours)) != len(colours):
            raise ValueError(f"colours must be at least two distinct words, got {colours!r}")
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 2:
            raise ValueError(f"max_turns must be an integer >= 2 (look, then answer), got {max_turns!r}")
        self.colours, self.max_turns = colours, max_turns
        self.calls: tuple[str, ...] = ("look", *(f"answer {c}" for c in colours))
        self.action_space = spaces.Text(max_length=32, min_length=0, charset=string.printable)
        self.observation_space = spaces.Text(max_length=256, min_length=0, charset=string.printable)
        self.colour = colours[0]
        self.turn, self.looked = 0, False

    @property
    def words(self) -> list[str]:
        """Every word the env can say or accept (a tokenizer vocabulary for it)."""
        text = " ".join([self._prompt(), "the box holds", "right wrong invalid call : that is not a call", *self.calls])
        return list(dict.fromkeys(text.split()))

    def _prompt(self) -> str:
        return "a box holds a colour . calls : " + " | ".join(self.calls)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.colour = self.colours[int(self.np_random.integers(len(self.colours)))]
        self.turn, self.looked = 0, False
        return self._prompt(), {"colour": self.colour, "looked": False}

    def step(self, action: str):
        if not isinstance(action, str):
            raise TypeError(f"LookThenAnswer-v0 actions are call strings such as 'look', got {type(action).__name__}")
        self.turn += 1
        words = action.split() if len(action) <= 32 else []
        reward, terminated = 0.0, False
        if words == ["look"]:
            obs, self.looked = f"the box holds {self.colour}", True
        elif len(words) == 2 and words[0] == "answer" and words[1] in self.colours:
            terminated, reward = True, float(self.looked and words[1] == self.colour)
            obs = "right" if reward else "wrong"
        else:
            obs = "invalid call : that is not a call"
        truncated = not terminated and self.turn >= self.max_turns
        return obs, reward, terminated, truncated, {"colour": self.colour, "turn": self.turn, "looked": self.looked}
