"""Shared test fixtures: one torch thread, the tokenizer, the base agent, a served model, a hostile task."""

from __future__ import annotations

import copy

import pytest
import torch

import bugfix_gym
from bugfix_gym.tasks.library import Task


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """Tiny models on a shared 2-core machine: one intra-op thread is faster than two, and the
    seeded results below are bit-exact only at a fixed thread count."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def tok() -> bugfix_gym.Tokenizer:
    """The default tokenizer."""
    return bugfix_gym.build_tokenizer()


@pytest.fixture(scope="session")
def shared_base_agent(tok):
    """The behaviour-cloned base agent, from the disk cache (trained once per machine and recipe)."""
    from agents.bugfix.base_agent import cached_base_agent

    return cached_base_agent(tok).eval()


@pytest.fixture
def base_agent(shared_base_agent):
    """A fresh copy of the base agent: train it freely."""
    return copy.deepcopy(shared_base_agent)


SERVED_NAME = "tiny"
"""The model name the ``server`` fixture serves under."""


@pytest.fixture(scope="module")
def model_file(tmp_path_factory, shared_base_agent):
    """A saved TokenPPO on the behaviour-cloned base agent, decoding under the call grammar (the ``serve`` tests'
    model; a module may define its own)."""
    import gymnasium as gym

    from agents.algorithms.ppo import TokenPPO

    model = TokenPPO("TinyAgentPolicy", gym.make("BugFix-v0"), base_agent=shared_base_agent, n_episodes=4, seed=0,
                     policy_kwargs=dict(call_grammar=list(bugfix_gym.CALLS)))
    path = tmp_path_factory.mktemp("serve") / "tiny.zip"
    model.save(path)
    return path


@pytest.fixture(scope="module")
def server(model_file):
    """``bugfix-gym serve`` of :func:`model_file` on loopback, for the module's tests."""
    from agents.cli.serve import serving

    with serving(model_file, SERVED_NAME, log_requests=False) as server:
        yield server


@pytest.fixture
def hostile_task() -> Task:
    """A task whose statement and source carry terminal escape sequences, control characters,
    CR LF line ends and unicode (as a task pack could); built directly, no pack needed."""
    return Task(name="loud", statement="make it quiet \x1b[2J\x1b]0;owned\x07 \x9b31m \r\x0b\x0c done \u3000 \u00e9",
                source='def loud(x):\r\n    return "\x1b[31m" + x\r\n', defect="init", fix_op="fix_init",
                visible=((("a",), "a"),), hidden=((("a",), "a"), (("b",), "b")), split="custom")


class _Boom:
    """Unpickling this object creates a marker file (a stand-in for any code a crafted file could run)."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture
def pickle_bomb(tmp_path):
    """``(obj, marker)``: an object whose unpickling creates ``marker``, and that (absent) path."""
    marker = tmp_path / "unpickled-and-ran"
    return _Boom(str(marker)), marker
