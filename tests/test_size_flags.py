"""Size flags of train, eval and play are bounded, and refused in one line before any env or task is built."""

from __future__ import annotations

import io

import pytest

import agents.cli.evaluate
import agents.cli.train
from agents.cli import main
from agents.cli.flags import MAX_EVAL_EPISODES, MAX_EVAL_TASKS, MAX_N_ENVS
from bugfix_gym.views import play


@pytest.fixture
def nothing_built(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("an env was built")

    monkeypatch.setattr(agents.cli.train, "make_env", refuse)


@pytest.mark.parametrize("argv", [
    ["train", "--n-envs", str(MAX_N_ENVS + 1)],
    ["train", "--n-envs", "10000000000"],
    ["eval", "m.zip", "--generated", "test", "--n", str(MAX_EVAL_TASKS + 1)],
    ["eval", "m.zip", "--episodes", str(MAX_EVAL_EPISODES + 1)],
])
def test_a_huge_size_flag_is_one_line(argv, capsys, nothing_built):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "must be <=" in err


@pytest.mark.parametrize("argv", [["--seed", "-1"], ["--episodes", "1000000000"], ["--seed", str(2**40)]])
def test_play_bad_seed_or_episodes_is_one_line(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        play.main(argv, stdin=io.StringIO(""), stdout=io.StringIO())
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "must be from" in err
