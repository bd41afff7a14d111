"""bugfix-gym CLI: help, one-line errors with exit status 2, eval of a saved model."""

from __future__ import annotations

import gymnasium as gym
import pytest

import bugfix_gym  # noqa: F401
from agents.cli import main
from agents.ppo import TokenPPO


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["eval", "--help"]])
def test_help(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0 and "usage" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["frobnicate"], ["train", "--timesteps", "many"], ["train", "--n-episodes", "0"],
                                  ["eval"], ["eval", "m.zip", "--split", "test"], ["eval", "/no/such/model.zip"]])
def test_bad_arguments_are_one_line_exit_2(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error" in err and "Traceback" not in err


def test_corrupt_model_file(tmp_path, capsys):
    bad = tmp_path / "bad.zip"
    bad.write_bytes(b"\x00" * 100)
    assert main(["eval", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a TokenPPO checkpoint" in err


def test_eval_a_saved_model(tmp_path, capsys):
    from agents.policies import cached_base_agent
    from bugfix_gym import build_tokenizer

    model = TokenPPO("TinyAgentPolicy", gym.make("BugFix-v0"), base_agent=cached_base_agent(build_tokenizer()),
                     n_episodes=4, seed=0)
    model.save(tmp_path / "m.zip")
    assert main(["eval", str(tmp_path / "m.zip"), "--split", "heldout", "--episodes", "1"]) == 0
    out = capsys.readouterr().out
    assert "pass rate" in out and "m.zip on heldout" in out
