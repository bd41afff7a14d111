"""Cost of TokenPPO's update, and TokenPPO vs the naive one-token-per-env-step design, measured side
by side in one run.

    python benchmarks/ppo_update.py            # median of 4, 3 TokenPPO iterations, 1024 naive tokens
    python benchmarks/ppo_update.py --quick    # fewer repetitions, smaller runs

1. **Training-phase overhead.** One PPO iteration's training phase on a 64-episode batch of
   the base agent (collate, freeze pi_old with one no-grad pass, GAE, whitening, 4 epochs x 4
   minibatches of whole trajectories with clipped policy / value losses, entropy, grad clip),
   timed against a raw forward + backward + Adam step of the same model over exactly the same
   minibatches (the layouts TokenPPO drew, the same length-sorted chunks): the floor any trainer
   pays. Two floors: the full LM head at every position (``sequence_log_probs``), and the heads at
   policy positions only (``score_tokens`` with the policy mask, TokenPPO's own scoring).
   Goal: <= 1.5x.
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
import statistics
import time

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from gymnasium import spaces
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.logger import configure

import bugfix_gym
from agents.bugfix.base_agent import cached_base_agent
from agents.algorithms.buffers import TokenRolloutBuffer
from agents.algorithms.callbacks import StopAfterIterations
from agents.model.tinyagent import TinyAgent, score_tokens, sequence_log_probs
from agents.algorithms.ppo import TokenPPO
from bugfix_gym import OWNER_PROMPT, OWNER_TOOL, Tokenizer, build_tokenizer, encode_segment


# ---------------------------------------------------------------------- 1. training-phase overhead
class LayoutRecordingBuffer(TokenRolloutBuffer):
    """A TokenRolloutBuffer that keeps every minibatch layout the trainer draws from it (one per
    epoch), so a reference loop can visit exactly the same minibatches."""

    def reset(self) -> None:
        super().reset()
        self.layouts: list[list[np.ndarray]] = []

    def minibatch_layout(self, batch_size: int | None = None,
                         rng: np.random.Generator | None = None) -> list[np.ndarray]:
        layout = super().minibatch_layout(batch_size, rng)
        self.layouts.append(layout)
        return layout


def chunked_log_probs(net: TinyAgent, ids: torch.Tensor, lengths: torch.Tensor, chunk: int | None) -> torch.Tensor:
    """Full-head log-probs [b, T-1] (``sequence_log_probs``) over the length-sorted chunks TokenPPO scores."""
    if chunk is None or chunk >= len(ids):
        return sequence_log_probs(net, ids)
    order = torch.argsort(lengths, descending=True)  # [b]
    parts = []
    for s in range(0, len(ids), chunk):
        rows = order[s: s + chunk]
        L = max(int(lengths[rows].max()), 2)
        parts.append(F.pad(sequence_log_probs(net, ids[rows, :L]), (0, ids.shape[1] - L)))  # [c, T-1]
    return torch.cat(parts)[torch.argsort(order)]


def raw_update(net: TinyAgent, opt: torch.optim.Optimizer, ids: torch.Tensor, mask: torch.Tensor,
               lengths: torch.Tensor, chunk: int | None, full_head: bool) -> None:
    """One raw step: forward, mean log-prob of the policy tokens, backward, Adam.

    :param ids: [b, T] a minibatch, trimmed to its longest row
    :param mask: [b, T-1] policy mask
    :param lengths: [b] real lengths
    :param chunk: rows per length-sorted chunk (None: one pass)
    :param full_head: LM head at every position (True) or at policy positions only (``score_tokens``)
    """
    if full_head:
        logp = chunked_log_probs(net, ids, lengths, chunk)  # [b, T-1]
    else:
        logp, _, _ = score_tokens(net, ids, mask, lengths=lengths, chunk=chunk)  # [b, T-1], 0 off the mask
    loss = -(logp * mask).sum() / mask.sum()
    opt.zero_grad()
    loss.backward()
    opt.step()


def raw_epochs(base: TinyAgent, buf: LayoutRecordingBuffer, chunk: int | None, full_head: bool) -> float:
    """Seconds of :func:`raw_update` over every minibatch of the layouts ``buf`` recorded."""
    net = copy.deepcopy(base)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    data, lengths = buf.data, buf.lengths
    start = time.perf_counter()
    for layout in buf.layouts:
        for rows in layout:
            idx = torch.as_tensor(rows)
            T = int(lengths[idx].max())
            raw_update(net, opt, data["ids"][idx, :T], data["policy_mask"][idx, : T - 1], lengths[idx], chunk,
                       full_head)
    return time.perf_counter() - start


def training_overhead(base: TinyAgent, tok: Tokenizer, reps: int) -> dict[str, float]:
    env = make_vec_env("BugFix-v0", n_envs=64, seed=0, env_kwargs=dict(render_mode=None))
    model = TokenPPO("TinyAgentPolicy", env, base_agent=base, policy_kwargs=dict(tokenizer=tok), n_episodes=64,
                     n_epochs=4, n_minibatches=4, seed=0, critic_warmup_steps=0, target_kl=None,
                     rollout_buffer_class=LayoutRecordingBuffer)
    model.set_logger(configure(folder=None, format_strings=[]))
    trajs = model.sample_episodes(n=64)[:64]  # the last env step may finish a few more
    state = copy.deepcopy(model.policy.state_dict())
    buf = model.rollout_buffer
    times: dict[str, list[float]] = {"ppo": [], "full": [], "masked": []}
    for _ in range(reps):
        model.policy.load_state_dict(state)
        model.policy.set_training_mode(True)
        start = time.perf_counter()
        buf.reset()
        buf.add(trajs)
        model.train_on_buffer(buf)  # draws its layouts from the model's seeded shuffle, recorded by buf
        times["ppo"].append(time.perf_counter() - start)
        times["full"].append(raw_epochs(base, buf, model.config.forward_chunk, full_head=True))
        times["masked"].append(raw_epochs(base, buf, model.config.forward_chunk, full_head=False))
    med = {k: statistics.median(v) for k, v in times.items()}
    return dict(ppo_s=med["ppo"], full_s=med["full"], masked_s=med["masked"], episodes=buf.size(),
                policy_tokens=buf.n_policy_tokens, tokens=int(buf.lengths.sum()), minibatches=len(buf.layouts[0]),
                epochs=len(buf.layouts))


# ---------------------------------------------------------------------- 2. the naive design
class TokenPerStep(gym.Env):
    """BugFix-v0 where one action is one token (RL4LMs-style): the observation is the padded
    context (token ids), a call is sent to the env at ``<eoc>`` or after ``max_call_tokens``.

    :param tok: the tokenizer
    :param max_len: observation length (the context is cut to its last ``max_len`` tokens)
    :param max_call_tokens: the most tokens one call may have
    """

    def __init__(self, tok: Tokenizer, max_len: int = 256, max_call_tokens: int = 8):
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


def naive_per_token(base: TinyAgent, tok: Tokenizer, n_tokens: int) -> dict[str, float]:
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    env = DummyVecEnv([lambda: TokenPerStep(tok) for _ in range(8)])
    model = PPO("MlpPolicy", env, n_steps=n_tokens // 8, batch_size=64, n_epochs=4, seed=0, device="cpu",
                policy_kwargs=dict(features_extractor_class=make_trunk_extractor(base), net_arch=[],
                                   share_features_extractor=True))
    start = time.perf_counter()
    model.learn(n_tokens)
    return dict(seconds=time.perf_counter() - start, policy_tokens=model.num_timesteps)


class RolloutClock(StopAfterIterations):
    """Stops after ``n_iterations`` and keeps the time each rollout started: the span from the first
    to the last is whole iterations (rollout + SB3 bookkeeping + update), without learn()'s set-up."""

    def __init__(self, n_iterations: int):
        super().__init__(n_iterations)
        self.starts: list[float] = []

    def _on_rollout_start(self) -> None:
        super()._on_rollout_start()
        self.starts.append(time.perf_counter())


def token_ppo_per_token(base: TinyAgent, tok: Tokenizer, iterations: int) -> dict[str, float]:
    """Steady-state TokenPPO: ``iterations`` whole iterations, timed from the first rollout's start to
    the start of the next one after the last update."""
    env = make_vec_env("BugFix-v0", n_envs=64, seed=0, env_kwargs=dict(render_mode=None))
    model = TokenPPO("TinyAgentPolicy", env, base_agent=base, policy_kwargs=dict(tokenizer=tok), n_episodes=64,
                     n_epochs=4, seed=0, critic_warmup_steps=0, target_kl=None)  # all 4 epochs, as the naive run
    clock = RolloutClock(iterations)
    model.learn(10**9, callback=clock)
    return dict(seconds=clock.starts[-1] - clock.starts[0], policy_tokens=model.total_policy_tokens)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, smaller runs")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    tok = build_tokenizer()
    base = cached_base_agent(tok)

    o = training_overhead(base, tok, reps=2 if args.quick else 4)
    print(f"1. one PPO iteration's training phase ({o['episodes']} episodes, {o['epochs']} epochs x "
          f"{o['minibatches']} minibatches, median of {2 if args.quick else 4})")
    print(f"   batch: {o['tokens']} tokens, {o['policy_tokens']} policy tokens")
    print(f"   {'TokenPPO train phase':44s} {o['ppo_s']:8.3f} s")
    print(f"   {'raw fwd+bwd+Adam, full LM head':44s} {o['full_s']:8.3f} s   ratio {o['ppo_s'] / o['full_s']:5.2f}")
    print(f"   {'raw fwd+bwd+Adam, heads at policy positions':44s} {o['masked_s']:8.3f} s   ratio "
          f"{o['ppo_s'] / o['masked_s']:5.2f}   (goal <= 1.5)")

    ours = token_ppo_per_token(base, tok, 2 if args.quick else 3)
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
    return dict(train_over_full=o["ppo_s"] / o["full_s"], train_over_masked=o["ppo_s"] / o["masked_s"],
                speedup=naive_ms / ours_ms)


if __name__ == "__main__":
    main()
