"""The conformance dump of a first update: one JSON episode per line, in docs/conformance.md's format.

TokenPPO and Reinforce call :func:`write_dump` once, on the first batch they train on, before their
first optimizer step, when ``first_update_dump`` names a file (``bugfix-gym train --dump FILE``).
What the trainer computes goes in as it is: the ids and owner codes of the batch, the sampler's
log-probs, pi_old's log-probs (the frozen pass), the log-probs of the first update's loss with the
weights before its first step (:func:`policy_loss_weights`: the per-token weight of the policy loss,
``d loss / d logp``, read off with autograd), the per-token advantages, the groups and resets, the
truncation flags and the loss normaliser. The policy's tokenizer goes next to it (:func:`tokenizer_path`),
for ``bugfix-gym conformance --tokenizer``. Writing it draws no random number and changes no tensor
of the batch, so a run with a dump trains exactly as one without.
"""

from __future__ import annotations

import json
import pathlib
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch as th

from bugfix_gym.contract.tokens import OWNER_POLICY, OWNER_TOOL

if TYPE_CHECKING:
    from agents.algorithms.buffers import TokenRolloutBuffer


def policy_loss_weights(loss: Callable[[th.Tensor], th.Tensor], logp: th.Tensor) -> th.Tensor:
    """``d loss / d logp`` per token: the weight the policy loss gives each log-prob.

    :param loss: the policy loss as a function of the log-probs ``[b, T-1]`` (the rest held fixed)
    :param logp: the log-probs the trainer computed ``[b, T-1]`` (not changed)
    :return: ``[b, T-1]``
    """
    leaf = logp.detach().clone().requires_grad_(True)
    with th.enable_grad():
        (grad,) = th.autograd.grad(loss(leaf), leaf)
    return grad.detach()


def _spans(owner: list[int], ids: list[int]) -> list[dict[str, Any]]:
    """The model turns (runs of policy tokens) and tool outputs (runs of tool tokens) as ``[start, end)``; a model
    turn also carries what the sampler was given (``input_ids``: the ids before it, as the KV-cached sampler
    appends every turn to one list) and wrote (``output_ids``), for ``prefix_preserved``."""
    turns: list[dict[str, Any]] = []
    for t, code in enumerate(owner):
        role = {OWNER_POLICY: "model", OWNER_TOOL: "tool"}.get(code)
        if role is None:
            continue
        if turns and turns[-1]["role"] == role and turns[-1]["end"] == t:
            turns[-1]["end"] = t + 1
        else:
            turns.append({"role": role, "start": t, "end": t + 1})
    for turn in turns:
        if turn["role"] == "model":
            turn.update(input_ids=ids[:turn["start"]], output_ids=ids[turn["start"]:turn["end"]])
    return turns


def _per_token(values: th.Tensor, row: int, length: int) -> list[float]:
    """Row ``row`` of a ``[N, T-1]`` tensor (position t about token t+1) as one value per token of the
    episode's ``length`` ids (the first token, predicted by nothing, gets 0)."""
    return [0.0] + [float(x) for x in values[row, : length - 1].tolist()]


def episodes(buffer: TokenRolloutBuffer, new_logp: th.Tensor, weights: th.Tensor, advantages: th.Tensor,
             common: dict[str, Any], per_episode: Sequence[dict[str, Any]] | None = None,
             groups: bool = False) -> list[dict[str, Any]]:
    """The batch in ``buffer`` as dump episodes.

    :param buffer: the batch, with ``old_logp`` frozen (TokenPPO) or None (Reinforce: pi_old is ``new_logp``)
    :param new_logp: ``[N, T-1]`` the first update's log-probs
    :param weights: ``[N, T-1]`` ``d loss / d logp`` of the policy loss
    :param advantages: ``[N, T-1]`` the advantages the loss read
    :param common: fields every episode gets (``loss_type``, ``advantage_estimator``, ...)
    :param per_episode: fields of each episode (``minibatch``, ``clip_fraction``), or None
    :param groups: write each episode's ``group`` (the run plays groups of episodes from one reset)
    """
    data, owner = buffer.data, buffer.data["owner"]
    old = buffer.old_logp if buffer.old_logp is not None else new_logp
    mask = buffer.policy_mask
    out = []
    for i, traj in enumerate(buffer.trajectories):
        n = int(buffer.lengths[i])
        codes = [int(c) for c in owner[i, :n].tolist()]
        ids = [int(x) for x in data["ids"][i, :n].tolist()]
        episode = dict(input_ids=ids, loss_mask=[int(c == OWNER_POLICY) for c in codes], turns=_spans(codes, ids),
                       logprobs=_per_token(data["sample_logp"], i, n), old_logprobs=_per_token(old, i, n),
                       new_logprobs=_per_token(new_logp, i, n), per_token_loss=_per_token(weights, i, n),
                       advantages=_per_token(advantages * mask, i, n), response_length=int(mask[i].sum()),
                       reward=float(data["rewards"][i]), truncated=bool(buffer.truncated[i]),
                       reset_seed=traj.reset_seed, task=traj.task, **common)
        if groups:
            episode["group"] = int(buffer.groups[i])
        episode.update(per_episode[i] if per_episode is not None else {})
        out.append(episode)
    return out


def tokenizer_path(path: str | pathlib.Path) -> pathlib.Path:
    """Where the dump at ``path`` keeps its ids' tokenizer: ``path`` with the suffix ``.tokenizer.json``
    (``dump.jsonl`` -> ``dump.tokenizer.json``), read by ``bugfix-gym conformance --tokenizer``."""
    return pathlib.Path(path).with_suffix(".tokenizer.json")


class DumpWriteError(RuntimeError):
    """The dump (or its tokenizer file) could not be written; the message is one line."""


def write_dump(path: str | pathlib.Path, rows: Sequence[dict[str, Any]], tokenizer: Any = None) -> None:
    """Write ``rows`` as one JSON object per line to ``path`` (its folder made if needed), and the tokenizer
    next to it, each as a regular file and never through a symbolic link
    (:func:`agents.files.checkpoint.write_regular`).

    :param path: the dump file
    :param rows: the episodes (:func:`episodes`)
    :param tokenizer: the ids' tokenizer; its ``to_dict()`` goes to :func:`tokenizer_path` (None: not written)
    :raises DumpWriteError: a file cannot be written (a full disk, a link, a FIFO): one line
    """
    from agents.files.checkpoint import why_not_writable, write_regular

    path = pathlib.Path(path)
    files = [(path, "".join(json.dumps(row) + "\n" for row in rows))]
    if tokenizer is not None:
        files.append((tokenizer_path(path), json.dumps(tokenizer.to_dict())))
    for target, text in files:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            write_regular(target, text.encode("utf-8"))
        except OSError as err:
            raise DumpWriteError(f"cannot write the first update's dump to {target} ({why_not_writable(err)})") \
                from None


def loss_fields(loss_mode: str, norm_const: float | None, mask_truncated: bool, estimator: str) -> dict[str, Any]:
    """The fields that say how the loss is normalised (``loss_type`` is our aggregation's name, which
    the conformance checks read as they read TRL's) and how the advantages were made."""
    fields: dict[str, Any] = dict(loss_type=loss_mode, mask_truncated_completions=bool(mask_truncated),
                                  advantage_estimator=estimator)
    if loss_mode == "seq_mean_token_sum_norm":
        fields["max_completion_length"] = norm_const
    elif loss_mode == "constant":
        fields["loss_norm_const"] = norm_const
    return fields
