"""A checkout in a folder only its owner may enter (``mktemp -d`` is 0700, so is ``/root``) keeps namespace isolation.

As root, namespace mode runs sandboxed code as ``nobody``, who cannot enter such a folder: the pack sandbox's
child and the v1 worker must therefore get their code without opening a file of the checkout (it travels on
stdin). These tests copy the working tree (its tracked and untracked, not ignored files: what a fresh clone of
this state would hold) into ``tempfile.mkdtemp()`` and run from there.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from bugfix_gym.execution.sandbox import available_isolation

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import json, sys, warnings
warnings.simplefilter("error")  # a fall back to a weaker mode warns: make it fail here
import bugfix_gym
from bugfix_gym.execution import sandbox
from bugfix_gym.execution.repair_cases import AssertCase, CallCase
from bugfix_gym.execution.repair_runner import run_repair_tests
source = "def f(x):\\n    return x + 1\\n"
print(json.dumps({"package": bugfix_gym.__file__, "isolation": sandbox.available_isolation(),
                  "pack": sandbox.run_cases_sandboxed(source, "f", [((1,), 2)]).ok,
                  "worker": run_repair_tests("f", "", (CallCase((1,), 2), AssertCase("assert candidate(2) == 3")),
                                             source).ok}))
"""


@pytest.fixture(scope="module")
def private_copy():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout to know which files are the project's")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True, timeout=60).stdout.split(b"\0")
    folder = Path(tempfile.mkdtemp(prefix="bugfix_gym_private_"))
    try:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        for name in filter(None, (item.decode() for item in listed)):
            if (ROOT / name).is_file():
                (folder / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, folder / name)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run(folder: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(folder)}
    return subprocess.run([sys.executable, *args], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_a_private_checkout_keeps_the_strongest_isolation(private_copy):
    out = _run(private_copy, "-c", PROBE, timeout=120)
    assert out.returncode == 0, out.stderr
    import json

    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["package"].startswith(str(private_copy))  # the copy ran, not this checkout
    assert found == {"package": found["package"], "isolation": available_isolation(), "pack": True, "worker": True}


@pytest.mark.slow
def test_the_pack_tests_pass_from_a_private_checkout(private_copy):
    tests = ["tests/test_packs.py::test_pack_cli_checks_files",
             "tests/test_play.py::test_module_entry_point_and_pack_tasks"]
    out = _run(private_copy, "-m", "pytest", "-n", "0", "-p", "no:cacheprovider", "-W",
               "error::RuntimeWarning", *tests, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "2 passed" in out.stdout
