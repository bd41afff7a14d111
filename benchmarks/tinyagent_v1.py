"""TinyAgent on BugFix-v1 from scratch: the legal-call grammar's cost per call, and short TokenPPO runs.

    python benchmarks/tinyagent_v1.py grammar                     # cost per call on train-split states
    python benchmarks/tinyagent_v1.py train --seeds 0 1 2 --iterations 10 --out runs/tinyagent_v1

``grammar``: on train-split tasks (reset, then random legal edits), the time of ``env.legal_calls()``, of
building the turn's table (``LegalCallGrammar.start_for`` on calls it has not seen), and of writing one legal call
token by token (``allowed_tokens`` and ``step`` per token, as the decoder does), plus ``mask_logits`` per written
token (as the trainer does). ``train``: per seed, a random-init TinyAgent trained by TokenPPO on the train split,
saved as ``OUT/seed-S.zip``, then evaluated on one task of each test-split function (8 episodes each, sampled as
in training); one JSON line per seed, then the mean and spread. Torch runs on one thread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.algorithms.callbacks import StopAfterIterations  # noqa: E402
from agents.bugfix.v1 import V1_MAX_CALL_TOKENS, evaluate_v1, new_v1_ppo, split_tasks  # noqa: E402
from agents.decoding.legal_calls import LegalCallGrammar  # noqa: E402
from bugfix_gym.contract.byte_tokenizer import ByteTokenizer  # noqa: E402
from bugfix_gym.core.env_v1 import BugFixEnvV1  # noqa: E402

SIZES = dict(max_len=1024, d_model=64, n_layer=2, n_head=4, d_ff=256)


def grammar_cost(n_states: int, seed: int = 0) -> dict[str, float]:
    """Milliseconds per call of each part of writing a call under the legal-call grammar (means over states)."""
    env, tok, rng = BugFixEnvV1(split="train"), ByteTokenizer(), np.random.default_rng(seed)
    grammar = LegalCallGrammar(tok, V1_MAX_CALL_TOKENS)
    parts: dict[str, list[float]] = {"legal_calls": [], "table": [], "write": [], "mask_logits": []}
    n_calls, tokens = [], []
    for k in range(n_states):
        env.reset(seed=k)
        for _ in range(int(rng.integers(0, 3))):
            edits = [c for c in env.legal_calls() if c.startswith("edit ")]
            if edits:
                env.step(edits[int(rng.integers(len(edits)))])
        t0 = time.perf_counter()
        calls = env.legal_calls()
        t1 = time.perf_counter()
        state = grammar.start_for(calls + [f"read {k}"])  # a list it has not seen: a new table
        t2 = time.perf_counter()
        target, states = tok.encode(calls[int(rng.integers(len(calls)))]) + [tok.eoc_id], []
        for token in target:
            grammar.allowed_tokens(state)
            states.append(state)
            state = grammar.step(state, token)
        t3 = time.perf_counter()
        grammar.mask_logits(torch.zeros(len(states), tok.vocab_size), torch.tensor(states))
        t4 = time.perf_counter()
        for name, dt in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            parts[name].append(1000 * dt)
        n_calls.append(len(calls))
        tokens.append(len(target))
    out = {f"{name}_ms": statistics.mean(v) for name, v in parts.items()}
    return dict(out, states=n_states, legal_calls_mean=statistics.mean(n_calls), legal_calls_max=max(n_calls),
                call_tokens_mean=statistics.mean(tokens))


def train_one(seed: int, iterations: int, n_episodes: int, out: Path) -> dict:
    """One short from-scratch run: train, save, evaluate on the test split."""
    torch.manual_seed(seed)
    start = time.perf_counter()
    model = new_v1_ppo(split="train", n_envs=8, seed=seed, model_sizes=SIZES, n_episodes=n_episodes,
                       batch_size=n_episodes, n_epochs=2, learning_rate=3e-4)
    curve = []
    for _ in range(iterations):
        model.learn(10**9, callback=StopAfterIterations(1), reset_num_timesteps=False)  # one iteration
        curve.append(round(float(model.diagnostics[-1]["rollout"]["reward"]), 3))  # the batch's pass rate
    train_s = time.perf_counter() - start
    path = out / f"seed-{seed}.zip"
    model.save(path)
    stats = evaluate_v1(model, split_tasks("test"), 8, seed=0)
    return dict(seed=seed, iterations=iterations, n_episodes=n_episodes, env_steps=int(model.num_timesteps),
                train_s=round(train_s, 1), train_pass_curve=curve, model=str(path),
                test={k: v for k, v in stats.items() if k != "per_class"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("grammar", "train"))
    parser.add_argument("--states", type=int, default=200)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--n-episodes", type=int, default=32)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "tinyagent_v1")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.what == "grammar":
        print(json.dumps(grammar_cost(args.states)))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    rates = []
    for seed in args.seeds:
        row = train_one(seed, args.iterations, args.n_episodes, args.out)
        rates.append(row["test"]["pass_rate"])
        print(json.dumps(row), flush=True)
    spread = statistics.stdev(rates) if len(rates) > 1 else 0.0
    print(json.dumps(dict(test_pass_rate_mean=statistics.mean(rates), test_pass_rate_sd=spread, seeds=args.seeds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
