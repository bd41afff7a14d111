"""``bugfix-gym serve``: what token-in, token-out RL through a server needs (docs/serve.md "Token ids and
log-probs"): the prompt's and each call's token ids, ``top_logprobs`` under the distribution sampled from,
``/tokenize``, ``--served-model-name``, ``--max-model-len``, the static ``docs/tools.json``, and SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest

from agents.cli import main
from bugfix_gym.integrations.chat import tool_schemas
from tests.test_serve import NAME, _request

ROOT = Path(__file__).resolve().parent.parent


def _prompt(seed: int = 1) -> list[dict]:
    return [{"role": "user", "content": gym.make("BugFix-v0").reset(seed=seed)[0]}]


def test_token_ids_come_back_and_are_the_ids_tokenize_gives(server):
    status, answer = _request(server.url + "/chat/completions", dict(
        model=NAME, messages=_prompt(), temperature=1.0, seed=3, n=2, return_token_ids=True, logprobs=True))
    assert status == 200
    status, tokenized = _request(server.url.replace("/v1", "/tokenize"), dict(model=NAME, messages=_prompt()))
    assert status == 200 and answer["prompt_token_ids"] == tokenized["tokens"]
    assert tokenized["count"] == len(tokenized["tokens"]) == answer["usage"]["prompt_tokens"]
    assert tokenized["max_model_len"] == server.agent.max_len
    tok = server.agent.tok
    for choice in answer["choices"]:
        ids = choice["token_ids"]
        assert ids[-1] == tok.eoc_id and tok.decode(ids) == choice["message"]["content"]
        assert [c["token"] for c in choice["logprobs"]["content"]] == [tok.decode([i], stop_at_eoc=False) for i in ids]
    status, plain = _request(server.url + "/chat/completions", dict(model=NAME, messages=_prompt(), temperature=0))
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]


def test_top_logprobs_are_the_sampled_distributions_most_likely_tokens(server):
    for temperature in (0.0, 0.7, 1.0):
        status, answer = _request(server.url + "/chat/completions", dict(
            model=NAME, messages=_prompt(2), temperature=temperature, seed=5, logprobs=True, top_logprobs=5,
            return_tokens_as_token_ids=True, return_token_ids=True))
        assert status == 200
        choice = answer["choices"][0]
        for token, entry in zip(choice["token_ids"], choice["logprobs"]["content"]):
            assert entry["token"] == f"token_id:{token}"
            top = entry["top_logprobs"]
            values = [t["logprob"] for t in top]
            assert 1 <= len(top) <= 5 and values == sorted(values, reverse=True)
            mine = {t["token"]: t["logprob"] for t in top}
            if entry["token"] in mine:  # the sampled token, scored by one full forward: the sampler's number
                assert abs(mine[entry["token"]] - entry["logprob"]) < 1e-4
            else:  # sampled outside the top 5: less likely than all of them
                assert entry["logprob"] <= top[-1]["logprob"] + 1e-4
            if temperature == 0:
                assert top[0]["token"] == entry["token"]  # greedy picks the most likely
        assert sum(1 for e in choice["logprobs"]["content"] if len(e["top_logprobs"]) == 1) >= 1  # a forced token
    status, answer = _request(server.url + "/chat/completions", dict(model=NAME, messages=_prompt(), top_logprobs=21))
    assert status == 400 and answer["error"]["param"] == "top_logprobs"


def test_the_static_tools_file_is_tool_schemas():
    assert json.loads((ROOT / "docs" / "tools.json").read_text()) == tool_schemas()


@pytest.mark.heavy
def test_served_model_name_and_max_model_len(model_file, capsys):
    assert main(["serve", str(model_file), "--max-model-len", "4"]) == 2
    assert "--max-model-len must be from" in capsys.readouterr().err
    proc = subprocess.Popen([sys.executable, "-m", "agents.cli", "serve", str(model_file), "--port", "0",
                             "--served-model-name", "agent-x", "--max-model-len", "120"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert "as model 'agent-x'" in line and "context 120" in line and "SIGTERM stops" in line, line
        url = line.split(" at ")[1].split(" ")[0]
        status, answer = _request(url + "/chat/completions", dict(model="agent-x", messages=_prompt(), temperature=0,
                                                                  tools=tool_schemas()))
        assert status == 200 and answer["choices"][0]["finish_reason"] == "tool_calls"
        long = _prompt() + [{"role": "assistant", "content": "read"}, {"role": "tool", "content": "x " * 300}]
        long += [{"role": "assistant", "content": "read"}, {"role": "tool", "content": "y " * 300}]
        status, answer = _request(url + "/chat/completions", dict(model="agent-x", messages=long))
        assert status == 400 and answer["error"]["code"] == "context_length_exceeded"
        assert "context of 120 tokens" in answer["error"]["message"]
        proc.send_signal(signal.SIGTERM)  # a script's or a process manager's stop: as clean as Ctrl-C
        assert proc.wait(timeout=60) == 0 and proc.stderr and proc.stderr.read().endswith("serve: stopped\n")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
