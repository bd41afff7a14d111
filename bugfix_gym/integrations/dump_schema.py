"""The conformance dump's JSON Schema (``docs/dump.schema.json``) and the small validator the reader runs on
every episode (standard library only: no ``jsonschema`` needed).

Three layouts of one episode are read (docs/conformance.md "The dump format"): ours (``input_ids`` +
``loss_mask``), TRL's (``prompt_ids`` + ``completion_ids`` + ``mask``) and verl's ``DataProto`` row
(``prompts`` + ``responses`` + ``response_mask``). :data:`SCHEMA` describes all three; :func:`layout_of`
names the one an episode is in, and :func:`validate_episode` checks it against the schema and raises one
``ValueError`` line naming the field. ``python -m bugfix_gym.integrations.dump_schema`` prints the schema
(``docs/dump.schema.json`` is that output; ``tests/test_conformance.py`` checks the two agree and
validates every layout with ``jsonschema`` too).
"""

from __future__ import annotations

import json
from typing import Any

_IDS = {"type": "array", "items": {"type": "integer"}}
_FLAGS = {"type": "array", "items": {"type": ["integer", "boolean"]}, "description": "one 0 / 1 per token"}
_NUMBERS = {"type": "array", "items": {"type": "number"}}
_SCALAR = {"type": ["integer", "string", "number", "array", "null"]}


def _per_token(what: str) -> dict[str, Any]:
    return dict(_NUMBERS, description=what)


#: the fields every layout shares (per-token lists are as long as the layout's token list)
COMMON = {
    "logprobs": _per_token("the sampler's log-prob of each token it wrote"),
    "old_logprobs": _per_token("the trainer's log-probs before its first update (pi_old)"),
    "new_logprobs": _per_token("the trainer's log-probs at its first update (the ratio's numerator)"),
    "clip_fraction": {"type": "number", "description": "the share of clipped tokens at the first update"},
    "advantages": {"type": ["number", "array"], "items": {"type": "number"},
                   "description": "one number, or one per token"},
    "turns": {"type": "array", "description": "each model turn and tool output", "items": {
        "type": "object", "properties": {
            "role": {"enum": ["model", "tool"]}, "start": {"type": "integer", "minimum": 0},
            "end": {"type": "integer", "minimum": 0},
            "input_ids": dict(_IDS, description="what the sampler was given at this model turn"),
            "output_ids": dict(_IDS, description="what the sampler wrote at this model turn")}}},
    "response_length": {"type": "integer", "minimum": 0, "description": "the length the trainer counted"},
    "group": dict(_SCALAR, description="the episode's GRPO group (members must share a reset)"),
    "reset_seed": dict(_SCALAR, description="what the env was reset from"),
    "task": dict(_SCALAR, description="what the env was reset from"),
    "reset_key": dict(_SCALAR, description="what the env was reset from, in one value"),
    "reward": {"type": "number", "description": "the episode's return"},
    "truncated": {"type": "boolean", "description": "stopped on a limit (turns, tokens), not on its own end"},
    "mask_truncated_completions": {"type": "boolean"},
    "loss_type": {"type": "string", "description": "TRL's loss_type or our aggregation name"},
    "max_completion_length": {"type": "number", "description": "L_max of dr_grpo / seq_mean_token_sum_norm"},
    "loss_norm_const": {"type": "number", "description": "C of the constant normaliser"},
    "minibatch": dict(_SCALAR, description="the first update's minibatch the episode was in"),
    "advantage_estimator": {"type": "string"},
}

#: layout name -> (its required fields, its own fields)
LAYOUTS: dict[str, tuple[list[str], dict[str, Any]]] = {
    "native": (["input_ids", "loss_mask"], {
        "input_ids": dict(_IDS, description="prompt, then each model turn and tool output, as trained"),
        "loss_mask": dict(_FLAGS, description="1 = written by the model; the prompt is the ids before the first 1"),
        "per_token_loss": _per_token("d loss / d logp of each token"),
    }),
    "trl": (["prompt_ids", "completion_ids", "mask"], {
        "prompt_ids": _IDS,
        "completion_ids": dict(_IDS, description="the model turns with the tool outputs spliced in"),
        "mask": dict(_FLAGS, description="TRL's tool_mask over completion_ids: 1 = written by the model"),
        "loss_weights": _per_token("d loss / d logp of each completion token"),
    }),
    "verl": (["prompts", "responses", "response_mask"], {
        "prompts": dict(_IDS, description="the prompt ids (left-padded, as in DataProto)"),
        "responses": dict(_IDS, description="the response ids (right-padded)"),
        "response_mask": dict(_FLAGS, description="over responses: 1 = written by the model"),
        "attention_mask": dict(_FLAGS, description="over prompts + responses: 0 = padding"),
        "uid": dict(_SCALAR, description="the prompt's uid: the GRPO group"),
        "rollout_log_probs": _per_token("the rollout engine's log-probs (the sampler's)"),
        "old_log_probs": _per_token("the actor's recomputed log-probs (pi_old)"),
        "token_level_scores": _per_token("the reward, placed on tokens (its sum is the episode's reward)"),
        "token_level_rewards": _per_token("the reward after the KL penalty"),
        "loss_agg_mode": {"enum": ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                   "seq-mean-token-sum-norm"]},
        "per_token_loss": _per_token("d loss / d logp of each response token"),
    }),
}

LAYOUT_FIELDS = {"native": "input_ids + loss_mask", "trl": "prompt_ids + completion_ids + mask (TRL)",
                 "verl": "prompts + responses + response_mask (verl)"}


def _build() -> dict[str, Any]:
    defs = {name: {"type": "object", "required": required, "properties": own}
            for name, (required, own) in LAYOUTS.items()}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "urn:bugfix-gym:conformance-dump",
        "title": "bugfix-gym conformance dump: one episode (one line of the dump)",
        "description": "One JSON object per line, one line per episode, in one of three layouts (native, TRL, "
                       "verl); token indices in messages and in turns' start / end count in the layout's token "
                       "list (input_ids, completion_ids, responses). docs/conformance.md has every field.",
        "type": "object",
        "properties": COMMON,
        "anyOf": [{"$ref": f"#/$defs/{name}"} for name in LAYOUTS],
        "$defs": defs,
    }


SCHEMA: dict[str, Any] = _build()
"""The JSON Schema of one dump line (``docs/dump.schema.json``)."""


def layout_of(episode: dict[str, Any]) -> str | None:
    """The layout an episode is written in: ``verl`` (has ``responses``), ``native`` (``input_ids``) or ``trl``
    (``completion_ids``), or None."""
    if "responses" in episode:
        return "verl"
    if "input_ids" in episode:
        return "native"
    if "completion_ids" in episode or "prompt_ids" in episode:
        return "trl"
    return None


_TYPES = {"integer": lambda x: isinstance(x, int) and not isinstance(x, bool),
          "number": lambda x: isinstance(x, (int, float)) and not isinstance(x, bool),
          "boolean": lambda x: isinstance(x, bool), "string": lambda x: isinstance(x, str),
          "array": lambda x: isinstance(x, list), "object": lambda x: isinstance(x, dict),
          "null": lambda x: x is None}


def _kind(x: Any) -> str:
    return next((name for name in ("boolean", "integer", "number", "string", "array", "object", "null")
                 if _TYPES[name](x)), type(x).__name__)


def _check(value: Any, schema: dict[str, Any], where: str) -> str | None:
    """The first way ``value`` breaks ``schema`` (the subset of JSON Schema :data:`SCHEMA` uses), or None."""
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not any(_TYPES[k](value) for k in kinds):
            return f"{where} is {_kind(value)}, not {' or '.join(kinds)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where} is {json.dumps(value)[:40]}, not one of {', '.join(map(json.dumps, schema['enum']))}"
    if "minimum" in schema and _TYPES["number"](value) and value < schema["minimum"]:
        return f"{where} is {value}, below {schema['minimum']}"
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            why = _check(item, schema["items"], f"{where}[{i}]")
            if why:
                return why
    if isinstance(value, dict):
        missing = [k for k in schema.get("required", ()) if k not in value]
        if missing:
            return f"{where} lacks {', '.join(repr(k) for k in missing)}"
        for key, sub in schema.get("properties", {}).items():
            if key in value and value[key] is not None:
                why = _check(value[key], sub, f"{where}{'.' if where else ''}{key}")
                if why:
                    return why
    return None


def validate_episode(episode: Any, index: int = 0) -> str:
    """Check one dump line against :data:`SCHEMA`; returns its layout.

    :param episode: the line's parsed JSON
    :param index: its episode number, for the message
    :raises ValueError: one line naming the field (and the schema) when it does not conform
    """
    if not isinstance(episode, dict):
        raise ValueError(f"episode {index} is {type(episode).__name__}, not a JSON object (docs/conformance.md)")
    layout = layout_of(episode)
    if layout is None:
        raise ValueError(f"episode {index} needs 'input_ids' and 'loss_mask' (or TRL's 'prompt_ids', "
                         "'completion_ids' and 'mask', or verl's 'prompts', 'responses' and 'response_mask'); "
                         "see docs/conformance.md")
    required, own = LAYOUTS[layout]
    missing = [k for k in required if episode.get(k) is None]
    if missing:
        has = " and ".join(repr(k) for k in required if k not in missing)
        raise ValueError(f"episode {index} has {has} but no {' or '.join(repr(k) for k in missing)} (the "
                         f"{layout} layout: {LAYOUT_FIELDS[layout]}; docs/dump.schema.json)")
    why = _check(episode, {"type": "object", "properties": {**COMMON, **own}}, "")
    if why:
        raise ValueError(f"episode {index}: {why} (docs/dump.schema.json)")
    return layout


def main() -> None:
    """Print :data:`SCHEMA` as ``docs/dump.schema.json`` holds it."""
    print(json.dumps(SCHEMA, indent=2))


if __name__ == "__main__":
    main()
