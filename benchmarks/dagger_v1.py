"""DAgger rounds on the BugFix-v1 base agent, judged on the held-out split.

    python benchmarks/dagger_v1.py --rounds 2 --episodes 500 --steps 200

Starts from the recipe's base agent (the scripted debugger behaviour-cloned: built or read from the cache), then
each round plays the current clone on ``--episodes`` train-split one-bug tasks (sampled, under the legal-call
grammar), lets the debugger label every state the clone reached (:mod:`agents.bugfix.dagger_v1`), adds the rows to
the training set (the base agent's demonstrations and every earlier round's rows) and clones ``--steps`` more
steps from the current weights (``--lr``). After the base agent and after each round it reports, on the held-out
split only: the imitation of the debugger's own held-out episodes
(:func:`agents.bugfix.base_agent_v1.imitation_scores`) and the pass rate of play (``--tasks-per-function``
one-bug tasks per function, three sampling seeds, and greedy), and per round how often the clone's calls were the
debugger's. The test split is not read. Writes
``runs/dagger_v1/NAME.json`` and each round's weights beside it (``NAME-round-R.pt``).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2, help="DAgger rounds (default 2)")
    p.add_argument("--episodes", type=int, default=500, help="clone episodes played per round (default 500)")
    p.add_argument("--steps", type=int, default=200, help="cloning steps per round (default 200)")
    p.add_argument("--lr", type=float, default=3e-4, help="the rounds' cloning learning rate (default 3e-4)")
    p.add_argument("--tasks-per-function", type=int, default=4, help="held-out tasks per function (default 4)")
    p.add_argument("--name", default="dagger", help="the output's name under runs/dagger_v1/")
    args = p.parse_args(argv)
    if min(args.rounds, args.episodes, args.steps, args.tasks_per_function) < 1 or not args.lr > 0:
        p.error("--rounds, --episodes, --steps, --lr and --tasks-per-function must be positive")

    import torch

    from agents.algorithms.presets import make_algorithm
    from agents.bugfix import base_agent_v1 as bav1
    from agents.bugfix import dagger_v1 as dagger
    from agents.bugfix.base_agent import progress_bar
    from agents.bugfix.recipe_v1 import RepairRecipeV1
    from agents.bugfix.repair_v1 import policy_kwargs, tasks_per_function
    from agents.bugfix.v1 import evaluate_v1, make_v1_env, play_v1, v1_tokenizer
    from agents.files.checkpoint import save_state_dict_file
    from agents.model.tinyagent import TinyAgentConfig
    from agents.rollout.vec_env import FreshInfoDummyVecEnv
    from bugfix_gym.core.env_v1 import BugFixEnvV1

    torch.set_num_threads(1)
    recipe = RepairRecipeV1()
    tok = v1_tokenizer(recipe.tokenizer)
    config = TinyAgentConfig(vocab_size=tok.vocab_size, **recipe.model_sizes())
    model = bav1.cached_base_agent_v1(tok, config, recipe.base_seed, recipe.base, recipe.max_call_tokens, verbose=1)
    data = bav1.cached_demonstrations(tok, recipe.base, config.max_len, recipe.max_call_tokens)
    data = {k: data[k] for k in ("ids", "owner", "policy_mask")}
    heldout = tasks_per_function("heldout", args.tasks_per_function, 1, seed=0)
    env = BugFixEnvV1(split="heldout", bugs=1, max_turns=recipe.max_turns)
    debugger_play = [ep for ep in (bav1.debugger_episode(env, task, tok, config.max_len, recipe.max_call_tokens)
                                   for task in heldout) if ep is not None]
    venv = FreshInfoDummyVecEnv([lambda: make_v1_env(split="train", max_turns=recipe.max_turns)])
    env_kwargs = dict(max_turns=recipe.max_turns)
    out = Path("runs") / "dagger_v1" / f"{args.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)

    def player() -> Any:
        return make_algorithm("ppo", "TinyAgentPolicy", venv, seed=0, policy_kwargs=policy_kwargs(tok, config),
                              base_agent=copy.deepcopy(model), **recipe.algorithm_settings("ppo"))

    def judged(round_: int, **extra: Any) -> dict[str, Any]:
        algo = player()
        sampled = [evaluate_v1(algo, heldout, 1, seed=s, env_kwargs=env_kwargs)["pass_rate"] for s in (0, 1, 2)]
        greedy = evaluate_v1(algo, heldout, 1, seed=0, env_kwargs=env_kwargs, greedy=True)["pass_rate"]
        return dict(round=round_, heldout_sampled=sampled, heldout_sampled_mean=statistics.mean(sampled),
                    heldout_greedy=greedy, episodes=len(heldout),
                    heldout_imitation=bav1.imitation_scores(model, debugger_play, tok), **extra)

    records = [judged(0, rows=len(data["ids"]))]
    print(json.dumps(records[-1]), flush=True)
    for round_ in range(1, args.rounds + 1):
        started = time.perf_counter()
        tasks = bav1.demonstration_tasks(args.episodes, seed=1000 + round_)  # train split; not the demonstrations'
        trajs = play_v1(player(), tasks, 1, seed=round_, env_kwargs=env_kwargs)
        rows, agreement = dagger.dagger_rows(trajs, tasks, tok, config.max_len, recipe.max_call_tokens,
                                             recipe.max_turns)
        data = dagger.join(data, dagger.stack_rows(rows, tok.pad_id), tok.pad_id)
        played_s = time.perf_counter() - started
        cfg = dataclasses.replace(recipe.base, steps=args.steps, lr=args.lr)
        bav1.clone(model, data, cfg, seed=round_, progress=progress_bar)
        record = judged(round_, rows=len(data["ids"]), clone_agreement=agreement,
                        train_pass_rate=statistics.mean(float(bool(t.info.get("hidden_pass"))) for t in trajs),
                        play_and_label_min=played_s / 60, round_min=(time.perf_counter() - started) / 60)
        records.append(record)
        print(json.dumps(record), flush=True)
        out.write_text(json.dumps(records, indent=1))
        save_state_dict_file(out.with_name(f"{out.stem}-round-{round_}.pt"), model, bav1.BASE_V1_FORMAT)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
