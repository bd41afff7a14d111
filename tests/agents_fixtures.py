"""Shared fixtures for the agent tests: the tokenizer and one base agent per session.

Import the fixtures into a test module (``from agents_fixtures import tok, base_agent``); the
base agent is cached at module level, so it is built once per session however many modules use it.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch

import bugfix_gym


@functools.lru_cache(maxsize=None)
def _tokenizer() -> bugfix_gym.Tokenizer:
    return bugfix_gym.build_tokenizer()


@functools.lru_cache(maxsize=None)
def _base_agent():
    from agents.base_agent import make_base_agent

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread builds a tiny model fastest on a shared machine
    try:
        return make_base_agent(_tokenizer(), seed=0).eval()
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models on a shared 2-core machine: one intra-op thread is ~3x faster than two."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def tok() -> bugfix_gym.Tokenizer:
    """The default tokenizer (all tasks)."""
    return _tokenizer()


@pytest.fixture(scope="session")
def base_agent():
    """A fresh copy of ``make_base_agent(tok, seed=0)`` (built once per session; train the copy freely)."""
    return copy.deepcopy(_base_agent())
