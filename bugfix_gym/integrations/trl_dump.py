"""A TRL ``GRPOTrainer`` batch as conformance episodes (:mod:`bugfix_gym.integrations.conformance`).

:func:`batch_episodes` reads the dict that ``GRPOTrainer._generate_and_score_completions`` returns
(padded ``prompt_ids`` / ``completion_ids`` with their masks, ``tool_mask``, ``advantages``) and adds what
only a forward and a backward pass can tell: the trainer's log-probs of the sampled tokens with the model
as it samples (eval mode) and as the loss sees it (train mode, the first update), and each token's
weight in TRL's own loss, read off as ``d loss / d logp`` with autograd through ``trainer._compute_loss``.
:func:`conformance_dump_callback` is a ``TrainerCallback`` that writes the first generated batch of a
``GRPOTrainer`` this way (``trainer.add_callback(conformance_dump_callback(trainer, "dump.jsonl"))``).
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


def batch_episodes(trainer: Any, inputs: list[dict[str, Any]], output: dict[str, Any]) -> list[dict[str, Any]]:
    """One conformance episode per rollout of a generated GRPO batch.

    :param trainer: the ``GRPOTrainer`` that generated the batch
    :param inputs: the dataset rows of the batch (each row G times, as TRL's sampler repeats them)
    :param output: what ``_generate_and_score_completions(inputs)`` returned
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
        episodes.append({
            "prompt_ids": _unpad(output["prompt_ids"][i], output["prompt_mask"][i]),
            "completion_ids": _unpad(output["completion_ids"][i], keep),
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
        })
    return episodes


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
                output = original(inputs)
                del trainer._generate_and_score_completions  # once: the class's own method again
                self.path.parent.mkdir(parents=True, exist_ok=True)
                episodes = batch_episodes(trainer, inputs, output)
                self.path.write_text("".join(json.dumps(e) + "\n" for e in episodes))
                self.written = True
                return output

            trainer._generate_and_score_completions = generate

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            vars(trainer).pop("_generate_and_score_completions", None)

    return ConformanceDump()
