"""Run task-pack code in a child process with a wall-clock timeout and a memory limit.

User task packs (:mod:`bugfix_gym.packs`) carry code nobody has reviewed, so
:func:`bugfix_gym.execution.run_tests` runs their tests here instead of in-process: a
fresh ``python -I -S`` child (no site packages, no user environment variables) applies
``resource`` limits (address space, CPU seconds, file size, no new processes where the OS
honours it), runs :func:`bugfix_gym.execution.run_cases` and sends the report back as one
line of JSON. The parent kills the child's whole process group after ``timeout_s``
seconds. A timeout, a crash or unreadable output becomes a failed :class:`TestReport`,
never an exception or a hang.

These are resource limits, not a security boundary: the child can still read files and
use the network. Run packs you do not trust inside a container.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from .execution import TestReport

TIMEOUT_S = 5.0  # wall-clock seconds for one run of a test list (all its cases)
MEMORY_MB = 512  # address-space limit of the child
_HERE = os.path.dirname(os.path.abspath(__file__))


def run_cases_sandboxed(source: str, name: str, cases: Sequence[tuple[tuple, Any]], *,
                        timeout_s: float | None = None, memory_mb: int | None = None) -> "TestReport":
    """Run ``name(*args)`` from ``source`` on every case in a limited child process; never raises.

    :param source: the function's source code
    :param name: the function to call
    :param cases: ``(args, expected)`` pairs
    :param timeout_s: wall-clock limit for the whole run (default :data:`TIMEOUT_S`)
    :param memory_mb: address-space limit (default :data:`MEMORY_MB`)
    """
    from .execution import TestReport

    timeout_s = TIMEOUT_S if timeout_s is None else float(timeout_s)
    memory_mb = MEMORY_MB if memory_mb is None else int(memory_mb)
    total = len(cases)
    try:
        payload = pickle.dumps((source, name, [(tuple(a), e) for a, e in cases]))
    except Exception as exc:  # noqa: BLE001 - cases that cannot be sent
        return TestReport(0, total, f"sandbox : cannot send the test cases ({type(exc).__name__})")
    cmd = [sys.executable, "-I", "-S", os.path.join(_HERE, "sandbox.py"), str(timeout_s), str(memory_mb)]
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                start_new_session=True)
    except OSError as exc:
        return TestReport(0, total, f"sandbox : cannot start the child process ({type(exc).__name__})")
    try:
        out, _ = proc.communicate(payload, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return TestReport(0, total, f"sandbox : Timeout after {timeout_s:g} s")
    except Exception as exc:  # noqa: BLE001 - e.g. a broken pipe when the child dies early
        _kill_group(proc)
        return TestReport(0, total, f"sandbox : the child process failed ({type(exc).__name__})")
    finally:
        _kill_group(proc)  # grandchildren the task code may have left behind
    try:
        data = json.loads(out.decode().strip().splitlines()[-1])
        return TestReport(int(data["passed"]), int(data["total"]), data["first_failure"])
    except Exception:  # noqa: BLE001 - killed for memory, segfault, os._exit, garbage on stdout
        return TestReport(0, total, f"sandbox : the code crashed (exit code {proc.returncode})")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _limit(resource_module, which: str, value: int) -> None:
    kind = getattr(resource_module, which, None)
    if kind is None:
        return
    try:
        resource_module.setrlimit(kind, (value, value))
    except (ValueError, OSError):
        pass  # a limit the OS refuses (or one already lower); the wall clock still holds


def _child_main(argv: Sequence[str]) -> None:
    """The child: apply limits, run the cases, print the report as one line of JSON."""
    import resource

    timeout_s, memory_mb = float(argv[0]), int(argv[1])
    payload = sys.stdin.buffer.read()
    _limit(resource, "RLIMIT_AS", memory_mb * 1024 * 1024)
    _limit(resource, "RLIMIT_CPU", int(timeout_s) + 1)
    _limit(resource, "RLIMIT_FSIZE", 1024 * 1024)
    _limit(resource, "RLIMIT_NPROC", 0)
    result = os.fdopen(os.dup(1), "w")  # keep the real stdout for the report ...
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # ... and give task code nothing to read and nowhere visible to print
        os.dup2(devnull, fd)
    import importlib.util

    # bugfix_gym/execution.py (stdlib only) by path: neither the package nor its folder on sys.path,
    # so the child imports nothing of ours but this one file and task code cannot shadow stdlib modules
    spec = importlib.util.spec_from_file_location("_bugfix_execution", os.path.join(_HERE, "execution.py"))
    execution = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = execution  # dataclasses looks its module up while building TestReport
    spec.loader.exec_module(execution)

    source, name, cases = pickle.loads(payload)
    report = execution.run_cases(source, name, cases)
    result.write("\n" + json.dumps({"passed": report.passed, "total": report.total,
                                    "first_failure": report.first_failure}) + "\n")
    result.flush()
    os._exit(0)  # skip interpreter teardown: task code may have left threads or atexit hooks


if __name__ == "__main__":
    _child_main(sys.argv[1:])
