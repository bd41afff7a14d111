"""Token-level PPO in one file, CleanRL style: the book's chapter 8 from top to bottom.

Sample whole episodes of BugFix-v0 (the project's TinyAgent and episode sampler), freeze
pi_old once, run GAE over the policy tokens only, whiten, then epochs x minibatches of the
clipped surrogate + clipped value loss - entropy bonus, with gradient clipping and a KL early
stop. Every line of PPO maths is in this file; ``agents.TokenPPO`` is the same algorithm
behind Stable-Baselines3's interface (tests/test_single_file.py checks that one update gives
the same loss).

Run: ``python examples/token_ppo_single_file.py [--iterations 30] [--seed 0]`` (writes nothing).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from stable_baselines3.common.env_util import make_vec_env

import bugfix_gym
from agents.bugfix.base_agent import cached_base_agent
from agents.rollout.sampler import EpisodeSampler
from agents.rollout.trajectory import collate


@dataclass
class Args:
    seed: int = 0
    iterations: int = 30  # PPO iterations of n_episodes episodes
    n_envs: int = 64  # envs stepped in lockstep
    n_episodes: int = 64  # at least this many whole episodes per iteration
    lr: float = 1e-3
    n_epochs: int = 4
    n_minibatches: int = 4
    gamma: float = 1.0  # discount per policy token
    gae_lambda: float = 1.0
    clip: float = 0.2  # epsilon of the ratio clip
    vf_clip: float = 0.2  # epsilon of the value clip
    vf_coef: float = 0.5
    ent_coef: float = 0.0
    max_grad_norm: float = 1.0
    target_kl: float = 0.02  # SB3's rule: stop before a minibatch whose KL > 1.5 * target


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float):
    """GAE over policy tokens only: prompt and tool positions carry the next value and advantage
    across them (verl's multi-turn rule). rewards, values, mask [B, T] -> (adv, returns) [B, T]."""
    adv = torch.zeros_like(rewards)
    next_value, last = torch.zeros(len(rewards)), torch.zeros(len(rewards))  # [B]
    for t in reversed(range(rewards.shape[1])):
        on = mask[:, t] > 0
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        a = delta + gamma * lam * last
        next_value, last = torch.where(on, values[:, t], next_value), torch.where(on, a, last)
        adv[:, t] = torch.where(on, a, torch.zeros_like(a))
    return adv, (adv + values) * mask


def score(model, ids: torch.Tensor):
    """One causal pass: ids [B, T] -> log pi(ids[t+1]), V(ids[:t+1]), entropy, each [B, T-1]."""
    logits, values = model(ids)  # [B, T, V], [B, T]
    logp_all = F.log_softmax(logits[:, :-1].float(), dim=-1)  # [B, T-1, V]
    logp = logp_all.gather(-1, ids[:, 1:, None]).squeeze(-1)  # [B, T-1]
    entropy = -(logp_all.exp() * logp_all).sum(-1)  # [B, T-1]
    return logp, values[:, :-1], entropy


def ppo_loss(model, mb: dict, args: Args):
    """The clipped PPO loss of one minibatch of whole trajectories (every mean over policy tokens)."""
    mask = mb["policy_mask"]  # [b, T-1]
    n = mask.sum()
    logp, values, entropy = score(model, mb["ids"])
    log_ratio = logp - mb["old_logp"]
    ratio = log_ratio.exp()  # rho = pi / pi_old per token
    pg = -torch.minimum(ratio * mb["adv"], ratio.clamp(1 - args.clip, 1 + args.clip) * mb["adv"])
    v_clipped = mb["old_values"] + (values - mb["old_values"]).clamp(-args.vf_clip, args.vf_clip)
    v_loss = 0.5 * torch.maximum((values - mb["returns"]) ** 2, (v_clipped - mb["returns"]) ** 2)
    pg_loss, v_loss, ent = (pg * mask).sum() / n, (v_loss * mask).sum() / n, (entropy * mask).sum() / n
    approx_kl = ((ratio - 1 - log_ratio) * mask).sum() / n  # k3 estimate of KL(pi_old || pi)
    return pg_loss + args.vf_coef * v_loss - args.ent_coef * ent, approx_kl.item()


def update(model, optimizer, trajs, args: Args, rng: np.random.Generator) -> dict:
    """One PPO iteration on a batch of trajectories."""
    batch = collate(trajs)  # ids [N, T]; policy_mask, token_rewards [N, T-1]
    mask = batch["policy_mask"]
    with torch.no_grad():  # 1. freeze pi_old ONCE (recomputing it inside the loop makes every ratio 1)
        old_logp, old_values, _ = score(model, batch["ids"])
    adv, returns = gae(batch["token_rewards"], old_values, mask, args.gamma, args.gae_lambda)  # 2. GAE
    m = mask > 0
    adv = torch.where(m, (adv - adv[m].mean()) / (adv[m].std() + 1e-8), torch.zeros_like(adv))  # whiten
    data = dict(ids=batch["ids"], policy_mask=mask, old_logp=old_logp, old_values=old_values, adv=adv,
                returns=returns)
    size = -(-len(trajs) // args.n_minibatches)
    for _ in range(args.n_epochs):  # 3. epochs x shuffled minibatches of whole trajectories
        order = rng.permutation(len(trajs))
        for start in range(0, len(trajs), size):
            idx = torch.as_tensor(order[start: start + size])
            T = int((batch["owner"][idx] > 0).sum(1).max())  # trim the minibatch's shared padding
            mb = {k: v[idx, :T] if k == "ids" else v[idx, : T - 1] for k, v in data.items()}
            loss, kl = ppo_loss(model, mb, args)
            if kl > 1.5 * args.target_kl:
                return {"approx_kl": kl, "stopped": True}
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            optimizer.step()
    return {"approx_kl": kl, "stopped": False}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, value in vars(Args()).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    args = Args(**vars(parser.parse_args(argv)))
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    tok = bugfix_gym.build_tokenizer()
    model = cached_base_agent(tok)  # the behaviour-cloned base agent
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, eps=1e-5)
    env = make_vec_env("BugFix-v0", n_envs=args.n_envs, seed=args.seed)
    sampler = EpisodeSampler(env, tok)
    gen, rng = torch.Generator().manual_seed(args.seed), np.random.default_rng(args.seed)
    start = time.perf_counter()
    for it in range(1, args.iterations + 1):
        trajs = sampler.collect(model, args.n_episodes, generator=gen)  # whole episodes, KV cache, no grad
        stats = update(model, optimizer, trajs, args, rng)
        passed = np.mean([t.info["submitted"] and t.info["hidden_pass"] for t in trajs])
        print(f"iteration {it:3d}  episodes {len(trajs):3d}  pass {passed:.2f}  kl {stats['approx_kl']:.4f}"
              f"{'  (early stop)' if stats['stopped'] else ''}  {time.perf_counter() - start:5.1f} s")


if __name__ == "__main__":
    main()
