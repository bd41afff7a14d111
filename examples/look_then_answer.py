"""TokenPPO on a text env that is not BugFix: LookThenAnswer-v0, from a random TinyAgent.

LookThenAnswer-v0 (``bugfix_gym.core.look``) uses gymnasium's own ``Text`` spaces: a box holds a
colour, ``look`` shows it, ``answer <colour>`` ends the episode (reward 1 only after a look).
The recipe is the one of tests/test_look_env.py: a tokenizer built from the env's own words
(a word outside the tokenizer encodes to ``<unk>``, so the policy could never write it), the
env's calls as the decoding grammar, a small random-init model (``base_agent=None``) and no
KL early stop (it is made for fine-tuning a base agent; from scratch the policy must move).

    python examples/look_then_answer.py [--seeds 0 1 2] [--timesteps 8000]

Prints, per seed, the mean reward and the share of episodes that looked, before -> after,
on 128 episodes of a separate seeded env. Writes nothing. Figures: docs/ppo.md "Any text env".
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from stable_baselines3.common.env_util import make_vec_env

import bugfix_gym
from agents import TextDummyVecEnv, TokenPPO
from bugfix_gym.core.look import COLOURS, LookThenAnswerEnv


def run(seed: int, timesteps: int, n_colours: int) -> dict[str, float]:
    """Train one seed; return reward and look rate before and after, and the training time."""
    colours = COLOURS[:n_colours]
    tok = bugfix_gym.Tokenizer(LookThenAnswerEnv(colours=colours).words)  # the env's whole vocabulary
    venv = make_vec_env("LookThenAnswer-v0", n_envs=32, seed=seed, vec_env_cls=TextDummyVecEnv,
                        env_kwargs=dict(colours=colours, render_mode=None))
    calls = venv.get_attr("calls")[0]
    model = TokenPPO("TinyAgentPolicy", venv, base_agent=None, n_episodes=64, seed=seed, learning_rate=3e-3,
                     target_kl=None, ent_coef=0.01,
                     policy_kwargs=dict(tokenizer=tok, call_grammar=list(calls),
                                        model_config=dict(vocab_size=tok.vocab_size, d_model=32, n_layer=1,
                                                          n_head=4, d_ff=128, max_len=64)))
    probe = make_vec_env("LookThenAnswer-v0", n_envs=32, seed=99, vec_env_cls=TextDummyVecEnv,
                         env_kwargs=dict(colours=colours, render_mode=None))

    def score() -> tuple[float, float]:  # its own env and generator: training is not disturbed
        trajs = model.sample_episodes(n=128, env=probe, generator=torch.Generator().manual_seed(0))
        return float(np.mean([t.reward for t in trajs])), float(np.mean([t.info["looked"] for t in trajs]))

    before, looked_before = score()
    t0 = time.perf_counter()
    model.learn(timesteps)
    train_s = time.perf_counter() - t0
    after, looked_after = score()
    return dict(before=before, after=after, looked_before=looked_before, looked_after=looked_after, train_s=train_s)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds (default: 0 1 2)")
    parser.add_argument("--timesteps", type=int, default=8000, help="env steps per seed (default: 8000)")
    parser.add_argument("--colours", type=int, default=4, choices=range(2, len(COLOURS) + 1),
                        help="number of colours (default: 4)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"LookThenAnswer-v0, {args.colours} colours, {args.timesteps} env steps per seed")
    for seed in args.seeds:
        r = run(seed, args.timesteps, args.colours)
        print(f"seed {seed}: reward {r['before']:.3f} -> {r['after']:.3f}, looked {r['looked_before']:.3f} -> "
              f"{r['looked_after']:.3f}  ({r['train_s']:.0f} s of training)", flush=True)


if __name__ == "__main__":
    main()
