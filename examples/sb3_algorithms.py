"""Train Stable-Baselines3 PPO, A2C or DQN on BugFix-v0 through the ``BugFixCalls-v0`` view.

SB3 builds the envs from the id (``make_vec_env``), reads the ``Dict`` observation with its
``MultiInputPolicy`` (an MLP over the flattened token ids, owner codes and call mask) and
picks one of the nine calls. Plain SB3 has no action masking: the one illegal call
(``revert`` before any change) is played as the env plays it, an invalid turn. For masked
PPO see ``examples/sb3_maskable_ppo.py``.

    python examples/sb3_algorithms.py --algo ppo [--timesteps 20000] [--seed 0]
    python examples/sb3_algorithms.py --algo a2c
    python examples/sb3_algorithms.py --algo dqn

Figures (pass rate before -> after, run time, which algorithms learn) are in docs/interop.md.
Writes only ``runs/interop/sb3_<algo>.json``.
"""

from __future__ import annotations

import argparse

import numpy as np
from stable_baselines3 import A2C, DQN, PPO
from stable_baselines3.common.env_util import make_vec_env

from interop_common import ENV_ID, MAX_LEN, Timer, evaluate, report, set_threads

DEFAULT_STEPS = {"ppo": 20_000, "a2c": 100_000, "dqn": 40_000}


def build(algo: str, seed: int):
    """The model with the settings measured in docs/interop.md."""
    venv = make_vec_env(ENV_ID, n_envs=8, seed=seed, env_kwargs={"max_len": MAX_LEN})
    if algo == "dqn":
        # The turn budget ends an episode as truncated; SB3's replay buffer then bootstraps past
        # it by default, as if the episode went on, and DQN stays at pass rate 0 (docs/interop.md).
        # The budget is part of the task (the agent sees its turns), so its end is terminal here.
        return DQN("MultiInputPolicy", venv, learning_rate=5e-4, buffer_size=50_000, learning_starts=1_000,
                   batch_size=64, train_freq=1, gradient_steps=2, target_update_interval=250,
                   exploration_fraction=0.5, exploration_final_eps=0.05, seed=seed, device="cpu",
                   replay_buffer_kwargs={"handle_timeout_termination": False})
    if algo == "a2c":
        return A2C("MultiInputPolicy", venv, n_steps=16, ent_coef=0.01, learning_rate=7e-4, seed=seed, device="cpu")
    return PPO("MultiInputPolicy", venv, n_steps=128, batch_size=256, ent_coef=0.01, seed=seed, device="cpu")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", choices=sorted(DEFAULT_STEPS), default="ppo")
    parser.add_argument("--timesteps", type=int, default=None,
                        help="env steps (default: PPO 20000, A2C 100000, DQN 40000)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    set_threads()
    steps = args.timesteps or DEFAULT_STEPS[args.algo]

    model = build(args.algo, args.seed)
    deterministic = args.algo == "dqn"  # DQN's policy is its greedy action; PPO / A2C sample

    def act(obs: dict[str, np.ndarray], call_mask: np.ndarray) -> int:
        return int(model.predict(obs, deterministic=deterministic)[0])

    before = evaluate(act, masked=False)  # no masking in plain SB3: an illegal call is an invalid turn
    with Timer() as t:
        model.learn(steps)
    after = evaluate(act, masked=False)
    report(f"sb3_{args.algo}", model.num_timesteps, t.seconds, before, after, seed=args.seed)


if __name__ == "__main__":  # make_vec_env with SubprocVecEnv, if you switch to it, needs this guard
    main()
