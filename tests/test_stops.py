"""A run survives every way it can be stopped: SIGTERM, a second Ctrl-C while saving, a failed final save,
and a second command on the same folder."""

from __future__ import annotations

import errno
import json
import os
import signal

import pytest

import agents.cli.report
import agents.files.runs
from agents.algorithms.ppo import TokenPPO
from agents.cli import main
from agents.files.stops import RunLock, signals_deferred


@pytest.fixture
def small_eval(monkeypatch):
    monkeypatch.setattr(agents.cli.report, "GENERATED_EVAL", dict(n=4, gen_seed=0))


def _train_args(out):
    return ["train", "--timesteps", "96", "--n-envs", "4", "--n-episodes", "8", "--n-minibatches", "2",
            "--eval-episodes", "1", "--out", str(out), "--no-progress", "--seed", "5"]


def _stop_on_third_update(monkeypatch, stop):
    original = TokenPPO.train
    calls = {"n": 0}

    def train(self):
        calls["n"] += 1
        if calls["n"] == 3:
            stop()
        return original(self)

    monkeypatch.setattr(TokenPPO, "train", train)
    return original


def test_sigterm_saves_like_ctrl_c(tmp_path, small_eval, monkeypatch, capsys):
    _stop_on_third_update(monkeypatch, lambda: os.kill(os.getpid(), signal.SIGTERM))
    assert main(_train_args(tmp_path / "run")) == 128 + signal.SIGTERM
    err = capsys.readouterr().err
    assert "interrupted (SIGTERM)" in err and "saved iteration 2" in err and err.count("\n") == 2
    assert TokenPPO.load(tmp_path / "run" / "tokenppo.zip")._iteration == 2
    assert json.loads((tmp_path / "run" / "resume.json").read_text())["envs"] is not None
    assert signal.getsignal(signal.SIGTERM) is not None


@pytest.mark.heavy
def test_a_second_ctrl_c_while_the_snapshot_is_written_and_a_failed_final_save_lose_nothing(
        tmp_path, small_eval, monkeypatch, capsys):
    def interrupt():
        raise KeyboardInterrupt

    original = _stop_on_third_update(monkeypatch, interrupt)
    real_write = agents.files.runs.atomic_write

    def impatient_write(path, write):  # the user presses Ctrl-C again while the files are written
        os.kill(os.getpid(), signal.SIGINT)
        real_write(path, write)

    monkeypatch.setattr(agents.files.runs, "atomic_write", impatient_write)
    run = tmp_path / "run"
    try:
        assert main(_train_args(run)) == 130
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    assert TokenPPO.load(run / "tokenppo.zip")._iteration == 2 and (run / "resume.json").exists()
    capsys.readouterr()

    monkeypatch.setattr(TokenPPO, "train", original)
    monkeypatch.setattr(agents.files.runs, "atomic_write", real_write)
    snapshot = (run / "tokenppo.zip").read_bytes()

    def full_disk(self, path, *args, **kwargs):
        path.write(b"half a model")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(TokenPPO, "save", full_disk)
    assert main(["train", "--resume", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("bugfix-gym train: error: cannot write the trained model") and "No space" in err[-1]
    assert "Traceback" not in "\n".join(err)
    assert (run / "tokenppo.zip").read_bytes() == snapshot and (run / "resume.json").exists()
    assert [p.name for p in run.iterdir() if p.name.endswith(".tmp")] == []


def test_a_second_train_on_a_locked_folder_is_one_line(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    lock = RunLock(tmp_path / "run")
    try:
        assert main(["train", "--resume", str(tmp_path / "run"), "--no-progress"]) == 2
    finally:
        lock.release()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "another bugfix-gym train is using" in err
    assert main(["train", "--resume", str(tmp_path / "run"), "--no-progress"]) == 2  # released: now the real check
    assert "is not a run that can be resumed" in capsys.readouterr().err


def test_signals_are_delivered_after_a_deferred_block():
    got = []
    old = signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    try:
        with signals_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            assert got == []  # held back while the files are written
        assert got == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, old)
