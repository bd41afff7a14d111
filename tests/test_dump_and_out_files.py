"""``bugfix-gym train --dump`` and ``--out`` write only regular files they were named (or that live in the run
folder), never through a symbolic link planted at one of those names, never into a FIFO or a device; a write
error is one line; and the run folder is locked before anything is written in it."""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

import pytest

from agents.cli import main
from agents.files import checkpoint
from agents.files.stops import RunLock

TRAIN = ["train", "--algo", "rloo", "--iterations", "1", "--n-episodes", "8", "--group-size", "4",
         "--eval-episodes", "1", "--no-progress"]


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def victim(tmp_path):
    """A file a planted link points to: it must come out of every test unchanged."""
    path = tmp_path / "victim.txt"
    path.write_text("keep me")
    yield path
    assert path.read_text() == "keep me"


def test_a_link_at_the_dump_is_refused(tmp_path, victim, capsys):
    dump = tmp_path / "dump.jsonl"
    dump.symlink_to(victim)
    assert main(TRAIN + ["--out", str(tmp_path / "run"), "--dump", str(dump)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "--dump" in line and "symbolic link" in line


def test_a_link_at_the_tokenizer_file_beside_the_dump_is_refused(tmp_path, victim, capsys):
    dump = tmp_path / "dump.jsonl"
    (tmp_path / "dump.tokenizer.json").symlink_to(victim)  # a file the user never named
    assert main(TRAIN + ["--out", str(tmp_path / "run"), "--dump", str(dump)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "dump.tokenizer.json" in line and "link" in line


@pytest.mark.parametrize("target", ["/dev/full", "/dev/null", "fifo"])
def test_a_device_or_a_fifo_as_the_dump_is_refused_up_front(tmp_path, capsys, target):
    """/dev/full passed the up-front check (a write of nothing) and died at the first update; a FIFO blocked."""
    if target == "fifo":
        target = str(tmp_path / "fifo")
        os.mkfifo(target)
    started = time.monotonic()
    assert main(TRAIN + ["--out", str(tmp_path / "run"), "--dump", target]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "--dump" in line and ("not a regular file" in line or "FIFO" in line)
    assert time.monotonic() - started < 30 and not (tmp_path / "run").exists()


@pytest.mark.heavy
def test_a_write_error_at_the_first_update_is_one_line(tmp_path, capsys, monkeypatch):
    real = checkpoint.write_regular

    def full_disk(path, data):
        if data and str(path).endswith(".jsonl"):  # the up-front check writes nothing: the dump itself fails
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, data)

    monkeypatch.setattr(checkpoint, "write_regular", full_disk)
    assert main(TRAIN + ["--out", str(tmp_path / "run"), "--dump", str(tmp_path / "dump.jsonl")]) == 2
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]
    assert "Traceback" not in err and line.startswith("bugfix-gym train: error: cannot write the first update's dump")
    assert "No space left on device" in line and "before its first update" in line


def test_the_run_folder_is_locked_before_anything_is_written(tmp_path, capsys):
    """A second ``train --out DIR`` started while the first sets up overwrote its run.json before refusing."""
    run = tmp_path / "run"
    run.mkdir()
    lock = RunLock(run)  # the first run, still setting up: no run.json yet
    try:
        assert main(TRAIN + ["--out", str(run)]) == 2
    finally:
        lock.release()
    assert "another bugfix-gym train is using" in _one_line(capsys.readouterr().err)
    assert sorted(p.name for p in run.iterdir()) == [".lock"]  # nothing of the second run was written


def test_a_link_planted_in_the_run_folder_is_not_written_through(tmp_path, victim, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").symlink_to(tmp_path / "elsewhere.json")  # dangling: exists() says no run is there
    assert main(TRAIN + ["--out", str(run)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "run.json" in line and "symbolic link" in line and not (tmp_path / "elsewhere.json").exists()


def test_write_regular_never_follows_a_link_or_fills_a_device(tmp_path, victim):
    link = tmp_path / "link"
    link.symlink_to(victim)
    with pytest.raises(OSError) as caught:
        checkpoint.write_regular(link, b"x")
    assert caught.value.errno == errno.ELOOP
    with pytest.raises(OSError, match="not a regular file"):
        checkpoint.write_regular(Path("/dev/null"), b"x")
    checkpoint.write_regular(tmp_path / "plain.json", json.dumps({"a": 1}).encode())
    assert json.loads((tmp_path / "plain.json").read_text()) == {"a": 1}
