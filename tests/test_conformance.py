"""The conformance checks: a correct two-turn batch passes every check, and one deliberately broken batch per
reported trainer bug fails exactly the check that names that bug."""

from __future__ import annotations

import copy
import json

import pytest

from bugfix_gym.integrations import conformance
from bugfix_gym.integrations.conformance import CHECKS, format_report, run_checks

END = 9  # the id that ends a model turn in these toy batches


class CharTokenizer:
    """One id per character, plus an optional merge ("ab" -> 99) that a text-level loop would produce."""

    def __init__(self, merge: bool = False):
        self.merge = merge

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            if self.merge and text.startswith("ab", i):
                ids.append(99)
                i += 2
                continue
            ids.append(ord(text[i]) - ord("a") + 1 if text[i] != "$" else END)
            i += 1
        return ids

    def decode(self, ids) -> str:
        return "".join("$" if i == END else "ab" if i == 99 else chr(ord("a") + i - 1) for i in ids)


def episode(group: int, reward: float, adv: float) -> dict:
    """Prompt [5, 6]; the model writes [1, 2, END], the env answers [3, 4], the model writes [1, END]."""
    prompt, first, tool, second = [5, 6], [1, 2, END], [3, 4], [1, END]
    completion = first + tool + second
    mask = [1, 1, 1, 0, 0, 1, 1]
    logprobs = [-0.5, -0.2, -0.1, 0.0, 0.0, -0.3, -0.05]
    return dict(prompt_ids=prompt, completion_ids=completion, mask=mask, logprobs=logprobs,
                old_logprobs=list(logprobs), new_logprobs=list(logprobs), loss_weights=[m / 5 for m in mask],
                turns=[{"input_ids": prompt, "output_ids": first},
                       {"input_ids": prompt + first + tool, "output_ids": second}],
                response_length=5, group=group, reset_key=f"task-{group}", reward=reward, advantages=adv,
                truncated=False)


def good_batch() -> list[dict]:
    return [episode(0, 1.0, 0.5), episode(0, 0.0, -0.5), episode(1, 1.0, 0.0), episode(1, 1.0, 0.0)]


def failed(batch, **kwargs) -> set[str]:
    return {r.name for r in run_checks(batch, end_ids=[END], tokenizer=CharTokenizer(), **kwargs) if r.failed}


def test_a_correct_batch_passes_every_check_and_skips_none():
    results = run_checks(good_batch(), end_ids=[END], tokenizer=CharTokenizer())
    assert [r.status for r in results] == ["pass"] * len(CHECKS), format_report(results)


def _mask_longer(b):  # trl#5144: the tool mask got one entry per tool token too many
    b[1]["mask"] = b[1]["mask"] + [0]


def _env_tokens_trained(b):  # TRL PR #4975: the fast loss path weighs every completion token
    b[0]["loss_weights"] = [0.2] * len(b[0]["mask"])


def _dropout_on(b):  # trlx#107: a second forward pass with dropout gives other log-probs
    b[2]["new_logprobs"] = [x + (0.03 if m else 0.0) for x, m in zip(b[2]["old_logprobs"], b[2]["mask"])]


def _sampler_numerics(b):  # trl#6789: the sampler's log-probs come from another precision / truncated sampling
    b[3]["logprobs"] = [x - (0.2 if m else 0.0) for x, m in zip(b[3]["logprobs"], b[3]["mask"])]


def _retokenised_history(b):  # trl#5224 / verl#3960: turn 2's input re-tokenised from text, a merge appears
    b[1]["turns"][1]["input_ids"] = [5, 6, 99, END, 3, 4]


def _template_strips_text(b):  # prime-rl#1334: the trained ids lose what the template stripped from turn 1
    b[0]["completion_ids"] = [1, 1, END, 3, 4, 1, END]


def _tool_tokens_in_length(b):  # OpenRLHF PR #1252: response length = the completion's span
    for e in b:
        e["response_length"] = len(e["completion_ids"])


def _eos_masked(b):  # RAGEN#59: the end token of a model turn written with mask 0
    b[0]["mask"] = [1, 1, 0, 0, 0, 1, 1]
    b[0]["loss_weights"] = [m / 5 for m in b[0]["mask"]]
    b[0]["response_length"] = 4


def _groups_differ(b):  # TRL environment_factory docs: reset() drew a fresh task per member
    b[1]["reset_key"] = "task-7"


def _advantages_off_centre(b):  # a baseline from the wrong group
    b[2]["advantages"] = 0.5


BROKEN = {
    "mask_length": _mask_longer,
    "env_tokens_out_of_loss": _env_tokens_trained,
    "first_ratio_one": _dropout_on,
    "sampler_matches_trainer": _sampler_numerics,
    "prefix_preserved": _template_strips_text,
    "response_length_is_model_tokens": _tool_tokens_in_length,
    "eos_trained": _eos_masked,
    "group_shares_reset": _groups_differ,
    "group_advantages_centred": _advantages_off_centre,
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_each_broken_batch_fails_exactly_its_check_and_the_message_names_the_bug(name):
    batch = good_batch()
    BROKEN[name](batch)
    results = {r.name: r for r in run_checks(batch, end_ids=[END], tokenizer=CharTokenizer())}
    assert {n for n, r in results.items() if r.failed} == {name}
    assert "episode" in results[name].detail or "group" in results[name].detail
    line = [ln for ln in format_report(list(results.values())).splitlines() if ln.startswith("FAIL")][0]
    assert results[name].bug in line and name in line


def test_retokenised_history_fails_the_prefix_check_at_the_merged_token():
    batch = good_batch()
    _retokenised_history(batch)
    result = {r.name: r for r in run_checks(batch)}["prefix_preserved"]
    assert result.failed and "episode 1 turn 0" in result.detail and "token 2" in result.detail
    assert "trl#5224" in result.bug


def test_a_merging_tokenizer_fails_retokenisation_on_the_turn_that_decodes_to_the_merge():
    assert failed(good_batch()) == set()
    results = {r.name: r for r in run_checks(good_batch(), tokenizer=CharTokenizer(merge=True))}
    assert results["retokenisation_stable"].failed
    assert results["retokenisation_stable"].detail.startswith("episode 0 token 0")


def test_missing_fields_skip_their_checks_rather_than_pass():
    bare = [{k: v for k, v in e.items() if k in ("prompt_ids", "completion_ids", "mask")} for e in good_batch()]
    results = {r.name: r.status for r in run_checks(bare)}
    assert results["mask_length"] == "pass"
    assert {n for n, s in results.items() if s == "skip"} == set(CHECKS) - {"mask_length"}


def test_a_batch_without_ids_is_one_clear_error():
    with pytest.raises(ValueError, match="needs 'prompt_ids' and 'completion_ids'"):
        run_checks([{"mask": [1]}])
    with pytest.raises(ValueError, match="unknown conformance check"):
        run_checks(good_batch(), only=["nope"])


def test_the_command_reads_a_dump_and_exits_1_on_a_failed_check(tmp_path, capsys):
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_text("\n".join(json.dumps(e) for e in good_batch()) + "\n")
    broken = copy.deepcopy(good_batch())
    _mask_longer(broken)
    bad.write_text("\n".join(json.dumps(e) for e in broken))
    assert conformance.main([str(good), "--end-ids", str(END)]) == 0
    assert conformance.main([str(bad)]) == 1
    out = capsys.readouterr().out
    assert "FAIL  mask_length" in out and "trl#5144" in out
    (tmp_path / "junk.jsonl").write_text("{not json\n")
    assert conformance.main([str(tmp_path / "junk.jsonl")]) == 2
    assert "junk.jsonl:1 is not JSON" in capsys.readouterr().err


def test_importing_bugfix_gym_and_its_integrations_imports_no_trainer_library():
    import subprocess
    import sys

    probe = ("import sys, bugfix_gym, bugfix_gym.integrations.conformance, bugfix_gym.integrations.trl, "
             "bugfix_gym.integrations.trl_rollout, bugfix_gym.integrations.trl_dump, "
             "bugfix_gym.integrations.hf_tokenizer, bugfix_gym.integrations.hf_model; "
             "print(sorted(m for m in ('trl', 'transformers', 'datasets', 'tokenizers', 'accelerate') "
             "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr
