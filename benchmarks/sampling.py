"""Sampling throughput of the episode sampler (KV cache) against a raw batched forward and against
re-running the prefix, measured side by side in one run on the same model.

    python benchmarks/sampling.py                 # base agent, batch 64, median of 5 repeats
    python benchmarks/sampling.py --repeats 2 --batch 16 --no-naive

Each repeat times, in turn, on the same tasks and seed:

* **sampling**: policy + tool tokens per second of :meth:`agents.rollout.sampler.EpisodeSampler.play_tasks`
  (one episode of each of ``--batch`` train tasks, lockstep in a ``FreshInfoDummyVecEnv`` of BugFix-v0, KV
  cache, env steps included);
* **full forward**: tokens per second of a no-grad forward over the same episodes, collated
  (non-pad tokens counted; median of 3 passes): what scoring the batch costs, the ceiling for sampling;
* **no cache**: the same sampler with :class:`PrefixRerunAgent`, a TinyAgent whose ``extend``
  re-runs every row's whole prefix for each sampled token (the naive decoder).

* **grammar**: the sampler decoding under the legal-call grammar (as the training recipes do): the
  tokens the grammar forces (a call's ``<eoc>``) take no model call; its **full forward (grammar)**
  is timed over its own episodes;
* **grammar + foresight** (with ``--foresight P``): with :class:`agents.decoding.foresight.Foresight`
  too (before each edit's op, one :meth:`~agents.model.tinyagent.TinyAgent.peek` of every op's continuation).

Printed: sampling / forward for free text and under the grammar (goal >= 0.5), the KV cache's
speed-up over re-running the prefix, and with ``--foresight`` what foresight costs: grammar +
foresight / grammar throughput.

``--env BugFix-v1`` times BugFix-v1 instead (:func:`main_v1`), what the repair recipe samples: its base agent
(its BPE tokenizer, sizes and longest call; ``--v1-agent untrained``: a random-init model of the same, ``byte``:
the random-init byte-level TinyAgent of :func:`agents.bugfix.v1.v1_policy_kwargs`) plays one episode of each of
``--episodes`` train-split tasks (:func:`agents.bugfix.v1.split_tasks`, cycled) in ``--batch`` lockstep envs
(default the recipe's ``n_envs``) under the legal-call grammar, against a padded full forward over the same
episodes and against the trainer's length-sorted chunked forward over them:

    python benchmarks/sampling.py --env BugFix-v1 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Sequence

import torch

import bugfix_gym
from agents.bugfix.base_agent import cached_base_agent
from agents.model.tinyagent import TinyAgent, TinyAgentConfig
from agents.decoding.grammar import CallGrammar
from agents.rollout.sampler import EpisodeSampler
from agents.decoding.foresight import Foresight
from agents.rollout.trajectory import Trajectory, collate
from agents.bugfix.evaluation import task_vec_env
from bugfix_gym.core.env import BugFixEnv


#: foresight's words, as BugFix-v0 advertises them to its agents
WORDS = BugFixEnv.metadata["agent_defaults"]["foresight"]


class PrefixCache:
    """What :class:`PrefixRerunAgent` keeps per row: the tokens so far, no keys or values.

    :param batch_size: rows
    :param max_len: the most tokens a row can hold
    """

    def __init__(self, batch_size: int, max_len: int):
        self.ids = torch.zeros(batch_size, max_len, dtype=torch.long)  # [B, max_len]
        self.lengths = torch.zeros(batch_size, dtype=torch.long)  # [B]; the sampler sets a row to 0 to restart it


class PrefixRerunAgent(TinyAgent):
    """A TinyAgent without a KV cache: every :meth:`extend` runs a full forward over each row's
    whole prefix and reads the logits at its last token (what decoding costs without the cache).

    :param config: the model sizes (copy the weights in with ``load_state_dict``)
    """

    def new_cache(self, batch_size: int, buffers: tuple[torch.Tensor, torch.Tensor] | None = None) -> PrefixCache:
        return PrefixCache(batch_size, self.config.max_len)

    @torch.no_grad()
    def extend(self, ids: torch.Tensor, n_new: torch.Tensor, cache: PrefixCache,  # type: ignore[override]
               last_only: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        if not last_only:
            raise NotImplementedError("PrefixRerunAgent returns the logits at each row's last token only")
        B, S = ids.shape
        pos = cache.lengths[:, None] + torch.arange(S)  # [B, S] position of each new token
        valid = torch.arange(S) < n_new[:, None]  # [B, S]
        cache.ids[valid.nonzero(as_tuple=True)[0], pos[valid]] = ids[valid]
        cache.lengths = cache.lengths + n_new
        P = int(cache.lengths.max())
        logits, values = self(cache.ids[:, :P])  # [B, P, V], [B, P]: the whole prefix again
        last = (cache.lengths - 1).clamp(min=0)  # [B]
        return logits[torch.arange(B), last], values.gather(1, pos.clamp(max=P - 1))  # [B, V], [B, S]


def without_cache(model: TinyAgent) -> PrefixRerunAgent:
    """The same weights in a :class:`PrefixRerunAgent`."""
    naive = PrefixRerunAgent(model.config)
    naive.load_state_dict(model.state_dict())
    return naive.eval()


def generated_tokens(trajs: Sequence[Trajectory]) -> int:
    """Policy + tool tokens (everything but the prompts)."""
    return sum(int((t.owner != bugfix_gym.OWNER_PROMPT).sum()) for t in trajs)


def time_sampling(sampler: EpisodeSampler, model: TinyAgent, tasks: Sequence, seed: int
                  ) -> tuple[list[Trajectory], float]:
    """One episode of each task; returns the episodes and the seconds it took."""
    start = time.perf_counter()
    trajs = sampler.play_tasks(model, tasks, generator=torch.Generator().manual_seed(seed))
    return trajs, time.perf_counter() - start


@torch.no_grad()
def time_forward(model: TinyAgent, ids: torch.Tensor, passes: int = 3, chunk: int | None = None,
                 pad_id: int = 0) -> float:
    """Median seconds of a full no-grad forward over ``ids`` [B, T] (``passes`` timed, after one warm-up); with
    ``chunk``, over length-sorted chunks of that many rows, each trimmed to its longest (as the trainer scores)."""
    lengths = (ids != pad_id).sum(1)  # [B]
    order = torch.argsort(lengths, descending=True).tolist()
    parts = [ids] if chunk is None else [ids[rows, : int(lengths[rows].max())]
                                         for rows in (order[i: i + chunk] for i in range(0, len(order), chunk))]
    for part in parts:
        model(part)
    times = []
    for _ in range(passes):
        start = time.perf_counter()
        for part in parts:
            model(part)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="alternating repeats (default 5)")
    parser.add_argument("--batch", type=int, default=None,
                        help="episodes sampled in lockstep (default 64; BugFix-v1: envs in lockstep, default the "
                             "repair recipe's n_envs)")
    parser.add_argument("--episodes", type=int, default=32,
                        help="BugFix-v1: train-split episodes per repeat, --batch at a time (default 32)")
    parser.add_argument("--v1-agent", choices=("base", "untrained", "byte"), default="base",
                        help="BugFix-v1's model: the repair recipe's base agent (built and cached on first use, "
                             "about 16 min), a random-init model of its sizes and BPE, or the earlier measurement's "
                             "random-init byte-level TinyAgent of v1_policy_kwargs()")
    parser.add_argument("--untrained", action="store_true",
                        help="sample from an untrained TinyAgent (long, invalid calls)")
    parser.add_argument("--no-naive", action="store_true", help="skip the (slow) no-cache path")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--foresight", type=float, default=None, metavar="P",
                        help="also time decoding under the call grammar without and with foresight at P")
    parser.add_argument("--env", choices=("BugFix-v0", "BugFix-v1"), default="BugFix-v0",
                        help="BugFix-v1: the repair recipe's sampling under the legal-call grammar (main_v1)")
    args = parser.parse_args(argv)
    if args.repeats < 1 or (args.batch is not None and args.batch < 1) or args.threads < 1 or args.episodes < 1:
        parser.error("--repeats, --batch, --episodes and --threads must be positive")
    torch.set_num_threads(args.threads)
    if args.env == "BugFix-v1":
        if args.foresight is not None or args.untrained:
            parser.error("--env BugFix-v1 samples under the legal-call grammar (no --foresight); its model is "
                         "chosen with --v1-agent (not --untrained)")
        return main_v1(args)
    args.batch = 64 if args.batch is None else args.batch

    tok = bugfix_gym.build_tokenizer()
    if args.untrained:
        torch.manual_seed(0)
        model, name = TinyAgent(tok.vocab_size), "untrained TinyAgent"
    else:
        model, name = cached_base_agent(tok, seed=0), "base agent"
    model.eval()
    train = bugfix_gym.make_tasks("train")
    tasks = [train[i % len(train)].name for i in range(args.batch)]
    sampler = EpisodeSampler(task_vec_env(args.batch), tok)
    slow_sampler = EpisodeSampler(task_vec_env(args.batch), tok)  # its own: each sampler reuses its cache

    time_sampling(sampler, model, tasks, 999)  # warm-up: env test cache, allocator
    grammar = CallGrammar(tok, bugfix_gym.CALLS)
    grammared = {"grammar": EpisodeSampler(task_vec_env(args.batch), tok, grammar=grammar)}
    if args.foresight is not None:
        grammared["grammar + foresight"] = EpisodeSampler(task_vec_env(args.batch), tok, grammar=grammar,
                                                          foresight=Foresight(grammar, tok, args.foresight, **WORDS))
    rows, tokens = time_repeats(args, model, tasks, sampler, slow_sampler, grammared)
    return report(args, name, rows, tokens, "grammar + foresight" in grammared)


def main_v1(args: argparse.Namespace) -> dict[str, float]:
    """BugFix-v1: legal-call grammar sampling of ``--episodes`` train-split episodes in ``--batch`` lockstep envs,
    against two no-grad forwards over the same episodes: one padded pass (the "raw batched forward", as on v0)
    and the trainer's own, length-sorted chunks of ``forward_chunk`` rows each trimmed to its longest; each repeat
    on the same tasks and seed. Returns ``{"v1_sampling_over_forward": ..., "v1_sampling_over_chunked_forward":
    ...}``."""
    from agents.algorithms.config import PPOConfig
    from agents.bugfix.base_agent_v1 import cached_base_agent_v1
    from agents.bugfix.recipe_v1 import RepairRecipeV1
    from agents.bugfix.v1 import V1_MAX_CALL_TOKENS, make_v1_env, split_tasks, v1_policy_kwargs, v1_tokenizer
    from agents.decoding.legal_calls import LEGAL_CALLS_KEY, LegalCallGrammar
    from agents.rollout.vec_env import FreshInfoDummyVecEnv

    recipe = RepairRecipeV1()
    batch = recipe.n_envs if args.batch is None else args.batch
    torch.manual_seed(0)
    if args.v1_agent == "byte":  # the earlier measurement's model
        kwargs, max_call_tokens = v1_policy_kwargs(), V1_MAX_CALL_TOKENS
        tok = kwargs["tokenizer"]
        model, name = TinyAgent(kwargs["model_config"]), "random-init byte-level TinyAgent (v1_policy_kwargs())"
    else:
        tok, max_call_tokens = v1_tokenizer(recipe.tokenizer), recipe.max_call_tokens
        config = TinyAgentConfig(vocab_size=tok.vocab_size, **recipe.model_sizes())  # as the recipe builds it
        if args.v1_agent == "untrained":
            model, name = TinyAgent(config), "random-init TinyAgent of the repair recipe's sizes"
        else:
            model = cached_base_agent_v1(tok, config, recipe.base_seed, recipe.base, max_call_tokens, verbose=1)
            name = "the repair recipe's base agent"
    model.eval()
    train = split_tasks("train")
    tasks = [train[i % len(train)] for i in range(args.episodes)]
    venv = FreshInfoDummyVecEnv([lambda: make_v1_env(tasks=train) for _ in range(batch)])
    sampler = EpisodeSampler(venv, tok, max_call_tokens=max_call_tokens,
                             grammar=LegalCallGrammar(tok, max_call_tokens), call_mask_key=LEGAL_CALLS_KEY)
    chunk = int(PPOConfig().forward_chunk or args.episodes)
    time_sampling(sampler, model, tasks, 999)  # warm-up: allocator, encodings
    rows: dict[str, list[float]] = {"grammar (v1)": [], "full forward (v1)": [], "chunked forward (v1)": []}
    tokens: dict[str, list[int]] = {k: [] for k in rows}
    for r in range(args.repeats):
        trajs = sample_then_forward(sampler, model, tasks, r, rows, tokens, "grammar (v1)", "full forward (v1)")
        ids = collate(trajs, tok.pad_id)["ids"]  # [B, T]
        real = int((ids != tok.pad_id).sum())
        rows["chunked forward (v1)"].append(real / time_forward(model, ids, chunk=chunk, pad_id=tok.pad_id))
        tokens["chunked forward (v1)"].append(real)
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"\nBugFix-v1, {name}, {args.episodes} episodes in {batch} lockstep envs, {args.repeats} repeats (median), "
          f"torch threads {torch.get_num_threads()}; chunked forward: length-sorted chunks of {chunk} rows")
    print(f"{'path':<24}{'tokens':>9}{'tokens/s':>12}")
    for k, v in med.items():
        print(f"{k:<24}{statistics.median(tokens[k]):>9.0f}{v:>12,.0f}")
    out = {"v1_sampling_over_forward": med["grammar (v1)"] / med["full forward (v1)"],
           "v1_sampling_over_chunked_forward": med["grammar (v1)"] / med["chunked forward (v1)"]}
    print(f"\nv1 grammar sampling / forward throughput: {out['v1_sampling_over_forward']:.2f}  (goal >= 0.5)")
    print(f"v1 grammar sampling / chunked forward throughput: {out['v1_sampling_over_chunked_forward']:.2f}")
    return out


def sample_then_forward(sampler: EpisodeSampler, model: TinyAgent, tasks: Sequence, repeat: int,
                        rows: dict[str, list[float]], tokens: dict[str, list[int]], sampled: str,
                        forward: str | None) -> list[Trajectory]:
    """Time ``sampler`` on ``tasks`` (row ``sampled``), then (unless ``forward`` is None) one no-grad forward over
    the episodes it sampled (row ``forward``): tokens per second into ``rows``, tokens into ``tokens``; return the
    episodes."""
    trajs, dt = time_sampling(sampler, model, tasks, repeat)
    rows[sampled].append(generated_tokens(trajs) / dt)
    tokens[sampled].append(generated_tokens(trajs))
    if forward is not None:
        ids = collate(trajs, sampler.tok.pad_id)["ids"]  # [B, T]
        real = int((ids != sampler.tok.pad_id).sum())
        rows[forward].append(real / time_forward(model, ids))
        tokens[forward].append(real)
    return trajs


def time_repeats(args: argparse.Namespace, model: TinyAgent, tasks: Sequence[str], sampler: EpisodeSampler,
                 slow_sampler: EpisodeSampler, grammared: dict[str, EpisodeSampler]
                 ) -> tuple[dict[str, list[float]], dict[str, list[int]]]:
    """Every path once per repeat, in turn, on the same tasks and seed: tokens per second and tokens, per path."""
    naive = without_cache(model)
    rows: dict[str, list[float]] = {"sampling (KV cache)": [], "full forward": [], "sampling (no cache)": [],
                                    "grammar": [], "full forward (grammar)": [], "grammar + foresight": []}
    tokens: dict[str, list[int]] = {k: [] for k in rows}
    for r in range(args.repeats):
        trajs = sample_then_forward(sampler, model, tasks, r, rows, tokens, "sampling (KV cache)", "full forward")
        if not args.no_naive:
            slow, dt = time_sampling(slow_sampler, naive, tasks, r)
            rows["sampling (no cache)"].append(generated_tokens(slow) / dt)
            tokens["sampling (no cache)"].append(generated_tokens(slow))
            if not all(torch.equal(a.ids, b.ids) for a, b in zip(trajs, slow)):
                print(f"  note: repeat {r}: no-cache samples differ from cached ones (float rounding flipped a draw)")
        for key, decoding in grammared.items():  # the same tasks and seed, in turn
            sample_then_forward(decoding, model, tasks, r, rows, tokens, key,
                                "full forward (grammar)" if key == "grammar" else None)
    return rows, tokens


def report(args: argparse.Namespace, name: str, rows: dict[str, list[float]], tokens: dict[str, list[int]],
           foresight: bool) -> dict[str, float]:
    """Print the medians and the ratios; return the ratios."""
    med = {k: statistics.median(v) for k, v in rows.items() if v}
    print(f"\n{name}, batch {args.batch}, {args.repeats} repeats (median), torch threads {torch.get_num_threads()}")
    print(f"{'path':<24}{'tokens':>9}{'tokens/s':>12}")
    for k, v in med.items():
        print(f"{k:<24}{statistics.median(tokens[k]):>9.0f}{v:>12,.0f}")
    out = {"sampling_over_forward": med["sampling (KV cache)"] / med["full forward"],
           "grammar_over_forward": med["grammar"] / med["full forward (grammar)"]}
    print(f"\nsampling / forward throughput: {out['sampling_over_forward']:.2f}  (goal >= 0.5)")
    print(f"grammar sampling / forward throughput: {out['grammar_over_forward']:.2f}  (goal >= 0.5)")
    if "sampling (no cache)" in med:
        out["cache_speedup"] = med["sampling (KV cache)"] / med["sampling (no cache)"]
        print(f"KV cache speed-up over re-running the prefix: {out['cache_speedup']:.1f}x")
    if foresight:
        out["foresight_over_grammar"] = med["grammar + foresight"] / med["grammar"]
        print(f"grammar + foresight / grammar throughput: {out['foresight_over_grammar']:.2f}")
    return out


if __name__ == "__main__":
    main()
