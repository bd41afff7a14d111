"""Cost of TokenPPO's update, and TokenPPO vs the naive one-token-per-env-step design.

    python benchmarks/ppo_update.py            # ~1-2 minutes on a 2-core laptop
    python benchmarks/ppo_update.py --quick    # fewer repetitions

1. **Training-phase overhead.** One PPO iteration's training phase on a 64-episode batch of
   the base agent (freeze pi_old with one forward, GAE, whitening, 4 epochs x 4 minibatches
   of whole trajectories with clipped policy / value losses, entropy, grad clip), timed
   against a raw forward + backward + Adam step of the same model over exactly the same
   minibatches (same trajectories, scored in the same length-sorted chunks): the floor any
   trainer pays. Goal <= 1.5.
2. **Token-level vs token-per-step.** The design RL4LMs uses: every generated token is one
   environment step of a gym env whose observation is the padded context, trained by stock
   SB3 ``PPO`` with the same TinyAgent trunk as features extractor. Each token then costs a
   full forward over its context when sampled and another forward + backward per epoch when
   trained, where TokenPPO pays one cached decoding step and one shared forward + backward
   per *episode*. Both run 4 epochs; we report wall time per trained policy token (sampling
   + training) side by side. Goal: TokenPPO >= 10x faster.
"""

from __future__ import annotations

import argparse
import copy
import time
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from gymnasium import spaces

import bugfix_gym
from agents.model import TinyAgent, sequence_log_probs
from agents.policies import cached_base_agent
from agents.ppo import TokenPPO
from bugfix_gym import OWNER_POLICY, OWNER_PROMPT, OWNER_TOOL, build_tokenizer, encode_segment


# ---------------------------------------------------------------------- 1. training-phase overhead
def raw_log_probs(net: TinyAgent, ids: torch.Tensor, owner: torch.Tensor, chunk: int | None) -> torch.Tensor:
    """Log-probs [b, T-1] from plain forwards over the same length-sorted chunks TokenPPO scores."""
    if chunk is None or chunk >= len(ids):
        return sequence_log_probs(net, ids)
    lengths = (owner > 0).sum(1)
    order = torch.argsort(lengths, descending=True)
    parts = []
    for s in range(0, len(ids), chunk):
        rows = order[s: s + chunk]
        L = max(int(lengths[rows].max()), 2)
        parts.append(torch.nn.functional.pad(sequence_log_probs(net, ids[rows, :L]), (0, ids.shape[1] - L)))
    return torch.cat(parts)[torch.argsort(order)]


def training_overhead(base: TinyAgent, reps: int) -> dict[str, float]:
    model = TokenPPO("TinyAgentPolicy", gym.make("BugFix-v0"), base_agent=base, n_episodes=64, n_epochs=4,
                     n_minibatches=4, seed=0, critic_warmup_steps=0, target_kl=None)
    trajs = model.sample_episodes()
    state = copy.deepcopy(model.policy.state_dict())

    # the exact minibatches TokenPPO will use: record the index sets it draws
    buf = model.rollout_buffer_class(len(trajs), model.observation_space, model.action_space,
                                     **model.rollout_buffer_kwargs)
    buf.add(trajs)
    ppo_s, raw_s = [], []
    for r in range(reps):
        model.policy.load_state_dict(state)
        np.random.seed(r)
        t = time.perf_counter()
        model.train_on_batch(trajs)
        ppo_s.append(time.perf_counter() - t)

        # raw reference: forward + backward + Adam step over the same minibatches
        np.random.seed(r)
        net = copy.deepcopy(base)
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        lengths = buf.lengths
        t = time.perf_counter()
        for _ in range(model.n_epochs):
            perm = np.random.permutation(len(trajs))
            for s in range(0, len(trajs), model.batch_size):
                idx = torch.as_tensor(perm[s: s + model.batch_size])
                T = int(lengths[idx].max())
                ids = buf.data["ids"][idx, :T]
                mask = buf.data["action_mask"][idx, : T - 1]
                logp = raw_log_probs(net, ids, buf.data["owner"][idx, :T], model.forward_chunk)
                loss = -(logp * mask).sum() / mask.sum()
                opt.zero_grad()
                loss.backward()
                opt.step()
        raw_s.append(time.perf_counter() - t)
    ppo, raw = float(np.median(ppo_s)), float(np.median(raw_s))
    return dict(ppo_s=ppo, raw_s=raw, ratio=ppo / raw, policy_tokens=buf.n_policy_tokens,
                tokens=int(buf.lengths.sum()))


# ---------------------------------------------------------------------- 2. the naive design
class TokenPerStep(gym.Env):
    """BugFix-v0 where one action is one token (RL4LMs-style): the observation is the padded
    context (token ids), a call is sent to the env at ``<eoc>`` or after ``max_call_tokens``."""

    def __init__(self, tok, max_len: int = 256, max_call_tokens: int = 8):
        self.env = bugfix_gym.BugFixEnv()
        self.tok, self.max_len, self.max_call_tokens = tok, max_len, max_call_tokens
        self.observation_space = spaces.Box(0, tok.vocab_size - 1, (max_len,), dtype=np.int64)
        self.action_space = spaces.Discrete(tok.vocab_size)

    def _obs(self) -> np.ndarray:
        out = np.full(self.max_len, self.tok.pad_id, dtype=np.int64)
        ctx = self.ids[-self.max_len:]
        out[: len(ctx)] = ctx
        return out

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        obs, info = self.env.reset(seed=seed, options=options)
        self.ids = encode_segment(self.tok, OWNER_PROMPT, obs)
        self.call: list[int] = []
        return self._obs(), {}

    def step(self, action):
        t = int(action)
        self.ids.append(t)
        self.call.append(t)
        if t != self.tok.eoc_id and len(self.call) < self.max_call_tokens:
            return self._obs(), 0.0, False, False, {}
        obs, reward, terminated, truncated, info = self.env.step(self.tok.decode(self.call))
        self.call = []
        self.ids += encode_segment(self.tok, OWNER_TOOL, obs)
        if len(self.ids) + self.max_call_tokens > self.max_len:
            truncated = True
        return self._obs(), float(reward), terminated, truncated, {}


def make_trunk_extractor(base: TinyAgent):
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor

    class TinyAgentTrunk(BaseFeaturesExtractor):
        """The TinyAgent's transformer; features = hidden state at the last real token."""

        def __init__(self, observation_space: spaces.Box, pad_id: int = 0):
            super().__init__(observation_space, features_dim=base.config.d_model)
            self.net = copy.deepcopy(base)
            self.pad_id = pad_id

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            ids = obs.long()  # [B, max_len]
            lengths = (ids != self.pad_id).sum(1).clamp(min=1)  # [B]
            T = int(lengths.max())  # trim the shared padding (fair to the naive design)
            ids = ids[:, :T]
            h = self.net.ln_f(self.net.trunk(ids))  # [B, T, C]
            return h[torch.arange(len(ids)), lengths - 1]  # [B, C]

    return TinyAgentTrunk


def naive_per_token(base: TinyAgent, tok, n_tokens: int) -> dict[str, float]:
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    env = DummyVecEnv([lambda: TokenPerStep(tok) for _ in range(8)])
    model = PPO("MlpPolicy", env, n_steps=n_tokens // 8, batch_size=64, n_epochs=4, seed=0, device="cpu",
                policy_kwargs=dict(features_extractor_class=make_trunk_extractor(base), net_arch=[],
                                   share_features_extractor=True))
    t = time.perf_counter()
    model.learn(n_tokens)
    return dict(seconds=time.perf_counter() - t, policy_tokens=model.num_timesteps)


def token_ppo_per_token(base: TinyAgent, iterations: int) -> dict[str, float]:
    model = TokenPPO("TinyAgentPolicy", gym.make("BugFix-v0"), base_agent=base, n_episodes=64, n_epochs=4, seed=0,
                     critic_warmup_steps=0, target_kl=None)  # all 4 epochs, as the naive run
    t = time.perf_counter()
    while len(model.diagnostics) < iterations:
        model.learn(1, reset_num_timesteps=False)
    return dict(seconds=time.perf_counter() - t, policy_tokens=model.total_policy_tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tok = build_tokenizer()
    base = cached_base_agent(tok)

    o = training_overhead(base, reps=2 if args.quick else 4)
    print("1. one PPO iteration's training phase (64 episodes, 4 epochs x 4 minibatches)")
    print(f"   batch: {o['tokens']} tokens, {o['policy_tokens']} policy tokens")
    print(f"   {'TokenPPO train phase':34s} {o['ppo_s']:8.3f} s")
    print(f"   {'raw fwd+bwd+Adam, same minibatches':34s} {o['raw_s']:8.3f} s")
    print(f"   {'ratio (goal <= 1.5)':34s} {o['ratio']:8.2f}")

    n_iter = 2 if args.quick else 3
    ours = token_ppo_per_token(base, n_iter)
    naive = naive_per_token(base, tok, 512 if args.quick else 1024)
    ours_ms = 1e3 * ours["seconds"] / ours["policy_tokens"]
    naive_ms = 1e3 * naive["seconds"] / naive["policy_tokens"]
    print("\n2. sampling + training, per trained policy token (4 epochs each)")
    print(f"   {'design':44s} {'policy tokens':>14s} {'seconds':>9s} {'ms / token':>11s}")
    print(f"   {'TokenPPO (whole trajectories, KV cache)':44s} {ours['policy_tokens']:14d} {ours['seconds']:9.2f} "
          f"{ours_ms:11.3f}")
    print(f"   {'SB3 PPO over one-token-per-step env':44s} {naive['policy_tokens']:14d} {naive['seconds']:9.2f} "
          f"{naive_ms:11.3f}")
    print(f"   {'speed-up (goal >= 10x)':44s} {'':14s} {'':9s} {naive_ms / ours_ms:10.1f}x")


if __name__ == "__main__":
    main()
