"""The training recipes behind ``bugfix-gym train``: the book's (``--tasks book``) and the
generalisation recipe (``--tasks generated``). docs/generalisation.md has the runs behind them.

A recipe is TokenPPO's keyword arguments plus the few settings around it (the training envs,
the number of env steps, the base agent). Command-line flags override single entries.
"""

from __future__ import annotations

from typing import Any

RECIPES: dict[str, dict[str, Any]] = {
    # the book's chapter 8: the 20 train tasks, 30 iterations of 64 episodes
    "book": dict(
        env=dict(split="train"),
        timesteps=6000,
        n_envs=64,
        ppo=dict(n_episodes=64, n_epochs=4, n_minibatches=4, learning_rate=1e-3, gae_lambda=1.0, target_kl=0.02,
                 target_kl_mode="minibatch", ent_coef=0.0),
        grammar=False,
    ),
    # fresh procedurally generated tasks every episode (generator "train" templates)
    "generated": dict(
        env=dict(generated="train"),
        timesteps=60_000,
        n_envs=64,
        ppo=dict(n_episodes=64, n_epochs=4, n_minibatches=4, learning_rate=1e-3, gae_lambda=1.0, target_kl=0.02,
                 target_kl_mode="minibatch", ent_coef=0.0),
        grammar=True,
    ),
}
