"""Ours against the trainer one would pick instead: the ``grpo`` preset (TokenPPO with an HF causal LM as its
policy) and TRL's ``GRPOTrainer`` (``environment_factory=BugFixToolEnv``) on the same tiny causal LM, side by side
in one run on the CPU, one torch thread each.

    python benchmarks/trainers.py --init runs/trl_grpo/sft/model # both from examples/trl_grpo.py's SFT model
    python benchmarks/trainers.py                                # random init (TRL's rollouts then make no call)
    python benchmarks/trainers.py --quick                        # 1 repeat of 2 batches of 8

Both get the same LM weights (``tiny_causal_lm(chat_tokenizer())`` of ``--seed``, or ``--init``'s folder), the
same BugFix train tasks, group size, batch, learning rate, KL coefficient, loss aggregation (``grpo``'s
``seq_mean_token_mean``, TRL's ``loss_type="grpo"``), and update: 4 epochs of 4 minibatches per batch (TRL:
``num_iterations=4``, ``steps_per_generation=4``). They differ in what each trainer is: ours decodes under the
legal-call grammar (every call is one of the env's, ``edit fix_init<|end|>``) with the KV-cached sampler of
``agents.rollout``; TRL samples free text with ``generate`` and parses ``<call>edit op=fix_init</call>`` with the
tokenizer's response template. Reported per trainer: env steps (tool calls played) per second, trained (model)
tokens per second, the pass rate of the first batch and of the last quarter of the batches, the wall time,
and ours / TRL; ``--repeats`` runs both that many times, alternating which goes first (seed ``--seed + r``),
and the table gives the medians (the machine is shared: one trainer's run must not meet the load alone).
Needs .venv-trl (``make trl-venv``); docs/llm_trainers.md has the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from functools import partial
from typing import Any

import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")


def start_model(init: str, seed: int) -> Any:
    """The LM both trainers start from: ``init``'s save_pretrained folder, else a random-init tiny Llama."""
    from bugfix_gym.integrations.hf_model import tiny_causal_lm
    from bugfix_gym.integrations.hf_tokenizer import chat_tokenizer

    if init:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(init, dtype=torch.float32)
    return tiny_causal_lm(chat_tokenizer(), seed=seed)


def run_ours(args: argparse.Namespace) -> dict[str, float]:
    """The ``grpo`` preset with the LM as its policy (our tokenizer: the chat template's ids)."""
    from stable_baselines3.common.env_util import make_vec_env

    import bugfix_gym
    from agents.algorithms.callbacks import StopAfterIterations
    from agents.algorithms.presets import make_algorithm
    from bugfix_gym.integrations.hf_tokenizer import ChatTemplateTokenizer, chat_tokenizer

    model = make_algorithm("grpo", env=make_vec_env("BugFix-v0", n_envs=4, seed=args.seed), base_agent=None,
                           n_episodes=args.batch, group_size=args.group, seed=args.seed, torch_threads=1,
                           learning_rate=args.lr, kl_coef=args.beta, n_epochs=4, n_minibatches=4,
                           policy_kwargs={"model": start_model(args.init, args.seed),
                                          "tokenizer": ChatTemplateTokenizer(chat_tokenizer()),
                                          "call_grammar": list(bugfix_gym.CALLS)})
    start = time.perf_counter()
    model.learn(10**9, callback=StopAfterIterations(args.batches))
    wall = time.perf_counter() - start
    passes = [d["rollout"]["pass_rate"] for d in model.diagnostics]
    return {"wall_s": wall, "episodes": float(sum(d["rollout"]["n_episodes"] for d in model.diagnostics)),
            "env_steps": float(model.num_timesteps),
            "tokens": float(sum(d["policy_tokens"] for d in model.diagnostics)),
            "first_pass": passes[0], "last_pass": statistics.mean(passes[-max(1, len(passes) // 4):])}


def run_trl(args: argparse.Namespace) -> dict[str, float]:
    """TRL's GRPOTrainer with ``environment_factory``: the same LM, tasks, groups, batch and update."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from bugfix_gym.integrations.hf_tokenizer import chat_tokenizer
    from bugfix_gym.integrations.trl import BugFixToolEnv, dataset_rows

    calls: list[int] = []

    class Counted(BugFixToolEnv):
        def _call(self, action: str) -> str:
            calls.append(1)
            return super()._call(action)

    tokenizer = chat_tokenizer()
    rows = dataset_rows("train", n=args.batches * args.batch // args.group + 4, seed=args.seed)
    config = GRPOConfig(output_dir=f"{args.out}/trl", per_device_train_batch_size=args.batch // 4,
                        steps_per_generation=4, num_iterations=4, num_generations=args.group,
                        max_completion_length=128, max_steps=args.batches * 16, learning_rate=args.lr,
                        beta=args.beta, loss_type="grpo", temperature=1.0, top_k=0, lr_scheduler_type="constant",
                        max_tool_calling_iterations=7, save_strategy="no", report_to="none", use_cpu=True,
                        bf16=False, seed=args.seed, logging_steps=16, disable_tqdm=True, log_completions=False)
    lm = start_model(args.init, args.seed)
    lm.save_pretrained(f"{args.out}/start")  # beta > 0: TRL loads its reference model from the path
    lm.config._name_or_path = f"{args.out}/start"
    trainer = GRPOTrainer(model=lm, args=config, processing_class=tokenizer,
                          train_dataset=Dataset.from_list(rows), reward_funcs=[],
                          environment_factory=partial(Counted, show_verdict=False))
    batches: list[dict[str, float]] = []
    original = trainer._generate_and_score_completions

    def counted(inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output = original(inputs)
        mask = output["completion_mask"] * output.get("tool_mask", 1)
        batches.append({"tokens": float(mask.sum()), "episodes": float(len(inputs))})
        return output

    trainer._generate_and_score_completions = counted
    passes: list[float] = []
    get_reward = Counted.get_reward

    def reward(self: BugFixToolEnv) -> float:
        value = get_reward(self)
        passes.append(value)
        return value

    Counted.get_reward = reward  # type: ignore[method-assign]
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    per_batch = [passes[k:k + args.batch] for k in range(0, len(passes), args.batch)]
    means = [statistics.mean(b) for b in per_batch if b]
    return {"wall_s": wall, "episodes": sum(b["episodes"] for b in batches), "env_steps": float(len(calls)),
            "tokens": sum(b["tokens"] for b in batches), "first_pass": means[0],
            "last_pass": statistics.mean(means[-max(1, len(means) // 4):])}


def with_rates(run: dict[str, float]) -> dict[str, float]:
    rates = {"env steps/s": run["env_steps"] / run["wall_s"], "trained tokens/s": run["tokens"] / run["wall_s"]}
    return dict(run, **rates)


def median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def table(ours: dict[str, float], trl: dict[str, float]) -> str:
    rows = [("episodes", "{:.0f}"), ("wall_s", "{:.1f}"), ("env_steps", "{:.0f}"), ("env steps/s", "{:.1f}"),
            ("tokens", "{:.0f}"), ("trained tokens/s", "{:.1f}"), ("first_pass", "{:.3f}"), ("last_pass", "{:.3f}")]
    lines = ["| | ours (grpo preset) | TRL GRPOTrainer | ours / TRL |", "|---|---|---|---|"]
    for key, fmt in rows:
        ratio = f"{ours[key] / trl[key]:.2f}" if trl[key] else "-"
        lines.append(f"| {key} | {fmt.format(ours[key])} | {fmt.format(trl[key])} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> tuple[dict[str, float], dict[str, float]]:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--batches", type=int, default=8, help="GRPO batches (generations) per trainer")
    p.add_argument("--batch", type=int, default=16, help="episodes per batch (a multiple of --group and of 4)")
    p.add_argument("--group", type=int, default=4, help="G, the episodes of one task")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--beta", type=float, default=0.04, help="KL coefficient (the grpo preset's)")
    p.add_argument("--init", default="", help="a save_pretrained model both start from (default: random init)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3, help="runs of each trainer, alternating which goes first")
    p.add_argument("--quick", action="store_true", help="1 repeat of 2 batches of 8")
    p.add_argument("--out", default="runs/bench_trainers", help="where TRL's start model and output go")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.batches, args.batch = 1, 2, 8
    torch.set_num_threads(1)
    runs: dict[str, list[dict[str, float]]] = {"ours": [], "TRL": []}
    seed = args.seed
    for r in range(args.repeats):
        args.seed = seed + r
        for name in (("ours", "TRL") if r % 2 == 0 else ("TRL", "ours")):
            result = with_rates(run_ours(args) if name == "ours" else run_trl(args))
            runs[name].append(result)
            print(f"repeat {r} (seed {args.seed}) {name}: " + ", ".join(f"{k} {v:.3g}" for k, v in result.items()),
                  flush=True)
    ours, trl = median(runs["ours"]), median(runs["TRL"])
    print(f"medians of {args.repeats} repeat(s):")
    print(table(ours, trl))
    return ours, trl


if __name__ == "__main__":
    main()
