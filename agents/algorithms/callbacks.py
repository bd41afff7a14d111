"""Callbacks for the token algorithms (Stable-Baselines3's callback interface)."""

from __future__ import annotations

from stable_baselines3.common.callbacks import BaseCallback


class StopAfterIterations(BaseCallback):
    """Stop ``learn`` after ``n_iterations`` updates (the book counts PPO iterations / REINFORCE steps,
    SB3's ``total_timesteps`` counts env steps): pass a large ``total_timesteps`` and this callback.

    The first env step of iteration ``n_iterations + 1`` returns False, so SB3's loop ends before
    collecting or training on that batch (that one env step is taken).

    :param n_iterations: updates to run
    :param verbose: SB3's verbosity
    """

    def __init__(self, n_iterations: int, verbose: int = 0):
        super().__init__(verbose)
        if n_iterations < 1:
            raise ValueError(f"n_iterations must be at least 1, got {n_iterations}")
        self.n_iterations = int(n_iterations)
        self.rollouts = 0

    def _on_rollout_start(self) -> None:
        self.rollouts += 1

    def _on_step(self) -> bool:
        return self.rollouts <= self.n_iterations
