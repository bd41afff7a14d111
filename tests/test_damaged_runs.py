"""A run folder is data: damaged run.json / resume.json files, a FIFO, and hostile episodes are one line."""

from __future__ import annotations

import json
import os
import shutil
import threading

import pytest

import agents.cli.report
from agents.algorithms.ppo import TokenPPO
from agents.cli import main


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """A run stopped by Ctrl-C after two iterations (a folder --resume continues)."""
    out = tmp_path_factory.mktemp("stopped") / "run"
    mp = pytest.MonkeyPatch()
    mp.setattr(agents.cli.report, "GENERATED_EVAL", dict(n=4, gen_seed=0))
    original, calls = TokenPPO.train, {"n": 0}

    def train(self):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return original(self)

    mp.setattr(TokenPPO, "train", train)
    try:
        assert main(["train", "--timesteps", "96", "--n-envs", "4", "--n-episodes", "8", "--n-minibatches", "2",
                     "--eval-episodes", "1", "--out", str(out), "--no-progress", "--seed", "5"]) == 130
    finally:
        mp.undo()
    return out


def _copy(stopped_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(stopped_run, run)
    return run


def _edit(run, name, change):
    data = json.loads((run / name).read_text())
    change(data)
    (run / name).write_text(json.dumps(data))


DAMAGE = {
    "run.json not JSON": lambda run: (run / "run.json").write_text("{"),
    "run.json a list": lambda run: (run / "run.json").write_text("[]"),
    "run.json n_envs a string": lambda run: _edit(run, "run.json", lambda d: d.update(n_envs="4")),
    "run.json n_envs huge": lambda run: _edit(run, "run.json", lambda d: d.update(n_envs=10**9)),
    "run.json n_episodes 1e30": lambda run: _edit(run, "run.json", lambda d: d["ppo"].update(n_episodes=1e30)),
    "run.json env a list": lambda run: _edit(run, "run.json", lambda d: d.update(env=[])),
    "run.json seed Infinity": lambda run: (run / "run.json").write_text(
        (run / "run.json").read_text().replace('"seed": 5', '"seed": Infinity')),
    "resume.json envs a string": lambda run: _edit(run, "resume.json", lambda d: d.update(envs="x")),
    "resume.json one env too many": lambda run: _edit(run, "resume.json", lambda d: d["envs"].append(d["envs"][0])),
    "resume.json env episode a list": lambda run: _edit(
        run, "resume.json", lambda d: d["envs"][0].update(episode=[])),
    "resume.json sampler garbage": lambda run: _edit(run, "resume.json", lambda d: d.update(sampler=[[1, 2]])),
    "resume.json generator garbage": lambda run: _edit(run, "resume.json", lambda d: d.update(sample_generator=[1])),
    "resume.json missing": lambda run: (run / "resume.json").unlink(),
    "resume.json a folder": lambda run: ((run / "resume.json").unlink(), (run / "resume.json").mkdir()),
}


@pytest.mark.parametrize("kind", DAMAGE)
def test_a_damaged_run_folder_is_one_line(stopped_run, tmp_path, capsys, kind):
    run = _copy(stopped_run, tmp_path)
    DAMAGE[kind](run)
    assert main(["train", "--resume", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and str(run) in err


def test_a_fifo_for_run_json_is_refused_without_blocking(stopped_run, tmp_path, capsys):
    run = _copy(stopped_run, tmp_path)
    (run / "run.json").unlink()
    os.mkfifo(run / "run.json")
    status: list[int] = []
    worker = threading.Thread(target=lambda: status.append(main(["train", "--resume", str(run), "--no-progress"])),
                              daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "reading a FIFO blocked"
    assert status == [2] and "not a regular file" in capsys.readouterr().err


@pytest.mark.heavy
def test_a_resumed_episode_cannot_run_its_code_outside_the_sandbox(stopped_run, tmp_path, capsys):
    run = _copy(stopped_run, tmp_path)
    marker = tmp_path / "ran"

    def hostile(state):
        episode = state["envs"][0]["episode"]
        name = episode["task"]["name"]
        episode["task"]["source"] = episode["source"] = (
            f"def {name}(*args):\n    open({str(marker)!r}, 'w').write('ran')\n    return 0\n")
        episode["task"]["sandbox"] = False

    _edit(run, "resume.json", hostile)
    main(["train", "--resume", str(run), "--no-progress"])
    capsys.readouterr()
    assert not marker.exists()
