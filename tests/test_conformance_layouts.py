"""The conformance suite on every layout (ours, TRL's, verl's), with and without the optional fields: the
planted bugs of tests/test_conformance.py each fail under ``--strict``, the correct batches pass; the headline
bug (tool tokens in the mask) fails a dump with no ``turns``; the JSON Schema agrees with the reader and
with ``jsonschema``; ``--json`` lists the skips."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from bugfix_gym.integrations import conformance
from bugfix_gym.integrations.conformance import CHECKS, derive_spans, run_checks
from bugfix_gym.integrations.dump_schema import SCHEMA, validate_episode
from tests.test_conformance import BROKEN, END, CharTokenizer, dump_format, good_batch

TOOL_END = [4]  # the toy tool output [3, 4] ends with 4
DOCS = Path(__file__).resolve().parent.parent / "docs"


def to_verl(e: dict, pad_prompt: int = 2, pad_response: int = 3) -> dict:
    """A TRL-shaped toy episode as a verl ``DataProto`` row: left-padded prompts, right-padded responses, the
    attention mask over both, ``uid`` for the group, the reward on the last response token."""
    n = len(e["completion_ids"])
    right = [0] * pad_response

    def over_responses(values):
        return list(values) + [0.0] * pad_response

    row = {"prompts": [0] * pad_prompt + e["prompt_ids"], "responses": e["completion_ids"] + right,
           "response_mask": e["mask"] + right,
           "attention_mask": [0] * pad_prompt + [1] * len(e["prompt_ids"]) + [1] * n + right,
           "uid": f"uid-{e['group']}", "rollout_log_probs": over_responses(e["logprobs"]),
           "old_log_probs": over_responses(e["old_logprobs"]), "new_logprobs": over_responses(e["new_logprobs"]),
           "per_token_loss": over_responses(e["loss_weights"]),
           "advantages": over_responses([e["advantages"] if m else 0.0 for m in e["mask"]]),
           "token_level_scores": over_responses([0.0] * (n - 1) + [e["reward"]]),
           "response_length": e["response_length"], "truncated": e["truncated"],
           "loss_agg_mode": "seq-mean-token-sum-norm", "max_completion_length": e["max_completion_length"]}
    if "clip_fraction" in e:
        row["clip_fraction"] = e["clip_fraction"]
    if "mask_truncated_completions" in e:
        row["mask_truncated_completions"] = e["mask_truncated_completions"]
    for key in ("turns", "reset_key"):
        if key in e:
            row[key] = e[key]
    return row


LAYOUTS = {"native": dump_format, "trl": lambda e: e, "verl": to_verl}


def bare(e: dict) -> dict:
    """The episode without the fields a trainer may not have: no ``turns`` (spans, per-turn ids), no reset key."""
    return {k: v for k, v in e.items() if k not in ("turns", "reset_key")}


def _groups_differ_in_prompt(b):  # the member reset to another task sees another prompt (and key, if written)
    b[1]["reset_key"] = "task-7"
    b[1]["prompt_ids"] = [5, 7]
    for turn in b[1]["turns"]:
        if "input_ids" in turn:
            turn["input_ids"] = [5, 7] + turn["input_ids"][2:]


PLANTED = dict(BROKEN, group_shares_reset=_groups_differ_in_prompt)
PER_TURN_IDS = {"prefix_preserved"}  # without turns, only --strict's skip catches its bug


def batch_of(layout: str, full: bool, broken: str | None = None) -> list[dict]:
    batch = good_batch()
    if broken:
        PLANTED[broken](batch)
    batch = [e if full else bare(e) for e in batch]
    return [LAYOUTS[layout](copy.deepcopy(e)) for e in batch]


def _run(batch, **kwargs):
    return {r.name: r for r in run_checks(batch, end_ids=[END], tool_end_ids=TOOL_END, tokenizer=CharTokenizer(),
                                          **kwargs)}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("full", [True, False], ids=["all fields", "no turns or reset keys"])
def test_a_correct_batch_passes_strict_in_every_layout(layout, full):
    results = _run(batch_of(layout, full), strict=True, allow_skip=[] if full else PER_TURN_IDS)
    assert not [r for r in results.values() if r.failed], conformance.format_report(list(results.values()))
    if not full:  # plain --strict names what is missing
        strict = _run(batch_of(layout, full), strict=True)
        assert [n for n, r in strict.items() if r.failed] == ["prefix_preserved"]


@pytest.mark.parametrize("broken", sorted(PLANTED))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("full", [True, False], ids=["all fields", "no turns or reset keys"])
def test_every_planted_bug_fails_strict_in_every_layout(broken, layout, full):
    results = _run(batch_of(layout, full, broken), strict=True)
    failed = {n for n, r in results.items() if r.failed}
    if full or broken not in PER_TURN_IDS:
        assert broken in failed, conformance.format_report(list(results.values()))
        assert not results[broken].detail.startswith("--strict")  # caught by the check itself
        assert failed - {broken} <= (set() if full else PER_TURN_IDS)
    else:  # the trained ids rewritten: with no per-turn ids nothing shows it, but --strict fails the skip
        assert failed == PER_TURN_IDS and results["prefix_preserved"].detail.startswith("--strict")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_tool_tokens_in_the_mask_fail_a_dump_with_no_turns_from_end_ids_alone(layout):
    """trl#5144's class in a dump without ``turns`` (every TRL dump): before, tool_spans_masked skipped and the
    command exited 0. The spans now come from the end ids (and, given, the tool suffix)."""
    batch = batch_of(layout, False, "tool_spans_masked")
    for tool_end in ([], TOOL_END):
        results = {r.name: r for r in run_checks(batch, end_ids=[END], tool_end_ids=tool_end)}
        assert results["tool_spans_masked"].failed, tool_end
        token = 5 if layout == "native" else 3  # the first tool token, counted in the layout's own ids
        assert results["tool_spans_masked"].detail.startswith(f"episode 2 token {token}: tool output 0 has mask 1")
        assert "spans from end ids" in results["tool_spans_masked"].detail
    assert run_checks(batch, only=["tool_spans_masked"])[0].status == "skip"  # no end ids: nothing to find them
    assert run_checks(batch, only=["tool_spans_masked"], strict=True)[0].failed


def test_derived_spans_split_on_end_ids_and_the_tool_suffix():
    ids, mask = [1, 2, END, 3, 4, 1, END], [1, 1, 1, 0, 0, 1, 1]
    spans = [(s["role"], s["start"], s["end"]) for s in derive_spans(ids, mask, {END}, TOOL_END)]
    assert spans == [("model", 0, 3), ("tool", 3, 5), ("model", 5, 7)]
    assert derive_spans(ids, mask, {END}) == derive_spans(ids, mask, {END}, TOOL_END)  # the mask's 0 -> 1 agrees
    wrong = [1] * 7
    assert [(s["role"], s["start"], s["end"]) for s in derive_spans(ids, wrong, {END})][1] == ("tool", 3, 4)
    assert [(s["role"], s["start"], s["end"]) for s in derive_spans(ids, wrong, {END}, TOOL_END)][1] == ("tool", 3, 5)
    cut = derive_spans([1, 2, END, 3, 4, 1, 1], mask, {END}, TOOL_END)  # the last turn cut before its end id
    assert cut[-1] == {"role": "model", "start": 5, "end": 7}


def test_eos_masked_out_fails_a_dump_with_no_turns():
    batch = batch_of("trl", False, "eos_trained")
    results = {r.name: r for r in run_checks(batch, end_ids=[END])}
    assert results["eos_trained"].failed and "model turn 0's end token has mask 0" in results["eos_trained"].detail


def test_group_resets_are_compared_by_prompt_ids_and_keys_are_shown():
    batch = bare_batch = [bare(e) for e in good_batch()]
    assert run_checks(bare_batch, only=["group_shares_reset"])[0].status == "pass"  # no key: prompt ids compared
    batch[1]["prompt_ids"] = [5, 7]
    result = run_checks(batch, only=["group_shares_reset"])[0]
    assert result.failed and result.detail == ("group 0: episode 1's prompt ids differ from episode 0's at prompt "
                                               "token 1 (2 and 2 ids)")
    batch = good_batch()
    batch[1]["reset_key"] = "task-7"
    assert run_checks(batch, only=["group_shares_reset"])[0].detail == (
        'group 0: episode 1\'s reset key "task-7" differs from episode 0\'s "task-0"')


def test_verl_rows_are_unpadded_and_renamed():
    row = to_verl(good_batch()[0])
    episode = conformance.normalise(row)
    assert episode["prompt_ids"] == [5, 6] and episode["completion_ids"] == [1, 2, END, 3, 4, 1, END]
    assert episode["mask"] == [1, 1, 1, 0, 0, 1, 1] and episode["group"] == "uid-0" and episode["reward"] == 1.0
    assert episode["loss_type"] == "seq_mean_token_sum_norm" and len(episode["logprobs"]) == 7
    row["attention_mask"] = row["attention_mask"][:-1]
    with pytest.raises(ValueError, match="attention_mask has 13 entries"):
        conformance.normalise(row)


def test_a_verl_batch_with_env_tokens_in_the_loss_fails():
    batch = batch_of("verl", False)
    for row in batch:  # verl's multi-turn bug class: response_mask = the attention mask (tool tokens trained)
        row["response_mask"] = [1] * len(row["completion_ids" if "completion_ids" in row else "responses"])
    failed = {r.name for r in run_checks(batch, end_ids=[END], tool_end_ids=TOOL_END) if r.failed}
    assert "tool_spans_masked" in failed


def test_the_schema_file_is_the_readers_schema_and_jsonschema_agrees():
    jsonschema = pytest.importorskip("jsonschema")
    assert json.loads((DOCS / "dump.schema.json").read_text()) == SCHEMA  # python -m ...dump_schema wrote it
    validator = jsonschema.Draft202012Validator(SCHEMA)
    validator.check_schema(SCHEMA)
    for layout in LAYOUTS:
        for full in (True, False):
            for episode in batch_of(layout, full):
                assert not list(validator.iter_errors(episode)), layout
                assert validate_episode(episode) == layout
    bad = [({"input_ids": [1, 2]}, "has 'input_ids' but no 'loss_mask'"),
           ({"prompts": [1], "responses": [2]}, "no 'response_mask'"),
           ({"input_ids": [1, 2], "loss_mask": [0, 1], "reward": "1"}, "reward is string, not number"),
           ({"input_ids": [1, 2], "loss_mask": [0, 1], "turns": [{"role": "user"}]}, "turns[0].role is \"user\""),
           ({"prompt_ids": [1], "completion_ids": [2.5], "mask": [1]}, "completion_ids[0] is number, not integer"),
           ({"mask": [1]}, "needs 'input_ids' and 'loss_mask'")]
    for episode, message in bad:
        assert list(validator.iter_errors(episode)), episode
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
            validate_episode(episode)


def test_strict_exits_1_on_a_skip_and_json_lists_the_skips(tmp_path, capsys):
    from agents.cli import main

    path = tmp_path / "dump.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in batch_of("trl", False)))
    assert main(["conformance", str(path), "--end-ids", str(END), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["failed"] == 0 and not report["strict"]
    skipped = {s["name"]: s["missing"] for s in report["skipped"]}
    assert skipped == {"prefix_preserved": True, "retokenisation_stable": True}
    assert main(["conformance", str(path), "--end-ids", str(END), "--strict", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["failed"] == 2 and report["skipped"] == []
    assert main(["conformance", str(path), "--end-ids", str(END), "--strict", "--allow-skip",
                 "prefix_preserved,retokenisation_stable"]) == 0
    capsys.readouterr()
    assert main(["conformance", str(path), "--strict", "--allow-skip", "nope"]) == 2
    assert "unknown conformance check" in capsys.readouterr().err
    assert main(["conformance", str(path), "--logprob-tol", "-1"]) == 2
    assert "--logprob-tol must be a positive number" in capsys.readouterr().err


def test_the_logprob_tolerance_is_a_flag(tmp_path, capsys):
    from agents.cli import main

    batch = good_batch()
    batch[0]["logprobs"] = [x - (0.02 if m else 0.0) for x, m in zip(batch[0]["logprobs"], batch[0]["mask"])]
    path = tmp_path / "dump.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in batch))
    assert main(["conformance", str(path), "--end-ids", str(END)]) == 1
    assert "FAIL  sampler_matches_trainer" in capsys.readouterr().out
    assert main(["conformance", str(path), "--end-ids", str(END), "--logprob-tol", "0.05"]) == 0


def test_every_check_runs_with_a_char_tokenizer_that_has_no_segments():
    assert conformance.tool_end_of(CharTokenizer()) == []
    assert conformance.tool_end_of(None) == []
    assert set(CHECKS) == {r.name for r in run_checks(good_batch(), end_ids=[END])}
