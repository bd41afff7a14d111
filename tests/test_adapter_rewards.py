"""The reward every adapter reports is the hidden tests' verdict, recomputed here independently: random call
sequences, malformed tool calls among them (huge numbers, deep nesting, wrong types, unknown tools), are
played through TRL's ``environment_factory`` class (:class:`BugFixToolEnv`), the ``rollout_func`` path's
tool runner, the OpenAI tool-call mapping that ``bugfix-gym serve`` and the verifiers adapter read, and (in
.venv-trl) the verifiers env itself; an oracle replays the calls the adapter says it played on the task's
source with the edit ops and runs the hidden tests itself. A malformed call is always an invalid turn, never
an exception, and a reset that fails leaves no reward of the episode before it."""

from __future__ import annotations

import asyncio
import json
import string
from typing import Any

import numpy as np
import pytest

import bugfix_gym
from bugfix_gym.edits.ops import FIX_OPS, apply_op
from bugfix_gym.execution.cases import run_cases
from bugfix_gym.integrations.chat import call_of_tool_call
from bugfix_gym.integrations.trl import BugFixToolEnv, dataset_rows
from bugfix_gym.integrations.trl_rollout import _run_tool

SEQUENCES = 150  # per adapter
TASKS = {t.name: t for t in bugfix_gym.make_tasks("all")}


def _deep(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


#: op arguments a model (or a broken parser) may pass: the real ops, typos, and hostile values
OPS: list[Any] = [*FIX_OPS, *FIX_OPS, "fix_init extra", " fix_comparison ", "FIX_INIT", "", "x" * 200, "\u00e9dit",
                  12, 1.5, None, True, {"op": "fix_init"}, ["fix_init"], 10 ** 5000, _deep(20_000)]
#: raw ``arguments`` strings of an OpenAI tool call
ARGUMENTS = ['{"op": "%s"}' % op for op in FIX_OPS] + [
    "{}", "", "{broken", '{"op": 7}', '{"op": null}', '{"op": ' + "9" * 5000 + "}", "[" * 20_000 + "]" * 20_000,
    '{"op": ' + "[" * 300 + "]" * 300 + "}", '"fix_init"', '{"op": "fix_init", "op2": 1}']


def _legal(text: str) -> tuple[str, str | None] | None:
    """The grammar, written out again: at most 64 printable characters, a bare tool or ``edit OP``."""
    if len(text) > 64 or any(c not in string.printable for c in text):
        return None
    words = text.split()
    if len(words) == 1 and words[0] in ("read", "test", "revert", "submit"):
        return words[0], None
    if len(words) == 2 and words[0] == "edit" and words[1] in FIX_OPS:
        return "edit", words[1]
    return None


def oracle(task: Any, played: list[str], max_turns: int = 6) -> float:
    """1.0 if a ``submit`` among the first ``max_turns`` calls finds a source that passes every hidden test, run
    here with :func:`run_cases` on the source the edit ops make (no env, no cache)."""
    source = task.source
    for text in played[:max_turns]:
        call = _legal(text)
        if call is None:
            continue
        if call[0] == "edit":
            source = apply_op(source, call[1])
        elif call[0] == "revert":
            source = task.source
        elif call[0] == "submit":
            report = run_cases(source, task.name, task.hidden)
            return 1.0 if report.passed == report.total else 0.0
    return 0.0


def _task_of(row: dict[str, Any]) -> Any:
    return TASKS[row["task"]]


def _rows(seed: int) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k != "prompt"} for row in dataset_rows("all", SEQUENCES, seed=seed)]


def _tool_sequence(rng: np.random.Generator, task: Any) -> list[tuple[str, Any]]:
    """A random episode's tool calls, ``(tool, op)``: random ones, and half the time the task's own fix and a
    submit after them (so both verdicts come up, and a fix undone by a later edit or a revert fails)."""
    out = []
    for _ in range(int(rng.integers(0, 7))):
        tool = str(rng.choice(["read", "test", "edit", "edit", "edit", "revert", "submit"]))
        op = None
        if tool == "edit":
            op = task.fix_op if rng.random() < 0.3 else OPS[int(rng.integers(len(OPS)))]
        out.append((tool, op))
    if rng.random() < 0.5:
        at = int(rng.integers(0, len(out) + 1))
        out[at:at] = [("edit", task.fix_op)]
        out.insert(int(rng.integers(at + 1, len(out) + 1)), ("submit", None))
    return out


def _expected_legal(tool: str, op: Any) -> bool:
    return tool != "edit" or (isinstance(op, str) and len(op.split()) == 1 and op.split()[0] in FIX_OPS)


def test_the_trl_tool_env_rewards_what_the_hidden_tests_say():
    rng = np.random.default_rng(0)
    player, passed = BugFixToolEnv(), 0
    for row in _rows(0):
        task = _task_of(row)
        player.reset(**row)
        sequence = _tool_sequence(rng, task)
        for tool, op in sequence:
            assert isinstance(player.edit(op) if tool == "edit" else getattr(player, tool)(), str)
        played = list(player.env.actions)  # the calls the env received
        assert [_legal(text) is not None for text in played] == [_expected_legal(*c) for c in sequence[:len(played)]]
        assert player.get_reward() == oracle(task, played)
        passed += player.get_reward() == 1.0
    assert 10 < passed < SEQUENCES - 10  # both verdicts are exercised


def test_the_rollout_func_tool_runner_rewards_what_the_hidden_tests_say():
    rng = np.random.default_rng(1)
    env = BugFixToolEnv()
    tools = ["read", "test", "edit", "revert", "submit", "delete_everything", ""]
    for row in _rows(1):
        task = _task_of(row)
        env.reset(**row)
        for _ in range(int(rng.integers(1, 9))):
            name = str(rng.choice(tools))
            arguments: dict[str, Any] = {}
            if name == "edit":
                arguments = {"op": task.fix_op if rng.random() < 0.4 else OPS[int(rng.integers(len(OPS)))]}
            elif rng.random() < 0.1:
                arguments = {"op": "fix_init"}  # an argument a tool does not take: TRL's error, not a crash
            assert isinstance(_run_tool(env, name, arguments), str)
        assert env.get_reward() == oracle(task, list(env.env.actions))


def test_openai_tool_calls_are_played_as_the_hidden_tests_judge_them():
    """What ``bugfix-gym serve`` reads back from a chat and the verifiers adapter plays: a tool call whose
    arguments are not JSON, hold 5,000 digits or nest 20,000 deep is the invalid call it is."""
    rng = np.random.default_rng(2)
    for row in _rows(2):
        task = _task_of(row)
        env = bugfix_gym.BugFixEnv(split="all")
        env.reset(seed=row["seed"], options={"task": row["task"]})
        played, passed = [], False
        for _ in range(int(rng.integers(1, 9))):
            name = str(rng.choice(["read", "test", "edit", "edit", "revert", "submit", "rm"]))
            arguments: Any = ARGUMENTS[int(rng.integers(len(ARGUMENTS)))] if name == "edit" else "{}"
            if name == "edit" and rng.random() < 0.4:
                arguments = json.dumps({"op": task.fix_op}) if rng.random() < 0.5 else {"op": task.fix_op}
            text = call_of_tool_call({"function": {"name": name, "arguments": arguments}})
            if env.stop is not None:
                break
            *_, info = env.step(text)
            played.append(text)
            passed = passed or info["hidden_pass"]
        assert (1.0 if passed else 0.0) == oracle(task, played)


def test_a_reset_that_fails_keeps_no_reward_of_the_episode_before():
    player = BugFixToolEnv()
    task = bugfix_gym.make_tasks("train")[0]
    player.reset(task=task.name)
    player.edit(task.fix_op)
    assert player.submit() == "hidden tests passed" and player.get_reward() == 1.0
    for row in ({"tasks": "nonsense"}, {"task": "no_such_task"}, {"tasks": "pack", "pack": "/no/such/pack.json"},
                {"tasks": "generated", "split": "nowhere"}):
        with pytest.raises(Exception):
            player.reset(**row)
        assert player.get_reward() == 0.0 and player.env is None and player.info == {}
        with pytest.raises(RuntimeError, match="call reset"):
            player.read()


# ---------------------------------------------------------------------- the verifiers env (.venv-trl)
def test_the_verifiers_env_rewards_what_the_hidden_tests_say():
    vf = pytest.importorskip("verifiers.v1")
    from bugfix_gym.integrations.verifiers import BugFixData, BugFixTask, BugFixVfEnv, load_environment

    env = load_environment("all", tasks="book", n=SEQUENCES, seed=3)
    rng = np.random.default_rng(3)

    class Trace:
        def __init__(self) -> None:
            self.info: dict[str, Any] = {}
            self.rewards: dict[str, float] = {}

        def record_reward(self, name: str, value: float, weight: float) -> None:
            self.rewards[name] = value

    class Segment:
        def __init__(self, messages: list[Any], terminated: bool) -> None:
            self.messages, self.terminated = messages, terminated

    class Interaction:
        """The model's side: each turn, one random tool call or text as an AssistantMessage."""

        def __init__(self, task: Any) -> None:
            self.task, self.trace, self.turns = task, Trace(), int(rng.integers(1, 9))

        async def __aenter__(self) -> "Interaction":
            return self

        async def __aexit__(self, *exc: Any) -> None:
            return None

        async def turn(self, answer: Any = None) -> Segment:
            self.turns -= 1
            if self.turns < 0:
                return Segment([], True)
            name = str(rng.choice(["read", "test", "edit", "edit", "revert", "submit", "text"]))
            fix = self.task.data.row["task"]
            if name == "text":
                message = vf.AssistantMessage(content=str(rng.choice(["submit", "edit " + TASKS[fix].fix_op, "hm"])))
            else:
                arguments = ARGUMENTS[int(rng.integers(len(ARGUMENTS)))] if name == "edit" else "{}"
                if name == "edit" and rng.random() < 0.4:
                    arguments = json.dumps({"op": TASKS[fix].fix_op})
                message = vf.AssistantMessage(content=None, tool_calls=[
                    vf.ToolCall(id=f"call_{self.turns}", name=name, arguments=arguments)])
            return Segment([message], False)

    class Agents:
        class player:  # noqa: N801 - the seat's name in verifiers
            @staticmethod
            def interaction(task: Any) -> Interaction:
                return Interaction(task)

    checked = 0
    for task in env.taskset:
        assert isinstance(task, BugFixTask) and isinstance(task.data, BugFixData)
        agents = Agents()
        interaction_holder: list[Interaction] = []
        real = Agents.player.interaction

        def interaction(t: Any, real: Any = real) -> Interaction:
            interaction_holder.append(real(t))
            return interaction_holder[-1]

        agents.player.interaction = staticmethod(interaction)  # type: ignore[assignment]
        asyncio.run(BugFixVfEnv.run(env, task, agents))
        trace = interaction_holder[-1].trace
        played = trace.info["bugfix_calls"]
        assert trace.rewards["hidden_tests"] == oracle(TASKS[task.data.row["task"]], played)
        checked += 1
    assert checked == SEQUENCES
