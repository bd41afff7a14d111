"""BugFix as a verifiers (0.4, ``verifiers.v1``) environment: :func:`load_environment`.

::

    from bugfix_gym.integrations.verifiers import load_environment

    env = load_environment(split="train", tasks="book", n=8, seed=0)

verifiers 0.4 is the ``verifiers.v1`` stack: an ``Env`` composes a ``Taskset`` (the data: one ``Task`` per
dataset row) with the agents that play it, each agent a ``Harness`` (the program that talks to the model)
behind verifiers' interception server, which relays every model call to the OpenAI-compatible endpoint of
the run and records it on the episode's ``Trace``. A game engine is the run's *user*: the env's ``run()``
opens ``agents.player.interaction(task)`` and answers each model turn itself, as verifiers' own TextArena
and OpenEnv tasksets do. Here:

- the tasks are :func:`bugfix_gym.integrations.trl.dataset_rows` (no row or prompt holds a defect kind or
  a fix op), and each task resets a :class:`~bugfix_gym.core.env.BugFixEnv` from its row alone, so every
  rollout of a row plays the same task;
- the model's turns are the five calls as OpenAI tools (:data:`TOOLS`, the schemas of
  :func:`bugfix_gym.integrations.chat.tool_schemas`, which ``bugfix-gym serve`` reads): :class:`BugFixHarness` sends
  them with every chat request, through the interception endpoint, and the env answers each tool call with
  a ``tool`` message holding the env's output (a reply with no tool call is played as a text call, e.g.
  ``edit fix_init``; one that does not parse is an invalid turn, as in ``BugFix-v0``);
- ``load_environment(env="BugFix-v1")`` plays BugFix-v1 instead: rows of
  :func:`bugfix_gym.integrations.trl_v1.dataset_rows_v1` (HumanEval's functions with injected bugs), the nine
  typed calls of :data:`TOOLS_V1` (``edit(line, expr, mutation, arg)``, ``patch(line, code)``, ...), each tool
  call read by :func:`bugfix_gym.integrations.chat_v1.call_of_tool_call_v1`;
- the episode ends on ``submit`` or the turn budget;
- the reward (``hidden_tests``, weight 1) is the hidden tests' verdict: 1.0 if the episode submitted a
  source that passes them all, else 0.0. The calls the env received are on ``trace.info["bugfix_calls"]``.

verifiers' plugin loader imports a taskset by an id without dots, so importing this module also registers
it as :data:`TASKSET_ID` (``bugfix_gym_verifiers``). This module imports ``verifiers``; ``import
bugfix_gym`` does not import this module.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Iterator

import verifiers.v1 as vf

from ..core.env import BugFixEnv
from ..core.env_v1 import BugFixEnvV1
from .chat import ChatError, call_of_tool_call, escape_control_tokens, tool_schemas
from .chat_v1 import call_of_tool_call_v1, tool_schemas_v1
from .trl import BugFixToolEnv, dataset_rows
from .trl_v1 import BugFixToolEnvV1, dataset_rows_v1

__all__ = ["BugFixTaskset", "BugFixVfEnv", "BugFixHarness", "load_environment", "tool_schemas"]

TASKSET_ID = "bugfix_gym_verifiers"
sys.modules.setdefault(TASKSET_ID, sys.modules[__name__])
TOOLS = tool_schemas()
"""the OpenAI ``tools`` every chat request carries: ``bugfix-gym serve``'s five calls"""
TOOLS_V1 = tool_schemas_v1()
"""the ``tools`` of a ``BugFix-v1`` environment's requests: its nine typed calls"""
ENVS = ("BugFix-v0", "BugFix-v1")


class BugFixTasksetConfig(vf.TasksetConfig):
    """Which tasks: the arguments of :func:`bugfix_gym.integrations.trl.dataset_rows`, and the turn budget."""

    id: str = TASKSET_ID
    split: str = "train"
    tasks: str = "book"
    n: int | None = None
    seed: int = 0
    pack: str = ""
    max_turns: int = 6
    env: str = "BugFix-v0"
    bugs: int = 1


class BugFixData(vf.TaskData):
    """One task: its dataset row (``tasks``, ``task``, ``seed``, ``split``, ``pack``; never the answer)."""

    row: dict[str, Any]
    max_turns: int = 6
    env: str = "BugFix-v0"


class BugFixTask(vf.Task[BugFixData, vf.State, vf.TaskConfig]):
    """A BugFix task; its reward is recorded by :meth:`BugFixVfEnv.run`."""


class BugFixTaskset(vf.Taskset[BugFixTask, BugFixTasksetConfig]):
    """The dataset rows as tasks, each prompted with its env's first observation."""

    def load(self) -> Iterator[BugFixTask]:
        """Yield one task per row of :func:`~bugfix_gym.integrations.trl.dataset_rows`."""
        cfg = self.config
        v1 = cfg.env == "BugFix-v1"
        player = _player(cfg.env, cfg.max_turns)
        rows = dataset_rows_v1(cfg.split, cfg.n, cfg.seed, cfg.bugs) if v1 else \
            dataset_rows(cfg.split, cfg.n, cfg.seed, cfg.tasks, cfg.pack)
        for row in rows:
            row = {k: v for k, v in row.items() if k != "prompt"}
            prompt = player.reset(**row)
            name = row["task"] or f"generated-{row['seed']}"
            yield BugFixTask(BugFixData(name=name, prompt=prompt, row=row, max_turns=cfg.max_turns, env=cfg.env),
                             cfg.task)


def _player(env: str, max_turns: int) -> BugFixToolEnv | BugFixToolEnvV1:
    """The tool env that plays ``env``'s rows."""
    return BugFixToolEnvV1(max_turns=max_turns) if env == "BugFix-v1" else BugFixToolEnv(max_turns=max_turns)


class BugFixHarnessConfig(vf.HarnessConfig):
    """The in-process chat harness's settings."""

    id: str = TASKSET_ID
    timeout_s: float = 60.0


class BugFixHarness(vf.Harness[BugFixHarnessConfig]):
    """One chat-completions request per segment, with :data:`TOOLS`, to the interception endpoint.

    verifiers' harness contract allows a loop that runs in-process instead of launching a program, as long
    as every model call goes through the interception endpoint and its secret (the interception server
    records the call on the trace); the bundled chat programs are PEP 723 scripts that need ``uv`` and an
    index to install their dependencies at rollout time, which this one does not.
    """

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx: Any, trace: Any, runtime: Any, endpoint: str, secret: str,
                     mcp_urls: dict[str, str], data: Any, tool_interception_url: str | None = None) -> Any:
        """Send the conversation so far and the tools; the model's reply lands on the trace.

        :param ctx: the rollout's model context (its ``model`` is the request's)
        :param trace: the rollout's trace (the interception server records the call on it)
        :param runtime: the agent's runtime (unused: nothing runs in it)
        :param endpoint: the interception server's base URL; ``secret`` is its bearer token
        :param mcp_urls: the task's tool servers (none: the tools are :data:`TOOLS`)
        :param data: this segment's task data; its prompt is the conversation so far
        :param tool_interception_url: unused (no tool is executed by the harness)
        :return: a successful ``ProgramResult`` (the trace is the record of what ran), or exit code 1 with the
            endpoint's error
        """
        import httpx

        system, prompt = self.resolve_prompt(data)
        messages = [] if system is None else [{"role": "system", "content": system}]
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        else:
            from verifiers.v1.dialects.chat import message_to_wire

            messages += [message_to_wire(m) for m in prompt or []]
        tools = TOOLS_V1 if getattr(data, "env", "BugFix-v0") == "BugFix-v1" else TOOLS
        body = {"model": ctx.model, "messages": messages, "tools": tools}
        async with httpx.AsyncClient(timeout=self.config.timeout_s) as http:
            reply = await http.post(endpoint.rstrip("/") + "/chat/completions", json=body,
                                    headers={"Authorization": f"Bearer {secret}"})
        if reply.status_code != 200:
            return vf.ProgramResult(exit_code=1, stdout="", stderr=f"{reply.status_code}: {reply.text[:500]}")
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


class BugFixVfEnvConfig(vf.EnvConfig):
    """The env's one seat, ``player``: its harness defaults to :class:`BugFixHarness`, its runtime to a local
    subprocess (verifiers' default runtime is a remote sandbox; the harness runs no code, the env steps
    host-side)."""

    player: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig())


class BugFixVfEnv(vf.Env[BugFixVfEnvConfig]):
    """BugFix steps host-side as the run's user: each model call is played, its output is the next turn."""

    async def run(self, task: BugFixTask, agents: Any) -> None:
        """Play one episode of ``task`` and record the hidden tests' verdict as the reward ``hidden_tests``.

        :param task: a :class:`BugFixTask` (its row says which BugFix task)
        :param agents: the episode's agents; ``agents.player`` plays
        """
        player = _player(task.data.env, task.data.max_turns)
        player.reset(**task.data.row)
        env: BugFixEnv | BugFixEnvV1 = player.env
        read = call_of_tool_call_v1 if task.data.env == "BugFix-v1" else call_of_tool_call
        calls: list[str] = []
        passed = False
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            while not segment.terminated:
                call_id, action = _last_call(segment.messages, read)
                obs, _, _, _, info = env.step(action)
                calls.append(action)
                passed = passed or bool(info["hidden_pass"])
                if env.stop is not None:
                    break
                obs = escape_control_tokens(obs)  # the serving model's template renders it: no forged turns
                answer = vf.ToolMessage(tool_call_id=call_id, content=obs) if call_id else obs
                segment = await interaction.turn([answer] if call_id else answer)
        trace = interaction.trace
        trace.info["bugfix_calls"] = calls
        trace.info["bugfix_stop"] = env.stop
        trace.record_reward("hidden_tests", 1.0 if passed else 0.0, 1.0)


def _last_call(messages: list[Any], read: Callable[[Any], str] = call_of_tool_call) -> tuple[str | None, str]:
    """The last assistant message's first tool call as ``(call id, text call)``, or ``(None, its text)``; a tool
    call or a content that cannot be read (no name, arguments of 5,000 digits or nested 20,000 deep, content
    that is not text) is played as the invalid call it is, never raised."""
    for message in reversed(messages):
        if isinstance(message, vf.AssistantMessage):
            if message.tool_calls:
                first = message.tool_calls[0]
                try:
                    return first.id, read({"function": {"name": first.name, "arguments": first.arguments}})
                except ChatError:
                    return first.id, "invalid tool call"
            content = message.content
            return None, content.strip() if isinstance(content, str) else "" if content is None else \
                "invalid content"
    return None, ""


def load_environment(split: str = "train", tasks: str = "book", n: int | None = None, seed: int = 0,
                     pack: str | None = None, max_turns: int = 6, env: str = "BugFix-v0", bugs: int = 1,
                     **kwargs: Any) -> BugFixVfEnv:
    """A verifiers environment whose tasks are BugFix rows and whose reward is the hidden tests.

    ``env="BugFix-v1"``: HumanEval's functions with injected bugs (``split`` ``"train"``, ``"heldout"``,
    ``"test"``, ``bugs`` 1 or 2; ``tasks`` and ``pack`` do not apply), the nine typed calls of
    :data:`TOOLS_V1` (:class:`~bugfix_gym.integrations.trl_v1.BugFixToolEnvV1`'s).

    :param split: book split, or generator split with ``tasks="generated"``
    :param tasks: ``"book"``, ``"generated"`` or ``"pack"``
    :param n: tasks (default: each book or pack task once, 64 generated)
    :param seed: the same arguments give the same tasks
    :param pack: the task pack file (``tasks="pack"``)
    :param max_turns: the env's turn budget
    :param env: ``"BugFix-v0"`` or ``"BugFix-v1"``
    :param bugs: bugs per task (``BugFix-v1``)
    :param kwargs: more fields of the env's config (``timeout``, ``max_concurrent_agents``, ...)
    """
    if env not in ENVS:
        raise ValueError(f"env must be one of {', '.join(ENVS)}, got {str(env)[:40]!r}")
    taskset = BugFixTasksetConfig(split=split, tasks=tasks, n=n, seed=seed, pack=pack or "", max_turns=max_turns,
                                  env=env, bugs=bugs)
    if env == "BugFix-v1":  # a bad argument fails here, in one line
        dataset_rows_v1(split, 0, seed, bugs)
    else:
        dataset_rows(split, 0, seed, tasks, pack or "")
    return BugFixVfEnv(BugFixVfEnvConfig(taskset=taskset, **kwargs))
