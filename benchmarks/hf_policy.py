"""TokenPPO with an HF causal LM (a tiny random-init Llama through agents.model.hf_adapter.HFAgent) against
TokenPPO with a TinyAgent of about the same size, measured side by side in one run on the CPU.

    python benchmarks/hf_policy.py            # 3 repeats of 4 PPO iterations of 16 episodes, 4 envs
    python benchmarks/hf_policy.py --quick    # 1 repeat of 1 iteration of 8 episodes

Both start from random weights (no base agent) with the legal-call grammar, so both write the same kind
of episodes; each repeat builds a fresh model of the same seed. Reported: env steps per second of whole
PPO iterations (sampling + update), the seconds of sampling and of the update per iteration, and the
ratio TinyAgent / HF. Needs ``transformers`` (``make trl-venv``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from stable_baselines3.common.env_util import make_vec_env

import bugfix_gym
from agents.algorithms.callbacks import StopAfterIterations
from agents.algorithms.ppo import TokenPPO


def tiny_llama(vocab_size: int, hidden: int, layers: int, heads: int, max_len: int, seed: int) -> Any:
    """A random-init LlamaForCausalLM, tied embeddings, no dropout, of TinyAgent's default sizes (width, depth,
    heads, MLP width ``4 * hidden``; Llama's gated MLP has 3 matrices where TinyAgent's has 2, and no
    learned positions)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=4 * hidden,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                         max_position_embeddings=max_len, attention_dropout=0.0, tie_word_embeddings=True,
                         bos_token_id=None)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def run(kind: str, iterations: int, episodes: int, envs: int, seed: int) -> dict[str, float]:
    """``iterations`` PPO iterations of a fresh model of ``kind`` (``tiny`` or ``hf``): env steps/s, s/iteration
    sampling and updating, and the parameter count."""
    tok = bugfix_gym.build_tokenizer()
    kwargs: dict[str, Any] = {"call_grammar": list(bugfix_gym.CALLS)}
    if kind == "hf":
        kwargs["model"] = tiny_llama(tok.vocab_size, 64, 2, 4, 512, seed)
    model = TokenPPO("TinyAgentPolicy", make_vec_env("BugFix-v0", n_envs=envs, seed=seed), base_agent=None,
                     policy_kwargs=kwargs, n_episodes=episodes, n_minibatches=4, n_epochs=4, seed=seed,
                     critic_warmup_steps=0, target_kl=None, torch_threads=1)
    start = time.perf_counter()
    model.learn(10**9, callback=StopAfterIterations(iterations))
    wall = time.perf_counter() - start
    sample_s = sum(d["rollout"]["sample_s"] for d in model.diagnostics) / iterations
    train_s = sum(d["train_s"] for d in model.diagnostics) / iterations
    return {"steps_per_s": model.num_timesteps / wall, "sample_s": sample_s, "train_s": train_s,
            "params": float(model.policy.model.num_params())}


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the comparison, print the table, return the medians and the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 repeat of 1 iteration of 8 episodes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--envs", type=int, default=4)
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.iterations, args.episodes = 1, 1, 8
    torch.set_num_threads(1)
    runs: dict[str, list[dict[str, float]]] = {"tiny": [], "hf": []}
    for r in range(args.repeats):
        for kind in runs:  # interleaved, so a slow moment of the machine hits both
            runs[kind].append(run(kind, args.iterations, args.episodes, args.envs, seed=r))
    med = {kind: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for kind, rs in runs.items()}
    print(f"{'':24s}{'TinyAgent':>12s}{'HF Llama':>12s}{'Tiny / HF':>12s}")
    for key, label in (("steps_per_s", "env steps / s"), ("sample_s", "sampling s / iteration"),
                       ("train_s", "update s / iteration"), ("params", "parameters")):
        a, b = med["tiny"][key], med["hf"][key]
        print(f"{label:24s}{a:12.3g}{b:12.3g}{a / b:12.2f}")
    print(f"(median of {args.repeats}; {args.iterations} iterations of {args.episodes} episodes on {args.envs} envs, "
          "1 torch thread, BugFix-v0 with the call grammar)")
    out = {f"{kind}_{k}": v for kind, m in med.items() for k, v in m.items()}
    out["steps_per_s_ratio"] = med["tiny"]["steps_per_s"] / med["hf"]["steps_per_s"]
    return out


if __name__ == "__main__":
    main()
