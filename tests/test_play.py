"""Terminal play: calls from stdin, the ansi render, clean exits and one-line argument errors."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from bugfix_gym.play import main


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
])
def test_bad_arguments_give_a_one_line_error(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv, stdin=io.StringIO(""), stdout=io.StringIO())
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and "Traceback" not in "".join(err)


def test_module_entry_point_and_pack_tasks():
    out = subprocess.run([sys.executable, "-m", "bugfix_gym.play", "--pack", "examples/task_pack_example.json",
                          "--task", "count_long"], input="edit fix_comparison\nsubmit\n", capture_output=True,
                         text=True, timeout=60, cwd=__file__.rsplit("/tests/", 1)[0])
    assert out.returncode == 0 and out.stderr == ""
    assert "hidden tests passed" in out.stdout
