"""The tools-pay recipe as one script: base agent (behaviour cloning on careful-shape, blind-op play over
generated train tasks), then TokenPPO on a large pool of generated train tasks, then evaluation on the
generator's train / heldout / test templates, the book's held-out split and the hand-written pack.

    .venv/bin/python research/recipe.py --seed 0 --out runs/recipe-s0 [key=value ...]

Every hyperparameter is a field of :class:`Recipe`; ``key=value`` arguments override them (values are
parsed as Python literals). The training budget is CPU seconds of this process (``time.process_time``),
so a loaded shared machine does not shorten the run; wall time is reported too.
"""
from __future__ import annotations

import ast
import dataclasses
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import bugfix_gym as bg  # noqa: E402
from agents.base_agent import make_base_agent  # noqa: E402
from agents.model import TinyAgentConfig  # noqa: E402
from agents.ppo import TokenPPO  # noqa: E402
from agents.rollout import rollout_batch  # noqa: E402
from bugfix_gym.generator import TEMPLATES  # noqa: E402
from bugfix_gym.ops import apply_op  # noqa: E402
from stable_baselines3.common.callbacks import BaseCallback  # noqa: E402


@dataclasses.dataclass
class Recipe:
    # tasks
    pool_size: int = 3000  # generated train tasks the env draws from (fresh names; names are <unk> anyway)
    ambiguous_share: float = 0.0  # part of the pool drawn only from the templates with two plausible defects
    # base agent
    teacher: str = "careful"
    p_read: float = 0.6
    p_test: float = 0.2
    retry_on_no_change: bool = True
    bc_episodes: int = 2000  # demonstrations (one per pool task, the first bc_episodes of the pool)
    bc_steps: int = 600
    bc_batch: int = 32
    bc_lr: float = 3e-3
    # model
    d_model: int = 64
    n_layer: int = 2
    n_head: int = 4
    d_ff: int = 256
    max_len: int = 512
    # PPO
    lr: float = 1e-3
    n_episodes: int = 64
    n_epochs: int = 4
    n_minibatches: int = 4
    gamma: float = 1.0
    gae_lambda: float = 1.0
    clip_range: float = 0.2
    clip_range_high: float | None = None
    ent_coef: float = 0.0
    target_kl: float | None = 0.02
    vf_coef: float = 0.5
    critic_warmup_steps: int = 50
    constrained: bool = True
    invalid_cost: float = 0.0
    call_cost: float = 0.0
    edit_penalty: float = 0.0
    kl_coef: float = 0.0
    blank_tools: bool = False
    book_only: bool = False  # ablation: train (BC and PPO) on the 20 book train tasks only
    # budget
    budget_cpu_s: float = 840.0  # PPO training (the base agent's time is counted separately)
    total_budget_cpu_s: float | None = None  # if set: pool + base agent + PPO (validation evals included) <= this
    max_iterations: int = 100000
    eval_every: int = 20  # iterations between validation evaluations (generated heldout)
    val_n: int = 100


# ---------------------------------------------------------------------- tasks
# train templates whose code carries two defects that both look plausible (reading alone cannot decide)
AMBIGUOUS = ("count_squares_above", "larger_exceeds", "smaller_reaches", "window_max", "capped_sum_upto",
             "count_window_at_least", "rank_from_top", "largest_square_within", "one_below", "count_capped_reaching",
             "sum_window_above")
def template_of(task: bg.Task, split: str) -> str:
    """Which generator template a generated task came from (by the shape of its repaired source)."""
    fixed = _shape(apply_op(task.source, task.fix_op))
    for t in TEMPLATES[split]:
        if _shape(t.source.format_map(_Blank())) == fixed:
            return t.key
    return "?"


class _Blank(dict):
    def __missing__(self, key: str) -> str:
        return f"v_{key}"


def _shape(source: str) -> str:
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            node.id = "_"
        elif isinstance(node, ast.arg):
            node.arg = "_"
        elif isinstance(node, ast.FunctionDef):
            node.name = "_"
    return ast.dump(tree)


def eval_sets(seed: int = 123) -> dict[str, list[bg.Task]]:
    """The evaluation task lists (fixed seeds, disjoint from training pools: train pools use seeds 1000+)."""
    pack = bg.load_task_pack(ROOT / "examples" / "task_pack_example.json")
    return {
        "gen_train": bg.generate_tasks("train", 200, seed=seed),
        "gen_heldout": bg.generate_tasks("heldout", 200, seed=seed),
        "gen_test": bg.generate_tasks("test", 200, seed=seed),
        "book_heldout": [t for t in bg.make_tasks("heldout") for _ in range(16)],
        "pack": [t for t in pack for _ in range(40)],
    }


# ---------------------------------------------------------------------- evaluation
def behaviour(trajs, tasks, split: str | None = None) -> dict[str, Any]:
    """Pass rate and behaviour statistics of sampled episodes."""
    n = len(trajs)
    rows = []
    for tr, task in zip(trajs, tasks):
        info = tr.info
        acts = [a.split() for a in info["actions"]]
        first = [a[0] if a else "" for a in acts]
        passed = bool(info["submitted"] and info["hidden_pass"])
        rows.append(dict(passed=passed, read="read" in first, test="test" in first, revert="revert" in first,
                         edits=len(info["ops"]), first_right=bool(info["ops"]) and info["ops"][0] == task.fix_op,
                         turns=info["n_turns"], invalid=info["n_invalid"], submitted=info["submitted"],
                         template=template_of(task, split) if split else task.name))
    mean = lambda k: sum(r[k] for r in rows) / n  # noqa: E731
    turns = sum(r["turns"] for r in rows)
    out = dict(n=n, pass_rate=mean("passed"), valid_calls=1 - sum(r["invalid"] for r in rows) / max(turns, 1),
               submit_rate=mean("submitted"), read_rate=mean("read"), test_rate=mean("test"),
               revert_rate=mean("revert"), first_edit_right=mean("first_right"), edits_per_episode=mean("edits"),
               turns=turns / n)
    for cond in ("read", "test"):
        sub = [r for r in rows if r[cond]]
        out[f"pass_given_{cond}"] = sum(r["passed"] for r in sub) / len(sub) if sub else float("nan")
        sub = [r for r in rows if not r[cond]]
        out[f"pass_given_no_{cond}"] = sum(r["passed"] for r in sub) / len(sub) if sub else float("nan")
    per = defaultdict(list)
    for r in rows:
        per[r["template"]].append(r["passed"])
    out["per_template"] = {k: round(sum(v) / len(v), 3) for k, v in sorted(per.items())}
    return out


def evaluate(model: TokenPPO, tasks: list[bg.Task], split: str | None, seed: int = 0, env_kwargs=None,
             batch: int = 100) -> dict[str, Any]:
    trajs = []
    gen = torch.Generator().manual_seed(seed)
    for i in range(0, len(tasks), batch):
        chunk = tasks[i:i + batch]
        envs = [bg.BugFixEnv(tasks=[t], **(env_kwargs or {})) for t in chunk]
        trajs += rollout_batch(model.policy.model, envs, chunk, model.policy.tokenizer, generator=gen,
                               grammar=model.policy.grammar, max_call_tokens=model.max_call_tokens)
    return behaviour(trajs, tasks, split)


# ---------------------------------------------------------------------- training
class Monitor(BaseCallback):
    """Stops at the CPU budget; logs each iteration's rollout stats and a periodic validation evaluation."""

    def __init__(self, recipe: Recipe, val_tasks: list[bg.Task], env_kwargs: dict, log: list, t0: float):
        super().__init__()
        self.recipe, self.val_tasks, self.env_kwargs, self.log, self.t0 = recipe, val_tasks, env_kwargs, log, t0
        self.iteration = 0
        self.stop = False
        self.setup_cpu_s = 0.0

    def _on_step(self) -> bool:
        return not self.stop

    def _on_rollout_end(self) -> None:
        self.iteration += 1
        model = self.model
        r = model.diagnostics[-1]["rollout"] if model.diagnostics and "rollout" in model.diagnostics[-1] else {}
        cpu = time.process_time() - self.t0
        entry = dict(iteration=self.iteration, cpu_s=round(cpu, 1), wall_s=round(time.time() - self.wall0, 1),
                     timesteps=model.num_timesteps)
        last = getattr(model, "_last_rollout", None) or {}
        entry.update({k: round(float(v), 4) for k, v in last.items() if isinstance(v, (int, float)) and v is not None})
        if self.iteration % self.recipe.eval_every == 0:
            v = evaluate(model, self.val_tasks, "heldout", seed=7, env_kwargs=self.env_kwargs)
            entry["val"] = {k: round(v[k], 4) for k in ("pass_rate", "valid_calls", "read_rate", "test_rate",
                                                         "first_edit_right")}
            print(json.dumps(entry), flush=True)
        self.log.append(entry)
        budget = self.recipe.budget_cpu_s
        if self.recipe.total_budget_cpu_s is not None:
            budget = self.recipe.total_budget_cpu_s - self.setup_cpu_s
        if cpu >= budget or self.iteration >= self.recipe.max_iterations:
            self.stop = True

    def _on_training_start(self) -> None:
        self.wall0 = time.time()


def run(recipe: Recipe, seed: int, out: Path) -> dict[str, Any]:
    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    tok = bg.fixed_tokenizer()
    env_kwargs = dict(invalid_cost=recipe.invalid_cost, call_cost=recipe.call_cost, blank_tools=recipe.blank_tools,
                      edit_penalty=recipe.edit_penalty)
    t_cpu0, t_wall0 = time.process_time(), time.time()
    if recipe.book_only:
        pool = bg.make_tasks("train")
    else:
        n_amb = int(round(recipe.ambiguous_share * recipe.pool_size))
        pool = bg.generate_tasks("train", recipe.pool_size - n_amb, seed=1000 + seed)
        if n_amb:
            pool += bg.generate_tasks("train", n_amb, seed=1000 + seed, templates=AMBIGUOUS)
            np.random.default_rng(seed).shuffle(pool)
    gen_s = time.process_time() - t_cpu0
    config = TinyAgentConfig(vocab_size=tok.vocab_size, d_model=recipe.d_model, n_layer=recipe.n_layer,
                             n_head=recipe.n_head, d_ff=recipe.d_ff, max_len=recipe.max_len)
    teacher_kwargs = {"careful": dict(p_read=recipe.p_read, p_test=recipe.p_test,
                                      retry_on_no_change=recipe.retry_on_no_change)}
    kinds = tuple(recipe.teacher.split("+"))
    bc_tasks = pool if recipe.book_only else pool[: recipe.bc_episodes]
    per_task = max(1, recipe.bc_episodes // len(bc_tasks))
    t1 = time.process_time()
    # blank_tools: the demonstrations are played in the blanked env too, so the base agent never sees outputs
    base = _make_base(tok, seed, kinds, per_task, recipe, config, bc_tasks, teacher_kwargs, env_kwargs)
    bc_s = time.process_time() - t1
    env = bg.BugFixEnv(tasks=pool, **env_kwargs)
    model = TokenPPO("TinyAgentPolicy", env, base_agent=base, learning_rate=recipe.lr, n_episodes=recipe.n_episodes,
                     n_epochs=recipe.n_epochs, n_minibatches=recipe.n_minibatches, gamma=recipe.gamma,
                     gae_lambda=recipe.gae_lambda, clip_range=recipe.clip_range,
                     clip_range_high=recipe.clip_range_high, ent_coef=recipe.ent_coef, target_kl=recipe.target_kl,
                     vf_coef=recipe.vf_coef, critic_warmup_steps=recipe.critic_warmup_steps, seed=seed,
                     kl_coef=recipe.kl_coef,
                     policy_kwargs=dict(tokenizer=tok, constrained_decoding=recipe.constrained))
    sets = eval_sets()
    val = bg.generate_tasks("heldout", recipe.val_n, seed=77)
    results: dict[str, Any] = dict(recipe=dataclasses.asdict(recipe), seed=seed, gen_cpu_s=round(gen_s, 1),
                                   bc_cpu_s=round(bc_s, 1))
    results["before"] = {k: _brief(evaluate(model, sets[k], _split(k), env_kwargs=env_kwargs))
                         for k in ("gen_train", "gen_heldout", "gen_test")}
    print(json.dumps({"before": results["before"]}), flush=True)
    log: list = []
    t_train = time.process_time()
    w_train = time.time()
    monitor = Monitor(recipe, val, env_kwargs, log, t_train)
    monitor.setup_cpu_s = gen_s + bc_s
    model.learn(10**9, callback=monitor)
    results["train_cpu_s"] = round(time.process_time() - t_train, 1)
    results["train_wall_s"] = round(time.time() - w_train, 1)
    results["iterations"] = monitor.iteration
    results["timesteps"] = model.num_timesteps
    results["after"] = {k: evaluate(model, sets[k], _split(k), env_kwargs=env_kwargs) for k in sets}
    results["total_wall_s"] = round(time.time() - t_wall0, 1)
    model.save(out / "tokenppo.zip")
    (out / "log.json").write_text(json.dumps(log))
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(json.dumps({"after": {k: _brief(v) for k, v in results["after"].items()},
                      "train_cpu_s": results["train_cpu_s"], "train_wall_s": results["train_wall_s"],
                      "iterations": monitor.iteration}), flush=True)
    print(json.dumps({"per_template_test": results["after"]["gen_test"]["per_template"]}), flush=True)
    return results


def _make_base(tok, seed, kinds, per_task, recipe, config, tasks, teacher_kwargs, env_kwargs):
    if not env_kwargs.get("blank_tools"):
        return make_base_agent(tok, seed=seed, kinds=kinds, episodes_per_task=per_task, steps=recipe.bc_steps,
                               batch_size=recipe.bc_batch, lr=recipe.bc_lr, config=config, tasks=tasks,
                               teacher_kwargs=teacher_kwargs)
    import agents.base_agent as ba

    original = ba.BugFixEnv
    ba.BugFixEnv = lambda **kw: original(**kw, blank_tools=True)  # the teacher's episodes, blanked
    try:
        return make_base_agent(tok, seed=seed, kinds=kinds, episodes_per_task=per_task, steps=recipe.bc_steps,
                               batch_size=recipe.bc_batch, lr=recipe.bc_lr, config=config, tasks=tasks,
                               teacher_kwargs=teacher_kwargs)
    finally:
        ba.BugFixEnv = original


def _split(key: str) -> str | None:
    return {"gen_train": "train", "gen_heldout": "heldout", "gen_test": "test"}.get(key)


def _brief(stats: dict[str, Any]) -> dict[str, float]:
    keys = ("pass_rate", "valid_calls", "read_rate", "test_rate", "revert_rate", "first_edit_right",
            "edits_per_episode", "pass_given_read", "pass_given_test")
    return {k: round(float(stats[k]), 3) for k in keys}


def main(argv: list[str]) -> None:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("overrides", nargs="*", help="key=value Recipe fields")
    args = ap.parse_args(argv)
    recipe = Recipe()
    for kv in args.overrides:
        k, v = kv.split("=", 1)
        if not hasattr(recipe, k):
            raise SystemExit(f"unknown recipe field {k!r}")
        try:
            val = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            val = v
        setattr(recipe, k, val)
    print(json.dumps({"recipe": dataclasses.asdict(recipe), "seed": args.seed}), flush=True)
    run(recipe, args.seed, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
