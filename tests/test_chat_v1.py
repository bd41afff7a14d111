"""BugFix-v1's tools as chat: the schemas, tool call <-> call text, and BugFixToolEnvV1 (TRL's environment_factory
contract, which needs no TRL to play: the TRL trainer itself is in tests/test_trl_v1.py)."""

from __future__ import annotations

import json

import pytest

from bugfix_gym.core.calls_v1 import CALL_KINDS, parse_call_v1
from bugfix_gym.core.env_v1 import BugFixEnvV1
from bugfix_gym.edits.sites import MUTATIONS
from bugfix_gym.integrations.chat_v1 import call_of_tool_call_v1, tool_call_of_v1, tool_schemas_v1
from bugfix_gym.integrations.trl_v1 import ENDED, BugFixToolEnvV1, dataset_rows_v1


def _tool_call(name: str, arguments) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def test_schemas_name_the_nine_calls_with_typed_arguments():
    schemas = {s["function"]["name"]: s["function"]["parameters"] for s in tool_schemas_v1()}
    assert list(schemas) == list(CALL_KINDS)
    edit = schemas["edit"]
    assert edit["required"] == ["line", "expr", "mutation"]
    assert edit["properties"]["mutation"]["enum"] == list(MUTATIONS)
    assert edit["properties"]["line"]["type"] == "integer" and schemas["patch"]["required"] == ["line", "code"]
    assert all(not schemas[k]["properties"] for k in ("read", "test", "locate", "revert", "submit"))


def test_every_legal_call_and_a_patch_round_trip_through_a_tool_call():
    env = BugFixEnvV1(split="test")
    env.reset(seed=0, options={"task": 4})
    calls = env.legal_calls()[::7] + ["patch 3 return sorted(x, key=lambda v: -v)", "insert 2 y = [1, 'a b']",
                                      "delete 3", "read", "submit"]
    for call in calls:
        function = tool_call_of_v1(call)
        assert function is not None and isinstance(json.loads(function["arguments"]), dict)
        assert call_of_tool_call_v1({"function": function}) == call
        assert parse_call_v1(call_of_tool_call_v1({"function": dict(function, arguments=json.loads(
            function["arguments"]))})) == parse_call_v1(call)
    assert tool_call_of_v1("edit 3 op") is None and tool_call_of_v1("frobnicate") is None


@pytest.mark.parametrize("name, arguments, played", [
    ("edit", "{not json", "edit . "),
    ("edit", {"line": [3], "expr": 1, "mutation": "op"}, "edit <list>.1 op"),
    ("edit", {"line": 3, "expr": 1, "mutation": "op", "arg": ""}, "edit 3.1 op"),
    ("patch", {"line": True, "code": "x"}, "patch <bool> x"),
    ("delete", "[1, 2]", "delete "),
    ("frobnicate", {}, "frobnicate"),
])
def test_a_tool_call_the_env_cannot_take_reads_as_the_invalid_call_it_is(name, arguments, played):
    text = call_of_tool_call_v1(_tool_call(name, arguments))
    assert text == played
    env = BugFixEnvV1(split="test")
    env.reset(seed=0, options={"task": 0})
    obs, *_, info = env.step(text)
    assert not info["valid"] and obs.startswith("invalid call")


def test_rows_reset_one_task_per_row_and_hold_no_repair():
    rows = dataset_rows_v1("test", n=6, seed=2)
    assert rows == dataset_rows_v1("test", n=6, seed=2) and len({r["task"] for r in rows}) == 6
    first, second = BugFixToolEnvV1(), BugFixToolEnvV1()
    first.reset(**dataset_rows_v1("heldout", n=1, seed=9)[0])
    for row in rows:
        assert first.reset(**row) == second.reset(**row) and first.env.task == second.env.task
        bug = first.env.task.bugs[0]
        assert bug.repair not in str(row) and bug.family not in str(row)
    with pytest.raises(ValueError, match="split must be one of"):
        dataset_rows_v1("bogus")


def test_typed_tools_repair_the_task_and_get_reward_is_the_hidden_verdict():
    row = dataset_rows_v1("test", n=1, seed=5)[0]
    player = BugFixToolEnvV1(max_turns=6)
    player.reset(**row)
    repair = parse_call_v1(player.env.task.bugs[0].repair)
    assert player.locate().startswith("suspicious lines")
    if repair.edit is not None:
        e = repair.edit
        answer = player.edit(line=e.line, expr=e.expr, mutation=e.mutation, arg=e.arg or "")
    elif repair.kind == "delete":
        answer = player.delete(line=repair.line)
    else:
        answer = getattr(player, repair.kind)(line=repair.line, code=repair.code)
    assert player.info["valid"], answer
    assert player.submit().startswith("hidden tests passed") and player.get_reward() == 1.0
    assert player.read() == ENDED and player.late_calls == 1
    player.reset(**row)
    assert player.get_reward() == 0.0 and player.edit(line=1, expr=0, mutation="op", arg="<=").startswith("invalid")
    player.submit()
    assert player.get_reward() == 0.0
