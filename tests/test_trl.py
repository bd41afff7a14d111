"""The LLM-trainer adapters with the real libraries (``make test-trl``; skipped where trl / transformers are missing):
the chat tokenizer TRL accepts, the extension property and the retokenisation trap, BugFixToolEnv's contract,
the rollout_func batch passing the conformance checks, and a few GRPO steps of the example."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("transformers")
trl = pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from bugfix_gym import FIX_OPS, CALLS, get_task  # noqa: E402
from bugfix_gym.integrations.conformance import run_checks  # noqa: E402
from bugfix_gym.integrations.hf_model import tiny_causal_lm  # noqa: E402
from bugfix_gym.integrations.hf_tokenizer import ChatIds, ChatTemplateTokenizer, call_ids, chat_tokenizer  # noqa: E402
from bugfix_gym.integrations.trl import ENDED, SUBMITTED, BugFixToolEnv, dataset_rows, make_dataset  # noqa: E402
from bugfix_gym.integrations.trl_rollout import (make_rollout_func, play_episode, reset_key,  # noqa: E402
                                                 rollout_rows, scripted_sft_rows)

torch.set_num_threads(1)
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


@pytest.fixture(scope="module")
def tokenizer():
    return chat_tokenizer()


def _split(call: str) -> tuple[str, str | None]:
    words = call.split()
    return words[0], words[1] if len(words) > 1 else None


def test_every_call_round_trips_and_parses_back_to_its_tool(tokenizer):
    from trl.chat_template_utils import parse_response

    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "fix the function clamp"}],
                                           add_generation_prompt=True, tokenize=True, return_dict=False)
    for call in CALLS:
        name, op = _split(call)
        ids = call_ids(tokenizer, name, op)
        assert tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False) == ids
        parsed = parse_response(tokenizer, ids, prefix=prompt)
        assert parsed["tool_calls"] == [{"type": "function", "function": {
            "name": name, "arguments": {"op": op} if op else {}}}]


def test_trl_accepts_the_chat_template_for_multi_turn_tool_calls(tokenizer):
    from trl.chat_template_utils import is_chat_template_prefix_preserving, supports_tool_calling

    assert supports_tool_calling(tokenizer) and is_chat_template_prefix_preserving(tokenizer)
    assert tokenizer.padding_side == "left" and tokenizer.eos_token == "<|end|>"


def test_tool_methods_have_the_schemas_trl_describes_them_with():
    from transformers.utils import get_json_schema

    env = BugFixToolEnv()
    schemas = {name: get_json_schema(getattr(env, name)) for name in ("read", "test", "edit", "revert", "submit")}
    assert list(schemas["edit"]["function"]["parameters"]["properties"]) == ["op"]
    assert all(not s["function"]["parameters"].get("properties") for n, s in schemas.items() if n != "edit")


def _text_level_turns(tokenizer, episode_calls, prompt, answers):
    """A loop that keeps the history as messages and re-renders and re-tokenises it every turn."""
    messages, turns = [{"role": "user", "content": prompt}], []
    for (name, op), answer in zip(episode_calls, answers):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        turns.append({"input_ids": list(ids), "output_ids": call_ids(tokenizer, name, op)})
        messages += [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
            "name": name, "arguments": {"op": op} if op else {}}}]}, {"role": "tool", "name": name, "content": answer}]
    return turns


@pytest.mark.parametrize("trap", [False, True])
def test_turn_k_ids_are_a_prefix_of_turn_k_plus_1_and_a_text_level_loop_breaks_only_on_the_trap(trap):
    tok = chat_tokenizer(trap=trap)
    row = dataset_rows("train", n=1, seed=3)[0]
    env = BugFixToolEnv()
    prompt = env.reset(**row)
    calls = [("read", None), ("edit", get_task(row["task"]).fix_op), ("submit", None)]
    answers = [getattr(env, name)(*([op] if op else [])) for name, op in calls]
    from bugfix_gym.integrations.hf_tokenizer import ChatIds

    chat = ChatIds(tok, prompt)
    for (name, op), answer in zip(calls, answers):
        chat.add_model(call_ids(tok, name, op))
        chat.add_tool(name, answer)
    token_level = {"prompt_ids": chat.prompt_ids, "completion_ids": chat.completion_ids, "mask": chat.mask,
                   "turns": chat.turns}
    assert [r.status for r in run_checks([token_level], only=["prefix_preserved", "mask_length"])] == ["pass"] * 2
    text_level = dict(token_level, turns=_text_level_turns(tok, calls, prompt, answers))
    result = run_checks([text_level], only=["prefix_preserved"], tokenizer=tok)[0]
    assert result.failed == trap
    if trap:
        assert "turn 0: turn 1's input differs" in result.detail and "trl#5224" in result.bug
        # the merged id is what a decode-and-encode round trip gives for the model's first call (a dump without
        # the per-turn ids; with them, the sampled ids are the trained ids and nothing goes through text)
        without_turns = {k: v for k, v in token_level.items() if k != "turns"}
        assert run_checks([without_turns], only=["retokenisation_stable"], tokenizer=tok)[0].failed
        assert run_checks([token_level], only=["retokenisation_stable"], tokenizer=tok)[0].status == "skip"


def test_reset_is_deterministic_per_row_so_a_group_shares_its_task():
    for row in dataset_rows("train", n=3, seed=1) + dataset_rows("train", n=3, seed=1, tasks="generated"):
        first, second = BugFixToolEnv(), BugFixToolEnv()
        first.reset(**dataset_rows("heldout", n=1, seed=9)[0])  # a first instance that played something else
        assert first.reset(**row) == second.reset(**row)
        assert first.env.task == second.env.task and first.read() == second.read()


def test_rows_and_prompts_never_hold_the_answer():
    ds = make_dataset("train", n=40, seed=0)
    rows = list(ds) + dataset_rows("heldout", n=10, tasks="generated")
    env = BugFixToolEnv()
    for row in rows:
        text = str(row) + env.reset(**row)
        assert not any(op in text.split("calls :")[0] for op in FIX_OPS), text
        assert env.env.task.defect not in str(row)
    assert {r["task"] for r in ds} == {t.name for t in __import__("bugfix_gym").make_tasks("train")}


def test_get_reward_is_the_hidden_tests_verdict_and_calls_after_the_end_change_nothing():
    row = dataset_rows("train", n=1, seed=5)[0]
    env = BugFixToolEnv()
    right = get_task(row["task"]).fix_op
    env.reset(**row)
    env.edit(right)
    assert env.submit() == "hidden tests passed" and env.get_reward() == 1.0
    assert env.read() == ENDED and env.get_reward() == 1.0
    env.reset(**row)
    assert env.get_reward() == 0.0
    env.edit([op for op in FIX_OPS if op != right][0])
    env.submit()
    assert env.get_reward() == 0.0
    env.reset(**row)
    assert env.edit("not_an_op").startswith("invalid call") and env.info["n_invalid"] == 1
    quiet = BugFixToolEnv(show_verdict=False)
    for op, reward in ((right, 1.0), ([op for op in FIX_OPS if op != right][0], 0.0)):
        quiet.reset(**row)
        quiet.edit(op)
        assert quiet.submit() == SUBMITTED and quiet.get_reward() == reward and quiet.submit() == ENDED
    assert quiet.late_calls == 1 and quiet.read() == ENDED and quiet.late_calls == 2
    quiet.reset(**row)
    assert quiet.late_calls == 0


def _example():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "examples" / "trl_grpo.py"
    spec = importlib.util.spec_from_file_location("trl_grpo_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def test_the_stop_penalty_hits_rollouts_that_call_after_the_end_or_run_out_of_budget():
    row = dataset_rows("train", n=1, seed=5)[0]
    envs = [BugFixToolEnv(show_verdict=False) for _ in range(3)]
    for env in envs:
        env.reset(**row)
        env.submit()
    envs[1].read()
    eos = 2
    penalty = _example().late_call_penalty(0.5, eos)
    rewards = penalty(completions=[[]] * 3, environments=envs, completion_ids=[[5, eos], [5, eos], [5, 6]])
    assert rewards == [0.0, -0.5, -0.5]


def test_the_time_budget_stops_training_only_once_the_reserve_would_not_fit():
    import time

    from transformers import TrainerControl

    example = _example()
    now = time.time()
    for deadline, stops in ((now + 3600, False), (now + 30, True)):
        control = example.time_budget_callback(deadline, reserve=60).on_step_end(None, None, TrainerControl())
        assert control.should_training_stop is stops


def test_bad_rows_are_one_clear_error():
    with pytest.raises(ValueError, match="'tasks' must be one of book, generated, pack"):
        BugFixToolEnv().reset(tasks="nope")
    with pytest.raises(ValueError, match="needs pack=PATH"):
        dataset_rows(tasks="pack")


def test_scripted_sft_rows_train_only_the_model_calls(tokenizer):
    rows = scripted_sft_rows(tokenizer, dataset_rows("train", n=3, seed=2))
    for row in rows:
        ids, mask = row["input_ids"], row["assistant_masks"]
        assert len(ids) == len(mask) and ids[-1] == tokenizer.eos_token_id and mask[-1] == 1
        trained = tokenizer.decode([i for i, m in zip(ids, mask) if m])
        assert trained.startswith("<call>") and "hidden tests" not in trained and "def " not in trained


def test_the_retry_teacher_plays_the_same_op_sequence_on_every_task_and_stops_within_the_budget():
    from bugfix_gym.integrations.trl_rollout import retry_policy

    env, plays = BugFixToolEnv(show_verdict=False), []
    for row in dataset_rows("train", n=20, seed=4):
        policy, calls = retry_policy(seed=7), []
        env.reset(**row)
        while env.info["stop"] is None:
            calls.append(policy("", env.info))
            name, *op = calls[-1].split()
            getattr(env, name)(*op)
        assert calls[-1] == "submit" and 2 <= len(calls) <= 6 and len(set(calls)) == len(calls)
        plays.append(tuple(calls))
    assert len(set(plays)) == 1  # the plan comes from the seed alone, never from the task
    with pytest.raises(ValueError, match="p_again must be a probability"):
        retry_policy(p_again=2.0)


def test_rollout_func_returns_env_mask_and_its_episodes_pass_the_conformance_checks(tokenizer):
    model = tiny_causal_lm(tokenizer, seed=1)
    model.eval()
    rows = rollout_rows(dataset_rows("train", n=2, seed=4))
    rollout = make_rollout_func(rows, tokenizer, max_turns=3, max_new_tokens=8)
    out = rollout([r["prompt"] for r in rows], type("T", (), {"model": model})())
    assert set(out) == {"prompt_ids", "completion_ids", "logprobs", "env_mask", "env_reward"}
    assert [len(m) for m in out["env_mask"]] == [len(c) for c in out["completion_ids"]]
    torch.manual_seed(0)
    episodes = [play_episode(model, tokenizer, row, max_turns=3, max_new_tokens=8) for row in rows]
    for e, episode in enumerate(episodes):  # the trainer's log-probs: one forward pass over the whole sequence
        ids = torch.tensor([episode["prompt_ids"] + episode["completion_ids"]])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0, :-1], -1).gather(1, ids[0, 1:, None])[:, 0]
        episode["old_logprobs"] = logp[len(episode["prompt_ids"]) - 1:].tolist()
        episode.update(group=e, response_length=sum(episode["mask"]))
    results = {r.name: r for r in run_checks(episodes, end_ids=[tokenizer.eos_token_id])}
    for name in ("mask_length", "prefix_preserved", "sampler_matches_trainer", "response_length_is_model_tokens"):
        assert results[name].status == "pass", results[name]
    assert reset_key(rows[0]) != reset_key(rows[1]) or rows[0]["task"] == rows[1]["task"]


def test_a_few_grpo_steps_of_the_example_run_and_their_batch_passes_the_checks(tmp_path, capsys):
    example = _example()
    dump = tmp_path / "batch.jsonl"
    example.main(["--sft-episodes", "16", "--sft-epochs", "1", "--grpo-steps", "1", "--batch", "4",
                  "--num-generations", "2", "--eval-episodes", "1", "--max-completion-length", "96",
                  "--dump", str(dump), "--out", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert "after SFT: train pass" in out and "after GRPO (1 steps)" in out
    from bugfix_gym.integrations.conformance import load_dump

    episodes = load_dump(str(dump))
    assert len(episodes) == 4 and episodes[0]["reset_key"] == episodes[1]["reset_key"]
    checks = ("mask_length", "env_tokens_out_of_loss", "first_ratio_one", "response_length_is_model_tokens",
              "group_shares_reset", "group_advantages_centred")
    results = run_checks(episodes, only=checks)
    assert [r.status for r in results] == ["pass"] * len(checks), [(r.name, r.detail) for r in results]


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_the_dump_callback_writes_the_first_batch_and_it_passes_the_checks(tokenizer, tmp_path, loss_type):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from bugfix_gym.integrations.conformance import CHECKS, load_dump
    from bugfix_gym.integrations.trl_dump import conformance_dump_callback

    def id_sum_reward(completion_ids, **kwargs):  # varies where the untrained model never passes: advantages != 0
        return [float(sum(ids) % 7) for ids in completion_ids]

    rows = rollout_rows(dataset_rows("train", n=4, seed=5))
    config = GRPOConfig(output_dir=str(tmp_path / "grpo"), per_device_train_batch_size=4, num_generations=2,
                        max_completion_length=96, max_steps=1, learning_rate=1e-3, beta=0.0, temperature=1.0,
                        top_k=0, save_strategy="no", report_to="none", use_cpu=True, seed=0, log_completions=False,
                        loss_type=loss_type, bf16=False)
    trainer = GRPOTrainer(model=tiny_causal_lm(tokenizer, seed=0), args=config, train_dataset=Dataset.from_list(rows),
                          processing_class=tokenizer, reward_funcs=id_sum_reward,
                          rollout_func=make_rollout_func(rows, tokenizer, max_turns=3, max_new_tokens=8))
    callback = conformance_dump_callback(trainer, tmp_path / "dumps" / "first.jsonl")
    trainer.add_callback(callback)
    trainer.train()
    assert callback.written and "_generate_and_score_completions" not in vars(trainer)
    episodes = load_dump(str(tmp_path / "dumps" / "first.jsonl"))
    assert len(episodes) == 4 and {e["loss_type"] for e in episodes} == {loss_type}
    results = {r.name: r for r in run_checks(episodes, tokenizer=ChatTemplateTokenizer(tokenizer), strict=True)}
    assert set(results) == set(CHECKS) and not [r for r in results.values() if r.failed], results
    for name in ("loss_normaliser", "first_ratio_one", "env_tokens_out_of_loss", "group_shares_reset",
                 "prefix_preserved", "sampler_matches_trainer"):
        assert results[name].status == "pass", results[name]
    assert all("reward" in e and e["turns"] and "logprobs" in e for e in episodes)
    assert any(w != 0.0 for e in episodes for w in e["loss_weights"])  # the normaliser compared real weights
    for e in episodes:  # and another formula's weights would not pass (the completions may all be one length:
        e.update(loss_type="dr_grpo" if loss_type != "dr_grpo" else "bnpo", max_completion_length=96)  # not grpo)
    assert run_checks(episodes, only=["loss_normaliser"])[0].failed


def _grpo_config(tmp_path, **kwargs):
    from trl import GRPOConfig

    return GRPOConfig(output_dir=str(tmp_path / "grpo"), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=96, max_steps=1, learning_rate=1e-3, beta=0.0, temperature=1.0, top_k=0,
                      save_strategy="no", report_to="none", use_cpu=True, seed=0, log_completions=False, bf16=False,
                      loss_type="dapo", **kwargs)


def test_the_environment_factory_dump_carries_turns_sampler_logprobs_and_rewards(tokenizer, tmp_path):
    """TRL keeps neither per-turn ids nor (without vLLM) the sampler's log-probs: the recorder does."""
    from trl import GRPOTrainer

    from bugfix_gym.integrations.conformance import load_dump
    from bugfix_gym.integrations.trl_dump import conformance_dump_callback

    trainer = GRPOTrainer(model=tiny_causal_lm(tokenizer, seed=0),
                          args=_grpo_config(tmp_path, max_tool_calling_iterations=3),
                          train_dataset=make_dataset("train", n=4, seed=5), processing_class=tokenizer,
                          reward_funcs=[], environment_factory=BugFixToolEnv)
    trainer.add_callback(conformance_dump_callback(trainer, tmp_path / "first.jsonl"))
    trainer.train()
    assert "generate" not in vars(trainer.model) and "_generate_single_turn" not in vars(trainer)
    episodes = load_dump(str(tmp_path / "first.jsonl"))
    assert all(e["turns"] and len(e["logprobs"]) == len(e["completion_ids"]) and e["reward"] == 0.0 for e in episodes)
    results = {r.name: r for r in run_checks(episodes, tokenizer=ChatTemplateTokenizer(tokenizer), strict=True)}
    assert not [r for r in results.values() if r.failed], results
    assert results["sampler_matches_trainer"].status == "pass" and results["prefix_preserved"].status == "pass"


def _scripted_rollout_func(rows, tokenizer):
    """A ``rollout_func`` that plays the scripted ``blind`` policy (one edit, then submit): real tool outputs in
    every episode, the model's log-probs by one forward pass."""
    from bugfix_gym.core.scripted import scripted_policy
    from bugfix_gym.core.tools import parse_call

    by_prompt = {row["prompt"][-1]["content"]: row for row in rows}
    turns: list = []

    def rollout_func(prompts, trainer):
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": []}
        for k, prompt in enumerate(prompts):
            env, policy = BugFixToolEnv(show_verdict=False), scripted_policy("blind", seed=k)
            chat, text = ChatIds(tokenizer, env.reset(**by_prompt[prompt[-1]["content"]])), ""
            while env.info["stop"] is None:
                name, op = parse_call(policy(text, env.info)) or ("submit", None)
                chat.add_model(call_ids(tokenizer, name, op))
                text = getattr(env, name)(*([op] if op else []))
                chat.add_tool(name, text)
            chat.add_model([tokenizer.eos_token_id])
            ids = torch.tensor([chat.prompt_ids + chat.completion_ids])
            with torch.no_grad():
                logp = torch.log_softmax(trainer.model(ids).logits[0, :-1].float(), -1).gather(1, ids[0, 1:, None])
            p = len(chat.prompt_ids)
            out["prompt_ids"].append(chat.prompt_ids)
            out["completion_ids"].append(chat.completion_ids)
            out["logprobs"].append([float(x) for x in logp[p - 1:, 0]])
            out["env_mask"].append(chat.mask)
            turns.extend(chat.turns)
        return out

    rollout_func.turns = turns
    return rollout_func


def test_a_tool_output_in_the_mask_fails_a_real_trl_dump_with_and_without_turns(tokenizer, tmp_path):
    from datasets import Dataset
    from trl import GRPOTrainer

    from bugfix_gym.integrations.conformance import load_dump
    from bugfix_gym.integrations.trl_dump import conformance_dump_callback

    def length_reward(completion_ids, **kwargs):
        return [float(len(ids) % 5) for ids in completion_ids]

    rows = rollout_rows(dataset_rows("train", n=4, seed=5))
    trainer = GRPOTrainer(model=tiny_causal_lm(tokenizer, seed=0), args=_grpo_config(tmp_path),
                          train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                          reward_funcs=length_reward, rollout_func=_scripted_rollout_func(rows, tokenizer))
    trainer.add_callback(conformance_dump_callback(trainer, tmp_path / "first.jsonl"))
    trainer.train()
    episodes = load_dump(str(tmp_path / "first.jsonl"))
    assert all(0 in e["mask"] for e in episodes)  # every episode has tool outputs
    tok = ChatTemplateTokenizer(tokenizer)
    results = {r.name: r for r in run_checks(episodes, tokenizer=tok, strict=True)}
    assert not [r for r in results.values() if r.failed], results
    assert results["tool_spans_masked"].status == "pass" and results["eos_trained"].status == "pass"
    for e in episodes:  # trl#5144's class: the tool outputs marked as the model's (and counted)
        e["mask"] = [1] * len(e["mask"])
        e["response_length"] = len(e["mask"])
    for with_turns in (True, False):
        batch = episodes if with_turns else [{k: v for k, v in e.items() if k != "turns"} for e in episodes]
        result = {r.name: r for r in run_checks(batch, tokenizer=tok)}["tool_spans_masked"]
        assert result.failed and "tool output 0 has mask 1" in result.detail, result


@pytest.mark.slow
def test_the_trainers_benchmark_runs_both_trainers_on_the_same_episodes(tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "trainers.py"
    spec = importlib.util.spec_from_file_location("benchmark_trainers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ours, trl = module.main(["--batches", "1", "--batch", "8", "--out", str(tmp_path)])
    assert ours["episodes"] == trl["episodes"] == 8 and ours["env_steps"] > 0 and ours["tokens"] > 0
    assert "| env steps/s |" in capsys.readouterr().out
