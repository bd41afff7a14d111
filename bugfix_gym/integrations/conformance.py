"""Conformance checks for a multi-turn trainer's batch: masks, ratios, token prefixes, groups, the loss.

A dump is one JSON object per episode (docs/conformance.md has every field, which checks read it, and
the broken dumps each check catches). Two spellings are read, and :func:`normalise` turns both into one:

* the dump format of docs/conformance.md: ``input_ids`` with ``loss_mask`` (1 = written by the model; the
  prompt is the ids before the first 1), per-token lists as long as ``input_ids``;
* TRL's batch layout: ``prompt_ids``, ``completion_ids`` (the tool outputs spliced in) and ``mask``,
  per-token lists as long as ``completion_ids`` (what :mod:`bugfix_gym.integrations.trl_dump` writes).

Every field but the ids is optional; a check whose fields are missing is skipped, never passed by
default. :func:`run_checks` runs them all, :func:`format_report` prints one line each, and
``bugfix-gym conformance DUMP.jsonl`` (or ``python -m bugfix_gym.integrations.conformance``) does
both for a file and exits 1 if any check fails, 2 if the file cannot be read.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from .bounded_json import MAX_ABS_INT, MAX_NESTING, _no_constant, parse_json, read_bounded  # noqa: F401 - re-exported

Episode = dict[str, Any]
Tokenizer = Any  # anything with encode(text) -> ids and decode(ids) -> text (an HF tokenizer: the ids' own)


@dataclass(frozen=True)
class CheckResult:
    """One check's verdict on a batch.

    :param name: the check's name
    :param bug: the reported trainer bug it catches
    :param status: ``"pass"``, ``"FAIL"`` or ``"skip"`` (the batch lacks the fields it reads, or has nothing
        the check looks at)
    :param detail: where it failed (the first offending episode and token index), or why it was skipped
    """

    name: str
    bug: str
    status: str
    detail: str = ""
    missing: bool = False
    """a skip for lack of a field or an option (``--strict`` fails it), not for lack of anything to check"""

    @property
    def failed(self) -> bool:
        return self.status == "FAIL"


Check = Callable[[Sequence[Episode], dict[str, Any]], "str | None"]
CHECKS: dict[str, tuple[str, Check]] = {}
"""check name -> (the bug it catches, the function); a function returns None (pass) or where it failed."""


class Skip(Exception):
    """Raised by a check that cannot run: the batch lacks a field it reads, or an option (``end_ids``, the
    tokenizer) was not given; ``--strict`` counts it as a failure.

    :param reason: what is missing, one line
    """

    missing = True


class NotApplicable(Skip):
    """Raised by a check that has nothing to check in this batch (no groups, no tool output, no group of
    equal rewards, an estimator that does not centre groups); ``--strict`` lets it pass."""

    missing = False


def register_check(name: str, bug: str) -> Callable[[Check], Check]:
    """Decorator: add a check under ``name``, catching ``bug``."""
    def add(function: Check) -> Check:
        if name in CHECKS:
            raise ValueError(f"conformance check {name!r} is already registered; pick another name")
        CHECKS[name] = (bug, function)
        return function
    return add


#: the per-token fields: as long as ``input_ids`` (or ``completion_ids``), one value per token
PER_TOKEN = ("logprobs", "old_logprobs", "new_logprobs", "loss_weights", "advantages")
#: the dump format's other names -> the name the checks read
ALIASES = {"per_token_loss": "loss_weights"}
#: verl's ``DataProto`` names -> ours (per-token lists over ``responses``)
VERL_NAMES = {"rollout_log_probs": "logprobs", "old_log_probs": "old_logprobs", "uid": "group"}
#: verl's ``loss_agg_mode`` -> the aggregation name ``loss_type`` reads
VERL_LOSS_AGG = {"token-mean": "token_mean", "seq-mean-token-mean": "seq_mean_token_mean",
                 "seq-mean-token-sum": "seq_mean_token_sum", "seq-mean-token-sum-norm": "seq_mean_token_sum_norm"}


def normalise(episode: Any, index: int = 0) -> Episode:
    """One dump episode in the checks' shape: ``prompt_ids``, ``completion_ids`` and ``mask``, per-token
    lists over the completion, ``turns`` spans over the completion, ``reset_key`` from ``reset_seed`` /
    ``task``; ``_offset`` is where the completion starts in the ids the dump gave (messages count tokens
    there: ``input_ids``, TRL's ``completion_ids``, verl's ``responses``).

    The episode is first checked against the dump's JSON Schema (:mod:`.dump_schema`).

    :param episode: a dump line's object in one of the three layouts (``input_ids`` + ``loss_mask``; TRL's
        ``prompt_ids`` + ``completion_ids`` + ``mask``; verl's ``prompts`` + ``responses`` + ``response_mask``)
    :param index: its line's episode number, for errors
    :raises ValueError: it does not conform to the schema (one line)
    """
    from .dump_schema import validate_episode

    layout = validate_episode(episode, index)
    if layout == "verl":
        episode = _from_verl(episode)
    out: Episode = {ALIASES.get(str(key), str(key)): value for key, value in episode.items()}
    if layout == "native":
        ids, loss_mask = list(out.pop("input_ids")), list(out.pop("loss_mask"))
        p = next((i for i, m in enumerate(loss_mask) if m), len(loss_mask))
        out.update(prompt_ids=ids[:p], completion_ids=ids[p:], mask=loss_mask[p:])
        for key in PER_TOKEN:
            if isinstance(out.get(key), list) and len(out[key]) == len(ids):
                out[key] = out[key][p:]
        offset = p
    else:
        offset = 0
    n = len(out["completion_ids"])
    if out.get("reset_key") is None and (out.get("reset_seed") is not None or out.get("task") is not None):
        out["reset_key"] = [out.get("reset_seed"), out.get("task")]
    if out.get("turns") is not None:
        out["turns"] = [_turn(turn, offset, offset + n, index) for turn in out["turns"]]
    out["_offset"] = offset
    return out


def _from_verl(row: dict[str, Any]) -> dict[str, Any]:
    """A verl ``DataProto`` row (left-padded ``prompts``, right-padded ``responses``, ``attention_mask`` over
    both) in TRL's layout: padding dropped by ``attention_mask``, ``rollout_log_probs`` / ``old_log_probs`` /
    ``uid`` renamed, ``reward`` the sum of ``token_level_scores``, ``loss_agg_mode`` as ``loss_type``."""
    prompts, responses = list(row["prompts"]), list(row["responses"])
    attention = row.get("attention_mask")
    if attention is None:
        attention = [1] * (len(prompts) + len(responses))
    if len(attention) != len(prompts) + len(responses):
        raise ValueError(f"verl's attention_mask has {len(attention)} entries for {len(prompts)} prompt and "
                         f"{len(responses)} response ids; it spans both")
    keep_p, keep_r = attention[:len(prompts)], attention[len(prompts):]
    out = {k: v for k, v in row.items() if k not in ("prompts", "responses", "response_mask", "attention_mask",
                                                     "input_ids", "position_ids")}
    for old, new in VERL_NAMES.items():
        if old in out:
            out[new] = out.pop(old)
    kept = [i for i, k in enumerate(keep_r) if k]
    out.update(prompt_ids=[t for t, k in zip(prompts, keep_p) if k], completion_ids=[responses[i] for i in kept],
               mask=_pick(row["response_mask"], kept, len(responses), "response_mask"))
    for key in PER_TOKEN + ("per_token_loss", "token_level_scores"):
        if isinstance(out.get(key), list):
            out[key] = _pick(out[key], kept, len(responses), key)
    if out.get("reward") is None and isinstance(out.get("token_level_scores"), list):
        out["reward"] = math.fsum(float(x) for x in out["token_level_scores"])
    if out.get("loss_type") is None and out.get("loss_agg_mode") in VERL_LOSS_AGG:
        out["loss_type"] = VERL_LOSS_AGG[out["loss_agg_mode"]]
    return out


def _pick(values: list[Any], kept: list[int], n: int, key: str) -> list[Any]:
    """``values[i]`` for the unpadded positions ``kept`` of a padded list of ``n`` (a list of another length is
    kept whole, for ``mask_length`` to report)."""
    return [values[i] for i in kept] if len(values) == n else list(values)


def _turn(turn: dict[str, Any], offset: int, n: int, index: int) -> dict[str, Any]:
    """A turn of ``turns``: its span (``start``, ``end`` in the dump's own ids) moved onto the completion."""
    out = dict(turn)
    if "start" in out or "end" in out:
        start, end = out.get("start"), out.get("end")
        if not (isinstance(start, int) and isinstance(end, int) and offset <= start < end <= n):
            raise ValueError(f"episode {index}: a turn's span needs integers start < end within the ids after "
                             f"the prompt ({offset} to {n}), got {start} to {end}")
        out.update(start=start - offset, end=end - offset, role=out.get("role", "model"))
    return out


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _at(episode: Episode, e: int, t: int) -> str:
    """``episode e token t``, the token counted in the episode's own ids (``input_ids`` when it has them)."""
    return f"episode {e} token {t + int(episode.get('_offset', 0))}"


def _field(episode: Episode, key: str) -> Any:
    if key not in episode or episode[key] is None:
        raise Skip(f"no {key!r}")
    return episode[key]


def _model_runs(mask: Sequence[int]) -> list[tuple[int, int]]:
    """``[start, end)`` spans of the runs of 1 in ``mask`` (the model's turns)."""
    runs, start = [], None
    for i, m in enumerate(list(mask) + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


@register_check("mask_length", "a tool mask longer or shorter than the completion ids (trl#5144)")
def check_mask_length(batch: Sequence[Episode], options: dict[str, Any]) -> str | None:
    for e, episode in enumerate(batch):
        n = len(episode["completion_ids"])
        for key in ("mask",) + PER_TOKEN:
            value = episode.get(key)
            if isinstance(value, list) and len(value) != n:
                return f"episode {e}: {key} has {len(value)} entries for {n} completion ids"
    return None


@register_check("env_tokens_out_of_loss", "a loss path that ignores the tool mask and trains env tokens (TRL PR #4975)")
def check_env_tokens_out_of_loss(batch: Sequence[Episode], options: dict[str, Any]) -> str | None:
    for e, episode in enumerate(batch):
        mask, weights = _field(episode, "mask"), _field(episode, "loss_weights")
        for t, (m, w) in enumerate(zip(mask, weights)):
            if not m and abs(float(w)) > 0.0:
                return f"{_at(episode, e, t)}: an env token (mask 0) has loss weight {float(w):.3g}"
    return None


@register_check("tool_spans_masked", "tool output tokens marked as written by the model (mask 1), so they are "
                "trained and counted as the model's (trl#5144, OpenRLHF PR #1252)")
def check_tool_spans_masked(batch: Sequence[Episode], options: dict[str, Any]) -> str | None:
    seen = False
    for e, episode in enumerate(batch):
        mask = _field(episode, "mask")
        for k, turn in enumerate(_spans(episode, "tool")):
            seen = True
            t = next((i for i in range(*turn) if i < len(mask) and mask[i]), None)
            if t is not None:
                return f"{_at(episode, e, t)}: tool output {k} has mask 1 (trained as the model's){_how(episode)}"
    if not seen:
        if not any(episode.get("_spans_from") for episode in batch):
            raise Skip("no tool spans in 'turns', and no end ids (--end-ids or --tokenizer) to find them")
        raise NotApplicable("no tool output in the batch (every episode is one model turn)")
    return None


def _how(episode: Episode) -> str:
    """`` (spans from ...)`` when the episode's spans were derived rather than given in ``turns``."""
    how = episode.get("_spans_from")
    return f" (spans from {how})" if how else ""


@register_check("first_ratio_one", "a first-update ratio != 1 or a clip fraction != 0, e.g. from dropout left on "
                "(trlx#107)")
def check_first_ratio_one(batch: Sequence[Episode], options: dict[str, Any]) -> str | None:
    tol = float(options.get("ratio_tol", 1e-5))
    gap = _first_gap(batch, "old_logprobs", "new_logprobs", tol)
    if gap is not None:
        e, t, a, b = gap
        return f"{_at(batch[e], e, t)}: log ratio {b - a:.3g} at the first update (|.| < {tol})"
    for e, episode in enumerate(batch):
        clipped = episode.get("clip_fraction")
        if clipped is not None and float(clipped) > 0.0:
            return (f"episode {e}: clip fraction {float(clipped):.3g} at the first update, where every ratio "
                    "is 1 (the clip reads other log-probs than the ratio)")
    return None


@register_check("sampler_matches_trainer", "sampler and trainer log-probs disagree, biasing the ratio (trl#6789)")
def check_sampler_matches_trainer(batch: Sequence[Episode], options: dict[str, Any]) -> str | None:
    tol = float(options.get("logprob_tol", 1e-3))
    gap = _first_gap(batch, "logprobs", "old_logprobs", tol)
    if gap is None:
        return None
    e, t, a, b = gap
    return f"{_at(batch[e], e, t)}: the sampler's log-prob {a:.4f} against the trainer's {b:.4f} (|.| < {tol})"


def _first_gap(batch: Sequence[Episode], first: str, second: str, tol: float
               ) -> tuple[int, int, float, float] | None:
    """(episode, token, a, b) of the first policy token whose ``first`` and ``second`` log-probs differ by
    ``tol`` or more, or None."""
    for e, episode in enumerate(batch):
        mask, xs, ys = _field(episode, "mask"), _field(episode, first), _field(episode, second)
        for t, (m, a, b) in enumerate(zip(mask, xs, ys)):
            if m and not abs(float(a) - float(b)) < tol:
                return e, t, float(a), float(b)
    return None


@register_check("prefix_preserved", "history re-tokenised or re-templated between tool turns, so turn t+1 does not "
                "start with turn t's ids (trl#5224, verl#3960, prime-rl#1334)")
def check_prefix_preserved(batch: Sequence[Episode], options: dict[str, Any]) -> str | None:
    seen = False
    for e, episode in enumerate(batch):
        turns = [turn for turn in _field(episode, "turns") if "input_ids" in turn and "output_ids" in turn]
        seen = seen or bool(turns)
        full = list(episode["prompt_ids"]) + list(episode["completion_ids"])
        for k, turn in enumerate(turns):
            seen_ids = list(turn["input_ids"]) + list(turn["output_ids"])
            later = list(turns[k + 1]["input_ids"]) if k + 1 < len(turns) else full
            if later[:len(seen_ids)] != seen_ids:
                t = next((i for i, (a, b) in enumerate(zip(seen_ids, later)) if a != b),
                         min(len(seen_ids), len(later)))
                what = f"turn {k + 1}'s input" if k + 1 < len(turns) else "the trained ids"
                return f"episode {e} turn {k}: {what} differs from turn {k}'s input + output at token {t}"
    if not seen:
        raise Skip("no model turn in 'turns' has 'input_ids' and 'output_ids' (what the sampler was given and "
                   "wrote)")
    return None


@register_check("retokenisation_stable", "training and inference tokenise the same text differently "
                "(verl#3720): encode(decode(ids)) != ids on a model turn")
def check_retokenisation_stable(batch: Sequence[Episode], options: dict[str, Any]) -> str | None:
    if all(_sampled_ids_trained(episode) for episode in batch):
        raise NotApplicable("every model turn's output_ids are the ids trained (token in, token out, which "
                            "prefix_preserved checks): no text round trip to check")
    tokenizer = options.get("tokenizer")
    if tokenizer is None:
        raise Skip("no tokenizer given (--tokenizer)")
    end_ids = options.get("end_ids") or set()
    for e, episode in enumerate(batch):
        ids, mask, sampled = list(episode["completion_ids"]), _field(episode, "mask"), _sampled_positions(episode)
        for start, end in _model_runs(mask):
            if all(t in sampled for t in range(start, end)):
                continue  # the sampler's own ids, trained as written
            end -= 1 if ids[end - 1] in end_ids else 0  # an end id is a control token, not text (ours has none)
            again = _encode(tokenizer, tokenizer.decode(ids[start:end]))
            if again != ids[start:end]:
                t = next((i for i, (a, b) in enumerate(zip(again, ids[start:end])) if a != b), min(len(again),
                                                                                                   end - start))
                return f"{_at(episode, e, start + t)}: re-encoding the decoded model turn gives other ids"
    return None


def _sampled_positions(episode: Episode) -> set[int]:
    """The completion positions whose ids are what the sampler wrote, shown by a model turn's ``input_ids`` /
    ``output_ids`` that the trained ids repeat (no text in between: nothing to re-tokenise there)."""
    full = list(episode["prompt_ids"]) + list(episode["completion_ids"])
    p, covered = len(episode["prompt_ids"]), set[int]()
    for t in episode.get("turns") or ():
        if "input_ids" in t and "output_ids" in t:
            n, out = len(t["input_ids"]), list(t["output_ids"])
            if n >= p and full[:n] == list(t["input_ids"]) and full[n:n + len(out)] == out:
                covered.update(range(n - p, n - p + len(out)))
    return covered


def _sampled_ids_trained(episode: Episode) -> bool:
    """Every model token of the episode is covered by :func:`_sampled_positions`."""
    covered = _sampled_positions(episode)
    return all(t in covered for t, m in enumerate(episode["mask"]) if m)


def _encode(tokenizer: Tokenizer, text: str) -> list[int]:
    """``text``'s ids without special tokens (an HF tokenizer's ``add_special_tokens=False``; ours adds none)."""
    try:
        return list(tokenizer.encode(text, add_special_tokens=False))
    except TypeError:  # a tokenizer without the keyword (bugfix_gym.Tokenizer)
        return list(tokenizer.encode(text))


@register_check("response_length_is_model_tokens", "tool tokens counted as response length (OpenRLHF PR #1252)")
def check_response_length(batch: Sequence[Episode], options: dict[str, Any]) -> str | None:
    for e, episode in enumerate(batch):
        length, mask = _field(episode, "response_length"), _field(episode, "mask")
        if int(length) != int(sum(int(m) for m in mask)):
            return (f"episode {e}: response length {int(length)}, but the model wrote {int(sum(mask))} tokens "
                    f"({len(mask)} with the env's)")
    return None


@register_check("eos_trained", "a model turn's end token masked out, so the model never learns to stop "
                "(RAGEN#59, verifiers#56)")
def check_eos_trained(batch: Sequence[Episode], options: dict[str, Any]) -> str | None:
    end_ids = options.get("end_ids")
    if not end_ids and not any(_spans(episode, "model") for episode in batch):
        raise Skip("no end ids (--end-ids or --tokenizer) and no model turn spans in 'turns'")
    for e, episode in enumerate(batch):
        ids, mask = list(episode["completion_ids"]), _field(episode, "mask")
        turns = _spans(episode, "model") or _model_runs(mask)
        for k, (start, end) in enumerate(turns):
            if end - 1 < len(mask) and not mask[end - 1]:
                return f"{_at(episode, e, end - 1)}: model turn {k}'s end token has mask 0{_how(episode)}"
            if end_ids and k < len(turns) - 1 and ids[end - 1] not in end_ids:  # the last: truncation_masked
                return f"{_at(episode, e, end - 1)}: model turn {k} ends on id {ids[end - 1]}, not an end id"
    return None


@register_check("truncation_masked", "truncated episodes trained as if they stopped, or trained despite "
                "mask_truncated_completions (trl#6789, TRL's mask_truncated_completions)")
def check_truncation_masked(batch: Sequence[Episode], options: dict[str, Any]) -> str | None:
    end_ids, ran = options.get("end_ids"), False
    for e, episode in enumerate(batch):
        truncated, mask = bool(_field(episode, "truncated")), _field(episode, "mask")
        turns = _spans(episode, "model") or _model_runs(mask)
        if end_ids and turns:
            ran, last = True, turns[-1][1] - 1
            if not truncated and episode["completion_ids"][last] not in end_ids:
                return (f"{_at(episode, e, last)}: the last model turn ends on id {episode['completion_ids'][last]}, "
                        "not an end id, but the episode is not marked truncated (trained as if it stopped)")
        if episode.get("mask_truncated_completions") and episode.get("loss_weights") is not None:
            ran = True
            t = next((t for t, w in enumerate(episode["loss_weights"]) if truncated and float(w) != 0.0), None)
            if t is not None:
                return (f"{_at(episode, e, t)}: a truncated episode under mask_truncated_completions has loss "
                        f"weight {float(episode['loss_weights'][t]):.3g}")
    if not ran:
        raise Skip("needs end ids (--end-ids or --tokenizer), or mask_truncated_completions with loss_weights")
    return None


@register_check("group_shares_reset", "the G members of a GRPO group do not share one initial state "
                "(TRL's environment_factory docs)")
def check_group_shares_reset(batch: Sequence[Episode], options: dict[str, Any]) -> str | None:
    groups = _groups(batch)
    if all(len(members) < 2 for members in groups.values()):
        raise NotApplicable("no group has two members")
    for group, members in groups.items():
        e0 = members[0]
        key0, prompt0 = batch[e0].get("reset_key"), list(batch[e0]["prompt_ids"])
        for e in members[1:]:
            key, prompt = batch[e].get("reset_key"), list(batch[e]["prompt_ids"])
            if key0 is not None and key is not None and _key(key) != _key(key0):
                return (f"group {group!r}: episode {e}'s reset key {_short(key)} differs from episode {e0}'s "
                        f"{_short(key0)}")
            if prompt != prompt0:
                t = next((i for i, (a, b) in enumerate(zip(prompt, prompt0)) if a != b),
                         min(len(prompt), len(prompt0)))
                return (f"group {group!r}: episode {e}'s prompt ids differ from episode {e0}'s at prompt token "
                        f"{t} ({len(prompt)} and {len(prompt0)} ids)")
    return None


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


#: advantage estimators whose advantages are not centred per group by definition (dump's
#: ``advantage_estimator``), and why
NOT_GROUP_CENTRED = {"reinforce_pp_baseline": "REINFORCE++-baseline whitens R - group mean over the whole batch"}


@register_check("group_advantages_centred", "group advantages that do not sum to zero (a baseline from the wrong "
                "group)")
def check_group_advantages(batch: Sequence[Episode], options: dict[str, Any]) -> str | None:
    _centred_estimator(batch)
    for group, members in _groups(batch).items():
        values = [_episode_advantage(batch[e]) for e in members]
        if abs(math.fsum(values)) > 1e-4 * max(1.0, len(values)):
            return f"group {group!r}: advantages sum to {math.fsum(values):.4g}, not 0"
    return None


@register_check("zero_variance_groups", "a group whose rewards are all equal given a nonzero advantage (it "
                "carries no signal: zero it or filter it)")
def check_zero_variance_groups(batch: Sequence[Episode], options: dict[str, Any]) -> str | None:
    _centred_estimator(batch)
    if any(episode.get("kl_in_reward") for episode in batch):
        raise NotApplicable("kl_in_reward: the KL subtracted from each reward makes equal rewards unequal returns")
    found = False
    for group, members in _groups(batch).items():
        rewards = {float(_field(batch[e], "reward")) for e in members}
        if len(members) < 2 or len(rewards) > 1:
            continue
        found = True
        for e in members:
            adv, mask = _field(batch[e], "advantages"), _field(batch[e], "mask")
            values = [(0, adv)] if _is_number(adv) else [(t, a) for t, (a, m) in enumerate(zip(adv, mask)) if m]
            t, a = next(((t, a) for t, a in values if abs(float(a)) > 1e-6), (None, 0.0))
            if t is not None:
                return (f"group {group!r}: every reward is {rewards.pop():g}, but {_at(batch[e], e, t)} has "
                        f"advantage {float(a):.4g}")
    if not found:
        raise NotApplicable("no group of two or more with equal rewards in the batch")
    return None


def _centred_estimator(batch: Sequence[Episode]) -> None:
    """Skip a group-advantage check for an estimator that does not centre its advantages per group."""
    name = next((ep.get("advantage_estimator") for ep in batch if ep.get("advantage_estimator")), None)
    if name in NOT_GROUP_CENTRED:
        raise NotApplicable(f"advantage_estimator {name!r}: {NOT_GROUP_CENTRED[name]}")


def _key(group: Any) -> Any:
    return tuple(group) if isinstance(group, list) else group


def _groups(batch: Sequence[Episode]) -> dict[Any, list[int]]:
    """group id -> the episodes of that group, in order; a batch without ``group`` has no groups (a trainer
    that plays none: the group checks do not apply)."""
    if all(episode.get("group") is None for episode in batch):
        raise NotApplicable("no 'group' (a batch without groups; write each episode's group if the trainer "
                            "plays them)")
    groups: dict[Any, list[int]] = {}
    for e, episode in enumerate(batch):
        groups.setdefault(_key(_field(episode, "group")), []).append(e)
    return groups


def _episode_advantage(episode: Episode) -> float:
    """An episode's advantage: the number, or the value on its first model token."""
    adv = _field(episode, "advantages")
    if _is_number(adv):
        return float(adv)
    return next((float(v) for v, m in zip(adv, _field(episode, "mask")) if m), 0.0)


#: ``loss_type`` (TRL's names, and agents.algorithms.losses' aggregation modes) -> the aggregation
LOSS_TYPES = {"grpo": "seq_mean_token_mean", "bnpo": "token_mean", "dapo": "token_mean", "cispo": "token_mean",
              "dr_grpo": "seq_mean_token_sum_norm", **{name: name for name in (
                  "token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm", "constant")}}


@register_check("loss_normaliser", "a loss normaliser that is not loss_type's formula (grpo: 1 / (B * L_n); "
                "bnpo, dapo: 1 / sum L; dr_grpo: 1 / (B * L_max)), biasing by length")
def check_loss_normaliser(batch: Sequence[Episode], options: dict[str, Any]) -> str | None:
    tol = float(options.get("normaliser_tol", 1e-3))
    minibatches: dict[Any, list[int]] = {}
    for e, episode in enumerate(batch):
        minibatches.setdefault(_key(episode.get("minibatch", 0)), []).append(e)
    for members in minibatches.values():
        trained = {e: _trained(batch[e]) for e in members}
        total = sum(sum(m) for m in trained.values())
        for e in members:
            episode = batch[e]
            weight, formula = _token_weight(episode, len(members), sum(trained[e]), total)
            adv, weights = _field(episode, "advantages"), _field(episode, "loss_weights")
            advs = [float(adv)] * len(weights) if _is_number(adv) else [float(a) for a in adv]
            for t, (m, g, a) in enumerate(zip(trained[e], weights, advs)):
                expected = -a * weight
                if m and abs(float(g) - expected) > tol * abs(expected) + 1e-9:
                    return (f"{_at(episode, e, t)}: loss weight {float(g):.4g}, but loss_type "
                            f"{episode['loss_type']!r} gives -A * {formula} = {expected:.4g} (A = {a:.4g})")
    return None


def _trained(episode: Episode) -> list[int]:
    """The episode's trained tokens: its mask, all 0 for a truncated one under ``mask_truncated_completions``."""
    mask = [1 if m else 0 for m in _field(episode, "mask")]
    return [0] * len(mask) if episode.get("mask_truncated_completions") and episode.get("truncated") else mask


def _token_weight(episode: Episode, n_seq: int, length: int, total: int) -> tuple[float, str]:
    """The weight ``loss_type``'s normaliser gives each trained token of ``episode``, and its formula."""
    kind = _field(episode, "loss_type")
    mode = LOSS_TYPES.get(kind)
    if mode is None:
        raise Skip(f"loss_type {kind!r} has no formula here; use one of {', '.join(LOSS_TYPES)}")
    if mode == "token_mean":
        return 1.0 / max(total, 1), f"1 / {total} (the minibatch's model tokens)"
    if mode == "seq_mean_token_mean":
        return 1.0 / (n_seq * max(length, 1)), f"1 / ({n_seq} sequences * {length} tokens)"
    if mode == "seq_mean_token_sum":
        return 1.0 / n_seq, f"1 / {n_seq} sequences"
    if mode == "seq_mean_token_sum_norm":
        cap = float(_field(episode, "max_completion_length"))
        if not cap > 0:
            raise ValueError(f"max_completion_length is {cap:g}; dr_grpo's normaliser divides by it: it must be > 0")
        return 1.0 / (n_seq * cap), f"1 / ({n_seq} sequences * max_completion_length {cap:g})"
    const = float(_field(episode, "loss_norm_const"))
    if not const > 0:
        raise ValueError(f"loss_norm_const is {const:g}; the constant normaliser divides by it: it must be > 0")
    return 1.0 / const, f"1 / {const:g}"


def _spans(episode: Episode, role: str) -> list[tuple[int, int]]:
    """``[start, end)`` over the completion of the turns of ``role`` (``model`` or ``tool``) in ``turns``."""
    return [(turn["start"], turn["end"]) for turn in episode.get("turns") or ()
            if "start" in turn and turn.get("role") == role]


def run_checks(batch: Sequence[Any], *, tokenizer: Tokenizer | None = None,
               end_ids: Iterable[int] | None = None, only: Iterable[str] | None = None,
               ratio_tol: float = 1e-5, logprob_tol: float = 1e-3, normaliser_tol: float = 1e-3,
               tool_end_ids: Sequence[int] | None = None, strict: bool = False,
               allow_skip: Iterable[str] = ()) -> list[CheckResult]:
    """Every registered check on ``batch`` (or those named in ``only``).

    An episode whose ``turns`` give no spans gets them from its ids (:func:`derive_spans`): a model turn runs
    to an end id, the tool output after it to the end of the tokenizer's tool suffix (``tool_end_ids``), so
    ``tool_spans_masked``, ``eos_trained`` and ``truncation_masked`` run on a dump with no ``turns``.

    :param batch: episodes in any layout of the module docstring (each goes through :func:`normalise`)
    :param tokenizer: the ids' tokenizer, for ``retokenisation_stable`` (and, when not given, ``end_ids`` and
        ``tool_end_ids``)
    :param end_ids: the ids that end a model turn (EOS, a tool-call close), for ``eos_trained``,
        ``truncation_masked`` and the derived spans (default: the tokenizer's end-of-turn id)
    :param only: check names to run (default: all)
    :param ratio_tol: the largest |log ratio| at the first update
    :param logprob_tol: the largest |sampler - trainer| log-prob difference
    :param normaliser_tol: the largest relative gap between a loss weight and ``loss_type``'s
    :param tool_end_ids: the ids that end every tool output (the chat template's tool suffix ends with the next
        generation prompt, ours with ``<turn>``; default: read off the tokenizer, :func:`tool_end_of`)
    :param strict: a check skipped for lack of a field or an option fails (``--strict``); one with nothing to
        check in this batch (no groups, no tool output) still skips
    :param allow_skip: checks ``strict`` lets skip all the same (a trainer that cannot dump what they read, e.g.
        ``prefix_preserved`` for one that keeps no per-turn ids)
    :return: one :class:`CheckResult` per check, in registration order
    :raises ValueError: an episode that is not one, or an unknown check name (one line)
    """
    batch = [normalise(episode, e) for e, episode in enumerate(batch)]
    names = list(CHECKS) if only is None else list(only)
    allowed = set(allow_skip)
    unknown = [n for n in [*names, *allowed] if n not in CHECKS]
    if unknown:
        raise ValueError(f"unknown conformance check(s) {unknown}; use some of {', '.join(CHECKS)}")
    ends = set(end_ids or ())
    if not ends and tokenizer is not None and isinstance(getattr(tokenizer, "eoc_id", None), int):
        ends = {int(tokenizer.eoc_id)}
    tool_end = list(tool_end_ids) if tool_end_ids else tool_end_of(tokenizer)
    for episode in batch:
        if ends and not _spans(episode, "model") and not _spans(episode, "tool"):
            spans = derive_spans(episode["completion_ids"], episode["mask"], ends, tool_end)
            episode["turns"] = list(episode.get("turns") or ()) + spans
            episode["_spans_from"] = "end ids" + (" and the tool suffix" if tool_end else " and the mask")
    options = {"tokenizer": tokenizer, "end_ids": ends, "ratio_tol": ratio_tol,
               "logprob_tol": logprob_tol, "normaliser_tol": normaliser_tol}
    results = []
    for name in names:
        bug, function = CHECKS[name]
        try:
            where = function(batch, options)
        except Skip as why:
            if strict and why.missing and name not in allowed:
                results.append(CheckResult(name, bug, "FAIL", f"--strict: skipped for lack of what it reads: {why}",
                                           missing=True))
            else:
                results.append(CheckResult(name, bug, "skip", str(why), missing=why.missing))
            continue
        except (TypeError, ValueError, KeyError, IndexError, ZeroDivisionError, OverflowError,
                RecursionError) as err:  # a field of the wrong shape or size
            first = str(err).splitlines()[0][:160] if str(err).strip() else ""
            raise ValueError(f"check {name} cannot read this dump ({type(err).__name__}: {first}); see "
                             "docs/conformance.md for the fields") from None
        results.append(CheckResult(name, bug, "pass" if where is None else "FAIL", where or ""))
    return results


def derive_spans(ids: Sequence[int], mask: Sequence[Any], end_ids: set[int], tool_end: Sequence[int] = ()
                 ) -> list[dict[str, Any]]:
    """The model turns and tool outputs of a completion, from its ids: what every trainer has.

    A model turn starts the completion or right after a tool output and runs to the end of its first run of end
    ids; the tool output after it runs to the end of the next ``tool_end`` (the tool suffix's last ids, which
    the next generation prompt ends), or, without ``tool_end``, up to the mask's next 0 -> 1 transition (and
    is then at least the one token after the end id: the model never writes right after its own end id). The
    spans come from the ids, not from the mask, so a mask that marks a tool output as the model's is caught.

    :param ids: the completion's ids
    :param mask: its mask (1 = the model's), read only without ``tool_end``
    :param end_ids: the ids that end a model turn
    :param tool_end: the ids that end every tool output (may be empty)
    :return: ``turns`` spans ``{"role", "start", "end"}`` over the completion
    """
    spans: list[dict[str, Any]] = []
    n, i = len(ids), 0
    tool_end = list(tool_end)
    while i < n:
        j = next((t for t in range(i, n) if ids[t] in end_ids), None)
        if j is None:
            spans.append({"role": "model", "start": i, "end": n})
            break
        while j + 1 < n and ids[j + 1] in end_ids:
            j += 1
        spans.append({"role": "model", "start": i, "end": j + 1})
        if j + 1 >= n:
            break
        start = j + 1
        if tool_end:
            k = next((t for t in range(start, n - len(tool_end) + 1)
                      if list(ids[t:t + len(tool_end)]) == tool_end), None)
            end = n if k is None else k + len(tool_end)
        else:
            end = next((t for t in range(start + 1, n) if mask[t] and not mask[t - 1]), n) if not mask[start] \
                else start + 1
        spans.append({"role": "tool", "start": start, "end": end})
        i = end
    return spans


def tool_end_of(tokenizer: Tokenizer | None) -> list[int]:
    """The ids every tool output of ``tokenizer`` ends with: the common tail of its tool segments
    (``segment_ids(3, text)``: ours end with ``<turn>``, a chat template's with the end of the tool message and the
    next generation prompt), or ``[]`` for a tokenizer without segments."""
    segment = getattr(tokenizer, "segment_ids", None)
    if segment is None:
        return []
    try:
        a, b = list(segment(3, "read")), list(segment(3, "no change"))
    except Exception:  # noqa: BLE001 - a tokenizer that cannot render a tool segment gives no suffix
        return []
    tail = 0
    while tail < min(len(a), len(b)) and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    return a[len(a) - tail:] if tail < min(len(a), len(b)) else []


def format_report(results: Sequence[CheckResult]) -> str:
    """One line per check: status, name, and where it failed (with the bug it names) or why it was skipped."""
    lines = []
    for r in results:
        tail = f"{r.detail} -- {r.bug}" if r.failed else r.detail
        lines.append(f"{r.status:4}  {r.name:32} {tail}".rstrip())
    return "\n".join(lines)


def report_json(results: Sequence[CheckResult], strict: bool = False) -> dict[str, Any]:
    """The ``--json`` report: ``failed`` (a count), ``skipped`` (each skip's name, reason and whether it lacked a
    field or option, ``missing``), ``strict``, and every check's ``name``, ``status``, ``detail``, ``bug``."""
    return {"failed": sum(r.failed for r in results), "strict": strict,
            "skipped": [dict(name=r.name, reason=r.detail, missing=r.missing) for r in results
                        if r.status == "skip"],
            "checks": [dict(name=r.name, status=r.status, detail=r.detail, bug=r.bug) for r in results]}


MAX_DUMP_BYTES = 256 << 20
"""The largest dump read (a first batch of 64 episodes of 1,000 tokens is a few MB)."""
MAX_TOKENIZER_BYTES = 16 << 20
"""The largest ``--tokenizer`` file read (a saved chat-template tokenizer keeps at most 6 MiB of tokenizer.json)."""


def load_dump(path: str) -> list[Episode]:
    """A dump file (one JSON episode per line) -> its episodes as written; a file that is not a regular file or
    is over :data:`MAX_DUMP_BYTES`, a line that is not plain finite JSON (:func:`parse_json`) or an empty file is
    one clear ``ValueError`` (or ``OSError``)."""
    blob = read_bounded(path, MAX_DUMP_BYTES, "the dump")
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a text file; a dump holds one JSON episode per line") from None
    episodes = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            episodes.append(parse_json(line))
        except ValueError as err:
            raise ValueError(f"{path}:{n} {err}; a dump holds one JSON episode per line") from None
    if not episodes:
        raise ValueError(f"{path} holds no episode; a dump holds one JSON episode per line")
    return episodes


def load_tokenizer(path: str) -> Tokenizer:
    """The ids' tokenizer at ``path``: the ``to_dict()`` JSON ``bugfix-gym train --dump`` writes (ours, or a
    chat-template tokenizer's), a Hugging Face ``tokenizer.json``, or a ``save_pretrained`` folder (both read by
    :func:`bugfix_gym.integrations.hf_checkpoint.read_tokenizer`; they need ``tokenizers``, and a chat template
    ``transformers``). An unreadable, oversized or corrupt file, or one whose chat template exceeds its budget
    (:mod:`bugfix_gym.integrations.chat_template`), is one clear ``ValueError`` (or ``OSError``).

    :param path: the file or folder
    """
    import os

    from bugfix_gym.contract.tokens import tokenizer_from_dict

    from .hf_checkpoint import read_tokenizer

    if os.path.isdir(path):
        return _hf_tokenizer(read_tokenizer, path)
    blob = read_bounded(path, MAX_TOKENIZER_BYTES, "--tokenizer")
    try:
        data = json.loads(blob.decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, RecursionError):  # not UTF-8, not JSON, NaN
        raise ValueError(f"--tokenizer {path} is not JSON; give the tokenizer file bugfix-gym train --dump "
                         "wrote next to the dump (DUMP.tokenizer.json), a tokenizer.json or a save_pretrained "
                         "folder") from None
    if isinstance(data, dict) and "model" in data and "format" not in data:  # Hugging Face's tokenizer.json
        return _hf_tokenizer(read_tokenizer, path)
    try:
        return tokenizer_from_dict(data)
    except ImportError:
        raise ValueError(f"--tokenizer {path} is a Hugging Face tokenizer; reading it needs transformers: run "
                         "this command in .venv-trl (make trl-venv)") from None
    except Exception as err:  # noqa: BLE001 - a crafted file may fail anywhere in the tokenizer's code
        first = str(err).splitlines()[0][:200] if str(err).strip() else "bad field"
        raise ValueError(f"--tokenizer {path} is not a tokenizer file ({type(err).__name__}: {first}); give the "
                         "file bugfix-gym train --dump wrote next to the dump (DUMP.tokenizer.json), a "
                         "tokenizer.json or a save_pretrained folder") from None


def _hf_tokenizer(read: Callable[[str], Tokenizer], path: str) -> Tokenizer:
    try:
        return read(path)
    except ValueError as err:
        raise ValueError(f"--tokenizer {err}") from None
    except Exception as err:  # noqa: BLE001 - a crafted file may fail anywhere in the tokenizer's code
        first = str(err).splitlines()[0][:200] if str(err).strip() else "bad field"
        raise ValueError(f"--tokenizer {path} does not load ({type(err).__name__}: {first})") from None


def add_arguments(parser: Any) -> None:
    """The conformance command's arguments (``bugfix-gym conformance`` and ``python -m`` share them).

    :param parser: an ``argparse`` parser
    """
    parser.add_argument("dump", help="one JSON episode per line, in our, TRL's or verl's layout "
                                     "(docs/conformance.md, docs/dump.schema.json)")
    parser.add_argument("--end-ids", default="", metavar="IDS",
                        help="comma-separated ids that end a model turn (EOS, a tool-call close), for "
                             "eos_trained, truncation_masked and the spans of a dump without turns (default: "
                             "--tokenizer's end-of-turn id)")
    parser.add_argument("--tool-end-ids", default="", metavar="IDS",
                        help="comma-separated ids that end every tool output (the tool suffix's last ids, e.g. "
                             "the next generation prompt), for the spans of a dump without turns (default: "
                             "read off --tokenizer)")
    parser.add_argument("--tokenizer", default=None, metavar="PATH",
                        help="the ids' tokenizer: DUMP.tokenizer.json (bugfix-gym train --dump writes it), a "
                             "Hugging Face tokenizer.json or a save_pretrained folder")
    parser.add_argument("--strict", action="store_true",
                        help="a check skipped for lack of a field or an option fails (exit 1); one with nothing "
                             "to check in this batch (no groups, no tool output) still skips")
    parser.add_argument("--allow-skip", default="", metavar="CHECKS",
                        help="comma-separated checks --strict lets skip (e.g. prefix_preserved for a trainer that "
                             "keeps no per-turn ids)")
    parser.add_argument("--logprob-tol", type=float, default=1e-3, metavar="X",
                        help="sampler_matches_trainer's largest |sampler - trainer| log-prob gap (default 1e-3)")
    parser.add_argument("--ratio-tol", type=float, default=1e-5, metavar="X",
                        help="first_ratio_one's largest |log ratio| at the first update (default 1e-5)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the lines")


def _read(read: Callable[[str], Any], path: str, what: str, hint: str) -> Any:
    """``read(path)``, its failures as one ``ValueError`` line: ``cannot read WHAT PATH (why); HINT``."""
    try:
        return read(path)
    except OSError as err:
        raise ValueError(f"cannot read {what}{path} ({err.strerror or err}); {hint}") from None


def run_command(args: Any, prog: str = "bugfix-gym conformance") -> int:
    """Check the dump ``args`` names and print the report; returns the exit status (0 every check passed or
    skipped, 1 one failed, 2 the dump, ``--end-ids`` or ``--tokenizer`` cannot be read: one line on stderr).

    :param args: the parsed arguments of :func:`add_arguments`
    :param prog: the command's name, for errors
    """
    ids: dict[str, list[int]] = {}
    for flag in ("end_ids", "tool_end_ids"):
        try:
            ids[flag] = [int(x) for x in getattr(args, flag, "").split(",") if x.strip()]
        except ValueError:
            print(f"{prog}: error: --{flag.replace('_', '-')} takes comma-separated integer ids, got "
                  f"{getattr(args, flag)!r}", file=sys.stderr)
            return 2
    tols: dict[str, float] = {"logprob_tol": getattr(args, "logprob_tol", 1e-3),
                              "ratio_tol": getattr(args, "ratio_tol", 1e-5)}
    bad = [k for k, v in tols.items() if not (math.isfinite(v) and v > 0)]
    if bad:
        print(f"{prog}: error: --{bad[0].replace('_', '-')} must be a positive number, got {tols[bad[0]]}",
              file=sys.stderr)
        return 2
    strict = bool(getattr(args, "strict", False))
    try:
        tokenizer = None if args.tokenizer is None else _read(
            load_tokenizer, args.tokenizer, "--tokenizer ",
            "give the tokenizer file bugfix-gym train --dump wrote (DUMP.tokenizer.json), a tokenizer.json or a "
            "save_pretrained folder")
        episodes = _read(load_dump, args.dump, "", "give a dump file (one JSON episode per line)")
        allowed = [name.strip() for name in getattr(args, "allow_skip", "").split(",") if name.strip()]
        results = run_checks(episodes, end_ids=ids["end_ids"], tokenizer=tokenizer,
                             tool_end_ids=ids["tool_end_ids"], strict=strict, allow_skip=allowed,
                             logprob_tol=tols["logprob_tol"], ratio_tol=tols["ratio_tol"])
    except ValueError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report_json(results, strict)))
    else:
        print(format_report(results))
    return 1 if any(r.failed for r in results) else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bugfix_gym.integrations.conformance DUMP.jsonl [--end-ids 2,7] [--tokenizer PATH] [--strict]
    [--json]``:
    the same command as ``bugfix-gym conformance``."""
    import argparse

    prog = "python -m bugfix_gym.integrations.conformance"
    parser = argparse.ArgumentParser(prog=prog, description=(__doc__ or "").split("\n")[0])
    add_arguments(parser)
    return run_command(parser.parse_args(argv), prog)


if __name__ == "__main__":
    sys.exit(main())
