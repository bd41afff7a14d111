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


B, L_MAX = 4, 8  # the toy batch's sequences, and dr_grpo's max_completion_length


def episode(group: int, reward: float, adv: float) -> dict:
    """Prompt [5, 6]; the model writes [1, 2, END], the env answers [3, 4], the model writes [1, END]."""
    prompt, first, tool, second = [5, 6], [1, 2, END], [3, 4], [1, END]
    completion = first + tool + second
    mask = [1, 1, 1, 0, 0, 1, 1]
    logprobs = [-0.5, -0.2, -0.1, 0.0, 0.0, -0.3, -0.05]
    return dict(prompt_ids=prompt, completion_ids=completion, mask=mask, logprobs=logprobs,
                old_logprobs=list(logprobs), new_logprobs=list(logprobs), loss_weights=dr_grpo_weights(mask, adv),
                turns=[{"role": "model", "start": 0, "end": 3, "input_ids": prompt, "output_ids": first},
                       {"role": "tool", "start": 3, "end": 5},
                       {"role": "model", "start": 5, "end": 7, "input_ids": prompt + first + tool,
                        "output_ids": second}],
                response_length=5, group=group, reset_key=f"task-{group}", reward=reward, advantages=adv,
                truncated=False, loss_type="dr_grpo", max_completion_length=L_MAX)


def dr_grpo_weights(mask, adv) -> list[float]:
    """d loss / d logp of TRL's dr_grpo at ratio 1: -A / (B * max_completion_length) on model tokens."""
    return [-adv / (B * L_MAX) if m else 0.0 for m in mask]


def good_batch() -> list[dict]:
    """Group 0 has rewards 1 and 0, group 1 two rewards of 1 (zero variance, zero advantage)."""
    return [episode(0, 1.0, 0.5), episode(0, 0.0, -0.5), episode(1, 1.0, 0.0), episode(1, 1.0, 0.0)]


def dump_format(e: dict) -> dict:
    """A TRL-shaped episode in the dump format: input_ids + loss_mask, per-token lists over input_ids."""
    out = {k: v for k, v in e.items() if k not in ("prompt_ids", "completion_ids", "mask", "loss_weights")}
    n = len(e["prompt_ids"])
    out.update(input_ids=e["prompt_ids"] + e["completion_ids"], loss_mask=[0] * n + e["mask"],
               per_token_loss=[0.0] * n + e["loss_weights"])
    for key in ("logprobs", "old_logprobs", "new_logprobs"):
        out[key] = [0.0] * n + e[key]
    if "turns" in e:
        out["turns"] = [dict(t, start=t["start"] + n, end=t["end"] + n) if "start" in t else t for t in e["turns"]]
    return out


def failed(batch, **kwargs) -> set[str]:
    return {r.name for r in run_checks(batch, end_ids=[END], tokenizer=CharTokenizer(), **kwargs) if r.failed}


TOKEN_LEVEL = "retokenisation_stable"  # not applicable where every turn's output_ids are the ids trained


def test_a_correct_batch_passes_every_check_and_skips_none():
    results = run_checks(good_batch(), end_ids=[END], tokenizer=CharTokenizer(), strict=True)
    assert {r.name: r.status for r in results} == {name: "skip" if name == TOKEN_LEVEL else "pass"
                                                   for name in CHECKS}, format_report(results)
    assert not [r for r in results if r.missing]
    without_turn_ids = good_batch()
    for e in without_turn_ids:
        e["turns"] = [{k: v for k, v in t.items() if k not in ("input_ids", "output_ids")} for t in e["turns"]]
    results = run_checks(without_turn_ids, end_ids=[END], tokenizer=CharTokenizer())
    assert {r.name: r.status for r in results} == {name: "skip" if name == "prefix_preserved" else "pass"
                                                   for name in CHECKS}, format_report(results)


def _mask_longer(b):  # trl#5144: the tool mask got one entry per tool token too many
    b[1]["mask"] = b[1]["mask"] + [0]


def _env_tokens_trained(b):  # TRL PR #4975: the fast loss path weighs every completion token
    b[0]["loss_weights"] = [w if m else 0.2 for w, m in zip(b[0]["loss_weights"], b[0]["mask"])]


def _tool_tokens_marked_model(b):  # a tool mask that marks the tool output as the model's (and counts it)
    b[2]["mask"] = [1] * len(b[2]["mask"])
    b[2]["response_length"] = len(b[2]["mask"])
    b[2]["loss_weights"] = dr_grpo_weights(b[2]["mask"], b[2]["advantages"])


def _clipped_at_ratio_one(b):  # the clip compares against other old log-probs than the ratio's
    b[0]["clip_fraction"] = 0.25


def _truncation_flag_lost(b):  # the last turn ran out of tokens, but the trainer trains it as if it stopped
    b[3]["completion_ids"] = b[3]["completion_ids"][:-1] + [1]
    b[3]["turns"][2]["output_ids"] = [1, 1]


def _zero_variance_group_trained(b):  # group 1's equal rewards given advantages (that still sum to zero)
    for e, adv in ((2, 0.3), (3, -0.3)):
        b[e]["advantages"] = adv
        b[e]["loss_weights"] = dr_grpo_weights(b[e]["mask"], adv)


def _normaliser_per_sequence(b):  # loss_type dr_grpo claimed, but episode 0 divided by its own length (grpo's)
    b[0]["loss_weights"] = [-0.5 / (B * 5) if m else 0.0 for m in b[0]["mask"]]


def _dropout_on(b):  # trlx#107: a second forward pass with dropout gives other log-probs
    b[2]["new_logprobs"] = [x + (0.03 if m else 0.0) for x, m in zip(b[2]["old_logprobs"], b[2]["mask"])]


def _sampler_numerics(b):  # trl#6789: the sampler's log-probs come from another precision / truncated sampling
    b[3]["logprobs"] = [x - (0.2 if m else 0.0) for x, m in zip(b[3]["logprobs"], b[3]["mask"])]


def _retokenised_history(b):  # trl#5224 / verl#3960: turn 2's input re-tokenised from text, a merge appears
    b[1]["turns"][2]["input_ids"] = [5, 6, 99, END, 3, 4]


def _template_strips_text(b):  # prime-rl#1334: the trained ids lose what the template stripped from turn 1
    b[0]["completion_ids"] = [1, 1, END, 3, 4, 1, END]


def _tool_tokens_in_length(b):  # OpenRLHF PR #1252: response length = the completion's span
    for e in b:
        e["response_length"] = len(e["completion_ids"])


def _eos_masked(b):  # RAGEN#59: the end token of a model turn written with mask 0
    b[0]["mask"] = [1, 1, 0, 0, 0, 1, 1]
    b[0]["loss_weights"] = dr_grpo_weights(b[0]["mask"], b[0]["advantages"])
    b[0]["response_length"] = 4


def _groups_differ(b):  # TRL environment_factory docs: reset() drew a fresh task per member
    b[1]["reset_key"] = "task-7"


def _advantages_off_centre(b):  # a baseline from the wrong group
    b[1]["advantages"] = -0.3
    b[1]["loss_weights"] = dr_grpo_weights(b[1]["mask"], -0.3)


BROKEN = {
    "mask_length": _mask_longer,
    "env_tokens_out_of_loss": _env_tokens_trained,
    "tool_spans_masked": _tool_tokens_marked_model,
    "first_ratio_one": _dropout_on,
    "sampler_matches_trainer": _sampler_numerics,
    "prefix_preserved": _template_strips_text,
    "response_length_is_model_tokens": _tool_tokens_in_length,
    "eos_trained": _eos_masked,
    "group_shares_reset": _groups_differ,
    "group_advantages_centred": _advantages_off_centre,
    "truncation_masked": _truncation_flag_lost,
    "zero_variance_groups": _zero_variance_group_trained,
    "loss_normaliser": _normaliser_per_sequence,
}
#: more broken batches, each caught by the check it names (a second bug for the same check)
BROKEN_TOO = {
    "clip fraction at ratio 1": ("first_ratio_one", _clipped_at_ratio_one),
    "mask_truncated_completions ignored": ("truncation_masked", lambda b: [
        e.update(mask_truncated_completions=True, truncated=e is b[0]) for e in b]),
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


@pytest.mark.parametrize("bug", sorted(BROKEN_TOO))
def test_a_second_bug_per_check_fails_exactly_that_check(bug):
    name, breaks = BROKEN_TOO[bug]
    batch = good_batch()
    breaks(batch)
    results = {r.name: r for r in run_checks(batch, end_ids=[END], tokenizer=CharTokenizer())}
    assert {n for n, r in results.items() if r.failed} == {name}, format_report(list(results.values()))
    assert "episode 0" in results[name].detail


def test_the_dump_format_reads_like_trls_layout_and_counts_tokens_in_input_ids():
    good = [dump_format(e) for e in good_batch()]
    assert [r.status for r in run_checks(good, end_ids=[END], tokenizer=CharTokenizer())] == [
        "skip" if name == TOKEN_LEVEL else "pass" for name in CHECKS]
    for name in ("env_tokens_out_of_loss", "loss_normaliser", "eos_trained"):
        trl, ours = good_batch(), good_batch()
        BROKEN[name](trl)
        BROKEN[name](ours)
        ours = [dump_format(e) for e in ours]
        a = {r.name: r for r in run_checks(trl, end_ids=[END])}[name]
        b = {r.name: r for r in run_checks(ours, end_ids=[END])}[name]
        assert a.failed and b.failed
        token = int(a.detail.split("token ")[1].split(":")[0])
        assert b.detail == a.detail.replace(f"token {token}", f"token {token + 2}")  # the prompt's 2 ids


def test_the_normaliser_of_each_loss_type_is_its_formula():
    batch = good_batch()
    lengths = [5, 5, 5, 5]
    for e in batch:
        e["advantages"] = [1.0 if m else 0.0 for m in e["mask"]]
    formulas = {"grpo": lambda n: 1 / (B * lengths[n]), "bnpo": lambda n: 1 / sum(lengths),
                "dapo": lambda n: 1 / sum(lengths), "dr_grpo": lambda n: 1 / (B * L_MAX)}
    for kind, weight in formulas.items():
        for n, e in enumerate(batch):
            e.update(loss_type=kind, loss_weights=[-weight(n) if m else 0.0 for m in e["mask"]])
        assert {r.name: r.status for r in run_checks(batch, only=["loss_normaliser"])} == {"loss_normaliser": "pass"}
        wrong = "grpo" if kind == "dr_grpo" else "dr_grpo"
        batch[1]["loss_type"] = wrong
        assert run_checks(batch, only=["loss_normaliser"])[0].failed, kind
    batch[0]["loss_type"] = "mystery"
    assert run_checks(batch, only=["loss_normaliser"])[0].status == "skip"


def test_retokenised_history_fails_the_prefix_check_at_the_merged_token():
    batch = good_batch()
    _retokenised_history(batch)
    result = {r.name: r for r in run_checks(batch)}["prefix_preserved"]
    assert result.failed and "episode 1 turn 0" in result.detail and "token 2" in result.detail
    assert "trl#5224" in result.bug


def test_a_merging_tokenizer_fails_retokenisation_on_the_turn_that_decodes_to_the_merge():
    assert failed(good_batch()) == set()
    batch = good_batch()  # without per-turn ids: nothing shows the trainer trains what the sampler wrote
    for e in batch:
        e["turns"] = [t for t in e["turns"] if "start" in t and t["role"] == "tool"]
    assert failed(batch) == set()
    results = {r.name: r for r in run_checks(batch, tokenizer=CharTokenizer(merge=True))}
    assert results["retokenisation_stable"].failed
    assert results["retokenisation_stable"].detail.startswith("episode 0 token 0")


def test_missing_fields_skip_their_checks_rather_than_pass():
    bare = [{k: v for k, v in e.items() if k in ("prompt_ids", "completion_ids", "mask")} for e in good_batch()]
    results = {r.name: r for r in run_checks(bare)}
    assert results["mask_length"].status == "pass"
    assert {n for n, r in results.items() if r.status == "skip"} == set(CHECKS) - {"mask_length"}
    no_groups = {"group_shares_reset", "group_advantages_centred", "zero_variance_groups"}
    assert {n for n, r in results.items() if r.status == "skip" and not r.missing} == no_groups  # nothing to check
    strict = {r.name: r for r in run_checks(bare, strict=True)}
    assert {n for n, r in strict.items() if r.failed} == set(CHECKS) - {"mask_length"} - no_groups
    assert strict["loss_normaliser"].detail.startswith("--strict: skipped for lack of what it reads: no 'loss_type'")


def test_a_batch_without_ids_is_one_clear_error():
    with pytest.raises(ValueError, match="needs 'input_ids' and 'loss_mask'"):
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


def test_bugfix_gym_conformance_prints_one_line_per_check_and_exits_1_on_a_failure(tmp_path, capsys):
    from agents.cli import main

    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_text("\n".join(json.dumps(dump_format(e)) for e in good_batch()) + "\n")
    broken = good_batch()
    _normaliser_per_sequence(broken)
    bad.write_text("\n".join(json.dumps(e) for e in broken))
    assert main(["conformance", str(good), "--end-ids", str(END)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[:2] for ln in lines] == [["skip" if name == "retokenisation_stable" else "pass", name]
                                                for name in CHECKS]  # n/a: every turn's output_ids are trained
    assert main(["conformance", str(bad), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["failed"] == 1 and {c["name"]: c["status"] for c in report["checks"]}["loss_normaliser"] == "FAIL"
    assert "episode 0 token 0: loss weight" in {c["name"]: c["detail"] for c in report["checks"]}["loss_normaliser"]


@pytest.mark.parametrize("content, error", [
    (None, "cannot read"), ("", "holds no episode"), ("\n\n", "holds no episode"), ("{not json\n", ":1 is not JSON"),
    ("[1, 2]\n", "episode 0 is list, not a JSON object"), ('{"mask": [1]}\n', "needs 'input_ids' and 'loss_mask'"),
    ('{"input_ids": [1, "x"], "loss_mask": [0, 1]}\n', "input_ids[1] is string, not integer"),
    ('{"input_ids": [1, 2], "loss_mask": [0, 1], "turns": [{"start": 0, "end": 9}]}\n', "a turn's span"),
    ('{"input_ids": [1, 2], "loss_mask": [0, 1], "logprobs": "abc"}\n', "logprobs is string, not array"),
    (b"\xff\xfe\x00", "not a text file"),
])
def test_an_unreadable_dump_is_one_line_and_exit_2(tmp_path, capsys, content, error):
    from agents.cli import main

    path = tmp_path / "dump.jsonl"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    assert main(["conformance", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bugfix-gym conformance: error: ") and error in err and len(err.splitlines()) == 1


def test_a_mistyped_command_gets_a_did_you_mean(capsys):
    from agents.cli import main

    assert main(["conformanc", "x.jsonl"]) == 2
    assert "did you mean 'conformance'?" in capsys.readouterr().err
    assert main(["conformance", "x.jsonl", "--end-ids", "2,x"]) == 2
    assert "--end-ids takes comma-separated integer ids" in capsys.readouterr().err


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


# ---------------------------------------------------------------------- hostile dumps: one line, exit 2, bounded
def _normalised(kind: str, value) -> str:
    e = dump_format(good_batch()[0])
    e.update(loss_type=kind, **value)
    return json.dumps(e) + "\n"


HOSTILE_DUMPS = {
    "Infinity": ('{"input_ids": [1, 2], "loss_mask": [0, 1], "logprobs": [0, Infinity]}\n', "holds Infinity"),
    "NaN": ('{"input_ids": [1, 2], "loss_mask": [0, 1], "logprobs": [0, NaN]}\n', "holds NaN"),
    "1e400": ('{"input_ids": [1, 2], "loss_mask": [0, 1], "logprobs": [0, -1e400]}\n', "overflows a float"),
    "5,000 digits": ('{"input_ids": [1, ' + "9" * 5000 + '], "loss_mask": [0, 1]}\n', "beyond 64 bits"),
    "2**64": ('{"input_ids": [1, 18446744073709551616], "loss_mask": [0, 1]}\n', "beyond 64 bits"),
    "100,000-deep nesting": ("[" * 100_000 + "]" * 100_000 + "\n", "nests deeper than 32"),
    "40-deep nesting": ('{"input_ids": [1, 2], "loss_mask": [0, 1], "x": ' + "[" * 40 + "]" * 40 + "}\n",
                        "nests deeper than 32"),
    "a zero constant normaliser": (_normalised("constant", {"loss_norm_const": 0}), "loss_norm_const is 0"),
    "a negative constant normaliser": (_normalised("constant", {"loss_norm_const": -2}), "loss_norm_const is -2"),
    "a zero max length": (_normalised("dr_grpo", {"max_completion_length": 0}), "max_completion_length is 0"),
    "a word for a length": (json.dumps(dict(dump_format(good_batch()[0]), response_length="lots")) + "\n",
                            "response_length is string, not integer (docs/dump.schema.json)"),
}


@pytest.mark.parametrize("kind", HOSTILE_DUMPS)
def test_a_hostile_dump_is_one_line_and_exit_2(tmp_path, capsys, kind):
    from agents.cli import main

    content, error = HOSTILE_DUMPS[kind]
    path = tmp_path / "dump.jsonl"
    path.write_text(content)
    assert main(["conformance", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bugfix-gym conformance: error: ") and error in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("where", ["/dev/zero", "fifo", "folder", "too big"])
@pytest.mark.parametrize("flag", ["dump", "--tokenizer"])
def test_a_dump_or_tokenizer_that_is_no_regular_file_is_refused_before_it_is_read(tmp_path, capsys, monkeypatch,
                                                                                  where, flag):
    """/dev/zero was read until MemoryError and a FIFO blocked for good: both are refused at open."""
    import os

    from agents.cli import main

    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps(dump_format(good_batch()[0])) + "\n")
    target = {"/dev/zero": "/dev/zero", "fifo": str(tmp_path / "fifo"), "folder": str(tmp_path),
              "too big": str(good)}[where]
    if where == "fifo":
        os.mkfifo(target)
    if where == "too big":
        monkeypatch.setattr(conformance, "MAX_DUMP_BYTES", 100)
        monkeypatch.setattr(conformance, "MAX_TOKENIZER_BYTES", 100)
    argv = [target] if flag == "dump" else [str(good), "--tokenizer", target]
    assert main(["conformance", *argv]) == 2
    err = capsys.readouterr().err
    folder = "Is a directory" if flag == "dump" else "holds no tokenizer.json"  # --tokenizer reads save_pretrained
    expected = {"too big": "more than the 100 read", "folder": folder}.get(where, "is not a regular file")
    assert expected in err and len(err.splitlines()) == 1, err


def test_a_kl_in_the_reward_batch_skips_the_zero_variance_check_only():
    """Equal rewards less a KL in the reward are unequal returns: the trainer that says ``kl_in_reward`` is not
    failed for giving that group advantages; the other checks still run (and pass)."""
    batch = good_batch()
    _zero_variance_group_trained(batch)
    for episode in batch:
        episode["kl_in_reward"] = 0.05
    results = {r.name: r for r in run_checks(batch, end_ids=[END], tokenizer=CharTokenizer())}
    assert not any(r.failed for r in results.values()), format_report(list(results.values()))
    assert "kl_in_reward" in results["zero_variance_groups"].detail
