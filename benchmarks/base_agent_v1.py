"""How long, on how many demonstrations and at what size to clone the BugFix-v1 base agent: judged on the
held-out split.

    python benchmarks/base_agent_v1.py --demonstrations 1000 --steps 400 800
    python benchmarks/base_agent_v1.py --demonstrations 4000 --steps 400 800 1200
    python benchmarks/base_agent_v1.py --demonstrations 4000 --steps 300 600 \
        --d-model 192 --n-layer 4 --n-head 6 --d-ff 576
    python benchmarks/base_agent_v1.py --demonstrations 4000 --steps 400 --weight-decay 0.1 --cosine

Runs the base agent's cloning loop (:func:`agents.bugfix.base_agent_v1.make_base_agent_v1`, the recipe's settings
but the flags) once up to the largest ``--steps``, and at each of them, with the weights so far:

* plays the held-out split's evaluation tasks (4 one-bug tasks per function): sampled with three seeds, and greedy,
  under the legal-call grammar;
* scores the imitation of the scripted debugger's own episodes on the same held-out tasks
  (:func:`agents.bugfix.base_agent_v1.imitation_scores`: loss per call token, and how often the argmax is the
  debugger's call and its edit's site), a measure with far less noise than 127 played episodes.

The test split is not read. Prints one JSON line per checkpoint and writes them to ``runs/base_agent_v1/NAME.json``
(``--name``; ``demonstrations-N`` by default), with each checkpoint's weights beside it (``NAME-step-S.pt``).
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
    for size in ("d_model", "n_layer", "n_head", "d_ff"):
        p.add_argument(f"--{size.replace('_', '-')}", type=int, default=None, help=f"TinyAgent's {size} "
                       "(default: the recipe's)")
    p.add_argument("--weight-decay", type=float, default=None, help="AdamW's weight decay (default: the recipe's)")
    p.add_argument("--cosine", action="store_true", help="decay the learning rate to 0 over the largest --steps "
                   "(earlier checkpoints are then mid-schedule)")
    p.add_argument("--name", default=None, help="the output's name under runs/base_agent_v1/")
    args = p.parse_args(argv)
    sizes = {k: getattr(args, k) for k in ("d_model", "n_layer", "n_head", "d_ff") if getattr(args, k) is not None}
    if (any(n < 1 for n in (args.steps or ())) or (args.demonstrations is not None and args.demonstrations < 1)
            or any(n < 1 for n in sizes.values())):
        p.error("--steps, --demonstrations and the model sizes must be positive")

    import torch

    from agents.algorithms.presets import make_algorithm
    from agents.bugfix import base_agent_v1 as bav1
    from agents.bugfix.recipe_v1 import RepairRecipeV1, with_changes
    from agents.bugfix.repair_v1 import policy_kwargs, tasks_per_function
    from agents.bugfix.v1 import evaluate_v1, make_v1_env, v1_tokenizer
    from agents.files.checkpoint import save_state_dict_file
    from agents.model.tinyagent import TinyAgent, TinyAgentConfig
    from agents.rollout.vec_env import FreshInfoDummyVecEnv
    from bugfix_gym.core.env_v1 import BugFixEnvV1

    torch.set_num_threads(1)
    recipe = RepairRecipeV1()
    cloning = dict(base_demonstrations=args.demonstrations, base_weight_decay=args.weight_decay,
                   base_cosine=args.cosine or None)
    try:
        recipe = with_changes(recipe, **sizes, **{k: v for k, v in cloning.items() if v is not None})
        config = TinyAgentConfig(vocab_size=v1_tokenizer(recipe.tokenizer).vocab_size, **recipe.model_sizes())
        TinyAgent(config)
    except ValueError as e:
        p.error(f"bad model sizes or cloning settings ({e})")
    checkpoints = sorted(set(args.steps or [recipe.base.steps]))
    cfg = with_changes(recipe, base_steps=checkpoints[-1]).base
    tok = v1_tokenizer(recipe.tokenizer)
    heldout = tasks_per_function("heldout", args.tasks_per_function, 1, seed=0)
    venv = FreshInfoDummyVecEnv([lambda: make_v1_env(split="train", max_turns=recipe.max_turns)])
    env_kwargs = dict(max_turns=recipe.max_turns)
    out = Path("runs") / "base_agent_v1" / f"{args.name or f'demonstrations-{cfg.demonstrations}'}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"playing {cfg.demonstrations} demonstrations (or reading them from the cache) ...", flush=True)
    started = time.perf_counter()
    bav1.cached_demonstrations(tok, cfg, config.max_len, recipe.max_call_tokens)
    heldout_env = BugFixEnvV1(split="heldout", bugs=1, max_turns=recipe.max_turns)
    played = [bav1.debugger_episode(heldout_env, task, tok, config.max_len, recipe.max_call_tokens) for task in heldout]
    debugger_play = [ep for ep in played if ep is not None]
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
        imitation = bav1.imitation_scores(model, debugger_play, tok)
        record = dict(demonstrations=cfg.demonstrations, steps=step, sizes=recipe.model_sizes(),
                      weight_decay=cfg.weight_decay, cosine=cfg.cosine,
                      parameters=sum(p.numel() for p in model.parameters()), loss_last_50=statistics.mean(losses[-50:]),
                      heldout_sampled=sampled, heldout_sampled_mean=statistics.mean(sampled), heldout_greedy=greedy,
                      episodes=len(heldout), heldout_imitation=imitation, cloning_min=clone_s[0] / 60)
        records.append(record)
        print(json.dumps(record), flush=True)
        out.write_text(json.dumps(records, indent=1))
        save_state_dict_file(out.with_name(f"{out.stem}-step-{step}.pt"), model, bav1.BASE_V1_FORMAT)
        clone_s[1] = time.perf_counter()

    demos_s = time.perf_counter() - started
    print(f"demonstrations ready in {demos_s / 60:.1f} min; cloning for {checkpoints[-1]} steps", flush=True)
    clone_s[1] = time.perf_counter()
    bav1.make_base_agent_v1(tok, config, recipe.base_seed, cfg, recipe.max_call_tokens, on_step=on_step)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
