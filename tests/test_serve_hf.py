"""``bugfix-gym serve`` with a policy whose tokenizer is a Hugging Face tokenizer (``make test-trl``; skipped
without transformers): a TinyAgent of ChatML's vocabulary (``ChatTemplateTokenizer(chatml_tokenizer())``),
saved and served, plays episodes over HTTP (urllib) whose calls are those of its own greedy ``predict``."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import bugfix_gym  # noqa: E402
from agents import TokenPPO  # noqa: E402
from agents.algorithms.presets import load_algorithm  # noqa: E402
from agents.cli.serve import serving  # noqa: E402
from bugfix_gym.integrations.chat import call_of_tool_call, tool_schemas  # noqa: E402
from bugfix_gym.integrations.hf_tokenizer import ChatTemplateTokenizer, chatml_tokenizer  # noqa: E402
from test_serve import _predicted  # noqa: E402  (the policy's own greedy predict on an episode)

torch.set_num_threads(1)
NAME = "hf-tiny"


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    """A saved (untrained) TokenPPO whose TinyAgent reads and writes ChatML's ids, under the call grammar."""
    tok = ChatTemplateTokenizer(chatml_tokenizer())
    model = TokenPPO("TinyAgentPolicy", gym.make("BugFix-v0"), base_agent=None, seed=0, n_episodes=4,
                     policy_kwargs=dict(tokenizer=tok, call_grammar=list(bugfix_gym.CALLS), model_config=dict(
                         vocab_size=tok.vocab_size, d_model=32, n_layer=1, n_head=2, d_ff=64, max_len=2048)))
    path = tmp_path_factory.mktemp("serve_hf") / "hf.zip"
    model.save(path)
    return path


def _chat(url: str, messages: list, **fields: Any) -> dict:
    body = json.dumps(dict(model=NAME, messages=messages, **fields)).encode()
    req = urllib.request.Request(url + "/chat/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as answer:
        assert answer.status == 200
        return json.loads(answer.read())


def _play(url: str, task: Any, tools: bool) -> tuple[list[str], list[dict]]:
    """One greedy episode of ``task`` over HTTP: the calls and each answer's choice."""
    env = gym.make("BugFix-v0")
    obs, _ = env.reset(seed=0, options={"task": task})
    messages: list[dict] = [{"role": "user", "content": obs}]
    calls, choices, done = [], [], False
    while not done:
        choice = _chat(url, messages, temperature=0, logprobs=True,
                       **(dict(tools=tool_schemas()) if tools else {}))["choices"][0]
        message = choice["message"]
        calls.append(call_of_tool_call(message["tool_calls"][0]) if tools else message["content"])
        choices.append(choice)
        obs, _, terminated, truncated, _ = env.step(calls[-1])
        done = terminated or truncated
        answer = {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"]} if tools else {"role": "user"}
        messages += [message, dict(answer, content=obs)]
    return calls, choices


@pytest.mark.parametrize("tools", [False, True], ids=["text", "tool_calls"])
def test_a_served_hf_tokenizer_policy_makes_the_calls_predict_makes(model_file, tools):
    tok = load_algorithm(model_file).policy.tokenizer
    assert isinstance(tok, ChatTemplateTokenizer)
    with serving(model_file, NAME, log_requests=False) as server:
        for task in bugfix_gym.make_tasks("heldout")[:3]:
            calls, choices = _play(server.url, task, tools)
            assert calls == _predicted(model_file, task, len(calls)), task.name
            assert all(call in bugfix_gym.CALLS for call in calls)
            for call, choice in zip(calls, choices):  # the log-probs name the call's tokens in the HF vocabulary
                tokens = [entry["token"] for entry in choice["logprobs"]["content"]]
                assert len(tokens) == len(tok.encode(call)) + 1
                assert "".join(tokens[:-1]).strip() == call and tokens[-1] == tok.end_token


def test_the_call_mask_closes_calls_in_hf_ids_and_a_context_overflow_is_a_400(model_file):
    with serving(model_file, NAME, call_mask_key="useful_calls", log_requests=False) as server:
        prompt = [{"role": "user", "content": gym.make("BugFix-v0").reset(seed=1)[0]}]
        for open_call in ("submit", "edit fix_init"):
            mask = [call == open_call for call in bugfix_gym.CALLS]
            answer = _chat(server.url, prompt, n=3, seed=0, useful_calls=mask)
            assert [c["message"]["content"] for c in answer["choices"]] == [open_call] * 3
        long = prompt + [{"role": "assistant", "content": "read"}, {"role": "tool", "content": "x " * 3000}] * 2
        body = json.dumps(dict(model=NAME, messages=long, useful_calls=[True] * 9)).encode()
        req = urllib.request.Request(server.url + "/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as error:
            urllib.request.urlopen(req, timeout=60)
        assert error.value.code == 400
        assert json.loads(error.value.read())["error"]["code"] == "context_length_exceeded"


@pytest.mark.parametrize("command", ["serve", "eval"])
def test_foresight_with_an_hf_tokenizer_is_one_line(model_file, command, capsys):
    from agents.cli import main

    assert main([command, str(model_file), "--foresight", "0.5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"bugfix-gym {command}: error: --foresight: foresight reads the tool's first answer word")
    assert "use foresight=None" in err and len(err.splitlines()) == 1
