"""``bugfix-gym play --env BugFix-v1``: a typed episode that repairs a task, the free commands that cost no turn,
invalid lines as lost turns, and one-line argument errors."""

from __future__ import annotations

import io

import pytest

from bugfix_gym.views.play import main

TASK = "has_close_elements~0"  # HumanEval/0 of the test split, its bug an operand swap on line 4


def _play(argv: list[str], lines: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(["--env", "BugFix-v1", *argv], stdin=io.StringIO(lines), stdout=out)
    return code, out.getvalue()


def test_a_typed_v1_episode_repairs_the_task_and_shows_the_bug():
    code, text = _play(["--split", "test", "--task", TASK],
                       "help\nlocate\nlegal 4\nedti 4.1 swap\nedit 4.1 swap\ntest\nsubmit\n")
    assert code == 0
    assert "calls : read | test | locate | edit L.K MUTATION [ARG]" in text
    assert "[turn 1/12] suspicious lines" in text  # help and legal cost no turn
    assert "edit 4.1 swap | edit 4.2 name n0" in text
    assert "[turn 2/12] invalid call" in text and "did you mean: edit" in text
    assert "[turn 4/12] visible tests : 2 / 2 passed" in text
    assert "reward 1.0 . stop : submit . fixed . the bug was operand_swap (repair : edit 4.1 swap)" in text


def test_a_v1_episode_out_of_turns_and_a_clean_quit():
    code, text = _play(["--split", "test", "--task", TASK, "--seed", "1"], "patch 4 for (\n" * 12)
    assert code == 0 and text.count("invalid call") >= 12 and "reward 0.0 . stop : budget . not fixed" in text
    code, text = _play(["--split", "heldout", "--seed", "2"], "read\nquit\nsubmit\n")
    assert code == 0 and "[turn 1/12]" in text and "hidden tests" not in text


def test_list_names_tasks_that_play_by_name():
    out = io.StringIO()
    assert main(["--env", "BugFix-v1", "--split", "test", "--list"], stdin=io.StringIO(""), stdout=out) == 0
    first = out.getvalue().split(": ", 1)[1].split()[0]
    code, text = _play(["--split", "test", "--task", first], "read\n")
    assert code == 0 and "[turn 1/12]" in text


@pytest.mark.parametrize("argv, message", [
    (["--split", "test", "--task", "nope"], "is not a task of this env"),
    (["--split", "bogus"], "invalid choice: 'bogus'"),
    (["--generated", "test"], "--generated plays BugFix-v0's generator"),
])
def test_bad_v1_arguments_are_one_line_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        _play(argv, "")
    assert stop.value.code == 2 and message in capsys.readouterr().err
