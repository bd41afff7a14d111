"""How long, and on how many demonstrations, to clone the BugFix-v1 base agent: judged on the held-out split.

    python benchmarks/base_agent_v1.py --demonstrations 1000 --steps 400 800
    python benchmarks/base_agent_v1.py --demonstrations 4000 --steps 400

Runs the base agent's cloning loop (:func:`agents.bugfix.base_agent_v1.make_base_agent_v1`, the recipe's settings
but ``--demonstrations``) once up to the largest ``--steps``, and at each of them plays the held-out split's
evaluation tasks (4 one-bug tasks per function) with the weights so far: sampled with three seeds, and greedy,
under the legal-call grammar. The test split is not read. Prints one JSON line per checkpoint and writes them to
``runs/base_agent_v1/demonstrations-N.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--demonstrations", type=int, default=None, help="debugger episodes (default: the recipe's)")
    p.add_argument("--steps", type=int, nargs="+", default=None, help="checkpoints (default: the recipe's steps)")
    p.add_argument("--tasks-per-function", type=int, default=4, help="held-out tasks per function")
    args = p.parse_args(argv)
    if any(n < 1 for n in (args.steps or ())) or (args.demonstrations is not None and args.demonstrations < 1):
        p.error("--steps and --demonstrations must be positive")

    import torch

    from agents.algorithms.presets import make_algorithm
    from agents.bugfix import base_agent_v1 as bav1
    from agents.bugfix.recipe_v1 import RepairRecipeV1, with_changes
    from agents.bugfix.repair_v1 import policy_kwargs, tasks_per_function
    from agents.bugfix.v1 import evaluate_v1, make_v1_env, v1_tokenizer
    from agents.model.tinyagent import TinyAgentConfig
    from agents.rollout.vec_env import FreshInfoDummyVecEnv

    torch.set_num_threads(1)
    recipe = RepairRecipeV1()
    if args.demonstrations is not None:
        recipe = with_changes(recipe, base_demonstrations=args.demonstrations)
    checkpoints = sorted(set(args.steps or [recipe.base.steps]))
    cfg = with_changes(recipe, base_steps=checkpoints[-1]).base
    tok = v1_tokenizer(recipe.tokenizer)
    config = TinyAgentConfig(vocab_size=tok.vocab_size, **recipe.model_sizes())
    heldout = tasks_per_function("heldout", args.tasks_per_function, 1, seed=0)
    venv = FreshInfoDummyVecEnv([lambda: make_v1_env(split="train", max_turns=recipe.max_turns)])
    env_kwargs = dict(max_turns=recipe.max_turns)
    out = Path("runs") / "base_agent_v1" / f"demonstrations-{cfg.demonstrations}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"playing {cfg.demonstrations} demonstrations (or reading them from the cache) ...", flush=True)
    started = time.perf_counter()
    bav1.cached_demonstrations(tok, cfg, config.max_len, recipe.max_call_tokens)
    records: list[dict[str, Any]] = []
    losses: list[float] = []
    clone_s = [0.0, time.perf_counter()]  # cloning time so far, when the current stretch began

    def on_step(step: int, model: Any, loss: float) -> None:
        losses.append(loss)
        if step not in checkpoints:
            return
        clone_s[0] += time.perf_counter() - clone_s[1]
        algo = make_algorithm("ppo", "TinyAgentPolicy", venv, seed=0, policy_kwargs=policy_kwargs(tok, config),
                              base_agent=copy.deepcopy(model), **recipe.algorithm_settings("ppo"))
        sampled = [evaluate_v1(algo, heldout, 1, seed=s, env_kwargs=env_kwargs)["pass_rate"] for s in (0, 1, 2)]
        greedy = evaluate_v1(algo, heldout, 1, seed=0, env_kwargs=env_kwargs, greedy=True)["pass_rate"]
        record = dict(demonstrations=cfg.demonstrations, steps=step, loss_last_50=statistics.mean(losses[-50:]),
                      heldout_sampled=sampled, heldout_sampled_mean=statistics.mean(sampled), heldout_greedy=greedy,
                      episodes=len(heldout), cloning_min=clone_s[0] / 60)
        records.append(record)
        print(json.dumps(record), flush=True)
        out.write_text(json.dumps(records, indent=1))
        clone_s[1] = time.perf_counter()

    demos_s = time.perf_counter() - started
    print(f"demonstrations ready in {demos_s / 60:.1f} min; cloning for {checkpoints[-1]} steps", flush=True)
    clone_s[1] = time.perf_counter()
    bav1.make_base_agent_v1(tok, config, recipe.base_seed, cfg, recipe.max_call_tokens, on_step=on_step)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
