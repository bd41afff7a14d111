"""Cost of one REINFORCE step (the book's §6.7 setting) against its floor, measured side by side in one run.

    python benchmarks/reinforce_step.py            # 20 steps, then the floor on the same batches
    python benchmarks/reinforce_step.py --steps 80 # the book's whole run

A ``Reinforce`` step is: sample 64 whole episodes (64 BugFix-v0 envs in a ``DummyVecEnv``, fresh
on-policy batches), collate, one policy-gradient update. Its floor is what any trainer must pay
for the same work: one bare :meth:`agents.rollout.sampler.EpisodeSampler.collect` of 64 episodes (no SB3
callbacks, logger or buffer) plus one raw forward + backward + Adam step over the collected batch
(the same length-sorted chunks). Printed: the wall time per step and per 80 steps (the book's
run), and step / floor (goal <= 1.3).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from stable_baselines3.common.env_util import make_vec_env

import bugfix_gym
from agents.bugfix.base_agent import cached_base_agent
from agents.algorithms.callbacks import StopAfterIterations
from agents.model.tinyagent import TinyAgent, score_tokens
from agents.algorithms.reinforce import Reinforce
from agents.rollout.sampler import EpisodeSampler
from agents.rollout.trajectory import Trajectory, collate


def reinforce_steps(base: TinyAgent, tok: bugfix_gym.Tokenizer, steps: int, seed: int) -> tuple[float, list[dict]]:
    """``steps`` REINFORCE updates of the book's run; returns the wall time and the per-step records."""
    env = make_vec_env("BugFix-v0", n_envs=64, seed=seed, env_kwargs=dict(render_mode=None))
    model = Reinforce("TinyAgentPolicy", env, base_agent=copy.deepcopy(base), n_episodes=64, seed=seed,
                      baseline_init=0.15, policy_kwargs=dict(tokenizer=tok))
    start = time.perf_counter()
    model.learn(10**9, callback=StopAfterIterations(steps))
    return time.perf_counter() - start, model.diagnostics


def floor_step(base: TinyAgent, tok: bugfix_gym.Tokenizer, seed: int, chunk: int = 8) -> tuple[float, float]:
    """(bare rollout seconds, raw forward + backward + Adam seconds) of one 64-episode batch."""
    env = make_vec_env("BugFix-v0", n_envs=64, seed=seed, env_kwargs=dict(render_mode=None))
    sampler = EpisodeSampler(env, tok)
    model = copy.deepcopy(base)
    opt = torch.optim.Adam(model.parameters(), lr=1e-6)
    gen = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    trajs: list[Trajectory] = sampler.collect(model, 64, generator=gen)
    rollout = time.perf_counter() - start
    batch = collate(trajs)
    start = time.perf_counter()
    mask = batch["policy_mask"]
    logp, _, _ = score_tokens(model, batch["ids"], mask, lengths=(batch["owner"] > 0).sum(1), chunk=chunk)
    loss = -(logp * mask).sum() / mask.sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return rollout, time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="REINFORCE steps timed (default 20)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    torch.set_num_threads(args.threads)
    tok = bugfix_gym.build_tokenizer()
    base = cached_base_agent(tok).eval()
    floor_step(base, tok, args.seed)  # warm-up
    wall, diag = reinforce_steps(base, tok, args.steps, args.seed)
    floors = [floor_step(base, tok, args.seed + k) for k in range(5)]
    step = wall / args.steps
    rollout = statistics.median(f[0] for f in floors)
    update = statistics.median(f[1] for f in floors)
    sample = statistics.median(d["rollout"]["sample_s"] for d in diag)
    train = statistics.median(d["train_s"] for d in diag)
    print(f"REINFORCE, 64 envs x 64 episodes per step, torch threads {args.threads}, {args.steps} steps")
    print(f"  per step: {step * 1000:.0f} ms wall (sampling {sample * 1000:.0f} ms, update {train * 1000:.0f} ms, "
          f"median)  ->  80 steps in {80 * step:.1f} s (goal <= 14 s; the book: ~7 s)")
    print(f"  floor: bare rollout {rollout * 1000:.0f} ms + raw forward/backward {update * 1000:.0f} ms "
          f"= {(rollout + update) * 1000:.0f} ms")
    print(f"  step / floor: {step / (rollout + update):.2f}  (goal <= 1.3)")
    return dict(step_s=step, floor_s=rollout + update, ratio=step / (rollout + update))


if __name__ == "__main__":
    main()
