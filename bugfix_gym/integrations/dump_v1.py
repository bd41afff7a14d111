"""A conformance dump of BugFix-v1 episodes: TRL's ``GRPOTrainer`` takes one step on scripted v1 episodes and
:func:`bugfix_gym.integrations.trl_dump.conformance_dump_callback` writes its first batch.

::

    python -m bugfix_gym.integrations.dump_v1 runs/v1_first.jsonl      # in .venv-trl; writes the tokenizer beside it
    bugfix-gym conformance runs/v1_first.jsonl --tokenizer runs/v1_first.tokenizer --strict

Each episode plays ``read``, ``locate``, one change and ``submit`` through
:class:`~bugfix_gym.integrations.trl_v1.BugFixToolEnvV1`, so every tool output in the batch is BugFix-v1's; the
change is the task's own repair for the first member of each GRPO group and a legal sited edit drawn at random
for the others, so groups carry rewards 1 and 0 (the group checks have something to look at). The model's turn
is the call's text as ids of :func:`v1_chat_tokenizer` (a :func:`~bugfix_gym.integrations.hf_tokenizer.chat_tokenizer`
that also knows v1's call words), ending with its EOS; its log-probs come from one float32 forward pass of the
random-init model the trainer then updates, so the dump checks the trainer's batch, not a policy's skill.

Needs trl, transformers and datasets (``.venv-trl``); importing this module imports none of them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..core.calls_v1 import CALL_KINDS
from ..edits.sites import ARGS, MAX_LINES, MUTATIONS
from .chat_v1 import tool_call_of_v1
from .trl_v1 import BugFixToolEnvV1, dataset_rows_v1


TOOL_ARGUMENTS = ("line", "expr", "mutation", "arg", "code")
"""The typed tools' argument names: a tool call in the chat template is ``<call>edit line=4 expr=1 ...</call>``."""


def v1_words() -> list[str]:
    """The v0 fixed vocabulary's words and every word of a v1 call: kinds, mutations, arguments, line numbers, the
    tools' argument names."""
    from ..core.vocabulary import fixed_tokenizer

    extra = [*CALL_KINDS, *MUTATIONS, *ARGS, *(str(i) for i in range(MAX_LINES + 1)), *TOOL_ARGUMENTS]
    words = list(fixed_tokenizer().words)
    seen = set(words)
    return words + [w for w in extra if not (w in seen or seen.add(w))]  # type: ignore[func-returns-value]


def v1_chat_tokenizer() -> Any:
    """:func:`~bugfix_gym.integrations.hf_tokenizer.chat_tokenizer` over :func:`v1_words`."""
    from .hf_tokenizer import chat_tokenizer

    return chat_tokenizer(v1_words())


def scripted_calls(player: BugFixToolEnvV1, member: int, rng: np.random.Generator) -> list[str]:
    """The calls of one episode: ``read``, ``locate``, the task's repair (member 0) or a random legal edit, ``submit``.

    :param player: reset to the episode's task
    :param member: the episode's index in its GRPO group
    :param rng: draws the random edit
    """
    assert player.env is not None and player.env.task is not None
    if member == 0 and player.env.task.bugs:
        change = player.env.task.bugs[0].repair
    else:
        edits = [c for c in player.env.legal_calls() if c.startswith("edit ")]
        change = edits[int(rng.integers(len(edits)))] if edits else "test"
    return ["read", "locate", change, "submit"]


def play(player: BugFixToolEnvV1, call: str) -> str:
    """Play a call's text through the typed tool TRL would call for it (``edit 3.1 op <=`` -> ``player.edit(line=3,
    expr=1, mutation="op", arg="<=")``)."""
    function = tool_call_of_v1(call)
    if function is None:
        raise ValueError(f"not a BugFix-v1 call: {call!r:.60}")
    return getattr(player, function["name"])(**json.loads(function["arguments"]))


def scripted_rollout_func(rows: Sequence[dict[str, Any]], tokenizer: Any, num_generations: int, seed: int = 0):
    """A TRL ``rollout_func`` playing :func:`scripted_calls`, with ``env_mask`` and the model's log-probs.

    :param rows: the dataset rows, each with its task's prompt as its user message
    :param tokenizer: a :func:`v1_chat_tokenizer`
    :param num_generations: the GRPO group size (a prompt's k-th rollout is member ``k % num_generations``)
    :param seed: seeds the random edits
    """
    import torch

    from .hf_tokenizer import ChatIds

    by_prompt = {row["prompt"][-1]["content"]: row for row in rows}
    turns: list[dict[str, list[int]]] = []
    rng = np.random.default_rng(seed)

    def rollout_func(prompts: list, trainer: Any) -> dict[str, list]:
        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [],
                                "env_reward": []}
        for k, prompt in enumerate(prompts):
            player = BugFixToolEnvV1(max_turns=8)
            chat = ChatIds(tokenizer, player.reset(**by_prompt[prompt[-1]["content"]]))
            for call in scripted_calls(player, k % num_generations, rng):
                chat.add_model(tokenizer.encode(call, add_special_tokens=False) + [tokenizer.eos_token_id])
                chat.add_tool(call.split()[0], play(player, call))
            chat.add_model([tokenizer.eos_token_id])
            ids = torch.tensor([chat.prompt_ids + chat.completion_ids])  # [1, T]
            with torch.no_grad():
                logp = torch.log_softmax(trainer.model(ids).logits[0, :-1].float(), -1).gather(1, ids[0, 1:, None])
            start = len(chat.prompt_ids)
            out["prompt_ids"].append(chat.prompt_ids)
            out["completion_ids"].append(chat.completion_ids)
            out["logprobs"].append([float(x) for x in logp[start - 1:, 0]])
            out["env_mask"].append(chat.mask)
            out["env_reward"].append(player.get_reward())
            turns.extend(chat.turns)
        return out

    rollout_func.turns = turns  # type: ignore[attr-defined]
    return rollout_func


def write_v1_dump(path: str | Path, n_rows: int = 2, num_generations: int = 2, split: str = "test",
                  seed: int = 0) -> Path:
    """One GRPO step on scripted BugFix-v1 episodes; writes the first batch to ``path`` and the tokenizer (a
    ``save_pretrained`` folder) to ``PATH.tokenizer``; returns that folder.

    :param path: the dump file (``.jsonl``)
    :param n_rows: dataset rows (tasks); the batch is ``n_rows * num_generations`` episodes
    :param num_generations: GRPO group size
    :param split: the HumanEval split the tasks come from
    :param seed: rows, random edits and the model's init
    """
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from .hf_model import tiny_causal_lm
    from .trl_dump import conformance_dump_callback
    from .trl_rollout import env_reward

    torch.manual_seed(seed)
    path = Path(path)
    tokenizer = v1_chat_tokenizer()
    player = BugFixToolEnvV1()
    rows = [{**row, "prompt": [{"role": "user", "content": player.reset(**row)}]}
            for row in dataset_rows_v1(split, n=n_rows, seed=seed)]
    batch = n_rows * num_generations
    config = GRPOConfig(output_dir=str(path.parent / (path.stem + ".grpo")), per_device_train_batch_size=batch,
                        num_generations=num_generations, max_completion_length=1024, max_steps=1,
                        learning_rate=1e-3, beta=0.0, temperature=1.0, top_k=0, save_strategy="no",
                        report_to="none", use_cpu=True, seed=seed, log_completions=False, bf16=False,
                        loss_type="dapo")
    trainer = GRPOTrainer(model=tiny_causal_lm(tokenizer, seed=seed, max_positions=4096), args=config,
                          train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                          reward_funcs=env_reward,
                          rollout_func=scripted_rollout_func(rows, tokenizer, num_generations, seed))
    callback = conformance_dump_callback(trainer, path)
    trainer.add_callback(callback)
    trainer.train()
    folder = path.with_suffix(".tokenizer")
    tokenizer.save_pretrained(str(folder))
    return folder


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bugfix_gym.integrations.dump_v1 OUT.jsonl [--rows N] [--group G] [--split S] [--seed S]``."""
    parser = argparse.ArgumentParser(prog="python -m bugfix_gym.integrations.dump_v1",
                                     description="Write a conformance dump of one GRPO step on BugFix-v1 episodes.")
    parser.add_argument("out", help="the dump file to write (.jsonl)")
    parser.add_argument("--rows", type=int, default=2, help="tasks (default 2)")
    parser.add_argument("--group", type=int, default=2, help="GRPO group size (default 2)")
    parser.add_argument("--split", default="test", choices=("train", "heldout", "test"), help="HumanEval split")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.rows < 1 or args.group < 2:
        parser.error("--rows must be at least 1 and --group at least 2")
    folder = write_v1_dump(args.out, args.rows, args.group, args.split, args.seed)
    print(f"wrote {args.out} and {folder}; check it: bugfix-gym conformance {args.out} --tokenizer {folder} --strict")
    return 0


if __name__ == "__main__":
    sys.exit(main())
