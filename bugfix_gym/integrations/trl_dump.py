"""A TRL ``GRPOTrainer`` batch as conformance episodes (:mod:`bugfix_gym.integrations.conformance`).

:func:`batch_episodes` reads the dict that ``GRPOTrainer._generate_and_score_completions`` returns
(padded ``prompt_ids`` / ``completion_ids`` with their masks, ``tool_mask``, ``advantages``) and adds what
only a forward and a backward pass can tell: the trainer's log-probs of the sampled tokens with the model
as it samples (eval mode) and as the loss sees it (train mode, the first update), and each token's
weight in TRL's own loss, read off as ``d loss / d logp`` with autograd through ``trainer._compute_loss``.
While the batch is generated, :class:`BatchRecorder` keeps what TRL's batch does not: each model turn's input
and output ids and the sampler's log-probs of what it wrote (transformers' ``generate``, its processed scores:
the distribution it sampled from), and each rollout's reward. :func:`conformance_dump_callback` is a
``TrainerCallback`` that writes the first generated batch of a ``GRPOTrainer`` this way
(``trainer.add_callback(conformance_dump_callback(trainer, "dump.jsonl"))``); :func:`dump_first_batch` is the
same for a subclass that overrides ``_generate_and_score_completions``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .trl_rollout import reset_key


def _unpad(ids: Any, mask: Any) -> list[int]:
    return [int(i) for i, m in zip(ids.tolist(), mask.tolist()) if m]


def _loss_weights(trainer: Any, output: dict[str, Any]) -> tuple[Any, Any]:
    """The per-token log-probs TRL's loss computes (train mode) and ``d loss / d logp`` at each."""
    captured: dict[str, Any] = {}
    original = trainer._get_per_token_logps_and_entropies

    def keep(*args: Any, **kwargs: Any):
        logps, *rest = original(*args, **kwargs)
        logps.retain_grad()
        captured["logps"] = logps
        return (logps, *rest)

    trainer.model.train()
    trainer._get_per_token_logps_and_entropies = keep
    try:
        trainer._compute_loss(trainer.model, output).backward()
    finally:
        del trainer._get_per_token_logps_and_entropies
    trainer.model.zero_grad(set_to_none=True)
    return captured["logps"].detach(), captured["logps"].grad


def _eval_logps(trainer: Any, output: dict[str, Any]) -> Any:
    """The sampled tokens' log-probs with the model in eval mode (as ``generate`` saw it)."""
    import torch

    input_ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
    attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
    trainer.model.eval()
    with torch.no_grad():
        logps, *_ = trainer._get_per_token_logps_and_entropies(trainer.model, input_ids, attention,
                                                               output["completion_ids"].size(1))
    trainer.model.train()
    return logps


class BatchRecorder:
    """Records, while a ``GRPOTrainer`` generates one batch, what its output does not keep: every model turn's
    input and output ids with the sampler's log-probs of the output (``_generate_single_turn`` and the model's
    ``generate``, transformers' path; a ``rollout_func`` with a ``turns`` list, :func:`~.trl_rollout.make_rollout_func`,
    gives its turns), and the rewards (``_calculate_rewards``, weighted and summed as TRL sums them).
    ``with BatchRecorder(trainer) as record: output = ...``.

    :param trainer: the ``GRPOTrainer``
    """

    def __init__(self, trainer: Any):
        self.trainer = trainer
        self.turns: list[tuple[list[int], list[int], list[float] | None]] = []
        self.rewards: list[float] | None = None
        self._last: Any = None

    def __enter__(self) -> "BatchRecorder":
        trainer, model = self.trainer, self.trainer.model
        single, generate, rewards = trainer._generate_single_turn, model.generate, trainer._calculate_rewards
        own_turns = getattr(getattr(trainer, "rollout_func", None), "turns", None)
        if isinstance(own_turns, list):
            own_turns.clear()

        def record_generate(*args: Any, **kwargs: Any) -> Any:
            import copy

            import torch

            if kwargs.get("return_dict_in_generate") or kwargs.get("generation_config") is None:
                return generate(*args, **kwargs)  # not TRL's own call (a rollout_func's play, say): as it is
            config = copy.deepcopy(kwargs["generation_config"])
            config.output_scores, config.return_dict_in_generate = True, True
            out = generate(*args, **dict(kwargs, generation_config=config))
            inputs: Any = kwargs.get("input_ids") if kwargs.get("input_ids") is not None else args[0]
            start = inputs.shape[1]
            new = out.sequences[:, start:]  # [B, T_new]
            logps = torch.stack([torch.log_softmax(s.float(), -1) for s in out.scores], 1)  # [B, T_new, V]
            self._last = logps.gather(-1, new[..., None].long())[..., 0]  # [B, T_new]
            return out.sequences

        def record_single(prompt_ids: Any, *args: Any, **kwargs: Any) -> Any:
            self._last = None
            completion_ids, logprobs = single(prompt_ids, *args, **kwargs)
            for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
                if logprobs is not None:
                    lps = [float(x) for x in logprobs[i]]
                elif self._last is not None:
                    lps = [float(x) for x in self._last[i, :len(c)].tolist()]
                else:
                    lps = None
                self.turns.append(([int(t) for t in p], [int(t) for t in c], lps))
            return completion_ids, logprobs

        def record_rewards(*args: Any, **kwargs: Any) -> Any:
            per_func = rewards(*args, **kwargs)  # [B, n_funcs]
            weights = trainer.reward_weights.to(per_func.device)
            self.rewards = [float(x) for x in (per_func * weights.unsqueeze(0)).nansum(dim=1).tolist()]
            return per_func

        trainer._generate_single_turn, model.generate = record_single, record_generate
        trainer._calculate_rewards = record_rewards
        return self

    def __exit__(self, *exc: Any) -> None:
        for owner, name in ((self.trainer, "_generate_single_turn"), (self.trainer.model, "generate"),
                            (self.trainer, "_calculate_rewards")):
            vars(owner).pop(name, None)
        own = getattr(self.trainer, "rollout_func", None)
        for turn in getattr(own, "turns", None) or ():
            self.turns.append((list(turn["input_ids"]), list(turn["output_ids"]), None))

    def episode_turns(self, prompt: list[int], completion: list[int]
                      ) -> tuple[list[dict[str, Any]], list[float | None]]:
        """The recorded model turns of one rollout (each ``input_ids`` / ``output_ids``), and the sampler's
        log-prob of each completion token (0 on the env's; None unless every model token has one)."""
        full, seen, turns = prompt + completion, set(), []
        logprobs: list[float | None] = [None] * len(completion)
        for inp, out, lps in sorted(self.turns, key=lambda t: len(t[0])):
            n = len(inp)
            out = out[:len(full) - n]  # TRL cuts a last turn that runs past max_completion_length: what was kept
            if n in seen or n < len(prompt) or not out or full[:n] != inp or full[n:n + len(out)] != out:
                continue
            seen.add(n)
            turns.append({"input_ids": inp, "output_ids": out})
            if lps is not None:
                for k, lp in enumerate(lps[:len(out)]):
                    logprobs[n - len(prompt) + k] = lp
        return turns, logprobs


def batch_episodes(trainer: Any, inputs: list[dict[str, Any]], output: dict[str, Any],
                   record: BatchRecorder | None = None) -> list[dict[str, Any]]:
    """One conformance episode per rollout of a generated GRPO batch.

    :param trainer: the ``GRPOTrainer`` that generated the batch
    :param inputs: the dataset rows of the batch (each row G times, as TRL's sampler repeats them)
    :param output: what ``_generate_and_score_completions(inputs)`` returned
    :param record: what a :class:`BatchRecorder` kept while the batch was generated: each episode then has
        ``turns`` (the model turns' input and output ids), ``reward``, and the sampler's ``logprobs`` where TRL
        kept none
    """
    new, weights = _loss_weights(trainer, output)
    old = output.get("old_per_token_logps")
    old = _eval_logps(trainer, output) if old is None else old
    sampled = output.get("sampling_per_token_logps")
    tool_mask = output.get("tool_mask")
    eos = trainer.processing_class.eos_token_id
    episodes = []
    for i, row in enumerate(inputs):
        keep = output["completion_mask"][i]
        mask = _unpad(tool_mask[i], keep) if tool_mask is not None else [1] * int(keep.sum())
        prompt, completion = _unpad(output["prompt_ids"][i], output["prompt_mask"][i]), _unpad(
            output["completion_ids"][i], keep)
        extra: dict[str, Any] = {}
        if record is not None:
            turns, logprobs = record.episode_turns(prompt, completion)
            extra["turns"] = turns
            if sampled is None and all(lp is not None for lp, m in zip(logprobs, mask) if m):
                extra["logprobs"] = [lp if lp is not None and m else 0.0 for lp, m in zip(logprobs, mask)]
            if record.rewards is not None:
                extra["reward"] = record.rewards[i]
        episodes.append({
            "prompt_ids": prompt,
            "completion_ids": completion,
            "mask": [int(m) for m in mask],
            "old_logprobs": [float(x) for x in old[i][keep.bool()].tolist()],
            "new_logprobs": [float(x) for x in new[i][keep.bool()].tolist()],
            "loss_weights": [float(x) for x in weights[i][keep.bool()].tolist()],
            **({"logprobs": [float(x) for x in sampled[i][keep.bool()].tolist()]} if sampled is not None
               else {}),
            "response_length": int(sum(mask)),  # what TRL counts (completions/mean_length): the tool_mask's sum
            "group": i // trainer.num_generations,
            "reset_key": reset_key(row),
            "advantages": float(output["advantages"][i]),
            "truncated": bool(_unpad(output["completion_ids"][i], keep)[-1:] != [eos]),
            **_loss_fields(trainer),
            **extra,
        })
    return episodes


def dump_first_batch(trainer: Any, inputs: list[dict[str, Any]], generate: Any, path: str | Path) -> Any:
    """``generate(inputs)`` (the trainer's ``_generate_and_score_completions``) under a :class:`BatchRecorder`,
    its batch written to ``path`` as a conformance dump; returns the batch.

    :param trainer: the ``GRPOTrainer``
    :param inputs: the batch's dataset rows
    :param generate: the function that generates and scores them
    :param path: the dump file (its folder is made if needed)
    """
    with BatchRecorder(trainer) as record:
        output = generate(inputs)
    episodes = batch_episodes(trainer, inputs, output, record)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("".join(json.dumps(e) + "\n" for e in episodes))
    return output


def _loss_fields(trainer: Any) -> dict[str, Any]:
    """``loss_type`` (and ``dr_grpo``'s ``max_completion_length``) where the weights are its formula's
    alone: one process, no gradient accumulation, one step per generation (else TRL divides the loss by
    those counts too, and the normaliser check would be given no ``loss_type`` to read)."""
    args = trainer.args
    if (trainer.accelerator.num_processes, args.gradient_accumulation_steps,
            getattr(args, "steps_per_generation", 1) or 1) != (1, 1, 1):
        return {}
    fields: dict[str, Any] = {"loss_type": trainer.loss_type}
    if trainer.loss_type == "dr_grpo":
        fields["max_completion_length"] = trainer.max_completion_length
    return fields


def conformance_dump_callback(trainer: Any, path: str | Path) -> Any:
    """A ``transformers.TrainerCallback`` that writes the conformance dump of ``trainer``'s first generated
    batch (:func:`batch_episodes`, one JSON episode per line) to ``path``, before that batch's first
    optimizer step; check it with ``bugfix-gym conformance PATH``. Register it with
    ``trainer.add_callback(...)``. It wraps ``trainer._generate_and_score_completions`` from the start
    of training until the batch is written.

    :param trainer: a ``GRPOTrainer``
    :param path: the dump file (its folder is made if needed)
    """
    from transformers import TrainerCallback

    class ConformanceDump(TrainerCallback):
        """Writes the first generated batch of a GRPOTrainer as a conformance dump (see the factory)."""

        def __init__(self) -> None:
            self.path, self.written = Path(path), False

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.written or "_generate_and_score_completions" in vars(trainer):
                return
            original = trainer._generate_and_score_completions

            def generate(inputs: list[dict[str, Any]]) -> dict[str, Any]:
                del trainer._generate_and_score_completions  # once: the class's own method again
                output = dump_first_batch(trainer, inputs, original, self.path)
                self.written = True
                return output

            trainer._generate_and_score_completions = generate

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            vars(trainer).pop("_generate_and_score_completions", None)

    return ConformanceDump()
