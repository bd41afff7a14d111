"""Pack code is contained: it cannot signal the env, outlive its run, flood it, read its environment or forge results.

Each test runs in every isolation mode ``docs/environment.md`` says contains what it checks:
``namespace`` (skipped where ``unshare`` or user namespaces do not work), ``uid`` (skipped unless
running as root) and ``plain`` where plain promises it too. On a machine with neither, the
``plain`` checks (environment variables, bounded reads, forged results, exception names,
``__eq__`` tricks) still run; only the checks that need containment are skipped, one by one.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import tracemalloc

import pytest

from bugfix_gym import load_task_pack
from bugfix_gym.execution import sandbox
from bugfix_gym.execution.sandbox import REPORT_BYTES, available_isolation, run_cases_sandboxed

ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
CONTAINED = [
    pytest.param("namespace", marks=pytest.mark.skipif(available_isolation() != "namespace",
                                                       reason="needs user namespaces (unshare)")),
    pytest.param("uid", marks=pytest.mark.skipif(not ROOT, reason="uid mode needs root")),
]


@pytest.fixture(autouse=True)
def root_may_run_plain(monkeypatch):
    """These tests run ``plain`` mode as root too (to check what it still promises); the refusal has its own test."""
    monkeypatch.setattr(sandbox, "ALLOW_ROOT_PLAIN", True)


@pytest.fixture
def sigusr1():
    """The signals SIGUSR1 this process receives while the test runs (a stand-in for SIGKILL)."""
    received: list[int] = []
    old = signal.signal(signal.SIGUSR1, lambda signum, frame: received.append(signum))
    yield received
    signal.signal(signal.SIGUSR1, old)


def _signaller(name: str, returns: str) -> str:
    return (f"def {name}(n):\n    import os, signal\n    for pid in (os.getppid(), {os.getpid()}):\n        try:\n"
            f"            os.kill(pid, signal.SIGUSR1)\n        except OSError:\n            pass\n"
            f"    return {returns}\n")


@pytest.mark.parametrize("mode", CONTAINED)
def test_pack_code_cannot_signal_the_env_process(sigusr1, mode):
    report = run_cases_sandboxed(_signaller("f", "n"), "f", [((1,), 1)], isolation=mode)
    time.sleep(0.05)
    assert report.ok  # the code ran to its end ...
    assert sigusr1 == []  # ... and neither its parent nor this process got the signal


@pytest.mark.skipif(available_isolation() == "plain", reason="plain mode cannot stop signals (same user)")
def test_pack_code_cannot_signal_the_env_process_during_validation(tmp_path, sigusr1):
    pack = tmp_path / "signals.json"
    task = {"name": "signal_half", "statement": "return half of n rounded down, but never less than 0",
            "source": _signaller("signal_half", "min(n // 2, 0)"), "fix_op": "swap_minmax",
            "visible": [[[4], 2]], "hidden": [[[4], 2], [[-4], 0]]}
    pack.write_text(json.dumps([task]))
    (loaded,) = load_task_pack(pack)  # validation ran the buggy and the fixed source
    time.sleep(0.05)
    assert loaded.name == "signal_half" and sigusr1 == []


def _processes_with(argv: bytes) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if cmdline.read() == argv:
                    found.append(int(pid))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("mode", CONTAINED)
def test_pack_code_leaves_no_process_behind(mode):
    # the sandbox has no writable place outside, so the left-behind process is found by its command line
    token = f"61.{os.getpid()}{time.monotonic_ns() % 10**6}"
    argv = b"sleep\0" + token.encode() + b"\0"
    src = (f"def f(x):\n    import os, time\n    if os.fork() == 0:\n        os.setsid()\n        if os.fork() == 0:\n"
           f"            os.closerange(3, 1024)\n"  # let go of the report pipe: nobody waits for this process
           f"            os.execv('/bin/sleep', ['sleep', {token!r}])\n        os._exit(0)\n"
           f"    for _ in range(200):  # until the grandchild is running\n"
           f"        for pid in filter(str.isdigit, os.listdir('/proc')):\n            try:\n"
           f"                if open(f'/proc/{{pid}}/cmdline', 'rb').read() == {argv!r}:\n"
           f"                    return x\n            except OSError:\n                pass\n"
           f"        time.sleep(0.01)\n    return -1\n")
    report = run_cases_sandboxed(src, "f", [((1,), 1)], isolation=mode)
    # the grandchild ran, or fork was refused (RLIMIT_NPROC = 0 holds for every uid but root outside)
    assert report.ok or "raised BlockingIOError" in str(report.first_failure), report.first_failure
    time.sleep(0.2)
    left = _processes_with(argv)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == []


@pytest.mark.parametrize("mode", [*CONTAINED, "plain"])
def test_the_env_process_reads_a_bounded_number_of_bytes(mode):
    flood = ("def f(x):\n    import os\n    block = b'x' * (1 << 20)\n    for fd in range(3, 32):\n        try:\n"
             "            for _ in range(64):\n                os.write(fd, block)\n        except OSError:\n"
             "            pass\n    return x\n")
    tracemalloc.start()
    try:
        report = run_cases_sandboxed(flood, "f", [((1,), 1)], isolation=mode)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * REPORT_BYTES
    assert not report.ok and report.first_failure == f"sandbox : the child wrote more than {REPORT_BYTES} bytes"


@pytest.mark.parametrize("mode", [*CONTAINED, "plain"])
def test_pack_code_sees_no_environment_variable_of_the_env_process(monkeypatch, mode):
    monkeypatch.setenv("BUGFIX_GYM_SECRET", "hunter2")
    src = "def f(x):\n    import os\n    return 'hunter2' in repr(os.environ) or 'PATH' in os.environ\n"
    assert run_cases_sandboxed(src, "f", [((0,), False)], isolation=mode).ok
    if mode != "plain":  # nor through /proc (in plain mode the code runs as this process's user)
        src = (f"def f(x):\n    try:\n        with open('/proc/{os.getpid()}/environ', 'rb') as env:\n"
               f"            return b'PATH=' in env.read()\n    except OSError:\n        return False\n")
        assert run_cases_sandboxed(src, "f", [((0,), False)], isolation=mode).ok


@pytest.mark.parametrize("mode", [*CONTAINED, "plain"])
def test_exception_and_type_names_that_come_back_are_short_identifiers(mode):
    cases = [((1,), 1)]
    long = run_cases_sandboxed("def f(x):\n    raise type('S' * 5000, (Exception,), {})\n", "f", cases, isolation=mode)
    assert long.first_failure == "f(1) expected 1 raised an exception with an unprintable name"
    escape = run_cases_sandboxed("def f(x):\n    raise type('\\x1b[2J', (Exception,), {})\n", "f", cases,
                                 isolation=mode)
    assert escape.first_failure == "f(1) expected 1 raised an exception with an unprintable name"
    odd = run_cases_sandboxed("def f(x):\n    return type('Odd', (), {})()\n", "f", cases, isolation=mode)
    assert odd.first_failure == "f(1) expected 1 got a value of type Odd, not a JSON value"


FORGERIES = {
    "an old-style 0 / 0 report": 'b\'\\n{"passed": 0, "total": 0, "first_failure": null}\\n\'',
    "a report with no outcomes": 'b\'{"load_error": null, "outcomes": []}\'',
    "a report with one outcome too many": 'b\'{"load_error": null, "outcomes": [["value", 2], ["value", 3], '
                                          '["value", 4]]}\'',
}


@pytest.mark.parametrize("mode", [*CONTAINED, "plain"])
@pytest.mark.parametrize("forgery", FORGERIES)
def test_pack_code_cannot_forge_its_results(mode, forgery):
    src = (f"def f(x):\n    import os\n    for fd in range(3, 32):\n        try:\n"
           f"            os.write(fd, {FORGERIES[forgery]})\n        except OSError:\n            pass\n"
           f"    os._exit(0)\n")
    report = run_cases_sandboxed(src, "f", [((1,), 2), ((2,), 3)], isolation=mode)
    assert not report.ok and report.passed == 0 and report.total == 2


@pytest.mark.parametrize("mode", [*CONTAINED, "plain"])
def test_an_object_equal_to_everything_does_not_pass(mode):
    src = "class Yes:\n    def __eq__(self, other):\n        return True\n\ndef f(x):\n    return Yes()\n"
    report = run_cases_sandboxed(src, "f", [((1,), 2)], isolation=mode)
    assert (report.passed, report.first_failure) == (0, "f(1) expected 2 got a value of type Yes, not a JSON value")


@pytest.mark.skipif(available_isolation() != "namespace", reason="needs user namespaces (unshare)")
def test_pack_code_has_no_network_in_namespace_mode():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        src = (f"def f(x):\n    import socket\n    try:\n"
               f"        socket.create_connection(('127.0.0.1', {server.getsockname()[1]}), timeout=2).close()\n"
               f"        return 'connected'\n    except OSError:\n        return 'unreachable'\n")
        report = run_cases_sandboxed(src, "f", [((0,), "unreachable")], isolation="namespace")
    assert report.ok, report.first_failure


@pytest.mark.parametrize("mode", CONTAINED)
def test_pack_code_cannot_open_the_memory_of_the_env_process_or_of_its_own_parent(mode):
    # /proc is the host's, so the worker can learn its parent's real pid there; opening /proc/<pid>/mem
    # needs the right to trace that process, which the worker must not have (no capabilities, other uid)
    src = (f"def f(x):\n    with open('/proc/self/status') as status:\n"
           f"        parent = next(int(line.split()[1]) for line in status if line.startswith('PPid:'))\n"
           f"    opened = []\n    for pid in ({os.getpid()}, parent):\n        try:\n"
           f"            open(f'/proc/{{pid}}/mem', 'rb').close()\n            opened.append(True)\n"
           f"        except OSError:\n            opened.append(False)\n    return opened\n")
    report = run_cases_sandboxed(src, "f", [((0,), [False, False])], isolation=mode)
    assert report.ok, report.first_failure


def test_isolation_falls_back_cleanly_when_namespaces_do_not_work(monkeypatch):
    monkeypatch.setattr(sandbox, "_UNSHARE_FLAGS", ("--no-such-flag",))  # unshare exits with an error
    sandbox.available_isolation.cache_clear()
    try:
        fallback = sandbox.available_isolation()
        assert fallback == ("uid" if os.geteuid() == 0 else "plain")
        assert run_cases_sandboxed("def f(x):\n    return x\n", "f", [((1,), 1)]).ok  # runs in the fallback mode
        failed = run_cases_sandboxed("def f(x):\n    return x\n", "f", [((1,), 1)], isolation="namespace")
        assert not failed.ok and failed.first_failure.startswith("sandbox : ")
    finally:
        sandbox.available_isolation.cache_clear()


HOSTILE_FILES = ("def f(x):\n    import os\n    done = []\n"
                 "    for path, how in ((x + '/planted', 'w'), ('/etc/shadow', 'r'), (x + '/planted_tmp', 'w')):\n"
                 "        try:\n            open(path, how).close()\n            done.append(path)\n"
                 "        except OSError:\n            pass\n    return done\n")


@pytest.mark.skipif(available_isolation() != "namespace", reason="needs user namespaces (unshare)")
def test_namespace_mode_gives_pack_code_no_root_access_to_files(tmp_path):
    # as root: a 0700 root folder must stay unwritten and /etc/shadow unread; for anyone: nothing outside
    # the private scratch space is writable
    private = tmp_path / "root_only"
    private.mkdir(mode=0o700)
    report = run_cases_sandboxed(HOSTILE_FILES, "f", [((str(private),), [])], isolation="namespace")
    assert report.ok, report.first_failure
    assert list(private.iterdir()) == []


@pytest.mark.skipif(available_isolation() != "namespace", reason="needs user namespaces (unshare)")
def test_namespace_mode_scratch_space_is_private_and_thrown_away():
    plant = ("def f(x):\n    import os\n    seen = sorted(os.listdir('/tmp'))\n"
             "    open('/tmp/left', 'w').write('x')\n    return [os.getcwd(), seen]\n")
    for _ in range(2):  # the second run sees nothing of the first
        report = run_cases_sandboxed(plant, "f", [((0,), ["/tmp", []])], isolation="namespace")
        assert report.ok, report.first_failure


@pytest.mark.skipif(not ROOT, reason="the refusal is for root")
def test_plain_mode_as_root_is_refused_unless_allowed(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox, "ALLOW_ROOT_PLAIN", False)
    report = run_cases_sandboxed(HOSTILE_FILES, "f", [((str(tmp_path),), [])], isolation="plain")
    assert not report.ok and "refusing to run pack code as root" in report.first_failure
    assert list(tmp_path.iterdir()) == []


def test_a_failed_probe_is_retried_and_the_fall_back_warns(monkeypatch):
    calls = []
    real = sandbox.run_cases_sandboxed

    def flaky(*args, **kwargs):
        calls.append(kwargs.get("isolation"))
        if len(calls) == 1:
            return sandbox.TestReport(0, 1, "sandbox : Timeout after 5 s")  # a loaded machine, once
        return real(*args, **kwargs)

    monkeypatch.setattr(sandbox, "run_cases_sandboxed", flaky)
    sandbox.available_isolation.cache_clear()
    try:
        if available_isolation() != "namespace":  # this machine cannot do it: the fall back must warn
            sandbox.available_isolation.cache_clear()
            with pytest.warns(RuntimeWarning, match="weaker"):
                sandbox.available_isolation()
        else:
            assert len(calls) == 2  # the first failure did not downgrade for good
    finally:
        sandbox.available_isolation.cache_clear()
