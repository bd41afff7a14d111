"""Terminal play: calls from stdin, the ansi render, clean exits and one-line argument errors."""

from __future__ import annotations

import io
import string
import subprocess
import sys

import pytest

from bugfix_gym.views.play import main


def _play(argv: list[str], lines: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(argv, stdin=io.StringIO(lines), stdout=out)
    return code, out.getvalue()


def test_a_full_episode_from_stdin():
    code, text = _play(["--task", "clamp"], "help\nread\nedit swap_minmax\nsubmit\n")
    assert code == 0
    assert "fix the function clamp" in text and "calls : read | test" in text
    assert "[turn 1/6] def clamp(x, lo, hi):" in text  # help cost no turn
    assert ">>> edit swap_minmax" in text and "[episode over: submit]" in text
    assert "reward 1.0 . stop : submit . fixed (the defect was swap_minmax)" in text


def test_end_of_input_and_quit_exit_cleanly_without_finishing():
    assert _play(["--split", "heldout", "--seed", "3"], "read\n")[0] == 0
    code, text = _play(["--task", "clamp"], "quit\nsubmit\n")
    assert code == 0 and "hidden tests" not in text


def test_invalid_calls_are_played_like_any_action_text():
    code, text = _play(["--task", "clamp"], "dance\n" * 6)
    turns = [line for line in text.splitlines() if "[turn " in line and "is not a call" in line]
    assert code == 0 and len(turns) == 6 and "reward 0.0 . stop : budget" in text


def test_ctrl_c_exits_with_130():
    class Interrupting(io.StringIO):
        def readline(self, *args):
            raise KeyboardInterrupt

    assert main(["--task", "clamp"], stdin=Interrupting(), stdout=io.StringIO()) == 130


@pytest.mark.parametrize("argv, message", [
    (["--task", "nope"], "no task named 'nope'"),
    (["--split", "test"], "invalid choice: 'test'"),
    (["--seed", "x"], "invalid int value: 'x'"),
    (["--pack", "missing.json"], "cannot read the file"),
    (["--episodes", "0"], "--episodes must be at least 1"),
    (["--generated", "all"], "invalid choice: 'all'"),
    (["--generated", "test", "--pack", "examples/task_pack_example.json"], "use either --pack or --generated"),
])
def test_bad_arguments_give_a_one_line_error(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv, stdin=io.StringIO(""), stdout=io.StringIO())
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and "Traceback" not in "".join(err)


def test_module_entry_point_and_pack_tasks():
    out = subprocess.run([sys.executable, "-m", "bugfix_gym.views.play", "--pack", "examples/task_pack_example.json",
                          "--task", "count_long"], input="edit fix_comparison\nsubmit\n", capture_output=True,
                         text=True, timeout=60, cwd=__file__.rsplit("/tests/", 1)[0])
    assert out.returncode == 0 and out.stderr == ""
    assert "hidden tests passed" in out.stdout


def test_escape_sequences_in_a_task_never_reach_the_terminal(hostile_task, monkeypatch):
    from bugfix_gym.tasks.library import REGISTRY

    monkeypatch.setitem(REGISTRY, hostile_task.name, hostile_task)
    code, text = _play(["--task", hostile_task.name], "read\ntest\nedit\x1b[2Jfix_init\nsubmit\n")
    assert code == 0 and "make it quiet ?[2J" in text and "reward 0.0 . stop : submit" in text
    assert not set(text) - set(string.printable) and not set(text) & set("\x1b\x07\r\x0b\x0c\x9b")


def test_generated_tasks_can_be_played():
    code, text = _play(["--generated", "test", "--seed", "1"], "read\nquit\n")
    assert code == 0 and "fix the function " in text and "[turn 1/6] def " in text
