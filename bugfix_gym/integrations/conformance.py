"""Conformance checks for a multi-turn trainer's batch: masks, ratios, token prefixes, groups.

A batch is a list of episodes, one ``dict`` each, in the shape TRL's ``GRPOTrainer`` keeps them
(``prompt_ids``, ``completion_ids`` with the tool outputs spliced in, and a mask that says which
completion tokens the model wrote). Every field but ``prompt_ids`` and ``completion_ids`` is
optional; a check whose fields are missing is skipped, never passed by default.

==================  =====================================================================
field               meaning
==================  =====================================================================
prompt_ids          the ids of the prompt the first turn was sampled from
completion_ids      everything after the prompt: model tokens and env (tool) tokens
mask                per completion token: 1 = written by the model, 0 = written by the env
                    (TRL's ``tool_mask`` / ``env_mask``)
logprobs            the sampler's log-prob of each completion token (anything at mask 0)
old_logprobs        the trainer's log-probs of the same tokens before its first update
new_logprobs        the trainer's log-probs at its first update (the ratio's numerator)
loss_weights        per completion token, the weight the loss gave it (e.g. d loss / d logp)
turns               the model's turns in order: ``{"input_ids": [...], "output_ids": [...]}``,
                    what the sampler was given and what it wrote at that turn
response_length     the length the trainer counted for this episode (its length penalty,
                    its ``completions/mean_length``)
group               the episode's GRPO group id
reset_key           what its env was reset from (a seed, a task name, the dataset row)
advantages          a number, or one number per completion token
truncated           the episode stopped on a length limit, not on its own end token
==================  =====================================================================

Each check names the trainer bug it catches; :func:`run_checks` runs them all and
:func:`format_report` prints one line each. ``python -m bugfix_gym.integrations.conformance
DUMP.jsonl`` does both for a file of one JSON episode per line and exits 1 if any check fails.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

Episode = dict[str, Any]
Tokenizer = Any  # anything with encode(text) -> ids and decode(ids) -> text (an HF tokenizer: the ids' own)


@dataclass(frozen=True)
class CheckResult:
    """One check's verdict on a batch.

    :param name: the check's name
    :param bug: the reported trainer bug it catches
    :param status: ``"pass"``, ``"FAIL"`` or ``"skip"`` (the batch lacks the fields it reads)
    :param detail: where it failed (the first offending episode and token index), or why it was skipped
    """

    name: str
    bug: str
    status: str
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.status == "FAIL"


Check = Callable[[Sequence[Episode], dict[str, Any]], "str | None"]
CHECKS: dict[str, tuple[str, Check]] = {}
"""check name -> (the bug it catches, the function); a function returns None (pass) or where it failed."""


class Skip(Exception):
    """Raised by a check when the batch lacks what it reads."""


def register_check(name: str, bug: str) -> Callable[[Check], Check]:
    """Decorator: add a check under ``name``, catching ``bug``."""
    def add(function: Check) -> Check:
        if name in CHECKS:
            raise ValueError(f"conformance check {name!r} is already registered; pick another name")
        CHECKS[name] = (bug, function)
        return function
    return add


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
        for key in ("mask", "logprobs", "old_logprobs", "new_logprobs", "loss_weights"):
            if episode.get(key) is not None and len(episode[key]) != n:
                return f"episode {e}: {key} has {len(episode[key])} entries for {n} completion ids"
        if episode.get("mask") is None:
            raise Skip("no 'mask'")
    return None


@register_check("env_tokens_out_of_loss", "a loss path that ignores the tool mask and trains env tokens (TRL PR #4975)")
def check_env_tokens_out_of_loss(batch: Sequence[Episode], options: dict[str, Any]) -> str | None:
    for e, episode in enumerate(batch):
        mask, weights = _field(episode, "mask"), _field(episode, "loss_weights")
        for t, (m, w) in enumerate(zip(mask, weights)):
            if not m and abs(float(w)) > 0.0:
                return f"episode {e} token {t}: an env token (mask 0) has loss weight {float(w):.3g}"
    return None


@register_check("first_ratio_one", "a first-update ratio != 1, e.g. from dropout left on (trlx#107)")
def check_first_ratio_one(batch: Sequence[Episode], options: dict[str, Any]) -> str | None:
    tol = float(options.get("ratio_tol", 1e-5))
    gap = _first_gap(batch, "old_logprobs", "new_logprobs", tol)
    if gap is None:
        return None
    e, t, a, b = gap
    return f"episode {e} token {t}: log ratio {b - a:.3g} at the first update (|.| < {tol})"


@register_check("sampler_matches_trainer", "sampler and trainer log-probs disagree, biasing the ratio (trl#6789)")
def check_sampler_matches_trainer(batch: Sequence[Episode], options: dict[str, Any]) -> str | None:
    tol = float(options.get("logprob_tol", 1e-3))
    gap = _first_gap(batch, "logprobs", "old_logprobs", tol)
    if gap is None:
        return None
    e, t, a, b = gap
    return f"episode {e} token {t}: the sampler's log-prob {a:.4f} against the trainer's {b:.4f} (|.| < {tol})"


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
    for e, episode in enumerate(batch):
        turns = _field(episode, "turns")
        full = list(episode["prompt_ids"]) + list(episode["completion_ids"])
        for k, turn in enumerate(turns):
            seen = list(turn["input_ids"]) + list(turn["output_ids"])
            later = list(turns[k + 1]["input_ids"]) if k + 1 < len(turns) else full
            if later[:len(seen)] != seen:
                t = next((i for i, (a, b) in enumerate(zip(seen, later)) if a != b), min(len(seen), len(later)))
                what = f"turn {k + 1}'s input" if k + 1 < len(turns) else "the trained ids"
                return f"episode {e} turn {k}: {what} differs from turn {k}'s input + output at token {t}"
    return None


@register_check("retokenisation_stable", "training and inference tokenise the same text differently "
                "(verl#3720): encode(decode(ids)) != ids on a model turn")
def check_retokenisation_stable(batch: Sequence[Episode], options: dict[str, Any]) -> str | None:
    tokenizer = options.get("tokenizer")
    if tokenizer is None:
        raise Skip("no tokenizer given")
    for e, episode in enumerate(batch):
        ids, mask = list(episode["completion_ids"]), _field(episode, "mask")
        for start, end in _model_runs(mask):
            again = list(tokenizer.encode(tokenizer.decode(ids[start:end]), add_special_tokens=False))
            if again != ids[start:end]:
                t = next((i for i, (a, b) in enumerate(zip(again, ids[start:end])) if a != b), min(len(again),
                                                                                                   end - start))
                return f"episode {e} token {start + t}: re-encoding the decoded model turn gives other ids"
    return None


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
    if not end_ids:
        raise Skip("no end_ids given")
    for e, episode in enumerate(batch):
        ids, mask = list(episode["completion_ids"]), _field(episode, "mask")
        runs = _model_runs(mask)
        for k, (start, end) in enumerate(runs):
            last = k == len(runs) - 1
            if ids[end - 1] not in end_ids and not (last and episode.get("truncated")):
                return f"episode {e} token {end - 1}: a model turn ends on id {ids[end - 1]}, not an end id (mask 1)"
    return None


@register_check("group_shares_reset", "the G members of a GRPO group do not share one initial state "
                "(TRL's environment_factory docs)")
def check_group_shares_reset(batch: Sequence[Episode], options: dict[str, Any]) -> str | None:
    first: dict[Any, tuple[int, Any, list[int]]] = {}
    for e, episode in enumerate(batch):
        group = _field(episode, "group")
        key, prompt = _field(episode, "reset_key"), list(episode["prompt_ids"])
        if group not in first:
            first[group] = (e, key, prompt)
            continue
        e0, key0, prompt0 = first[group]
        if key != key0 or prompt != prompt0:
            what = "reset key" if key != key0 else "prompt ids"
            return f"group {group!r}: episode {e}'s {what} differ from episode {e0}'s"
    if all(len([1 for ep in batch if ep["group"] == g]) < 2 for g in first):
        raise Skip("no group has two members")
    return None


@register_check("group_advantages_centred", "group advantages that do not sum to zero (a baseline from the wrong "
                "group, or zero-variance groups given an advantage)")
def check_group_advantages(batch: Sequence[Episode], options: dict[str, Any]) -> str | None:
    sums: dict[Any, list[float]] = {}
    for episode in batch:
        adv = _field(episode, "advantages")
        value = float(adv) if isinstance(adv, (int, float)) else _first_model_value(adv, _field(episode, "mask"))
        sums.setdefault(_field(episode, "group"), []).append(value)
    for group, values in sums.items():
        if abs(math.fsum(values)) > 1e-4 * max(1.0, len(values)):
            return f"group {group!r}: advantages sum to {math.fsum(values):.4g}, not 0"
    return None


def _first_model_value(values: Sequence[float], mask: Sequence[int]) -> float:
    return next((float(v) for v, m in zip(values, mask) if m), 0.0)


def run_checks(batch: Sequence[Episode], *, tokenizer: Tokenizer | None = None,
               end_ids: Iterable[int] | None = None, only: Iterable[str] | None = None,
               ratio_tol: float = 1e-5, logprob_tol: float = 1e-3) -> list[CheckResult]:
    """Every registered check on ``batch`` (or those named in ``only``).

    :param batch: episodes as in the module docstring
    :param tokenizer: the ids' tokenizer, for ``retokenisation_stable``
    :param end_ids: the ids that end a model turn (EOS, a tool-call close), for ``eos_trained``
    :param only: check names to run (default: all)
    :param ratio_tol: the largest |log ratio| at the first update
    :param logprob_tol: the largest |sampler - trainer| log-prob difference
    :return: one :class:`CheckResult` per check, in registration order
    """
    batch = list(batch)
    for e, episode in enumerate(batch):
        if not isinstance(episode, dict) or "prompt_ids" not in episode or "completion_ids" not in episode:
            raise ValueError(f"episode {e} needs 'prompt_ids' and 'completion_ids' (see bugfix_gym.integrations."
                             "conformance)")
    names = list(CHECKS) if only is None else list(only)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        raise ValueError(f"unknown conformance check(s) {unknown}; use some of {', '.join(CHECKS)}")
    options = {"tokenizer": tokenizer, "end_ids": set(end_ids or ()), "ratio_tol": ratio_tol,
               "logprob_tol": logprob_tol}
    results = []
    for name in names:
        bug, function = CHECKS[name]
        try:
            where = function(batch, options)
        except Skip as why:
            results.append(CheckResult(name, bug, "skip", str(why)))
            continue
        results.append(CheckResult(name, bug, "pass" if where is None else "FAIL", where or ""))
    return results


def format_report(results: Sequence[CheckResult]) -> str:
    """One line per check: status, name, and where it failed (with the bug it names) or why it was skipped."""
    lines = []
    for r in results:
        tail = f"{r.detail} -- {r.bug}" if r.failed else r.detail
        lines.append(f"{r.status:4}  {r.name:32} {tail}".rstrip())
    return "\n".join(lines)


def load_dump(path: str) -> list[Episode]:
    """A dump file (one JSON episode per line) -> episodes; a bad line is one clear error."""
    episodes = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                episodes.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{n} is not JSON ({err.msg}); a dump holds one JSON episode per line") \
                    from None
    return episodes


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bugfix_gym.integrations.conformance DUMP.jsonl [--end-ids 2,7]``: print the report, exit 1 on a
    failed check, 2 on an unreadable dump."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bugfix_gym.integrations.conformance", description=__doc__
                                     .split("\n")[0])
    parser.add_argument("dump", help="one JSON episode per line (fields: see the module docstring)")
    parser.add_argument("--end-ids", default="", help="comma-separated ids that end a model turn, for eos_trained")
    args = parser.parse_args(argv)
    try:
        batch = load_dump(args.dump)
        end_ids = [int(x) for x in args.end_ids.split(",") if x.strip()]
        results = run_checks(batch, end_ids=end_ids)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(format_report(results))
    return 1 if any(r.failed for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
