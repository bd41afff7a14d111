"""A TRL ``GRPOTrainer`` batch as conformance episodes (:mod:`bugfix_gym.integrations.conformance`).

:func:`batch_episodes` reads the dict that ``GRPOTrainer._generate_and_score_completions`` returns
(padded ``prompt_ids`` / ``completion_ids`` with their masks, ``tool_mask``, ``advantages``) and adds what
only a forward and a backward pass can tell: the trainer's log-probs of the sampled tokens with the model
as it samples (eval mode) and as the loss sees it (train mode, the first update), and each token's
weight in TRL's own loss, read off as ``d loss / d logp`` with autograd through ``trainer._compute_loss``.
"""

from __future__ import annotations

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
        })
    return episodes
