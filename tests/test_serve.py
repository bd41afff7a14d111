"""``bugfix-gym serve``: the OpenAI-compatible chat server plays a saved TinyAgent over HTTP, with the
calls, tokens and errors the docs promise (docs/serve.md). A standard-library client (urllib) against a
server on 127.0.0.1, port 0, in a thread."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import bugfix_gym
from agents.algorithms.ppo import TokenPPO
from agents.algorithms.presets import load_algorithm
from agents.bugfix.chat_agent import ChatAgent
from agents.cli import main
from agents.cli.serve import MAX_BODY_BYTES, ChatServer, serving
from agents.rollout.sampler import EpisodeSampler
from agents.rollout.vec_env import TextDummyVecEnv
from bugfix_gym.integrations.chat import call_of_tool_call, tool_call_of, tool_schemas, transcript_of
from bugfix_gym.contract.tokens import episode_tokens

ROOT = Path(__file__).resolve().parent.parent
NAME = "tiny"


def _request(url: str, body: Any = None, raw: bytes | None = None) -> tuple[int, dict]:
    """``(status, JSON)`` of a GET (no body) or a POST of ``body`` as JSON (or ``raw`` bytes)."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _chat(server: ChatServer, messages: list, **fields: Any) -> dict:
    status, answer = _request(server.url + "/chat/completions", dict(model=NAME, messages=messages, **fields))
    assert status == 200, answer
    return answer


def test_models_and_health_name_the_served_model(server):
    assert _request(server.url + "/models")[1]["data"][0]["id"] == NAME
    assert _request(server.url + f"/models/{NAME}") == (200, _request(server.url + "/models")[1]["data"][0])
    assert _request(server.url.replace("/v1", "/health")) == (200, {"status": "ok", "model": NAME})
    status, answer = _request(server.url + "/models/gpt-4")
    assert status == 404 and answer["error"]["code"] == "model_not_found"


def _call_of(message: dict, tools: bool) -> str:
    """The call an answer's message made, read back as the client would (a tool call or the text)."""
    if tools:
        assert message["content"] is None and len(message["tool_calls"]) == 1
        return call_of_tool_call(message["tool_calls"][0])
    assert "tool_calls" not in message
    return message["content"]


def _play(server: ChatServer, task: Any, tools: bool) -> tuple[list[str], list[dict], float, dict]:
    """One greedy episode of ``task`` played over HTTP: the calls, the chat, the return, the last info."""
    env = gym.make("BugFix-v0")
    obs, _ = env.reset(seed=0, options={"task": task})
    messages: list[dict] = [{"role": "system", "content": "You repair Python functions."},
                            {"role": "user", "content": obs}]
    calls, total, done = [], 0.0, False
    while not done:
        choice = _chat(server, messages, temperature=0, **(dict(tools=tool_schemas()) if tools else {}))["choices"][0]
        assert choice["finish_reason"] == ("tool_calls" if tools else "stop")
        calls.append(_call_of(choice["message"], tools))
        obs, reward, terminated, truncated, info = env.step(calls[-1])
        total, done = total + float(reward), terminated or truncated
        answer = {"role": "tool", "tool_call_id": choice["message"]["tool_calls"][0]["id"]} if tools else \
            {"role": "user"}
        messages += [choice["message"], dict(answer, content=obs)]
    return calls, messages, total, info


def _predicted(model_file: Path, task: Any, n_calls: int) -> list[str]:
    """The policy's own ``predict`` (greedy) on the same episode, its history in ``state``."""
    model = load_algorithm(model_file)
    env = gym.make("BugFix-v0")
    obs, _ = env.reset(seed=0, options={"task": task})
    state, start, calls = None, np.array([True]), []
    for _ in range(n_calls):
        action, state = model.predict(obs, state=state, episode_start=start, deterministic=True)
        calls.append(str(action))
        obs, *_ = env.step(calls[-1])
        start = np.array([False])
    return calls


@pytest.mark.parametrize("tools", [False, True], ids=["text", "tool_calls"])
def test_an_episode_over_http_makes_the_calls_predict_makes(server, model_file, tools):
    for task in bugfix_gym.make_tasks("heldout")[:3]:
        calls, *_ = _play(server, task, tools)
        assert calls == _predicted(model_file, task, len(calls)), task.name
        assert all(call in bugfix_gym.CALLS for call in calls)


def test_the_chat_encodes_to_the_samplers_own_tokens(server, model_file):
    model = load_algorithm(model_file)
    task = bugfix_gym.make_tasks("heldout")[0]
    sampler = EpisodeSampler(TextDummyVecEnv([lambda: gym.make("BugFix-v0")]), model.policy.tokenizer,
                             **model.policy.sampler_kwargs())
    traj = sampler.play_tasks(model.policy.model, [task], deterministic=True)[0]
    _, messages, total, _ = _play(server, task, tools=True)
    assert total == pytest.approx(traj.reward)
    ids = ChatAgent(model).encode(transcript_of(messages))
    assert ids == traj.ids.tolist()
    env_ids, _ = episode_tokens([(1, messages[1]["content"])], model.policy.tokenizer)
    assert ids[: len(env_ids)] == env_ids.tolist()


@pytest.fixture(scope="module")
def trained_file(tmp_path_factory, shared_base_agent) -> Path:
    """The base agent after 48 steps of TokenPPO on the first book train task alone (a few seconds)."""
    task = bugfix_gym.make_tasks("train")[0]
    model = TokenPPO("TinyAgentPolicy", gym.make("BugFix-v0", tasks=[task]), base_agent=shared_base_agent,
                     n_episodes=16, seed=0, learning_rate=1e-3, policy_kwargs=dict(call_grammar=list(bugfix_gym.CALLS)))
    model.learn(48)
    path = tmp_path_factory.mktemp("serve") / "trained.zip"
    model.save(path)
    return path


def test_a_served_trained_agent_plays_to_submit_and_passes_where_the_untrained_one_fails(server, trained_file):
    task = bugfix_gym.make_tasks("train")[0]
    with serving(trained_file, NAME, log_requests=False) as trained:
        calls, _, _, info = _play(trained, task, tools=True)
    assert calls[-1] == "submit" and info["hidden_pass"], calls
    calls, _, _, info = _play(server, task, tools=True)  # the base agent it started from
    assert calls[-1] == "submit" and not info["hidden_pass"], calls


def test_a_seed_gives_the_same_samples_and_other_seeds_differ(server):
    prompt = [{"role": "user", "content": gym.make("BugFix-v0").reset(seed=1)[0]}]

    def sample(seed: int) -> list[str]:
        answer = _chat(server, prompt, n=8, temperature=2.0, seed=seed)
        return [c["message"]["content"] for c in answer["choices"]]

    first = sample(7)
    assert first == sample(7) and len(first) == 8
    assert any(sample(seed) != first for seed in (8, 9, 10))


def test_logprobs_are_the_calls_tokens_and_forced_tokens_cost_nothing(server):
    prompt = [{"role": "user", "content": gym.make("BugFix-v0").reset(seed=1)[0]}]
    for c in _chat(server, prompt, n=6, seed=0, logprobs=True)["choices"]:
        tokens = c["logprobs"]["content"]
        assert " ".join(t["token"] for t in tokens) == c["message"]["content"] + " <eoc>"
        assert all(t["logprob"] <= 0 for t in tokens) and tokens[-1]["logprob"] == 0.0  # <eoc> is forced
    usage = _chat(server, prompt, n=3, seed=0)["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_the_call_mask_field_closes_calls(model_file):
    with serving(model_file, NAME, call_mask_key="useful_calls", log_requests=False) as server:
        prompt = [{"role": "user", "content": gym.make("BugFix-v0").reset(seed=1)[0]}]
        status, answer = _request(server.url + "/chat/completions", dict(model=NAME, messages=prompt))
        assert status == 400 and "useful_calls" in answer["error"]["message"]
        only_submit = [call == "submit" for call in bugfix_gym.CALLS]
        answer = _chat(server, prompt, n=4, seed=0, useful_calls=only_submit)
        assert [c["message"]["content"] for c in answer["choices"]] == ["submit"] * 4


_PROMPT = [{"role": "user", "content": "fix the function f : . calls : read"}]


@pytest.mark.parametrize("body, status, code", [
    (b"{not json", 400, "invalid_json"),
    (b"\xff\xfe", 400, "invalid_json"),
    (b"[" * 100_000 + b"]" * 100_000, 400, "invalid_json"),
    ([1, 2], 400, "invalid_json"),
    (dict(messages=_PROMPT), 400, "missing_model"),
    (dict(model="gpt-4", messages=_PROMPT), 404, "model_not_found"),
    (dict(model=NAME, messages=_PROMPT, stream=True), 400, "unsupported_value"),
    (dict(model=NAME, messages=[]), 400, "invalid_messages"),
    (dict(model=NAME, messages="hi"), 400, "invalid_messages"),
    (dict(model=NAME, messages=[{"role": "wizard", "content": "x"}]), 400, "invalid_messages"),
    (dict(model=NAME, messages=[{"role": "tool", "content": "x"}]), 400, "invalid_messages"),
    (dict(model=NAME, messages=_PROMPT + [{"role": "assistant", "content": "read"}]), 400, "invalid_messages"),
    (dict(model=NAME, messages=_PROMPT + [{"role": "user", "content": "x"}]), 400, "invalid_messages"),
    (dict(model=NAME, messages=[{"role": "user", "content": {"a": 1}}]), 400, "invalid_messages"),
    (dict(model=NAME, messages=_PROMPT + [{"role": "assistant", "tool_calls": [
        {"function": {"name": "read"}}, {"function": {"name": "test"}}]}, {"role": "tool", "content": "x"}]),
     400, "invalid_messages"),
    (dict(model=NAME, messages=_PROMPT, n=0), 400, "invalid_value"),
    (dict(model=NAME, messages=_PROMPT, n=1.5), 400, "invalid_value"),
    (dict(model=NAME, messages=_PROMPT, temperature=3), 400, "invalid_value"),
    (dict(model=NAME, messages=_PROMPT, seed="x"), 400, "invalid_value"),
    (dict(model=NAME, messages=_PROMPT, max_tokens=0), 400, "invalid_value"),
    (dict(model=NAME, messages=_PROMPT, logprobs="yes"), 400, "invalid_type"),
    (dict(model=NAME, messages=_PROMPT, tools={"read": 1}), 400, "invalid_type"),
    (dict(model=NAME, messages=[{"role": "user", "content": "x " * 600}]), 400, "context_length_exceeded"),
])
def test_bad_requests_get_openai_error_json_and_the_server_keeps_serving(server, body, status, code):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    got, answer = _request(server.url + "/chat/completions", raw=raw)
    assert (got, answer["error"]["code"]) == (status, code), answer
    assert set(answer["error"]) >= {"message", "type", "code"} and "\n" not in answer["error"]["message"]
    assert _request(server.url.replace("/v1", "/health"))[0] == 200


def test_oversized_bodies_and_unknown_routes(server):
    got, answer = _request(server.url + "/chat/completions", raw=b" " * (MAX_BODY_BYTES + 1))
    assert got == 413 and answer["error"]["code"] == "request_too_large"
    assert _request(server.url + "/completions", raw=b"{}")[0] == 404
    assert _request(server.url + "/nowhere")[1]["error"]["code"] == "unknown_route"


def test_a_client_still_sending_a_refused_body_reads_the_answer(server):
    """The 413 goes out before the body is read; closing over the unread bytes would reset the connection, and a
    client still sending its body would lose the answer (urllib did, now and then, under load)."""
    with socket.create_connection(server.server_address[:2], timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % (MAX_BODY_BYTES + 1))
        sock.recv(1, socket.MSG_PEEK)  # the answer has arrived: the server has not read the body
        time.sleep(0.2)
        sock.sendall(b" " * (MAX_BODY_BYTES + 1))
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413") and b"request_too_large" in answer


def test_max_tokens_cuts_a_call_and_says_length(server):
    prompt = [{"role": "user", "content": gym.make("BugFix-v0").reset(seed=1)[0]}]
    answer = _chat(server, prompt, max_tokens=1, n=8, seed=0, tools=tool_schemas())
    for c in answer["choices"]:
        if c["finish_reason"] == "length":  # a word of a call, no <eoc>: not a call the tools can take
            assert c["message"]["content"] in ("edit", "read", "test", "revert", "submit")
    assert answer["usage"]["completion_tokens"] == 8


def test_content_parts_tool_choice_none_and_keep_alive(server):
    obs = gym.make("BugFix-v0").reset(seed=2)[0]
    plain = _chat(server, [{"role": "user", "content": obs}], temperature=0)["choices"][0]["message"]
    parts = [{"role": "user", "content": [{"type": "text", "text": obs[:20]}, {"type": "text", "text": obs[20:]}]}]
    assert _chat(server, parts, temperature=0)["choices"][0]["message"] == plain
    no_tools = _chat(server, parts, temperature=0, tools=tool_schemas(), tool_choice="none")["choices"][0]
    assert no_tools["message"] == plain and no_tools["finish_reason"] == "stop"
    host, port = server.server_address[:2]
    connection = http.client.HTTPConnection(str(host), port, timeout=60)  # two requests, one connection
    try:
        for path in ("/health", "/v1/models"):
            connection.request("GET", path)
            answer = connection.getresponse()
            assert answer.status == 200 and json.loads(answer.read())
    finally:
        connection.close()


def test_tool_schemas_name_the_five_calls_and_round_trip_every_call():
    names = [t["function"]["name"] for t in tool_schemas()]
    assert names == ["read", "test", "edit", "revert", "submit"]
    edit = tool_schemas()[2]["function"]["parameters"]
    assert edit["required"] == ["op"] and edit["properties"]["op"]["enum"] == list(bugfix_gym.FIX_OPS)
    for call in bugfix_gym.CALLS:
        function = tool_call_of(call)
        assert function is not None and call_of_tool_call({"function": function}) == call
    assert tool_call_of("edit nothing") is None
    assert call_of_tool_call({"function": {"name": "edit", "arguments": "{broken"}}) == "edit"


def test_closing_the_server_joins_every_thread_it_started(model_file):
    """A connection thread (or the deadline watchdog) that outlives ``server_close`` can free the last
    reference to the model while the interpreter exits, which aborts ``serve`` at Ctrl-C (SIGABRT)."""
    with serving(model_file, NAME, log_requests=False) as server:
        idle = socket.create_connection(server.server_address[:2])  # a keep-alive client that never writes
        status, _ = _request(server.url + "/models")
        assert status == 200
        threads = [server._watchdog, *server._connection_threads]
        assert len(threads) >= 3 and all(t.is_alive() for t in threads[:1])
    idle.close()
    assert not any(t.is_alive() for t in threads)


@pytest.mark.heavy
def test_serve_command_starts_and_refuses_bad_models_in_one_line(model_file, tmp_path, capsys):
    assert main(["serve", str(tmp_path / "missing.zip")]) == 2
    assert "no model file" in capsys.readouterr().err
    free_text = ROOT / "tests" / "fixtures" / "tokenppo_main_4e10e0a.zip"
    assert main(["serve", str(free_text), "--foresight", "0.5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bugfix-gym serve: error:") and "call grammar" in err and len(err.splitlines()) == 1
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert main(["serve", str(model_file), "--port", str(taken.getsockname()[1])]) == 2
    assert "cannot listen on 127.0.0.1" in capsys.readouterr().err
    proc = subprocess.Popen([sys.executable, "-m", "agents.cli", "serve", str(model_file), "--port", "0",
                             "--model-name", NAME], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert "call grammar, call mask none, foresight off" in line, line
        url = line.split(" at ")[1].split(" ")[0]
        prompt = [{"role": "user", "content": gym.make("BugFix-v0").reset(seed=1)[0]}]
        status, answer = _request(url + "/chat/completions", dict(model=NAME, messages=prompt, temperature=0))
        assert status == 200 and answer["choices"][0]["message"]["content"] in bugfix_gym.CALLS
        proc.send_signal(signal.SIGINT)  # Ctrl-C: a clean stop
        assert proc.wait(timeout=60) == 0 and proc.stderr and proc.stderr.read().endswith("serve: stopped\n")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
