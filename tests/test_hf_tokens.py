"""Real Hugging Face tokenizers, token in, token out (``make test-trl``; skipped without transformers):
``ChatTemplateTokenizer`` over our words with our chat template and with Qwen2's ChatML template, in
``BugFixTokens-v0``, the episode sampler with a call grammar, TokenPPO with a TinyAgent of the HF
vocabulary, and saving; the extension property, and the retokenisation trap a text-level loop falls into."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import bugfix_gym  # noqa: E402,F401  (registers the envs)
from bugfix_gym import CALLS, get_task  # noqa: E402
from bugfix_gym.integrations.conformance import run_checks  # noqa: E402
from bugfix_gym.integrations.hf_tokenizer import (CHATML_TEMPLATE, MAX_TOKENIZER_CHARS,  # noqa: E402
                                                  ChatTemplateTokenizer, chat_tokenizer, chatml_tokenizer,
                                                  tool_suffix_ids)
from bugfix_gym.contract.tokens import (  # noqa: E402
    OWNER_POLICY, OWNER_PROMPT, OWNER_TOOL, TokenizerLike, tokenizer_from_dict)

torch.set_num_threads(1)
MAKERS = {"chat": chat_tokenizer, "chatml": chatml_tokenizer}
TASK = "clamp"


@pytest.fixture(scope="module", params=sorted(MAKERS))
def adapter(request) -> ChatTemplateTokenizer:
    return ChatTemplateTokenizer(MAKERS[request.param]())


def _view(env):
    while not hasattr(env, "view"):
        env = env.env
    return env.view


def _episode_calls() -> list[str]:
    return ["read", "test", f"edit {get_task(TASK).fix_op}", "test", "submit"]


def _play(tok: ChatTemplateTokenizer, calls: list[str]) -> dict:
    """One BugFixTokens-v0 episode, each call written as the ids ``encode`` gives and the end-of-turn id:
    the view's ids, owner codes and per-turn ids, the env's transcript and received calls."""
    env = gym.make("BugFixTokens-v0", tokenizer=tok, max_len=4096, max_call_tokens=8)
    env.reset(options={"task": get_task(TASK)})
    view, before, turns = _view(env), [], []
    for call in calls:
        ids = tok.encode(call) + [tok.eoc_id]
        before.append(view.ids.tolist())
        turns.append({"input_ids": before[-1], "output_ids": ids})
        env.step(np.array(ids + [tok.pad_id] * (8 - len(ids))))
    ids, owner = view.ids.tolist(), view.owner.tolist()
    n_prompt = view.n_prompt
    return {"ids": ids, "owner": owner, "turns": turns, "n_prompt": n_prompt,
            "transcript": list(env.unwrapped.transcript), "actions": list(env.unwrapped.actions),
            "batch": {"prompt_ids": ids[:n_prompt], "completion_ids": ids[n_prompt:], "turns": turns,
                      "mask": [int(o == OWNER_POLICY) for o in owner[n_prompt:]]}}


def _messages(transcript) -> list[dict]:
    roles = {OWNER_PROMPT: "user", OWNER_POLICY: "assistant", OWNER_TOOL: "tool"}
    return [{"role": roles[owner], "content": text, **({"name": "bugfix"} if owner == OWNER_TOOL else {})}
            for owner, text in transcript]


def _text_level_turns(tok: ChatTemplateTokenizer, transcript) -> list[dict]:
    """A loop that keeps the history as messages and renders and encodes it again every turn."""
    messages, turns = _messages(transcript), []
    for k in range(1, len(messages), 2):  # messages[k] is the k-th assistant turn
        ids = tok.hf.apply_chat_template(messages[:k], add_generation_prompt=True, tokenize=True, return_dict=False)
        turns.append({"input_ids": list(ids), "output_ids": tok.encode(messages[k]["content"]) + [tok.eoc_id]})
    return turns


def test_the_adapter_has_what_the_token_views_need(adapter):
    assert isinstance(adapter, TokenizerLike)
    assert adapter.vocab_size == len(adapter.hf) and adapter.eoc_id == adapter.hf.eos_token_id
    assert adapter.pad_id == adapter.hf.pad_token_id and adapter.unk_id == adapter.hf.unk_token_id
    for call in CALLS:
        ids = adapter.encode(call)
        assert adapter.decode(ids + [adapter.eoc_id, 5, 6]) == call and adapter.unk_id not in ids
        assert adapter.segment_ids(OWNER_POLICY, call) == ids + [adapter.eoc_id]
    assert adapter.segment_ids(OWNER_PROMPT, "fix it") == list(adapter.hf.apply_chat_template(
        [{"role": "user", "content": "fix it"}], add_generation_prompt=True, tokenize=True, return_dict=False))


def test_a_whole_episode_is_token_in_token_out_and_equals_the_rendered_conversation(adapter):
    played = _play(adapter, _episode_calls())
    ids, owner, turns = played["ids"], played["owner"], played["turns"]
    for k, turn in enumerate(turns):  # every turn's ids start with the previous turn's ids and output
        later = turns[k + 1]["input_ids"] if k + 1 < len(turns) else ids
        assert later[:len(turn["input_ids"]) + len(turn["output_ids"])] == turn["input_ids"] + turn["output_ids"]
    assert run_checks([played["batch"]], only=["prefix_preserved", "mask_length"])[0].status == "pass"
    # the ids a token-level loop gives: the prompt rendered once, then each call's ids and the tool suffix
    transcript = played["transcript"]
    expected, owners = adapter.segment_ids(OWNER_PROMPT, transcript[0][1]), []
    owners += [OWNER_PROMPT] * len(expected)
    for (_, call), (_, answer) in zip(transcript[1::2], transcript[2::2]):
        call_ids = adapter.encode(call) + [adapter.eoc_id]
        suffix = tool_suffix_ids(adapter.hf, "bugfix", answer, adapter.eoc_id)
        expected += call_ids + suffix
        owners += [OWNER_POLICY] * len(call_ids) + [OWNER_TOOL] * len(suffix)
    assert ids == expected and owner == owners
    # ... which is what the template renders for the whole conversation (no trap in these tokenizers)
    rendered = adapter.hf.apply_chat_template(_messages(transcript), add_generation_prompt=True, tokenize=True,
                                              return_dict=False)
    assert ids == list(rendered)
    assert played["actions"] == _episode_calls()  # the env received the sampled text
    assert [adapter.decode(t["output_ids"]) for t in turns] == _episode_calls()


@pytest.mark.parametrize("trap", [False, True])
def test_a_render_then_retokenise_loop_breaks_the_prefix_exactly_on_the_chatml_trap(trap):
    tok = ChatTemplateTokenizer(chatml_tokenizer(trap=trap))
    played = _play(tok, _episode_calls())
    token_level = played["batch"]
    assert run_checks([token_level], only=["prefix_preserved"])[0].status == "pass"
    text_level = dict(token_level, turns=_text_level_turns(tok, played["transcript"]))
    result = run_checks([text_level], only=["prefix_preserved"])[0]
    assert result.failed == trap
    if trap:
        assert result.detail.startswith("episode 0 turn 0: turn 1's input differs")
        # the generation prompt's last newline and the model's first call word, merged into one piece
        at = len(token_level["prompt_ids"]) - 1
        assert tok.hf.convert_ids_to_tokens(text_level["turns"][1]["input_ids"][at]) == "\nread"
        assert tok.hf.convert_ids_to_tokens(played["ids"][at:at + 2]) == ["\n", "read"]
    else:
        assert [t["input_ids"] for t in text_level["turns"]] == [t["input_ids"] for t in token_level["turns"]]


def test_our_chat_template_s_trap_never_bites_plain_calls():
    """chat_tokenizer's trap merges a call word with ``</call>``; the env's calls are plain text, so both loops
    agree on it (the ChatML trap above is the one that bites this adapter)."""
    tok = ChatTemplateTokenizer(chat_tokenizer(trap=True))
    played = _play(tok, _episode_calls())
    text_level = dict(played["batch"], turns=_text_level_turns(tok, played["transcript"]))
    assert run_checks([text_level], only=["prefix_preserved"])[0].status == "pass"


def _vec_env(n: int):
    from agents.bugfix.evaluation import task_vec_env

    return task_vec_env(n)


def test_the_sampler_writes_grammar_calls_in_hf_ids_that_replay_in_the_token_view(adapter):
    from agents.decoding.grammar import CallGrammar
    from agents.model.tinyagent import TinyAgent, TinyAgentConfig
    from agents.rollout.sampler import EpisodeSampler

    grammar = CallGrammar(adapter, CALLS)
    assert grammar.max_call_tokens <= 8
    torch.manual_seed(0)
    model = TinyAgent(TinyAgentConfig(vocab_size=adapter.vocab_size, d_model=32, n_layer=1, n_head=2, d_ff=64,
                                      max_len=2048))
    sampler = EpisodeSampler(_vec_env(2), adapter, max_call_tokens=8, grammar=grammar)
    tasks = [get_task(TASK), get_task("spread")]
    trajs = sampler.play_tasks(model, tasks, generator=torch.Generator().manual_seed(1))
    for task, traj in zip(tasks, trajs):
        ids, owner = traj.ids.tolist(), traj.owner.tolist()
        actions = traj.info["actions"]
        assert set(actions) <= set(CALLS) and not traj.info.get("context_cut")
        # the policy's runs are the ids encode gives for the calls the env received, each ending at the end id
        runs, k = [], 0
        while k < len(ids):
            j = k
            while j < len(ids) and owner[j] == owner[k]:
                j += 1
            runs.append((owner[k], ids[k:j]))
            k = j
        assert [o for o, _ in runs] == [OWNER_PROMPT] + [OWNER_POLICY, OWNER_TOOL] * len(actions)
        assert [adapter.decode(r) for o, r in runs if o == OWNER_POLICY] == actions
        assert all(r == adapter.encode(a) + [adapter.eoc_id]
                   for (o, r), a in zip([x for x in runs if x[0] == OWNER_POLICY], actions))
        # replaying the env's calls in BugFixTokens-v0 gives the same ids and owners
        env = gym.make("BugFixTokens-v0", tokenizer=adapter, max_len=4096)
        env.reset(options={"task": task})
        for call in actions:
            call_ids = adapter.encode(call) + [adapter.eoc_id]
            env.step(np.array(call_ids + [adapter.pad_id] * (8 - len(call_ids))))
        assert _view(env).ids.tolist() == ids and _view(env).owner.tolist() == owner


def test_token_ppo_trains_a_tinyagent_of_the_hf_vocabulary_and_saves_its_tokenizer(tmp_path):
    from agents import TokenPPO

    tok = ChatTemplateTokenizer(chatml_tokenizer())
    model = TokenPPO("TinyAgentPolicy", gym.make("BugFix-v0"), base_agent=None, seed=0, n_episodes=4, n_epochs=1,
                     policy_kwargs=dict(tokenizer=tok, call_grammar=list(CALLS), model_config=dict(
                         vocab_size=tok.vocab_size, d_model=32, n_layer=1, n_head=2, d_ff=64, max_len=1024)))
    before = [p.detach().clone() for p in model.policy.parameters()]
    model.learn(8)
    assert model.num_timesteps >= 8
    assert any(not torch.equal(a, b) for a, b in zip(before, model.policy.parameters()))
    assert model.policy.model.config.vocab_size == tok.vocab_size == 1115
    path = tmp_path / "hf.zip"
    model.save(path)
    loaded = TokenPPO.load(path)
    assert isinstance(loaded.policy.tokenizer, ChatTemplateTokenizer) and loaded.policy.tokenizer == tok
    env = gym.make("BugFixTokens-v0", tokenizer=loaded.policy.tokenizer)
    obs, _ = env.reset(seed=4)
    assert np.array_equal(model.predict(obs, deterministic=True)[0], loaded.predict(obs, deterministic=True)[0])
    assert tok.decode(loaded.predict(obs, deterministic=True)[0]) in CALLS


def test_to_dict_round_trips_and_a_bad_dict_is_one_line():
    tok = ChatTemplateTokenizer(chatml_tokenizer(trap=True))
    data = tok.to_dict()
    again = tokenizer_from_dict(data)
    assert again == tok and again.hf.chat_template == CHATML_TEMPLATE
    assert again.encode("\nread x") == tok.encode("\nread x") and again.eoc_id == tok.eoc_id
    bad = [({**data, "format": "other/1"}, "unknown tokenizer format"),
           ({k: v for k, v in data.items() if k != "chat_template"}, "lacks chat_template"),
           ({**data, "tool_name": 3}, "tool_name must be strings"),
           ({**data, "tokenizer_json": "{not json"}, "does not load"),
           ({**data, "tokenizer_json": "x" * (MAX_TOKENIZER_CHARS + 1)}, "larger than")]
    for broken, message in bad:
        with pytest.raises(ValueError, match=message) as err:
            tokenizer_from_dict(broken)
        assert "\n" not in str(err.value)


def test_a_tokenizer_the_adapter_cannot_use_is_one_line():
    hf = chatml_tokenizer()
    hf.chat_template = None
    with pytest.raises(ValueError, match="needs a transformers tokenizer with a chat template"):
        ChatTemplateTokenizer(hf)
    with pytest.raises(ValueError, match="not in the vocabulary"):
        ChatTemplateTokenizer(chatml_tokenizer(), end_token="<|not_a_token|>")
    with pytest.raises(ValueError, match="does not end an assistant turn"):
        ChatTemplateTokenizer(chatml_tokenizer(), end_token="<pad>")


def test_what_needs_our_words_says_so_in_one_line():
    from agents import TokenPPO
    from agents.bugfix.aux_losses import aux_losses_from_settings

    tok = ChatTemplateTokenizer(chatml_tokenizer())
    kwargs = dict(tokenizer=tok, call_grammar=list(CALLS))
    with pytest.raises(ValueError, match="base_agent='auto' is the env's own base agent"):
        TokenPPO("TinyAgentPolicy", gym.make("BugFix-v0"), base_agent="auto", policy_kwargs=kwargs)
    with pytest.raises(ValueError, match="foresight reads the tool's first answer word"):
        TokenPPO("TinyAgentPolicy", gym.make("BugFix-v0"), base_agent=None, policy_kwargs={**kwargs, "foresight": 0.5})
    with pytest.raises(ValueError, match="tool_calls finds calls by their words"):
        TokenPPO("TinyAgentPolicy", gym.make("BugFix-v0"), base_agent=None, policy_kwargs=kwargs,
                 aux_losses=aux_losses_from_settings(tool_coef=0.1, tool_calls=["read"]))


def test_the_conformance_command_reads_an_hf_tokenizer_file(adapter, tmp_path, capsys):
    import json

    from agents.cli import main

    dump, tokenizer = tmp_path / "d.jsonl", tmp_path / "d.tokenizer.json"
    dump.write_text(json.dumps(_play(adapter, _episode_calls())["batch"]) + "\n")
    tokenizer.write_text(json.dumps(adapter.to_dict()))  # what bugfix-gym train --dump writes
    assert main(["conformance", str(dump), "--tokenizer", str(tokenizer), "--json"]) == 0  # end id: its eoc_id
    status = {c["name"]: c["status"] for c in json.loads(capsys.readouterr().out)["checks"]}
    assert status["retokenisation_stable"] == "skip" and status["prefix_preserved"] == "pass"  # token in, out
    batch = _play(adapter, _episode_calls())["batch"]
    dump.write_text(json.dumps({k: v for k, v in batch.items() if k != "turns"}) + "\n")  # no per-turn ids
    assert main(["conformance", str(dump), "--tokenizer", str(tokenizer), "--json"]) == 0
    status = {c["name"]: c["status"] for c in json.loads(capsys.readouterr().out)["checks"]}
    assert status["retokenisation_stable"] == "pass"  # the round trip, with the file's tokenizer
