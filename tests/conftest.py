"""Shared test fixtures."""

from __future__ import annotations

import pytest

from bugfix_gym.tasks import Task


@pytest.fixture
def hostile_task() -> Task:
    """A task whose statement and source carry terminal escape sequences, control characters,
    CR LF line ends and unicode (as a task pack could); built directly, no pack needed."""
    return Task(name="loud", statement="make it quiet \x1b[2J\x1b]0;owned\x07 \x9b31m \r\x0b\x0c done \u3000 \u00e9",
                source='def loud(x):\r\n    return "\x1b[31m" + x\r\n', defect="init", fix_op="fix_init",
                visible=((("a",), "a"),), hidden=((("a",), "a"), (("b",), "b")), split="custom")
