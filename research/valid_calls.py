"""Valid calls under RL (issue 7 item 2): REINFORCE (book §6.7: 80 steps x 64 episodes, Adam 2e-3, EMA
baseline) and TokenPPO (the demo: 30 iterations x 64 episodes) from the book's base agent, on the book's
train split, with and without grammar-constrained decoding and the env's ``invalid_cost``.

    .venv/bin/python research/valid_calls.py --algo reinforce --seeds 0 1 2 --variants free cost grammar

Prints one JSON line per (algo, variant, seed): train / held-out pass, valid calls, the invalid calls
by kind (empty, truncated, revert-with-nothing-to-revert, other), and the tasks whose episodes are all
invalid-call loops.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bugfix_gym as bg  # noqa: E402
from agents.advantages import reward_to_go  # noqa: E402,F401
from agents.grammar import CallGrammar  # noqa: E402
from agents.model import sequence_logp_values_entropy  # noqa: E402
from agents.policies import cached_base_agent  # noqa: E402
from agents.reinforce import Reinforce  # noqa: E402
from agents.losses import reinforce_loss  # noqa: E402
from agents.rollout import collate, rollout_batch, rollout_stats  # noqa: E402

VARIANTS = {"free": dict(), "cost": dict(invalid_cost=0.1), "grammar": dict(grammar=True),
            "grammar+cost": dict(grammar=True, invalid_cost=0.1)}


class GrammarReinforce(Reinforce):
    """The book's REINFORCE step, sampling and scoring under the call grammar when one is given."""

    def __init__(self, *args, grammar: CallGrammar | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.grammar = grammar

    def train_step(self) -> dict:
        if self.baseline is None:
            self._init_baseline()
        idx = torch.randint(len(self.train_tasks), (self.episodes_per_step,), generator=self.generator)
        tasks = [self.train_tasks[i] for i in idx.tolist()]
        envs = [bg.BugFixEnv(**self.env_kwargs) for _ in tasks]
        trajs = rollout_batch(self.model, envs, tasks, self.tok, generator=self.generator, grammar=self.grammar)
        batch = collate(trajs, self.tok.pad_id)
        rewards = batch["rewards"]
        b = self.baseline.value
        adv = rewards - b
        mask = batch["action_mask"]
        if bool((adv[:, None].expand_as(mask) * mask != 0).any()):
            g = () if self.grammar is None else (batch["grammar_state"], self.grammar.allowed)
            logp = sequence_logp_values_entropy(self.model, batch["ids"], None, *g)[0]
            loss = reinforce_loss(logp, adv, mask, self.mode, self.norm_const)
            self.optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
            self.optimizer.step()
        self.baseline.update(rewards)
        s = rollout_stats(trajs)
        rec = dict(step=self.num_steps, reward=rewards.mean().item(), pass_rate=s["pass_rate"],
                   valid_calls=s["valid_calls"])
        self.history.append(rec)
        self.num_steps += 1
        return rec


def invalid_kinds(trajs) -> Counter:
    kinds: Counter = Counter()
    for tr in trajs:
        env = bg.BugFixEnv()
        env.reset(options={"task": tr.task})
        for a in tr.info["actions"]:
            obs, *_, info = env.step(a)
            if info["valid"]:
                continue
            if not a.split():
                kinds["empty"] += 1
            elif obs.endswith("nothing to revert"):
                kinds["revert_nothing"] += 1
            else:
                kinds["malformed"] += 1
    return kinds


def sample(model, tok, tasks, n, seed, grammar, env_kwargs):
    batch = [t for t in tasks for _ in range(n)]
    return rollout_batch(model, [bg.BugFixEnv(**env_kwargs) for _ in batch], batch, tok,
                         generator=torch.Generator().manual_seed(seed), grammar=grammar)


def report(model, tok, grammar, env_kwargs) -> dict:
    out = {}
    for split in ("train", "heldout"):
        trajs = sample(model, tok, bg.make_tasks(split), 16, 1234, grammar, env_kwargs)
        s = rollout_stats(trajs)
        loops = sorted({tr.task for tr in trajs if tr.info["n_invalid"] >= 3})
        out[split] = dict(pass_rate=round(s["pass_rate"], 3), valid_calls=round(s["valid_calls"], 3),
                          submit_rate=round(s["submit_rate"], 3), invalid=dict(invalid_kinds(trajs)),
                          tasks_with_3plus_invalid=loops)
    return out


def run_reinforce(seed, variant, tok, base):
    import copy

    kw = VARIANTS[variant]
    grammar = CallGrammar(tok) if kw.get("grammar") else None
    env_kwargs = {"invalid_cost": kw["invalid_cost"]} if "invalid_cost" in kw else {}
    torch.manual_seed(seed)
    agent = GrammarReinforce(copy.deepcopy(base), tok, episodes_per_step=64, lr=2e-3, seed=seed, eval_every=0,
                             env_kwargs=env_kwargs, grammar=grammar)
    t0 = time.process_time()
    agent.learn(80)
    return dict(cpu_s=round(time.process_time() - t0, 1), **report(agent.model, tok, grammar, env_kwargs))


def run_ppo(seed, variant, tok, base):
    from agents.ppo import TokenPPO

    kw = VARIANTS[variant]
    env_kwargs = {"invalid_cost": kw["invalid_cost"]} if "invalid_cost" in kw else {}
    model = TokenPPO("TinyAgentPolicy", bg.BugFixEnv(**env_kwargs), base_agent=base, seed=seed,
                     policy_kwargs=dict(tokenizer=tok, constrained_decoding=bool(kw.get("grammar"))))
    t0 = time.process_time()
    model.learn(6000)
    return dict(cpu_s=round(time.process_time() - t0, 1),
                **report(model.policy.model, tok, model.policy.grammar, env_kwargs))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--algo", choices=("reinforce", "ppo"), default="reinforce")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    ap.add_argument("--bc-steps", type=int, default=800)
    args = ap.parse_args()
    torch.set_num_threads(1)
    tok = bg.build_tokenizer()
    base = cached_base_agent(tok, seed=0, steps=args.bc_steps) if args.bc_steps != 800 else cached_base_agent(tok)
    print(json.dumps({"base": report(base, tok, None, {})}), flush=True)
    for variant in args.variants:
        for seed in args.seeds:
            fn = run_reinforce if args.algo == "reinforce" else run_ppo
            print(json.dumps(dict(algo=args.algo, variant=variant, seed=seed, bc_steps=args.bc_steps,
                                  **fn(seed, variant, tok, base))), flush=True)


if __name__ == "__main__":
    main()
