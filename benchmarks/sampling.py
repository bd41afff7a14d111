"""Sampling throughput of TinyAgent rollouts (batch 64, KV cache) against a raw batched forward.

Three numbers, each the median of several repeats in the same run on the same model:

* sampling: policy + tool tokens per second of ``rollout_batch`` (64 lockstep episodes, KV cache,
  env steps included);
* forward: tokens per second of one full forward (no grad) over the same collated batch
  (non-pad tokens counted);
* no cache: ``rollout_batch`` with the KV cache replaced by re-running the whole prefix for every
  sampled token (the naive path), to show what the cache buys.

Goal: sampling / forward >= 0.5.  Usage: ``python benchmarks/sampling.py [--repeats 5] [--untrained]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import bugfix_gym
from agents.model import TinyAgent
from agents.rollout import collate, rollout_batch


class NoCacheAgent:
    """Wraps a TinyAgent so that ``rollout_batch`` re-runs the full prefix at every model call."""

    class _Ids:
        def __init__(self, batch_size: int, max_len: int):
            self.ids = torch.zeros(batch_size, max_len, dtype=torch.long)  # [B, max_len]
            self.lengths = torch.zeros(batch_size, dtype=torch.long)  # [B]

    def __init__(self, model: TinyAgent):
        self.model, self.config, self.tok_emb = model, model.config, model.tok_emb

    @property
    def training(self) -> bool:
        return self.model.training

    def eval(self):
        self.model.eval()
        return self

    def train(self, mode: bool = True):
        self.model.train(mode)
        return self

    def new_cache(self, batch_size: int) -> "NoCacheAgent._Ids":
        return self._Ids(batch_size, self.config.max_len)

    @torch.no_grad()
    def extend(self, ids: torch.Tensor, n_new: torch.Tensor, cache: "NoCacheAgent._Ids", last_only: bool = True):
        B, S = ids.shape
        pos = cache.lengths[:, None] + torch.arange(S)  # [B, S]
        valid = torch.arange(S) < n_new[:, None]  # [B, S]
        cache.ids[valid.nonzero(as_tuple=True)[0], pos[valid]] = ids[valid]
        cache.lengths = cache.lengths + n_new
        P = int(cache.lengths.max())
        logits, values = self.model(cache.ids[:, :P])  # [B, P, V], [B, P]: the whole prefix again
        rows = torch.arange(B)
        last = (cache.lengths - 1).clamp(min=0)  # [B]
        vals = values.gather(1, pos.clamp(max=P - 1))  # [B, S]
        return logits[rows, last], vals


def generated_tokens(trajs) -> int:
    """Policy + tool tokens (everything but the prompts)."""
    return sum(int((t.owner != 1).sum()) for t in trajs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--untrained", action="store_true", help="sample from an untrained TinyAgent (long, invalid calls)")
    parser.add_argument("--no-naive", action="store_true", help="skip the (slow) no-cache path")
    parser.add_argument("--threads", type=int, default=0, help="torch threads for the measurement (0: default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    tok = bugfix_gym.build_tokenizer()
    if args.untrained:
        torch.manual_seed(0)
        model, name = TinyAgent(tok.vocab_size), "untrained TinyAgent"
    else:
        from agents.base_agent import make_base_agent
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # build on one thread (fast for a tiny model); measure with the default
        t0 = time.perf_counter()
        model, name = make_base_agent(tok, seed=0), "base agent"
        print(f"make_base_agent: {time.perf_counter() - t0:.1f} s (1 thread)")
        torch.set_num_threads(threads)
    model.eval()
    train = bugfix_gym.make_tasks("train")
    tasks = [train[i % len(train)].name for i in range(args.batch)]

    def sample(agent, seed):
        envs = [bugfix_gym.BugFixEnv() for _ in tasks]
        t0 = time.perf_counter()
        trajs = rollout_batch(agent, envs, tasks, tok, generator=torch.Generator().manual_seed(seed))
        return trajs, time.perf_counter() - t0

    sample(model, 999)  # warm-up: env test cache, allocator
    rows = {"sampling (KV cache)": [], "full forward": [], "sampling (no cache)": []}
    tokens = {k: [] for k in rows}
    for r in range(args.repeats):
        trajs, dt = sample(model, r)
        rows["sampling (KV cache)"].append(generated_tokens(trajs) / dt)
        tokens["sampling (KV cache)"].append(generated_tokens(trajs))
        ids = collate(trajs, tok.pad_id)["ids"]  # [B, T]
        real = int((ids != tok.pad_id).sum())
        with torch.no_grad():
            model(ids)
            t0 = time.perf_counter()
            model(ids)
            dt = time.perf_counter() - t0
        rows["full forward"].append(real / dt)
        tokens["full forward"].append(real)
        if not args.no_naive:
            naive, dt = sample(NoCacheAgent(model), r)
            same = all(torch.equal(a.ids, b.ids) for a, b in zip(trajs, naive))
            rows["sampling (no cache)"].append(generated_tokens(naive) / dt)
            tokens["sampling (no cache)"].append(generated_tokens(naive))
            if not same:
                print(f"  note: repeat {r}: no-cache samples differ from cached ones (float rounding flipped a draw)")
    print(f"\n{name}, batch {args.batch}, {args.repeats} repeats (median), torch threads {torch.get_num_threads()}")
    print(f"{'path':<22}{'tokens':>9}{'tokens/s':>12}")
    med = {k: statistics.median(v) for k, v in rows.items() if v}
    for k, v in med.items():
        print(f"{k:<22}{statistics.median(tokens[k]):>9.0f}{v:>12,.0f}")
    print(f"\nsampling / forward throughput: {med['sampling (KV cache)'] / med['full forward']:.2f}  (goal >= 0.5)")
    if "sampling (no cache)" in med:
        print(f"KV cache speed-up over re-running the prefix: {med['sampling (KV cache)'] / med['sampling (no cache)']:.1f}x")


if __name__ == "__main__":
    main()
