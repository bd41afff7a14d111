"""What a newcomer types first: --version, play --list, "did you mean", and printed commands that run as printed."""

from __future__ import annotations

import io
import os
import sys

import pytest

import bugfix_gym
from agents.cli import flags, main
from bugfix_gym.views.play import did_you_mean, main as play_main


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"bugfix-gym {bugfix_gym.__version__}"


def test_play_list_prints_the_task_names_of_the_split():
    out = io.StringIO()
    assert play_main(["--list", "--split", "heldout"], stdin=io.StringIO(""), stdout=out) == 0
    names = [t.name for t in bugfix_gym.make_tasks("heldout")]
    assert out.getvalue().strip() == f"{len(names)} tasks (heldout): " + " ".join(names)


def test_an_unknown_task_points_to_list(capsys):
    with pytest.raises(SystemExit):
        play_main(["--task", "nope"], stdin=io.StringIO(""), stdout=io.StringIO())
    assert "--list --split all lists them" in capsys.readouterr().err


@pytest.mark.parametrize("typed, hint", [("reed", "did you mean: read"), ("sumbit", "did you mean: submit"),
                                         ("edit swap", "did you mean: edit swap_minmax ?"),
                                         ("make it work", "not a call; help lists them")])
def test_a_mistyped_call_gets_the_closest_calls(typed, hint):
    assert did_you_mean(typed).startswith(hint)


def test_play_shows_the_hint_after_the_invalid_call_it_played():
    out = io.StringIO()
    play_main(["--task", "clamp"], stdin=io.StringIO("sumbit\nquit\n"), stdout=out)
    lines = out.getvalue().splitlines()
    turn = next(i for i, line in enumerate(lines) if "'sumbit' is not a call" in line)
    assert lines[turn + 1] == "did you mean: submit ?"


def test_printed_commands_name_a_program_that_runs_from_here(tmp_path, monkeypatch):
    script = tmp_path / ".venv" / "bin" / "bugfix-gym"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(script), "train"])
    monkeypatch.setattr(flags.shutil, "which", lambda name: None)  # not on PATH (venv not activated)
    assert flags.program() == os.path.join(".venv", "bin", "bugfix-gym")
    monkeypatch.setattr(flags.shutil, "which", lambda name: str(script))  # activated
    assert flags.program() == "bugfix-gym"
    monkeypatch.setattr(sys, "argv", ["-m"])  # python -m agents.cli
    assert flags.program().endswith(" -m agents.cli")


def test_the_readme_use_it_block_fixes_the_task_it_draws():
    import pathlib
    import re

    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = re.search(r"```python\n(.*?)```", readme, flags=re.S).group(1)
    env_part = block.split("from agents import")[0]  # the env steps, not the training
    scope: dict = {}
    exec(compile(env_part, "README.md", "exec"), scope)
    assert scope["reward"] == 1.0 and scope["terminated"] and scope["info"]["hidden_pass"]


def test_eval_pack_breaks_the_pass_rate_down_per_task(tmp_path, shared_base_agent, capsys):
    import json

    import gymnasium as gym

    from agents.algorithms.ppo import TokenPPO

    path = tmp_path / "m.zip"
    TokenPPO("TinyAgentPolicy", gym.make("BugFix-v0"), base_agent=shared_base_agent, seed=0).save(path)
    pack = "examples/task_pack_example.json"
    assert main(["eval", str(path), "--pack", pack, "--episodes", "2", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    names = [t.name for t in bugfix_gym.load_task_pack(pack)]
    assert list(stats["per_task"]) == names and all(row["episodes"] == 2 for row in stats["per_task"].values())
    mean = sum(row["pass_rate"] for row in stats["per_task"].values()) / len(names)
    assert abs(mean - stats["pass_rate"]) < 1e-9  # equal episodes per task: the mean of the tasks' rates
    assert main(["eval", str(path), "--pack", pack, "--episodes", "2"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in names) and "pass rate" in out.split("task")[-1]


def test_the_scripted_evaluator_takes_a_list_of_tasks():
    oracle = bugfix_gym.scripted_policy("oracle")
    tasks = bugfix_gym.make_tasks("heldout")[:2]
    assert bugfix_gym.evaluate(oracle, tasks, n_per_task=2)["pass_rate"] == 1.0
    assert bugfix_gym.evaluate(oracle, [t.name for t in tasks], n_per_task=2)["pass_rate"] == 1.0
    with pytest.raises(ValueError, match="split must be one of train, heldout, all or a list of tasks"):
        bugfix_gym.evaluate(oracle, "test")


def test_the_curve_before_a_resume_is_kept_and_extended(tmp_path):
    from agents.cli.report import load_earlier_curve, save_earlier_curve

    rows = [{"iteration": i, "rollout": {"pass_rate": i / 10}, "epochs": [{}]} for i in (1, 2, 3)]
    save_earlier_curve(tmp_path, rows, upto=2)  # iteration 3 was cut by Ctrl-C: not in the snapshot
    assert [r["iteration"] for r in load_earlier_curve(tmp_path)] == [1, 2]
    save_earlier_curve(tmp_path, [{"iteration": 3, "rollout": {"pass_rate": 0.3}}], upto=3)  # a second stop
    assert [r["iteration"] for r in load_earlier_curve(tmp_path)] == [1, 2, 3]
    assert load_earlier_curve(tmp_path / "nothing") == []


def test_the_learning_curve_has_labels_integer_ticks_a_base_line_and_the_kept_iteration(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from agents.cli.report import CURVE_LINES, plot_learning_curve

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    rows = [{"iteration": i, "rollout": {"pass_rate": 1.0, "valid_calls": 1.0, "read_rate": 1.0, "test_rate": 1.0}}
            for i in (1, 2, 3)]
    plot_learning_curve(rows, tmp_path / "c.png", "t", validation=[(2, 0.9)], base_pass_rate=0.2, kept=2)
    assert (tmp_path / "c.png").stat().st_size > 0
    ax = figures[0].axes[0]
    assert ax.get_ylabel() and ax.get_xlabel() == "PPO iteration" and ax.get_ylim()[1] > 1.0
    assert all(float(t).is_integer() for t in ax.get_xticks())
    styles = {(line.get_linestyle(), line.get_marker()) for line in ax.get_lines()[:len(CURVE_LINES)]}
    assert len(styles) == len(CURVE_LINES)  # four lines at 1.0, each still told apart
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "base agent pass rate (0.20)" in labels and "kept weights" in labels
