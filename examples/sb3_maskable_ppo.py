"""Train sb3-contrib's MaskablePPO on BugFix-v0 through the ``BugFixCalls-v0`` view.

The same environment, another library: ``BugFixCalls-v0`` (the ``DiscreteCalls`` view)
turns each turn into one of the nine calls (``Discrete(9)``) with an ``action_masks()``
method, which MaskablePPO finds through the vector env by itself, and the episode so far
into token-id arrays. MaskablePPO's ``MultiInputPolicy`` reads those arrays with a plain
MLP over token ids; it is an interoperability example (no token-level credit assignment),
yet it learns well on this small call menu, held-out tasks included.

    python examples/sb3_maskable_ppo.py [--timesteps 20000] [--seed 0]

Figures (pass rate before -> after, run time) are in docs/interop.md. Writes only
``runs/interop/sb3_maskable_ppo.json``.
"""

from __future__ import annotations

import argparse

import numpy as np
from sb3_contrib import MaskablePPO
from stable_baselines3.common.env_util import make_vec_env

from interop_common import ENV_ID, MAX_LEN, Timer, evaluate, report, set_threads


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=20_000, help="environment steps (default: 20000)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    set_threads()

    venv = make_vec_env(ENV_ID, n_envs=8, seed=args.seed, env_kwargs={"max_len": MAX_LEN})
    model = MaskablePPO("MultiInputPolicy", venv, n_steps=128, batch_size=256, ent_coef=0.01,
                        seed=args.seed, device="cpu", verbose=0)

    def act(obs: dict[str, np.ndarray], call_mask: np.ndarray) -> int:
        return int(model.predict(obs, action_masks=call_mask, deterministic=False)[0])

    before = evaluate(act)
    with Timer() as t:
        model.learn(args.timesteps)
    after = evaluate(act)
    report("sb3_maskable_ppo", model.num_timesteps, t.seconds, before, after, seed=args.seed)


if __name__ == "__main__":  # make_vec_env(..., vec_env_cls=SubprocVecEnv) needs this guard
    main()
