"""CleanRL-style masked PPO on BugFix-v0, in one file: torch + gymnasium, nothing else.

Reads top to bottom like CleanRL's ``ppo.py``: a vector env, an agent (actor and critic
MLPs over the token view), rollouts into fixed tensors, GAE, then epochs x minibatches of
the clipped objective. One change for this env: invalid calls are masked, the logits of
calls with ``action_mask == False`` set to the lowest float, in sampling and in the update
alike (Huang & Ontanon 2020, "A Closer Look at Invalid Action Masking").

    python examples/cleanrl_ppo.py [--total-steps 20000] [--seed 0]

Prints the pass rate before -> after (sampled, masked actions; 200 seeded episodes of each
split) and keeps it in ``runs/interop/cleanrl_ppo.json`` (the only file it writes).
Figures are in docs/interop.md.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical

import bugfix_gym  # noqa: F401  (registers BugFix-v0 and its views)


@dataclass
class Args:
    seed: int = 0
    total_steps: int = 20_000
    num_envs: int = 8
    num_steps: int = 128  # steps per env per rollout
    max_len: int = 128  # token-view length
    lr: float = 3e-4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    update_epochs: int = 10
    minibatch_size: int = 256
    clip_coef: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5


def obs_tensor(obs: dict[str, np.ndarray]) -> torch.Tensor:
    """Token ids then owner codes, as floats: [N, 2 * max_len]."""
    return torch.cat([torch.as_tensor(obs["ids"]), torch.as_tensor(obs["owner"])], dim=-1).float()


class Agent(nn.Module):
    def __init__(self, max_len: int, n_calls: int, hidden: int = 64):
        super().__init__()
        self.actor = nn.Sequential(nn.Linear(2 * max_len, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                   nn.Linear(hidden, n_calls))
        self.critic = nn.Sequential(nn.Linear(2 * max_len, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                    nn.Linear(hidden, 1))

    def value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x).squeeze(-1)  # [N]

    def dist(self, x: torch.Tensor, mask: torch.Tensor) -> Categorical:
        logits = self.actor(x)  # [N, 9]
        return Categorical(logits=logits.masked_fill(~mask, torch.finfo(logits.dtype).min))


def pass_rate(agent: Agent, split: str, max_len: int, episodes: int = 200, seed: int = 10_000) -> float:
    """Sampled, masked actions on ``episodes`` seeded episodes -> fraction that pass."""
    env = gym.make("BugFixCalls-v0", split=split, max_len=max_len)
    passed = 0
    for k in range(episodes):
        obs, info = env.reset(seed=seed + k)
        done = False
        while not done:
            with torch.no_grad():
                call = agent.dist(obs_tensor(obs)[None], torch.as_tensor(obs["action_mask"])[None]).sample()
            obs, _, terminated, truncated, info = env.step(int(call))
            done = terminated or truncated
        passed += bool(info["submitted"] and info["hidden_pass"])
    return passed / episodes


def main(args: Args) -> None:
    torch.set_num_threads(int(os.environ.get("BUGFIX_THREADS", "1")))
    torch.manual_seed(args.seed)
    envs = gym.make_vec("BugFixCalls-v0", num_envs=args.num_envs, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}, max_len=args.max_len)
    n_calls = int(envs.single_action_space.n)
    agent = Agent(args.max_len, n_calls)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.lr, eps=1e-5)
    before = {split: pass_rate(agent, split, args.max_len) for split in ("train", "heldout")}

    # rollout storage: [T, N, ...]
    T, N = args.num_steps, args.num_envs
    obs_buf = torch.zeros(T, N, 2 * args.max_len)
    mask_buf = torch.zeros(T, N, n_calls, dtype=torch.bool)
    actions = torch.zeros(T, N, dtype=torch.long)
    old_logp = torch.zeros(T, N)
    rewards = torch.zeros(T, N)
    dones = torch.zeros(T, N)
    values = torch.zeros(T, N)

    start = time.perf_counter()
    obs, _ = envs.reset(seed=args.seed)
    next_x, next_mask = obs_tensor(obs), torch.as_tensor(obs["action_mask"])
    next_done = torch.zeros(N)
    n_updates = args.total_steps // (T * N) + (args.total_steps % (T * N) > 0)
    for update in range(n_updates):
        # 1. collect T steps in each of N envs with the current policy (pi_old)
        for t in range(T):
            obs_buf[t], mask_buf[t], dones[t] = next_x, next_mask, next_done
            with torch.no_grad():
                dist = agent.dist(next_x, next_mask)
                action = dist.sample()  # [N]
                old_logp[t], values[t] = dist.log_prob(action), agent.value(next_x)
            actions[t] = action
            obs, reward, terminated, truncated, _ = envs.step(action.numpy())
            rewards[t] = torch.as_tensor(reward, dtype=torch.float32)
            # SAME_STEP autoreset: obs is already the next episode's first obs where an episode ended
            next_x, next_mask = obs_tensor(obs), torch.as_tensor(obs["action_mask"])
            next_done = torch.as_tensor(np.logical_or(terminated, truncated), dtype=torch.float32)

        # 2. GAE (Schulman et al. 2016): delta_t = r_t + gamma V(s_t+1)(1 - done_t+1) - V(s_t)
        with torch.no_grad():
            next_value = agent.value(next_x)
            adv = torch.zeros(T, N)
            last = torch.zeros(N)
            for t in reversed(range(T)):
                not_done = 1.0 - (next_done if t == T - 1 else dones[t + 1])
                v_next = next_value if t == T - 1 else values[t + 1]
                delta = rewards[t] + args.gamma * v_next * not_done - values[t]
                last = delta + args.gamma * args.gae_lambda * not_done * last
                adv[t] = last
            returns = adv + values

        # 3. epochs x minibatches of the clipped surrogate (Schulman et al. 2017, eq. 7)
        b_x, b_mask = obs_buf.reshape(T * N, -1), mask_buf.reshape(T * N, -1)
        b_act, b_logp, b_adv = actions.reshape(-1), old_logp.reshape(-1), adv.reshape(-1)
        b_ret = returns.reshape(-1)
        for epoch in range(args.update_epochs):
            for idx in torch.randperm(T * N).split(args.minibatch_size):
                dist = agent.dist(b_x[idx], b_mask[idx])
                logp = dist.log_prob(b_act[idx])
                ratio = (logp - b_logp[idx]).exp()
                mb_adv = (b_adv[idx] - b_adv[idx].mean()) / (b_adv[idx].std() + 1e-8)
                clipped = ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)
                pg_loss = torch.max(-mb_adv * ratio, -mb_adv * clipped).mean()
                v_loss = 0.5 * ((agent.value(b_x[idx]) - b_ret[idx]) ** 2).mean()
                loss = pg_loss - args.ent_coef * dist.entropy().mean() + args.vf_coef * v_loss
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
    seconds = time.perf_counter() - start
    envs.close()

    steps = n_updates * T * N
    after = {split: pass_rate(agent, split, args.max_len) for split in ("train", "heldout")}
    print(f"cleanrl_ppo: {steps} env steps in {seconds:.0f} s")
    print(f"{'split':<8} {'pass before':>12} {'pass after':>11}")
    for split in ("train", "heldout"):
        print(f"{split:<8} {before[split]:12.3f} {after[split]:11.3f}")
    out = Path("runs") / "interop"
    out.mkdir(parents=True, exist_ok=True)
    (out / "cleanrl_ppo.json").write_text(json.dumps(
        {"example": "cleanrl_ppo", "env_steps": steps, "train_seconds": round(seconds, 1), "before": before,
         "after": after, "args": asdict(args)}, indent=2) + "\n")


if __name__ == "__main__":  # vectorization_mode="async" starts worker processes: keep this guard
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-steps", type=int, default=Args.total_steps)
    parser.add_argument("--seed", type=int, default=Args.seed)
    cli = parser.parse_args()
    main(Args(seed=cli.seed, total_steps=cli.total_steps))
