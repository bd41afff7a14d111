"""Pack inputs the audit tried: a FIFO, deep nesting, too many cases, a pack that validates forever."""

from __future__ import annotations

import json
import os
import threading

import pytest

from bugfix_gym import load_task_pack
from bugfix_gym.tasks import packs
from bugfix_gym.edits.ops import apply_op

TASK = {"name": "limit_cap", "statement": "return x, but never more than 10", "source":
        "def limit_cap(x):\n    return max(x, 10)\n", "fix_op": "swap_minmax",
        "visible": [[[3], 3]], "hidden": [[[3], 3], [[12], 10]]}


def test_a_fifo_instead_of_a_pack_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pack.json"
    os.mkfifo(fifo)
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(_error(fifo)), daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert not reader.is_alive(), "reading a FIFO blocked"
    assert "not a regular file" in result[0]


def _error(path) -> str:
    try:
        load_task_pack(path)
    except packs.TaskPackError as exc:
        return str(exc)
    return "loaded"


@pytest.mark.parametrize("expression", ["-" * 3000 + "x", " + ".join(["x"] * 900), "[" * 150 + "x" + "]" * 150])
def test_deeply_nested_source_is_one_line(tmp_path, expression):
    task = dict(TASK, source=f"def limit_cap(x):\n    return max({expression}, 10)\n")
    assert len(task["source"]) <= packs.MAX_SOURCE_CHARS
    pack = tmp_path / "deep.json"
    pack.write_text(json.dumps([task]))
    message = _error(pack)
    assert "nested" in message and "\n" not in message


def test_edit_ops_on_deeply_nested_source_change_nothing():
    source = "def f(x):\n    return " + "-" * 100_000 + "x\n"
    assert apply_op(source, "swap_minmax") == source


def test_too_many_cases_say_so(tmp_path):
    task = dict(TASK, hidden=[[[i], min(i, 10)] for i in range(16_384)])
    pack = tmp_path / "big.json"
    pack.write_text(json.dumps([task]))
    message = _error(pack)
    assert f"keep it to at most {packs.MAX_CASES}" in message and "too large to send back" not in message


def test_pack_validation_has_an_overall_time_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(packs, "VALIDATION_BUDGET_S", 0.0)
    tasks = [dict(TASK, name=f"limit_cap_{i}", source=TASK["source"].replace("limit_cap", f"limit_cap_{i}"))
             for i in range(3)]
    pack = tmp_path / "slow.json"
    pack.write_text(json.dumps(tasks))
    assert "took over 0 s (at task 1 of 3)" in _error(pack)
