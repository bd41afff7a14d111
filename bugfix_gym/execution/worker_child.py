"""The worker child: one long-lived contained process that runs BugFix-v1's test requests, each in a fresh grandchild.

:mod:`bugfix_gym.execution.worker` starts it as the sandbox starts a pack child
(:func:`bugfix_gym.execution.sandbox.child_command`: ``python -I -S -c BOOT MODE MEMORY_MB
REPORT_BYTES``, under ``unshare`` in ``namespace`` mode, as ``nobody`` when the caller is root there;
empty environment, ``/`` as the working directory) and sends this module's source and those of
its leaf modules ``cases``, ``repair_cases`` and ``sandbox_child`` on stdin first, so it opens no
file of the checkout. Standard library only.

Once up, it sets up what lasts (in ``namespace`` mode, as the namespace's init: every mount
read-only, the scratch places :data:`bugfix_gym.execution.sandbox_child.SCRATCH` fresh tmpfs, then
those made read-only too, so no request can leave a file for a later one), imports the standard
modules task code commonly needs (:data:`PRELOAD`: a grandchild that has switched to ``nobody``
may not be able to read the interpreter's library any more), writes a ready frame and serves
requests until its stdin ends. Frames are a decimal length line and that many bytes of JSON.

A request ``{"jobs": [job, ...], "timeout_s", "max_ticks", "total_bytes"}``, each job
``{"source", "entry", "support", "cases", "coverage"}`` with cases ``["call", encoded args]`` or
``["assert", code, setup]``, is answered by a frame ``{"jobs": [[status, exit code, size], ...]}``
followed by each job's ``size`` bytes of answer. For each job it forks a grandchild, which:

* limits itself (address space ``MEMORY_MB``, CPU seconds, 1 MiB files, no core dumps, no new
  processes or threads: ``RLIMIT_NPROC = 0``), sets ``no_new_privs`` and, in ``namespace`` mode,
  takes a private IPC namespace and drops every capability, or in ``uid`` mode switches to
  ``nobody`` (the worker itself stays the caller, out of the grandchild's reach); asks to be
  killed if the worker dies; keeps only its answer pipe (stdin, stdout and stderr are
  ``/dev/null``);
* compiles the source with the loop ticks of :mod:`bugfix_gym.execution.cases` and writes one
  JSON line ``{"load": null | [error name, line]}``, then one line per case as it finishes:
  ``{"o": outcome}`` for a call (``["value", encoded]`` | ``["raised", name]``) or ``{"c": calls}``
  for an assert (:func:`bugfix_gym.execution.repair_cases.record_assert_case`), with ``"l": [lines]``
  when coverage was asked: the lines of the candidate's own code (filename ``<task ENTRY>``) that
  ran during that case (``sys.settrace``).

The worker reads each answer with the request's deadline and ``REPORT_BYTES`` as its cap, kills
the grandchild past either (status ``"timeout"`` / ``"overflow"``), and reports ``"ok"`` (the answer
ended with :data:`END`), ``"crash"`` (the process ended first, whatever its exit status),
``"setup"`` (the grandchild could not apply its limits: it never ran task code) or ``"skipped"``
(the request's ``total_bytes`` were used up by earlier jobs). It
never runs task code itself and judges nothing: the env process trusts none of the answer.
"""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import sys
import time
from typing import Any, Callable

if __package__:  # imported as bugfix_gym.execution.worker_child (documentation tools, type checkers)
    from . import cases, repair_cases, sandbox_child
else:  # loaded by the bootstrap, which put the leaf modules in sys.modules first
    import cases  # type: ignore[no-redef]
    import repair_cases  # type: ignore[no-redef]
    import sandbox_child  # type: ignore[no-redef]

SETUP_FAILED = sandbox_child.SETUP_FAILED
UNPRIVILEGED_UID = sandbox_child.UNPRIVILEGED_UID
PRELOAD = ("math", "random", "re", "string", "itertools", "functools", "collections", "heapq", "bisect",
           "typing", "hashlib", "copy", "fractions", "decimal", "statistics", "operator", "json")
MAX_UNREAPED = 8  # ended grandchildren the worker lets finish dying before it waits for the oldest
END = b"\0"  # the grandchild's last byte after its last answer line (JSON text never holds a NUL byte)
_CLONE_NEWIPC = 0x08000000
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE = 1, 4
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT = 1, 2, 4, 32


def _read_frame(stream) -> Any:
    line = stream.readline(32)
    if not line:
        return None
    return json.loads(stream.read(int(line)))


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _write_frame(fd: int, obj: Any, payload: bytes = b"") -> None:
    body = json.dumps(obj).encode()
    _write_all(fd, b"%d\n" % len(body) + body + payload)


def _scratch_read_only() -> None:
    """Namespace init, after :func:`sandbox_child._private_filesystem`: the fresh tmpfs read-only too."""
    ctypes, libc = sandbox_child._libc()
    for point in sandbox_child.SCRATCH:
        if os.path.isdir(point):
            flags = _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV
            if sandbox_child._mount(libc, ctypes, None, point, None, flags, None):
                raise OSError(f"cannot make {point} read-only")
    try:
        open("/tmp/.bugfix_gym_probe", "w").close()
    except OSError:
        return
    raise OSError("/tmp is still writable")


def _contain(mode: str, memory_mb: int, parent: int) -> None:
    """In the grandchild, before any task code: limits, privileges, the parent-death signal. Raises if any fails.
    (The CPU-seconds limit follows with the job, which carries its deadline.)"""
    import resource

    sandbox_child._limit(resource, "RLIMIT_AS", memory_mb * 1024 * 1024)
    sandbox_child._limit(resource, "RLIMIT_FSIZE", 1024 * 1024)
    sandbox_child._limit(resource, "RLIMIT_CORE", 0)
    sandbox_child._limit(resource, "RLIMIT_NPROC", 0)  # no new processes: honoured for every uid but 0
    if mode != "plain":
        sandbox_child._no_new_privileges()
    if mode == "namespace":
        ctypes, libc = sandbox_child._libc()
        if libc.unshare(_CLONE_NEWIPC) != 0:  # System V IPC objects die with this grandchild
            raise OSError(ctypes.get_errno(), "cannot unshare the IPC namespace")
        sandbox_child._drop_capabilities()
    elif mode == "uid":
        os.setgroups([])
        os.setgid(UNPRIVILEGED_UID)
        os.setuid(UNPRIVILEGED_UID)
    if sys.platform.startswith("linux"):  # after setuid, which resets both
        ctypes, libc = sandbox_child._libc()
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "cannot set the parent-death signal")
        if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:  # no grandchild may trace or read another's memory
            raise OSError(ctypes.get_errno(), "cannot clear the dumpable flag")
    if os.getppid() != parent:  # the worker died before the signal was set
        raise OSError("the worker is gone")


def _tracer(filename: str, lines: set[int]) -> Callable:
    """A ``sys.settrace`` function that notes the lines run in code compiled from ``filename`` only."""
    def local(frame, event, arg):
        if event == "line":
            lines.add(frame.f_lineno)
        return local

    def calls(frame, event, arg):
        return local if frame.f_code.co_filename == filename else None

    return calls


def _run_job(job: dict, write: Callable[[str], None], max_ticks: int, budget: int) -> None:
    """In the grandchild: load the source, run every case, write the answer lines."""
    entry, source, support = job["entry"], job["source"], job["support"]
    try:
        func, reset = cases.compile_function(source, entry, max_ticks)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - task code may raise anything
        line = exc.lineno if isinstance(exc, SyntaxError) and type(exc.lineno) is int else None
        write(json.dumps({"load": [cases.error_name(exc), line]}))
        return
    write('{"load": null}')
    filename = f"<task {entry}>"
    budget -= 64 * len(job["cases"])
    for case in job["cases"]:
        lines: set[int] | None = set() if job["coverage"] else None
        if lines is not None:
            sys.settrace(_tracer(filename, lines))
        try:
            if case[0] == "call":
                kind, payload = cases.call_one(func, reset, repair_cases.decode_value(case[1]))
                outcome = ["value", repair_cases.encode_value(payload, budget)] if kind == "value" else [kind, payload]
                item: dict[str, Any] = {"o": outcome}
            else:
                test = repair_cases.AssertCase(code=case[1], setup=case[2])
                item = {"c": repair_cases.record_assert_case(test, support, func, reset, budget)}
        finally:
            sys.settrace(None)
        if lines is not None:
            item["l"] = sorted(lines)
        text = json.dumps(item, allow_nan=False)
        budget -= len(text)
        write(text)


def _grandchild(mode: str, memory_mb: int, job_end: int, answer_end: int, parent: int) -> None:
    """A spare grandchild: contain itself, wait for its one job on ``job_end``, run it, answer on ``answer_end``."""
    try:
        _contain(mode, memory_mb, parent)
        low, high = sorted((job_end, answer_end))
        os.closerange(3, low)  # every descriptor of the worker but this grandchild's two pipes
        os.closerange(low + 1, high)
        os.closerange(high + 1, 1 << 16)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # nothing to read, nowhere visible to print
            os.dup2(devnull, fd)
        os.close(devnull)
    except BaseException:  # noqa: BLE001 - no limits, no task code
        os._exit(SETUP_FAILED)
    try:
        with os.fdopen(job_end, "rb") as jobs:
            params = _read_frame(jobs)
            if params is None:  # the worker is closing: no job came
                os._exit(0)
            job = json.loads(jobs.read(params["size"]))
        import resource

        sandbox_child._limit(resource, "RLIMIT_CPU", int(params["timeout_s"]) + 1)
    except BaseException:  # noqa: BLE001 - a broken job pipe: the worker reports the exit status
        os._exit(SETUP_FAILED)
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 1000))
    try:
        _run_job(job, lambda text: _write_all(answer_end, text.encode() + b"\n"), params["max_ticks"], params["budget"])
        _write_all(answer_end, END)
    except BaseException:  # noqa: BLE001 - task code broke the runner (patched json, ...): what was written stands
        os._exit(1)
    os._exit(0)  # skip interpreter teardown: task code may have left atexit hooks


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


_OURS: set[int] = set()  # the grandchildren forked and not yet reaped


def _reap_orphans() -> None:
    """Namespace init: collect any ended process reparented to it that is not one of its own grandchildren (none
    can exist while RLIMIT_NPROC holds; this is the init's duty all the same)."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid in _OURS:
            return
        os.waitpid(info.si_pid, 0)


class _Grandchild:
    """A grandchild forked and contained ahead of its job, so the fork is off the request's path: the next
    request's is forked once an answer is sent, the next job's of a batch while this one runs. Its answer ends
    with :data:`END` (or its end of file): the worker answers the env process first and kills and reaps the
    grandchild afterwards (:meth:`reap`)."""

    def __init__(self, mode: str, memory_mb: int):
        self.namespace, self.code = mode == "namespace", 0
        job_read, self.job_write = os.pipe()
        self.answer_read, answer_write = os.pipe()
        parent = os.getpid()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(self.job_write)
            os.close(self.answer_read)
            _grandchild(mode, memory_mb, job_read, answer_write, parent)
        _OURS.add(self.pid)
        os.close(job_read)
        os.close(answer_write)

    def send(self, job: bytes, timeout_s: float, max_ticks: int, cap: int) -> None:
        """Hand the grandchild its job (the parameters frame, then the job's JSON text as the env sent it)."""
        self.deadline, self.cap = time.monotonic() + timeout_s, cap
        params = {"size": len(job), "timeout_s": timeout_s, "max_ticks": max_ticks, "budget": cap}
        try:
            _write_frame(self.job_write, params, job)  # a job past the pipe's buffer waits for the reader
        except OSError:  # the grandchild died before it read its job (its exit status says why)
            pass
        os.close(self.job_write)

    def collect(self) -> tuple[str, int, bytes]:
        """Read the answer until its end, the deadline or the cap; kill the grandchild unless it ended its answer
        and exited (an ended answer's grandchild is killed too, and reaped by :meth:`reap`).

        :return: ``(status, exit code or -signal (0 for an ended answer), answer bytes)``
        """
        chunks: list[bytes] = []
        size, status, ended = 0, "ok", False
        try:
            while True:
                left = self.deadline - time.monotonic()
                if left <= 0:
                    status = "timeout"
                    break
                if not select.select([self.answer_read], [], [], left)[0]:
                    continue
                chunk = os.read(self.answer_read, 65536)
                if not chunk:
                    break
                size += len(chunk)
                if size > self.cap + len(END):
                    status = "overflow"
                    break
                chunks.append(chunk)
                if chunk.endswith(END):  # written after the last line (task code could write it sooner: then the
                    ended = True  # answer just ends there, and the grandchild is killed all the same)
                    break
        finally:
            os.close(self.answer_read)
            if status != "ok" or ended:
                _kill(self.pid)
        data = b"".join(chunks)
        if ended:
            return status, 0, data[: -len(END)]
        code = self.reap() or 0
        if status == "ok":  # the answer ended without END: the process ended before it finished
            status = "setup" if code == SETUP_FAILED else "crash"
        return status, code, data

    def reap(self, block: bool = True) -> int | None:
        """Wait for the grandchild (killed, or exited) once; its exit code, or minus the signal that ended it (None:
        not ended yet, without ``block``)."""
        if self.pid:
            pid, wait_status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
            if pid == 0:
                return None
            _OURS.discard(self.pid)
            self.pid = 0
            self.code = os.WEXITSTATUS(wait_status) if os.WIFEXITED(wait_status) else -os.WTERMSIG(wait_status)
            if self.namespace:
                _reap_orphans()
        return self.code


def _serve(mode: str, memory_mb: int, report_bytes: int) -> None:
    """Answer requests until stdin ends. A request frame ``{"sizes", "timeout_s", "max_ticks", "total_bytes"}`` is
    followed by the jobs' JSON texts, ``sizes`` bytes each, passed on to the grandchildren unread."""
    stdin = sys.stdin.buffer
    spare: _Grandchild | None = _Grandchild(mode, memory_mb)
    done: list[_Grandchild] = []  # killed or exited, reaped when they have ended (never before the answer)
    while True:
        request = _read_frame(stdin)
        if request is None:
            if spare is not None:
                os.close(spare.job_write)  # the spare reads no job and exits; PDEATHSIG covers the rest
            os._exit(0)
        header, payload, used = [], [], 0
        for k, size in enumerate(request["sizes"]):
            job = stdin.read(size)
            if used >= request["total_bytes"]:
                header.append(["skipped", 0, 0])
                continue
            running, spare = spare or _Grandchild(mode, memory_mb), None
            cap = min(report_bytes, request["total_bytes"] - used)
            running.send(job, request["timeout_s"], request["max_ticks"], cap)
            if k + 1 < len(request["sizes"]):  # in a batch, the next job's grandchild is forked while this one works
                spare = _Grandchild(mode, memory_mb)
            status, code, data = running.collect()
            done.append(running)
            header.append([status, code, len(data)])
            payload.append(data)
            used += cap if status == "overflow" else len(data)
            done = [g for g in done if g.reap(block=False) is None]  # killed: they run no more code, so no waiting
        _write_frame(1, {"jobs": header}, b"".join(payload))
        spare = spare or _Grandchild(mode, memory_mb)  # the next request's, forked while the env judges this one
        done = [g for g in done if g.reap(block=False) is None]  # the killed ones end on their own: no waiting,
        while len(done) > MAX_UNREAPED:  # unless too many are still dying
            done.pop(0).reap()


def main(argv: list[str]) -> None:
    mode, memory_mb, report_bytes = argv[0], int(argv[1]), int(argv[2])
    for sig in (signal.SIGINT, signal.SIGTERM):  # as a namespace's init, take no signal from inside it
        signal.signal(sig, signal.SIG_DFL)
    try:
        if mode == "namespace":
            sandbox_child._private_filesystem()
            _scratch_read_only()
        os.chdir("/")
        for name in PRELOAD:
            __import__(name)
        if sys.platform.startswith("linux"):
            sandbox_child._libc()  # ctypes and the C library, loaded once, while the library is readable
        import resource  # noqa: F401 - the same
        gc.freeze()  # what is loaded now stays out of the collector's reach: grandchildren copy fewer pages
    except Exception:  # noqa: BLE001 - no containment, no service
        os._exit(SETUP_FAILED)
    _write_frame(1, {"ready": mode})
    _serve(mode, memory_mb, report_bytes)
