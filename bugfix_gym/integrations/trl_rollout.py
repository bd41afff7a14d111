"""Token-in, token-out BugFix play with a Hugging Face causal LM, and TRL's ``rollout_func`` path built on it.

:func:`play_episode` plays one episode: every turn the model samples from the ids so far (prompt, its
own sampled ids, the env's tool-suffix ids), the call is parsed from the sampled ids with the tokenizer's
response template, and the tool's answer is appended as ids; nothing is ever re-tokenised. It returns
the episode in the shape :mod:`bugfix_gym.integrations.conformance` checks (``turns`` included).

:func:`make_rollout_func` wraps it as ``GRPOTrainer(rollout_func=...)``: TRL's other multi-turn path,
which must return ``prompt_ids``, ``completion_ids``, ``logprobs`` and ``env_mask`` (1 = the model wrote
the token). :func:`scripted_sft_rows` turns scripted play (the ``careful`` policy: blind ops, it never
sees the answer) into pre-tokenised SFT rows with the same ids and masks.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..edits.ops import FIX_OPS
from ..core.scripted import Policy, scripted_policy
from ..core.tools import parse_call
from .hf_tokenizer import ChatIds, call_ids
from .trl import BugFixToolEnv


def _sample_turn(model: Any, tokenizer: Any, ids: list[int], max_new_tokens: int, greedy: bool,
                 temperature: float) -> tuple[list[int], list[float]]:
    """One model turn from ``ids``: the sampled ids (up to and with EOS) and their log-probs."""
    import torch

    inputs = torch.tensor([ids], device=model.device)
    with torch.no_grad():
        out = model.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=max_new_tokens,
                             do_sample=not greedy, temperature=temperature if not greedy else None, top_k=None,
                             top_p=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                             output_scores=True, return_dict_in_generate=True)
    new = out.sequences[0, len(ids):].tolist()
    scores = model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)[0].tolist()
    if tokenizer.eos_token_id in new:  # generate pads after EOS when it stops early; keep up to EOS
        new = new[:new.index(tokenizer.eos_token_id) + 1]
    return new, scores[:len(new)]


def _tool_call(tokenizer: Any, prompt_ids: list[int], sampled: list[int]) -> tuple[str, dict] | None:
    """The first tool call in the sampled ids, as ``(name, arguments)``, or None (the model stopped calling)."""
    try:
        parsed = tokenizer.parse_response(sampled, prefix=prompt_ids)
    except Exception:  # malformed text: TRL's parse_response falls back to plain content the same way
        return None
    calls = parsed.get("tool_calls") or []
    if not calls:
        return None
    function = calls[0].get("function", {})
    return str(function.get("name", "")), dict(function.get("arguments") or {})


def play_episode(model: Any, tokenizer: Any, row: dict[str, Any], env: BugFixToolEnv | None = None,
                 max_turns: int = 7, max_new_tokens: int = 12, greedy: bool = False,
                 temperature: float = 1.0) -> dict[str, Any]:
    """Play the episode of a dataset row, token in and token out.

    :param model: a Hugging Face causal LM
    :param tokenizer: a :func:`~bugfix_gym.integrations.hf_tokenizer.chat_tokenizer`
    :param row: a :func:`~bugfix_gym.integrations.trl.make_dataset` row (its reset columns)
    :param env: the tool env to play in (default: a new one)
    :param max_turns: model turns at most (the env's budget is six calls; one more lets it stop after ``submit``)
    :param max_new_tokens: the longest model turn
    :param greedy: argmax instead of sampling
    :param temperature: the sampling temperature
    :return: ``prompt_ids``, ``completion_ids``, ``mask``, ``logprobs``, ``turns``, ``reward``, ``reset_key``,
        ``truncated``
    """
    env = env if env is not None else BugFixToolEnv()
    chat = ChatIds(tokenizer, env.reset(**row))
    logprobs: list[float] = []
    truncated = True
    for _ in range(max_turns):
        sampled, scores = _sample_turn(model, tokenizer, chat.prompt_ids + chat.completion_ids, max_new_tokens,
                                       greedy, temperature)
        chat.add_model(sampled)
        logprobs += scores
        call = _tool_call(tokenizer, chat.prompt_ids + chat.completion_ids[:-len(sampled)], sampled)
        if call is None:
            truncated = not sampled or sampled[-1] != tokenizer.eos_token_id
            break
        name, arguments = call
        result = _run_tool(env, name, arguments)
        chat.add_tool(name, result)
        logprobs += [0.0] * (len(chat.completion_ids) - len(logprobs))
    return {"prompt_ids": chat.prompt_ids, "completion_ids": chat.completion_ids, "mask": chat.mask,
            "logprobs": logprobs, "turns": chat.turns, "reward": env.get_reward(), "reset_key": reset_key(row),
            "truncated": truncated}


def _run_tool(env: BugFixToolEnv, name: str, arguments: dict) -> str:
    """Call a tool the way TRL does: an unknown tool or bad arguments answer ``{'error': ...}``, never raise."""
    if name not in ("read", "test", "edit", "revert", "submit"):
        return str({"error": f"Tool {name} not found."})
    try:
        return getattr(env, name)(**arguments)
    except TypeError as err:
        return str({"error": str(err)})


def reset_key(row: dict[str, Any]) -> str:
    """What a row resets its env from, as one string (rows with the same key play the same task)."""
    return f"{row.get('tasks', 'book')}:{row.get('split', '')}:{row.get('pack', '')}:{row.get('task', '')}:" \
           f"{row.get('seed', 0) if row.get('tasks') == 'generated' else ''}"


def rollout_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows for the ``rollout_func`` path: the task's prompt written into the row's user message, since TRL
    hands a ``rollout_func`` the prompts only (:func:`make_rollout_func` finds each row again by its prompt)."""
    env = BugFixToolEnv()
    return [{**row, "prompt": [{"role": "user", "content": env.reset(**row)}]} for row in rows]


def make_rollout_func(rows: Sequence[dict[str, Any]], tokenizer: Any, **play_kwargs: Any):
    """``GRPOTrainer(rollout_func=...)`` playing BugFix token in, token out, returning ``env_mask``.

    :param rows: the :func:`rollout_rows` of the training dataset (to find a prompt's row)
    :param tokenizer: the trainer's :func:`~bugfix_gym.integrations.hf_tokenizer.chat_tokenizer`
    :param play_kwargs: :func:`play_episode`'s ``max_turns``, ``max_new_tokens``, ``temperature``
    :return: ``rollout_func(prompts, trainer) -> {"prompt_ids", "completion_ids", "logprobs", "env_mask",
        "env_reward"}``; pass ``reward_funcs=env_reward`` to train on the hidden tests' verdict. Its ``turns`` list
        keeps each model turn's input and output ids of the latest rollouts, for the conformance dump
    """
    by_prompt = {row["prompt"][-1]["content"]: row for row in rows}
    env = BugFixToolEnv(show_verdict=False)
    turns: list[dict[str, list[int]]] = []

    def rollout_func(prompts: list, trainer: Any) -> dict[str, list]:
        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [],
                                "env_reward": []}
        for prompt in prompts:
            text = prompt[-1]["content"] if isinstance(prompt, list) else str(prompt)
            if text not in by_prompt:
                raise ValueError("rollout_func got a prompt that is not one of its rows; build the dataset and "
                                 "the rollout_func from the same rollout_rows(...)")
            episode = play_episode(trainer.model, tokenizer, by_prompt[text], env=env, **play_kwargs)
            out["prompt_ids"].append(episode["prompt_ids"])
            out["completion_ids"].append(episode["completion_ids"])
            out["logprobs"].append(episode["logprobs"])
            out["env_mask"].append(episode["mask"])
            out["env_reward"].append(episode["reward"])
            turns.extend(episode["turns"])
        del turns[:-4096]  # what the conformance dump reads of the last batch (trl_dump.BatchRecorder), bounded
        return out

    rollout_func.turns = turns  # type: ignore[attr-defined]
    return rollout_func


def env_reward(prompts: list, completions: list, env_reward: list[float], **kwargs: Any) -> list[float]:
    """The reward function of the ``rollout_func`` path: the hidden tests' verdict it returned."""
    return [float(r) for r in env_reward]


TEACHERS = ("careful", "blind", "retry", "random")


def retry_policy(seed: int = 0, p_again: float = 0.5) -> Policy:
    """Blind ops, a random shape: edit, then edit again (a coin of ``p_again``) or submit.

    At the start of every episode it draws, from its own generator and nothing else, the order in which it
    will try the five ops; after each edit it flips a coin: edit the next op of that order with probability
    ``p_again`` (while one is left), else ``submit``. It reads nothing, neither the source nor any tool answer,
    so which op it edits and when it stops never depend on the task. What it leaves to learn: the env answers
    ``no change`` to an op that does not apply, so "edit again after ``no change``, submit after a changed
    line" passes about 0.8 of the train tasks where the coin passes 0.3 (docs/llm_trainers.md).

    :param seed: seeds the policy's generator
    :param p_again: the probability of another edit after an edit
    """
    if not 0.0 <= p_again <= 1.0:
        raise ValueError(f"p_again must be a probability, got {p_again}")
    rng = np.random.default_rng(seed)
    plan: dict[str, Any] = {}

    def retry(observation: str, info: dict[str, Any]) -> str:
        if info["turn"] == 0:
            plan["order"], plan["next"] = [FIX_OPS[i] for i in rng.permutation(len(FIX_OPS))], 0
        again = plan["next"] == 0 or (plan["next"] < len(FIX_OPS) and rng.random() < p_again)
        if not again:
            return "submit"
        plan["next"] += 1
        return f"edit {plan['order'][plan['next'] - 1]}"

    return retry


def scripted_sft_rows(tokenizer: Any, rows: Sequence[dict[str, Any]], seed: int = 0, teacher: str = "careful",
                      show_verdict: bool = True) -> list[dict[str, list[int]]]:
    """Pre-tokenised SFT rows (``input_ids``, ``assistant_masks``) from a scripted policy's play.

    The teacher never sees the answer: ``careful`` (read or test, edit, test, revert on failure, edit again,
    submit), ``blind`` (one edit, then submit; both :func:`bugfix_gym.core.scripted.scripted_policy`) and ``retry``
    (:func:`retry_policy`: edit, then another edit or submit at random) all choose their edit ops at random;
    the oracles are refused.
    Each episode is laid out exactly as :func:`play_episode` and TRL's tool loop lay one out (the model's call
    ids, the env's tool-suffix ids, a final EOS after the last tool answer), and only the model's ids count.

    :param tokenizer: a :func:`~bugfix_gym.integrations.hf_tokenizer.chat_tokenizer`
    :param rows: the dataset rows to play
    :param seed: the policy's seed
    :param teacher: ``"careful"``, ``"blind"``, ``"retry"`` or ``"random"`` (uniform over the legal calls)
    :param show_verdict: what ``submit`` answers (:class:`~bugfix_gym.integrations.trl.BugFixToolEnv`'s argument)
    """
    if teacher not in TEACHERS:
        raise ValueError(f"teacher must be one of {', '.join(TEACHERS)} (a teacher never sees the answer), "
                         f"got {teacher!r}")
    policy = retry_policy(seed) if teacher == "retry" else scripted_policy(teacher, seed=seed)
    env, out = BugFixToolEnv(show_verdict=show_verdict), []
    for row in rows:
        chat, text = ChatIds(tokenizer, env.reset(**row)), ""
        while env.info["stop"] is None:
            name, op = parse_call(policy(text, env.info)) or ("submit", None)
            chat.add_model(call_ids(tokenizer, name, op))
            text = getattr(env, name)(*([op] if op else []))
            chat.add_tool(name, text)
        chat.add_model([tokenizer.eos_token_id])
        out.append({"input_ids": chat.prompt_ids + chat.completion_ids,
                    "assistant_masks": [0] * len(chat.prompt_ids) + chat.mask})
    return out
