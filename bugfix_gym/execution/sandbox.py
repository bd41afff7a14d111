"""Run task-pack code in a contained child process; the parent judges what comes back.

User task packs (:mod:`bugfix_gym.tasks.packs`) carry code nobody has reviewed, so
:func:`bugfix_gym.execution.runner.run_tests` runs their tests here instead of in-process.

What the parent does for one test list:

* It sends the child the source, the function name and the argument lists (JSON, through a
  temporary file on stdin), never the expected values, and starts it with an empty
  environment in a fresh session, ``/`` as the working directory. The child's own code travels
  on stdin too, ahead of the request (:func:`child_command`, :func:`module_bundle`): the child
  opens no file of the checkout, so a checkout in a folder ``nobody`` cannot enter (``mktemp -d``,
  ``/root``) keeps namespace isolation.
* It reads the child's answer from a pipe with a deadline (``TIMEOUT_S``) and a size cap
  (``REPORT_BYTES``); past either it kills the child's process group at once.
* It checks the answer (one outcome per case sent, each a plain JSON value, a bounded
  exception name or a bounded type name) and compares the values itself with
  :func:`bugfix_gym.execution.cases.same_value`. Anything else is a failed :class:`TestReport`:
  a timeout, a crash, an oversized or malformed answer never raises and never hangs.

What the child does (:mod:`bugfix_gym.execution.sandbox_child`, standard library only): it limits its
address space, CPU seconds, file size and core dumps, then isolates itself as far as the
machine allows (:func:`available_isolation`):

* ``namespace`` (Linux with ``unshare`` and user namespaces, root or not): the child is the
  init of fresh user, PID, network, IPC and mount namespaces and runs the code in a worker with
  no capabilities. As root, ``unshare`` is started as ``nobody`` (:data:`UNPRIVILEGED_UID`), so
  the namespace's root is ``nobody`` outside it. The init makes every mount read-only and gives
  the worker fresh throw-away tmpfs for ``/tmp``, ``/var/tmp`` and ``/dev/shm`` (and empty ones
  over the terminals). The env process and every other process outside are invisible to it;
  it has no network; when the init exits or is killed, the kernel kills every process left in
  the namespace.
* ``uid`` (root, where ``namespace`` does not work): the worker switches to ``nobody``; it
  cannot signal root's processes and cannot start processes (``RLIMIT_NPROC = 0``).
* ``plain`` (anything else): resource limits and ``RLIMIT_NPROC = 0`` only; the code runs as the
  caller's user and can signal the caller's processes and use the network. As root it is
  refused (:data:`ALLOW_ROOT_PLAIN` opts in).

In ``namespace`` mode the code can still read what its outer uid may read, and write only its
scratch space; in ``uid`` and ``plain`` mode it reads and writes what its uid may. Run packs you
do not trust inside a container; see the threat model in ``docs/environment.md``.
"""

from __future__ import annotations

import functools
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any, Sequence

from .cases import Outcome, TestReport, is_plain, judge, safe_name

TIMEOUT_S = 5.0  # wall-clock seconds for one run of a test list (all its cases)
MEMORY_MB = 512  # address-space limit of the worker
REPORT_BYTES = 1 << 20  # the most the parent reads from the child for one run
ISOLATION: str | None = None  # "namespace" | "uid" | "plain"; None: the strongest available_isolation()
ISOLATION_MODES = ("namespace", "uid", "plain")
SETUP_FAILED = 121  # the child's exit status when it could not apply its limits (see sandbox_child.py)

_HERE = os.path.dirname(os.path.abspath(__file__))
#: the child's whole program text (``python -I -S -c BOOT ARGS``): it reads one frame from stdin (a length line,
#: then JSON ``{"modules": [[name, source], ...], "main": name}``), runs each module's source as the top-level
#: module of that name, and calls ``main(ARGS)`` of the last; the rest of stdin is that module's to read
BOOT = ("import sys, json, types\n"
        "r = sys.stdin.buffer\n"
        "b = json.loads(r.read(int(r.readline(32))))\n"
        "for k, s in b['modules']:\n"
        "    m = types.ModuleType(k)\n"
        "    m.__file__ = '<bugfix_gym ' + k + '>'\n"
        "    sys.modules[k] = m\n"
        "    exec(compile(s, m.__file__, 'exec'), m.__dict__)\n"
        "sys.modules[b['main']].main(sys.argv[1:])\n")
_UNSHARE_FLAGS = ("--user", "--map-root-user", "--pid", "--net", "--ipc", "--mount", "--fork", "--kill-child")
UNPRIVILEGED_UID = 65534  # "nobody": as root, namespace mode starts unshare as this uid (so no root outside)
ALLOW_ROOT_PLAIN = False  # True: let plain mode run pack code as root (it then keeps root's access to everything)
_NO_NAME = "an exception with an unprintable name"


def run_cases_sandboxed(source: str, name: str, cases: Sequence[tuple[tuple, Any]], *,
                        timeout_s: float | None = None, memory_mb: int | None = None,
                        isolation: str | None = None) -> TestReport:
    """Run ``name(*args)`` from ``source`` on every case in a contained child and judge it here.

    Never raises for anything the code does (only ``ValueError`` for an unknown ``isolation``).

    :param source: the function's source code
    :param name: the function to call
    :param cases: ``(args, expected)`` pairs; the arguments must be JSON values
    :param timeout_s: wall-clock limit for the whole run (default :data:`TIMEOUT_S`)
    :param memory_mb: address-space limit of the worker (default :data:`MEMORY_MB`)
    :param isolation: ``"namespace"``, ``"uid"`` or ``"plain"`` (default :data:`ISOLATION`, else
        :func:`available_isolation`)
    """
    timeout_s = TIMEOUT_S if timeout_s is None else float(timeout_s)
    memory_mb = MEMORY_MB if memory_mb is None else int(memory_mb)
    mode = isolation or ISOLATION or available_isolation()
    if mode not in ISOLATION_MODES:
        raise ValueError(f"unknown sandbox isolation {mode!r}; use one of {', '.join(ISOLATION_MODES)}")
    total = len(cases)
    try:
        request = json.dumps({"source": source, "name": name, "args": [list(args) for args, _ in cases]})
    except (TypeError, ValueError) as exc:  # arguments that are not JSON values
        return TestReport(0, total, f"sandbox : cannot send the test cases ({type(exc).__name__})")
    if mode == "plain" and _is_root() and not ALLOW_ROOT_PLAIN:
        return TestReport(0, total, "sandbox : refusing to run pack code as root in plain isolation (it would keep "
                                    "root's access); use namespace or uid isolation, or set "
                                    "bugfix_gym.execution.sandbox.ALLOW_ROOT_PLAIN = True")
    code, data, stop = _run_child(mode, request.encode(), timeout_s, memory_mb)
    if stop == "start":
        return TestReport(0, total, f"sandbox : cannot start the child process ({data.decode()})")
    if stop == "timeout":
        return TestReport(0, total, f"sandbox : Timeout after {timeout_s:g} s")
    if stop == "overflow":
        return TestReport(0, total, f"sandbox : the child wrote more than {REPORT_BYTES} bytes")
    if code == SETUP_FAILED:
        return TestReport(0, total, f"sandbox : the child could not apply its limits ({mode} isolation)")
    answer = _parse(data, total)
    if answer is None:
        if code != 0:
            return TestReport(0, total, f"sandbox : the code crashed (exit code {code})")
        return TestReport(0, total, "sandbox : the child's report is malformed")
    return judge(name, cases, *answer)


def child_command(mode: str, args: Sequence[str]) -> list[str]:
    """The command line of a contained child in ``mode``: the bootstrap :data:`BOOT` under ``python -I -S``
    (an interpreter ``nobody`` can run in namespace mode as root), under ``unshare`` in namespace mode."""
    python = _nobody_python() if mode == "namespace" and _is_root() else sys.executable
    child = [python or sys.executable, "-I", "-S", "-c", BOOT, *args]
    if mode == "namespace":
        return [_unshare() or "unshare", *_UNSHARE_FLAGS, "--", *child]
    return child


def drop_to_nobody(mode: str) -> dict[str, Any]:
    """``subprocess.Popen`` arguments that start the child as ``nobody`` where that is how ``mode`` runs as root."""
    if mode == "namespace" and _is_root():  # the namespace's root is then nobody outside it, not root
        return dict(user=UNPRIVILEGED_UID, group=UNPRIVILEGED_UID, extra_groups=[])
    return {}


@functools.lru_cache(maxsize=None)
def _module_source(name: str) -> str:
    with open(os.path.join(_HERE, f"{name}.py"), encoding="utf-8") as source:
        return source.read()


def module_bundle(names: Sequence[str]) -> bytes:
    """The first frame of a child's stdin for :data:`BOOT`: the sources of this package's leaf modules
    ``names`` (in import order; the last one's ``main`` runs), read here, by the env process."""
    body = json.dumps({"modules": [[name, _module_source(name)] for name in names], "main": names[-1]}).encode()
    return b"%d\n" % len(body) + body


def _command(mode: str, timeout_s: float, memory_mb: int) -> list[str]:
    return child_command(mode, [mode, repr(timeout_s), str(memory_mb), str(REPORT_BYTES)])


def _run_child(mode: str, request: bytes, timeout_s: float, memory_mb: int) -> tuple[int | None, bytes, str | None]:
    """Start the child, read at most REPORT_BYTES before the deadline, leave nothing running.

    :return: ``(exit code, bytes read, why it stopped early: None | "start" | "timeout" | "overflow")``
    """
    deadline = time.monotonic() + timeout_s
    with tempfile.TemporaryFile() as stdin:
        stdin.write(module_bundle(("cases", "sandbox_child")))
        stdin.write(request)
        stdin.seek(0)
        try:
            proc = subprocess.Popen(_command(mode, timeout_s, memory_mb), stdin=stdin, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, cwd="/", env={}, start_new_session=True,
                                    **drop_to_nobody(mode))
        except OSError as exc:
            return None, type(exc).__name__.encode(), "start"
    assert proc.stdout is not None
    stop: str | None = "timeout"
    chunks: list[bytes] = []
    try:
        stop, chunks = _read_capped(proc.stdout.fileno(), deadline)
        if stop is None:  # end of file: wait (until the deadline) for the child to finish
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                stop = "timeout"
    finally:
        if proc.returncode is None:
            _kill_group(proc)
        proc.stdout.close()
    return proc.returncode, b"".join(chunks), stop


def _read_capped(fd: int, deadline: float) -> tuple[str | None, list[bytes]]:
    """Read ``fd`` to its end, or until the deadline ("timeout"), or until over REPORT_BYTES ("overflow")."""
    os.set_blocking(fd, False)
    chunks: list[bytes] = []
    size = 0
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout", chunks
            if not selector.select(left):
                continue
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                return None, chunks
            size += len(chunk)
            if size > REPORT_BYTES:
                return "overflow", chunks
            chunks.append(chunk)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's process group while its leader is unreaped (so the group id cannot be reused)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # in namespace mode this kills the namespace's init too
    except OSError:
        pass
    proc.kill()
    proc.wait()


def _parse(data: bytes, n_cases: int) -> tuple[str | None, list[Outcome]] | None:
    """The child's answer as ``(load error, outcomes)``, or None unless it has exactly the expected shape."""
    try:
        answer = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if type(answer) is not dict or set(answer) != {"load_error", "outcomes"}:
        return None
    if answer["load_error"] is not None:
        return safe_name(answer["load_error"]) or _NO_NAME, []
    items = answer["outcomes"]
    if type(items) is not list or len(items) != n_cases:
        return None
    outcomes: list[Outcome] = []
    for item in items:
        if type(item) is not list or not item:
            return None
        if item[0] == "value" and len(item) == 2 and is_plain(item[1]):
            outcomes.append(("value", item[1]))
        elif item[0] == "raised" and len(item) == 2:
            outcomes.append(("raised", safe_name(item[1]) or _NO_NAME))
        elif item[0] == "type" and len(item) == 2:
            outcomes.append(("unsent", f"a value of type {safe_name(item[1]) or 'object'}, not a JSON value"))
        elif item == ["big"]:
            outcomes.append(("unsent", "a value too large to send back"))
        else:
            return None
    return None, outcomes


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _others_can_run(path: str) -> bool:
    """Whether a user other than the owner may execute ``path`` (every folder above it searchable)."""
    import stat

    try:
        if not os.stat(path).st_mode & stat.S_IXOTH:
            return False
        folder = os.path.dirname(path)
        while True:
            if not os.stat(folder).st_mode & stat.S_IXOTH:
                return False
            if folder == os.path.dirname(folder):
                return True
            folder = os.path.dirname(folder)
    except OSError:
        return False


@functools.lru_cache(maxsize=1)
def _nobody_python() -> str | None:
    """An interpreter ``nobody`` can start (this one, else the system's): namespace mode as root starts the
    child as ``nobody``, and a virtual environment under ``/root`` is out of its reach (the child needs
    the standard library only)."""
    for candidate in (sys.executable, getattr(sys, "_base_executable", ""), "/usr/bin/python3",
                      "/usr/local/bin/python3"):
        if candidate and _others_can_run(os.path.realpath(candidate)):
            return os.path.realpath(candidate)
    return None


@functools.lru_cache(maxsize=1)
def _unshare() -> str | None:
    return shutil.which("unshare") if sys.platform.startswith("linux") else None


PROBE_TRIES = 3  # a failed isolation probe is tried this often (a loaded machine can fail one) before falling back


@functools.lru_cache(maxsize=1)
def available_isolation() -> str:
    """The strongest isolation this machine gives, checked once per process by a real sandboxed run.

    ``"namespace"`` if ``unshare`` can create user, PID, network, IPC and mount namespaces here and
    the worker can drop its capabilities (tried :data:`PROBE_TRIES` times); else ``"uid"`` when
    running as root; else ``"plain"``. A fall back from a mode that exists warns (``RuntimeWarning``).
    """
    if _unshare() is not None:
        for _ in range(PROBE_TRIES):
            probe = run_cases_sandboxed("def probe(x):\n    return x\n", "probe", [((1,), 1)], isolation="namespace")
            if probe.ok:
                return "namespace"
        fallback = "uid" if _is_root() else "plain"
        warnings.warn(f"bugfix_gym.execution.sandbox: unshare is installed but namespace isolation failed "
                      f"{PROBE_TRIES} times ({probe.first_failure}); pack code runs in the weaker {fallback} mode",
                      RuntimeWarning, stacklevel=2)
        return fallback
    return "uid" if _is_root() else "plain"
