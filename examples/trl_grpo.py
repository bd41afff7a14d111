"""TRL plays BugFix: a tiny SFT on scripted play, then GRPO with TRL's own trainers, on CPU.

Everything is local: the chat tokenizer is built from BugFix's vocabulary and the model is a random-init
``LlamaForCausalLM`` of ~150k parameters (``bugfix_gym.integrations``). Steps:

1. SFT (``trl.SFTTrainer``) on a scripted policy's play (``--teacher retry``: random ops, another edit or submit
   on a coin flip; ``blind``: one random op, then submit; ``careful``), pre-tokenised the way TRL's tool loop lays
   out an episode (teachers never see the answer);
2. GRPO (``trl.GRPOTrainer``) with ``environment_factory=BugFixToolEnv`` (the default) and a ``-1`` reward for a
   rollout that does not stop (:func:`late_call_penalty`), or with ``--rollout-func``, TRL's other path: our
   token-in, token-out loop returning ``env_mask``; ``submit`` answers ``submitted``
   (``BugFixToolEnv(show_verdict=False)``, whose docstring says why);
3. the train pass rate (sampled play of every train task, ``--eval-episodes`` each) before and after GRPO.

``--dump FILE`` writes the first GRPO batch as a conformance dump (the model turns' ids, the sampler's log-probs,
the rewards) and runs the conformance checks on it with ``strict``. The GRPO model is saved with
``save_pretrained`` to ``OUT/grpo/model`` (``bugfix-gym serve OUT/grpo/model`` serves it). Training runs in
float32: TRL's configs default to bf16 autocast, and on the CPU the sampler's KV-cached steps and the trainer's
full pass then round differently (``--bf16``; docs/conformance.md). Run in .venv-trl: ``make trl``
(docs/llm_trainers.md has its figures).
"""

from __future__ import annotations

import argparse
import os
import time
from functools import partial

import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--sft-episodes", type=int, default=400, help="scripted episodes to imitate")
    p.add_argument("--sft-epochs", type=float, default=6.0)
    p.add_argument("--teacher", default="retry", choices=("blind", "retry", "careful"),
                   help="the scripted policy imitated (all pick edit ops at random)")
    p.add_argument("--grpo-steps", type=int, default=180)
    p.add_argument("--num-generations", type=int, default=8, help="G, the rollouts of one task")
    p.add_argument("--batch", type=int, default=32, help="rollouts per GRPO step (a multiple of G)")
    p.add_argument("--lr", type=float, default=1e-3, help="GRPO learning rate (constant after the warm-up)")
    p.add_argument("--max-completion-length", type=int, default=128, help="model and tool tokens of one rollout")
    p.add_argument("--num-iterations", type=int, default=1, help="GRPO updates per generated batch")
    p.add_argument("--beta", type=float, default=0.02, help="the KL coefficient (0: no reference model)")
    p.add_argument("--warmup-steps", type=int, default=10, help="GRPO learning-rate warm-up")
    p.add_argument("--stop-penalty", type=float, default=1.0, help="reward subtracted from a rollout that calls a "
                   "tool after its episode ended (environment_factory path)")
    p.add_argument("--mask-truncated", action="store_true", help="leave rollouts cut at --max-completion-length "
                   "out of the loss")
    p.add_argument("--eval-episodes", type=int, default=10, help="sampled episodes per train task, for the pass rate")
    p.add_argument("--rollout-func", action="store_true", help="GRPO through rollout_func (env_mask) instead of "
                   "environment_factory")
    p.add_argument("--dump", default="", help="write the first GRPO batch here (JSON lines) and check it")
    p.add_argument("--time-budget", type=float, default=0.0, help="seconds in all (SFT, GRPO, both evaluations): "
                   "GRPO stops early when what is left would not hold the last evaluation (0: no budget)")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (TRL's default) instead of float32: the "
                   "sampler's and the trainer's log-probs then differ by up to ~0.03 (sampler_matches_trainer)")
    p.add_argument("--init", default="", metavar="DIR", help="start GRPO from this save_pretrained model (e.g. an "
                   "earlier run's OUT/sft/model) instead of running the SFT")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/trl_grpo")
    return p.parse_args(argv)


def sft(model, tokenizer, args) -> None:
    """Imitate the ``--teacher`` scripted policy (blind ops) with TRL's SFTTrainer on pre-tokenised episodes."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from bugfix_gym.integrations.trl import dataset_rows
    from bugfix_gym.integrations.trl_rollout import scripted_sft_rows

    rows = scripted_sft_rows(tokenizer, dataset_rows("train", n=args.sft_episodes, seed=args.seed + 1),
                             seed=args.seed, teacher=args.teacher, show_verdict=False)
    config = SFTConfig(output_dir=f"{args.out}/sft", num_train_epochs=args.sft_epochs, per_device_train_batch_size=16,
                       learning_rate=3e-3, lr_scheduler_type="cosine", logging_steps=20, save_strategy="no",
                       report_to="none", use_cpu=True, seed=args.seed, max_length=None, dataloader_num_workers=0,
                       bf16=args.bf16)
    SFTTrainer(model=model, args=config, train_dataset=Dataset.from_list(rows), processing_class=tokenizer).train()


def train_pass(model, tokenizer, episodes: int, seed: int) -> float:
    """The share of sampled episodes that pass, over every train task ``episodes`` times."""
    from bugfix_gym.integrations.trl import BugFixToolEnv, dataset_rows
    from bugfix_gym.integrations.trl_rollout import play_episode

    torch.manual_seed(seed)
    rows = dataset_rows("train", n=20 * episodes, seed=seed)
    model.eval()
    env = BugFixToolEnv(show_verdict=False)
    return sum(play_episode(model, tokenizer, row, env=env)["reward"] for row in rows) / len(rows)


def grpo_trainer(model, tokenizer, args):
    """TRL's GRPOTrainer on BugFix rows: environment_factory=BugFixToolEnv, or our rollout_func."""
    from datasets import Dataset
    from trl import GRPOConfig

    from bugfix_gym.integrations.trl import BugFixToolEnv, dataset_rows
    from bugfix_gym.integrations.trl_rollout import env_reward, make_rollout_func, rollout_rows

    n_rows = args.grpo_steps * args.batch // args.num_generations + 20
    rows = dataset_rows("train", n=n_rows, seed=args.seed + 2)
    config = GRPOConfig(output_dir=f"{args.out}/grpo", per_device_train_batch_size=args.batch,
                        num_generations=args.num_generations, max_completion_length=args.max_completion_length,
                        max_steps=args.grpo_steps, num_iterations=args.num_iterations, warmup_steps=args.warmup_steps,
                        lr_scheduler_type="constant_with_warmup",
                        mask_truncated_completions=args.mask_truncated, disable_tqdm=True,
                        learning_rate=args.lr, beta=args.beta, temperature=1.0, top_k=0, logging_steps=5,
                        max_tool_calling_iterations=7, save_strategy="no", report_to="none", use_cpu=True,
                        seed=args.seed, log_completions=False, bf16=args.bf16)
    if args.rollout_func:
        rows = rollout_rows(rows)
        return DumpingGRPOTrainer(model=model, args=config, train_dataset=Dataset.from_list(rows),
                                  processing_class=tokenizer, reward_funcs=env_reward,
                                  rollout_func=make_rollout_func(rows, tokenizer), dump=args.dump)
    return DumpingGRPOTrainer(model=model, args=config, train_dataset=Dataset.from_list(rows),
                              processing_class=tokenizer, dump=args.dump,
                              reward_funcs=[late_call_penalty(args.stop_penalty, tokenizer.eos_token_id)],
                              environment_factory=partial(BugFixToolEnv, show_verdict=False))


def late_call_penalty(penalty: float, eos_token_id: int):
    """A reward function: ``-penalty`` for each rollout that did not stop, else 0.

    A rollout did not stop if it called a tool after its episode ended or was cut at the completion budget
    (its last id is not EOS). TRL samples one more model turn after every tool answer, the one that should
    stop; without this term nothing rewards stopping there, and GRPO drifts into rollouts that run on.
    """
    def late_calls(completions: list, environments: list, completion_ids: list, **kwargs) -> list[float]:
        return [-penalty if env.late_calls or not ids or ids[-1] != eos_token_id else 0.0
                for env, ids in zip(environments, completion_ids)]

    return late_calls


def _dumping_trainer_class():
    from trl import GRPOTrainer

    from bugfix_gym.integrations.trl_dump import dump_first_batch

    class Dumping(GRPOTrainer):
        """GRPOTrainer that writes its first generated batch as a conformance dump."""

        def __init__(self, *a, dump: str = "", **kw):
            super().__init__(*a, **kw)
            self.dump, self.dumped = dump, False

        def _generate_and_score_completions(self, inputs):
            if self.dump and not self.dumped:
                self.dumped = True
                return dump_first_batch(self, inputs, super()._generate_and_score_completions, self.dump)
            return super()._generate_and_score_completions(inputs)

    return Dumping


def DumpingGRPOTrainer(*a, **kw):
    return _dumping_trainer_class()(*a, **kw)


def time_budget_callback(deadline: float, reserve: float):
    """A TrainerCallback that stops training once fewer than ``reserve`` seconds are left before ``deadline``.

    :param deadline: the ``time.time()`` by which the whole run must be done
    :param reserve: the seconds kept back for what comes after training (the last evaluation)
    """
    from transformers import TrainerCallback

    class TimeBudget(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if time.time() + reserve >= deadline:
                control.should_training_stop = True
            return control

    return TimeBudget()


def main(argv=None) -> None:
    torch.set_num_threads(1)
    args = parse_args(argv)
    from bugfix_gym.integrations.hf_model import tiny_causal_lm
    from bugfix_gym.integrations.hf_tokenizer import chat_tokenizer

    os.makedirs(args.out, exist_ok=True)
    tokenizer = chat_tokenizer()
    start = time.time()
    if args.init:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(args.init, dtype=torch.float32)
    else:
        model = tiny_causal_lm(tokenizer, seed=args.seed)
        sft(model, tokenizer, args)
    model.save_pretrained(f"{args.out}/sft/model")  # beta > 0: TRL loads its reference model from this path
    model.config._name_or_path = f"{args.out}/sft/model"
    eval_start = time.time()
    before = train_pass(model, tokenizer, args.eval_episodes, seed=args.seed + 10)
    eval_s = time.time() - eval_start
    print(f"after SFT: train pass {before:.3f} ({time.time() - start:.0f} s)", flush=True)
    if args.grpo_steps == 0:
        return
    trainer = grpo_trainer(model, tokenizer, args)
    if args.time_budget > 0:  # the last evaluation plays longer episodes than the first: keep 1.5 times its time
        trainer.add_callback(time_budget_callback(start + args.time_budget, 1.5 * eval_s + 10))
    trainer.train()
    trainer.save_model(f"{args.out}/grpo/model")  # config, model.safetensors, the tokenizer: bugfix-gym serve reads it
    tokenizer.save_pretrained(f"{args.out}/grpo/model")
    after = train_pass(model, tokenizer, args.eval_episodes, seed=args.seed + 10)
    print(f"after GRPO ({trainer.state.global_step} steps): train pass {after:.3f} (SFT start {before:.3f}, "
          f"{after - before:+.3f}; {time.time() - start:.0f} s in all); saved to {args.out}/grpo/model", flush=True)
    if args.dump:
        from bugfix_gym.integrations.conformance import format_report, load_dump, run_checks
        from bugfix_gym.integrations.hf_tokenizer import ChatTemplateTokenizer

        print(format_report(run_checks(load_dump(args.dump), tokenizer=ChatTemplateTokenizer(tokenizer), strict=True)))


if __name__ == "__main__":
    main()
