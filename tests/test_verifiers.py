"""BugFix as a verifiers environment (``make test-trl``; skipped where verifiers is missing), rolled out by
verifiers' own eval runner (``run_eval``, the function behind ``vf-eval``, and the ``vf-eval`` command line with
the env package environments/bugfix_gym_verifiers) against OpenAI-compatible chat servers on 127.0.0.1: a
scripted one here, and ``bugfix-gym serve`` with a TinyAgent."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import pytest

vf = pytest.importorskip("verifiers.v1")

from bugfix_gym import get_task  # noqa: E402
from bugfix_gym.integrations.chat import call_of_tool_call  # noqa: E402
from bugfix_gym.integrations.trl import BugFixToolEnv  # noqa: E402
from bugfix_gym.integrations.verifiers import TOOLS, load_environment  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
Policy = Callable[[list[dict[str, Any]]], dict[str, Any]]


class ScriptedServer:
    """``POST /v1/chat/completions`` answered by ``policy(messages)``; keeps every request and every reply."""

    def __init__(self, policy: Policy):
        self.policy, self.requests, self.replies = policy, [], []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                message = outer.policy(body["messages"])
                outer.requests.append(body)
                outer.replies.append((body["messages"][0]["content"], message))
                data = json.dumps({"id": "chatcmpl-0", "object": "chat.completion", "created": 0,
                                   "model": body["model"], "choices": [{
                                       "index": 0, "message": message,
                                       "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
                                   "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def evaluate(env, url: str, tmp_path, rollouts: int = 1) -> list[Any]:
    """verifiers' own eval runner on ``env``, against the chat server at ``url``."""
    from verifiers.v1.cli.eval.runner import run_eval
    from verifiers.v1.configs.cli.eval import EvalConfig

    config = EvalConfig(env=env.config, model="tinyagent", num_rollouts=rollouts, rich=None, push=False,
                        max_concurrent=4,
                        client=vf.EvalClientConfig(base_url=url, api_key_var="BUGFIX_NO_KEY"),
                        output_dir=tmp_path)
    return asyncio.run(run_eval(config))


def replay(row: dict[str, Any], calls: list[str]) -> float:
    """What BugFixEnv itself gives for ``calls`` on ``row``'s task: 1.0 if a submit passed the hidden tests."""
    player = BugFixToolEnv()
    player.reset(**row)
    passed = False
    for call in calls:
        *_, info = player.env.step(call)
        passed = passed or info["hidden_pass"]
    return 1.0 if passed else 0.0


def tool_call(k: int, name: str, op: str | None = None) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [{
        "id": f"call_{k}", "type": "function",
        "function": {"name": name, "arguments": json.dumps({"op": op} if op else {})}}]}


def played(message: Any) -> str:
    """An assistant message on verifiers' trace as the call it makes: its tool call, else its text."""
    if message.tool_calls:
        call = message.tool_calls[0]
        return call_of_tool_call({"function": {"name": call.name, "arguments": call.arguments}})
    return (message.content or "").strip()


def returned_calls(server: ScriptedServer, prompt: str) -> list[str]:
    out = []
    for first, message in server.replies:
        if first == prompt:
            calls = message.get("tool_calls")
            out.append(call_of_tool_call(calls[0]) if calls
                       else message["content"].strip())
    return out


def test_tool_call_rollouts_score_what_bugfix_env_scores(tmp_path):
    env = load_environment("train", tasks="book", n=4, seed=3)
    tasks = list(env.taskset)
    index = {task.data.prompt: k for k, task in enumerate(tasks)}

    def policy(messages):
        k = index[messages[0]["content"]]
        answer = get_task(tasks[k].data.row["task"]).fix_op  # a scripted policy that knows the answer, or not
        op = answer if k % 2 == 0 else next(o for o in ("fix_init", "swap_minmax") if o != answer)
        script = [("read", None), ("edit", op), ("test", None), ("submit", None)]
        k = sum(m["role"] == "assistant" for m in messages)
        return tool_call(k, *script[k])

    server = ScriptedServer(policy)
    try:
        episodes = evaluate(env, server.url, tmp_path)
    finally:
        server.close()
    assert len(episodes) == 4 and all(e.ok for e in episodes)
    rewards = []
    for episode in episodes:
        (trace,) = episode.traces
        data = episode.task.data
        calls = trace.info["bugfix_calls"]
        assert calls == returned_calls(server, data.prompt)
        assert calls[-1] == "submit" and trace.info["bugfix_stop"] == "submit"
        assert trace.rewards["hidden_tests"].score == replay(data.row, calls)
        rewards.append(trace.rewards["hidden_tests"].score)
    assert set(rewards) == {0.0, 1.0}
    assert all(request["tools"] == TOOLS for request in server.requests)
    # the env answered each call with a tool message holding the env's output, after its tool call
    last = max(server.requests, key=lambda r: len(r["messages"]))["messages"]
    assert [m["role"] for m in last] == ["user", "assistant", "tool", "assistant", "tool", "assistant", "tool"]
    assert last[2]["tool_call_id"] == last[1]["tool_calls"][0]["id"] and last[2]["content"].startswith("def ")


def test_text_replies_are_text_calls_and_the_budget_ends_the_episode(tmp_path):
    env = load_environment("heldout", tasks="book", n=1, seed=0, max_turns=4)

    def policy(messages):
        k = sum(m["role"] == "assistant" for m in messages)
        return {"role": "assistant", "content": ["read", "frobnicate", "test", "read"][k]}

    server = ScriptedServer(policy)
    try:
        (episode,) = evaluate(env, server.url, tmp_path)
    finally:
        server.close()
    (trace,) = episode.traces
    assert trace.info["bugfix_calls"] == ["read", "frobnicate", "test", "read"]
    assert trace.info["bugfix_stop"] == "budget" and trace.rewards["hidden_tests"].score == 0.0
    second = server.requests[2]["messages"]
    assert second[-1]["role"] == "user" and second[-1]["content"].startswith("invalid call")


def test_a_group_of_rollouts_plays_one_task(tmp_path):
    env = load_environment("train", tasks="generated", n=1, seed=5)
    server = ScriptedServer(lambda messages: tool_call(0, "submit"))
    try:
        episodes = evaluate(env, server.url, tmp_path, rollouts=3)
    finally:
        server.close()
    assert len(episodes) == 3 and len({first for first, _ in server.replies}) == 1
    assert {e.traces[0].info["bugfix_stop"] for e in episodes} == {"submit"}


def test_rows_hold_no_answer_and_bad_arguments_fail_in_one_line():
    for task in load_environment("train", n=3).taskset:
        assert set(task.data.row) == {"tasks", "task", "seed", "split", "pack"}
    with pytest.raises(ValueError, match="tasks must be one of"):
        load_environment(tasks="bogus")
    with pytest.raises(ValueError, match="needs pack=PATH"):
        load_environment(tasks="pack")


def test_import_bugfix_gym_imports_no_verifiers():
    code = "import sys, bugfix_gym, bugfix_gym.integrations; print('verifiers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _cli_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


@pytest.fixture(scope="module")
def tinyagent(tmp_path_factory) -> Path:
    """A TinyAgent model file: ``$BUGFIX_SERVE_MODEL``, else one PPO iteration of ``bugfix-gym train`` (~30 s)."""
    if os.environ.get("BUGFIX_SERVE_MODEL"):
        return Path(os.environ["BUGFIX_SERVE_MODEL"])
    out = tmp_path_factory.mktemp("tinyagent")
    subprocess.run([sys.executable, "-m", "agents.cli", "train", "--timesteps", "384", "--eval-episodes", "8",
                    "--out", str(out)], check=True, capture_output=True, env=_cli_env(), cwd=ROOT)
    return out / "tokenppo.zip"


@pytest.fixture()
def served(tinyagent, tmp_path):
    """``bugfix-gym serve`` of the TinyAgent on 127.0.0.1 (a free port), in a subprocess; yields its base URL."""
    log = tmp_path / "serve.log"
    with open(log, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "agents.cli", "serve", str(tinyagent), "--port", "0",
                                 "--model-name", "tinyagent"], stdout=subprocess.PIPE, stderr=stderr,
                                text=True, env=_cli_env(), cwd=ROOT)
    try:
        line = proc.stdout.readline()
        match = re.search(r" at (http://\S+/v1) ", line)
        assert match, f"bugfix-gym serve printed {line!r}; its log: {log.read_text()[-2000:]}"
        yield match.group(1)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_verifiers_rollouts_through_bugfix_gym_serve(served, tmp_path):
    env = load_environment("train", tasks="book", n=4, seed=1)
    episodes = evaluate(env, served, tmp_path, rollouts=2)
    assert len(episodes) == 8 and all(e.ok for e in episodes), [e.errors for e in episodes]
    stops = []
    for episode in episodes:
        (trace,) = episode.traces
        calls = trace.info["bugfix_calls"]
        # the calls the server returned (the assistant messages on verifiers' trace) are the calls the env played
        sampled = [m for m in trace.branches[-1].messages if isinstance(m, vf.AssistantMessage)]
        assert [played(m) for m in sampled] == calls
        assert all(m.tool_calls for m in sampled)  # the server answered the tools with tool calls
        assert trace.info["bugfix_stop"] in ("submit", "budget")
        assert (calls[-1] == "submit") == (trace.info["bugfix_stop"] == "submit")
        assert trace.rewards["hidden_tests"].score == replay(episode.task.data.row, calls)
        stops.append(trace.info["bugfix_stop"])
    assert "submit" in stops


def test_vf_eval_cli_through_bugfix_gym_serve(served, tmp_path):
    """The ``vf-eval`` command line finds the env by its id (the package environments/bugfix_gym_verifiers)."""
    cmd = [str(Path(sys.executable).parent / "vf-eval"), "bugfix_gym_verifiers", "-m", "tinyagent", "-n", "3",
           "-r", "2", "--env.taskset.seed", "1", "--client.base-url", served,
           "--client.api-key-var", "BUGFIX_NO_KEY", "--no-push", "-o", str(tmp_path / "out"), "--run.dir", "vf"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=_cli_env(), cwd=tmp_path, timeout=120)
    assert out.returncode == 0, ("is the env package installed? make trl-venv (pip install -e "
                                 "environments/bugfix_gym_verifiers)\n" + out.stdout[-2000:] + out.stderr[-2000:])
    assert "hidden_tests" in out.stdout
    results = [json.loads(line) for line in (tmp_path / "out" / "vf" / "traces.jsonl").read_text().splitlines()]
    assert len(results) == 6 and all(r["ok"] and not r["errors"] for r in results), [r["errors"] for r in results]
    assert len({r["task"]["data"]["name"] for r in results}) == 3
    for result in results:
        (trace,) = result["traces"]
        calls = trace["info"]["bugfix_calls"]
        # one model call per call the env played, each answered with a tool call
        assert [c["finish_reason"] for c in trace["calls"]] == ["tool_calls"] * len(calls)
        assert trace["info"]["bugfix_stop"] in ("submit", "budget")
        score = trace["rewards"]["hidden_tests"]["score"]
        assert score in (0.0, 1.0) and score == replay(result["task"]["data"]["row"], calls)
