"""``load_environment(env="BugFix-v1")``: verifiers' own eval runner plays BugFix-v1 through a scripted chat server
with the nine typed tools (``make test-trl``; skipped where verifiers is missing)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("verifiers.v1")

from bugfix_gym.core.calls_v1 import parse_call_v1  # noqa: E402
from bugfix_gym.integrations.chat_v1 import call_of_tool_call_v1, tool_call_of_v1  # noqa: E402
from bugfix_gym.integrations.trl_v1 import BugFixToolEnvV1  # noqa: E402
from bugfix_gym.integrations.verifiers import TOOLS_V1, load_environment  # noqa: E402
from test_verifiers import ScriptedServer, evaluate  # noqa: E402


def _replay(row, calls) -> float:
    player = BugFixToolEnvV1()
    player.reset(**row)
    for call in calls:
        player.env.step(call)
    return 1.0 if player.env.hidden_pass else 0.0


def test_v1_tool_call_rollouts_score_what_bugfix_v1_scores(tmp_path):
    env = load_environment("test", env="BugFix-v1", n=4, seed=3, max_turns=6)
    tasks = list(env.taskset)
    index = {task.data.prompt: k for k, task in enumerate(tasks)}
    player = BugFixToolEnvV1()

    def policy(messages):
        k = index[messages[0]["content"]]
        player.reset(**tasks[k].data.row)
        repair = player.env.task.bugs[0].repair if k % 2 == 0 else "delete 1"
        script = ["read", "locate", repair, "submit"]
        turn = sum(m["role"] == "assistant" for m in messages)
        function = tool_call_of_v1(script[turn])
        return {"role": "assistant", "content": None,
                "tool_calls": [{"id": f"call_{turn}", "type": "function", "function": function}]}

    server = ScriptedServer(policy)
    try:
        episodes = evaluate(env, server.url, tmp_path)
    finally:
        server.close()
    assert len(episodes) == 4 and all(e.ok for e in episodes)
    rewards = []
    for episode in episodes:
        (trace,) = episode.traces
        calls = trace.info["bugfix_calls"]
        assert len(calls) == 4 and calls[0] == "read" and calls[-1] == "submit"
        parse_call_v1(calls[2])  # the edit arrived as the call text it was sent as
        assert trace.rewards["hidden_tests"].score == _replay(episode.task.data.row, calls)
        rewards.append(trace.rewards["hidden_tests"].score)
    assert sorted(rewards) == [0.0, 0.0, 1.0, 1.0]
    assert all(request["tools"] == TOOLS_V1 for request in server.requests)
    last = max(server.requests, key=lambda r: len(r["messages"]))["messages"]
    assert last[2]["role"] == "tool" and last[2]["content"].startswith("names :")
    assert call_of_tool_call_v1(last[3]["tool_calls"][0]) == "locate"


def test_v1_rows_hold_no_repair_and_a_bad_env_fails_in_one_line():
    for task in load_environment("test", env="BugFix-v1", n=3).taskset:
        assert set(task.data.row) == {"task", "seed", "split", "bugs"} and task.data.env == "BugFix-v1"
        assert "edit " not in json.dumps(task.data.row)
    with pytest.raises(ValueError, match="env must be one of"):
        load_environment(env="BugFix-v9")
    with pytest.raises(ValueError, match="split must be one of"):
        load_environment("bogus", env="BugFix-v1")
