"""BugFix-v1's persistent contained worker: one long-lived child per process, a fresh grandchild per request.

The pack sandbox (:mod:`bugfix_gym.execution.sandbox`) starts one interpreter per test run (tens of
milliseconds). BugFix-v1 runs every test, every ``locate`` and every brute-force candidate in a
sandbox, so :class:`Worker` keeps one contained child (:mod:`bugfix_gym.execution.worker_child`)
alive and has it fork a fresh grandchild per request: no state survives between requests, and a
request costs a fork and a round trip on a pipe instead of an interpreter start.

* **Isolation** as the pack sandbox's: the strongest mode this machine gives
  (:func:`bugfix_gym.execution.sandbox.available_isolation`, or :data:`bugfix_gym.execution.sandbox.ISOLATION`,
  or the ``isolation`` argument), the same limits (``MEMORY_MB`` of address space, CPU seconds, 1 MiB
  files, no new processes), the same refusal of ``plain`` mode as root unless
  :data:`bugfix_gym.execution.sandbox.ALLOW_ROOT_PLAIN`. The child's code reaches it on stdin.
* **Deadlines** on both sides: the worker kills a grandchild past the request's ``timeout_s``;
  this process waits for the whole answer at most the sum of the jobs' deadlines plus
  :data:`SLACK_S`, and past that kills the worker (a fresh one starts with the next request).
* **Nothing trusted comes back**: the answer is parsed strictly (:func:`parse_job`), bounded in
  size (``REPORT_BYTES`` a job, :data:`BATCH_BYTES` a request); a timeout, a crash, a load error or a
  malformed or oversized answer fails the cases it touches, never passes them.

The worker is started lazily, restarted when it has died, closed at exit and forgotten in a
forked child process (which starts its own); one lock serialises the requests of a process's
threads. :func:`default_worker` is the process's shared one.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any, Sequence

from . import sandbox
from .cases import safe_name
from .repair_cases import AssertCase, CallCase, contains_unsent, decode_value, encode_value

LOOP_TICKS = 1_000_000  # loop iterations per candidate call (v0's 100,000 is too few for some HumanEval solutions)
SLACK_S = 2.0  # seconds this process allows a request beyond its jobs' deadlines (forks, pipes, a loaded machine)
START_TIMEOUT_S = 20.0  # seconds for a worker to start and set itself up
BATCH_BYTES = 32 << 20  # the most one request's answers may hold together
MODULES = ("cases", "repair_cases", "sandbox_child", "worker_child")  # sent to the child, in import order
_NO_NAME = "an exception with an unprintable name"


@dataclass(frozen=True)
class Job:
    """One source to run on a list of cases.

    :param source: the module source (the candidate)
    :param entry: the function the cases call
    :param cases: :class:`CallCase` and :class:`AssertCase` items
    :param support: trusted code that AssertCases may use (run before each of them)
    :param coverage: also note the candidate's lines each case runs
    """

    source: str
    entry: str
    cases: tuple
    support: str = ""
    coverage: bool = False


@dataclass(frozen=True)
class JobResult:
    """What one job came back with, checked.

    :param load_error: the source did not load (``"SyntaxError (line 3)"``, ``"ImportError"``, ...), else None
    :param outcomes: per case ``("value", decoded)`` | ``("raised", name)`` for a CallCase, ``("calls", calls)``
        for an AssertCase (``calls``: ``(args_key, outcome)`` pairs), or ``("failed", why in words)``
    :param lines: per case the candidate's lines it ran (with coverage), else None
    """

    load_error: str | None
    outcomes: tuple
    lines: tuple | None = None


def _failed(job: Job, why: str) -> JobResult:
    return JobResult(None, tuple(("failed", why) for _ in job.cases),
                     tuple(frozenset() for _ in job.cases) if job.coverage else None)


def _wire_case(case: Any) -> list | None:
    """A case as the child gets it (a CallCase's arguments only), or None if it cannot be sent."""
    if type(case) is CallCase:
        encoded = encode_value(list(case.args))
        if contains_unsent(decode_value(encoded)) is not None:
            return None
        return ["call", encoded]
    if type(case) is AssertCase and type(case.code) is str and type(case.setup) is str:
        return ["assert", case.code, case.setup]
    return None


def _parse_outcome(item: Any) -> tuple:
    if type(item) is not list or not item or type(item[0]) is not str:
        raise ValueError("a malformed outcome")
    if item[0] == "value" and len(item) == 2:
        return "value", decode_value(item[1])
    if item[0] == "raised" and len(item) == 2:
        return "raised", safe_name(item[1]) or _NO_NAME
    if item[0] == "failed" and len(item) == 2 and item[1] == "too many calls to record":
        return "failed", item[1]
    raise ValueError("a malformed outcome")


def _parse_case(line: bytes, case: Any, n_lines: int, coverage: bool) -> tuple[tuple, frozenset | None]:
    item = json.loads(line, parse_constant=_no_constant)
    if type(item) is not dict:
        raise ValueError("a malformed case")
    if type(case) is CallCase:
        if set(item) - {"l"} != {"o"}:
            raise ValueError("a malformed case")
        outcome = _parse_outcome(item["o"])
    else:
        calls = item.get("c")
        if set(item) - {"l"} != {"c"} or type(calls) is not list:
            raise ValueError("a malformed case")
        parsed = []
        for call in calls:
            if type(call) is not list or len(call) != 2 or type(call[0]) is not str:
                raise ValueError("a malformed call")
            parsed.append((call[0], _parse_outcome(call[1])))
        outcome = ("calls", tuple(parsed))
    lines = None
    if coverage:
        got = item.get("l")
        if type(got) is not list or len(got) > n_lines or not all(type(n) is int and 0 < n <= n_lines for n in got):
            raise ValueError("malformed coverage")
        lines = frozenset(got)
    return outcome, lines


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON value")


def parse_job(job: Job, sent: Sequence[int], status: str, code: int, data: bytes,
              timeout_s: float) -> JobResult:
    """The checked result of one job from the worker's status, exit code and answer bytes.

    :param sent: the indices of ``job.cases`` that were sent (the others could not be)
    """
    if status == "setup":
        return _failed(job, "sandbox : the worker could not apply its limits")
    if status == "skipped":
        return _failed(job, f"sandbox : not run (the request's answers passed {BATCH_BYTES} bytes)")
    complete = data.split(b"\n")[:-1]  # an answer cut short ends without its newline: that partial line is dropped
    stopped = {"timeout": f"sandbox : Timeout after {timeout_s:g} s",
               "overflow": "sandbox : the answer was too large",
               "crash": f"sandbox : the code ended its process before answering "
                        f"({f'killed by signal {-code}' if code < 0 else f'exit code {code}'})"}.get(status)
    n_lines = job.source.count("\n") + 1
    try:
        if not complete:
            raise ValueError("no answer")
        head = json.loads(complete[0])
        if type(head) is not dict or set(head) != {"load"}:
            raise ValueError("a malformed answer")
        if head["load"] is not None:
            name, line = head["load"] if type(head["load"]) is list and len(head["load"]) == 2 else (None, None)
            if type(line) is not int or not 0 < line <= n_lines:
                line = None
            name = safe_name(name) or _NO_NAME
            return JobResult(f"{name} (line {line})" if line else name, (),
                             tuple(frozenset() for _ in job.cases) if job.coverage else None)
        if len(complete) - 1 > len(sent):
            raise ValueError("more answers than cases")
        outcomes: list[tuple] = [("failed", "sandbox : cannot send this case's arguments")] * len(job.cases)
        lines: list[frozenset] = [frozenset()] * len(job.cases)
        for k, index in enumerate(sent):
            if k + 1 < len(complete):
                outcomes[index], got = _parse_case(complete[k + 1], job.cases[index], n_lines, job.coverage)
                lines[index] = got or frozenset()
            elif k + 1 == len(complete):
                outcomes[index] = ("failed", stopped or "sandbox : the answer ended early")
            else:
                outcomes[index] = ("failed", "not run (an earlier case stopped the run)")
    except (ValueError, TypeError, RecursionError):
        if stopped and not complete:
            return _failed(job, stopped)
        return _failed(job, "sandbox : the answer is malformed")
    return JobResult(None, tuple(outcomes), tuple(lines) if job.coverage else None)


class Worker:
    """A long-lived contained worker child (see the module docstring).

    :param isolation: ``"namespace"``, ``"uid"`` or ``"plain"`` (default: the sandbox's choice)
    :param memory_mb: address-space limit of each grandchild (default ``sandbox.MEMORY_MB``)
    """

    def __init__(self, isolation: str | None = None, memory_mb: int | None = None):
        self.isolation = isolation
        self.memory_mb = memory_mb
        self._proc: subprocess.Popen | None = None
        self._buffer = b""  # read from the child's stdout beyond the last frame (the next one's start)
        self._mode_running: str | None = None  # the isolation mode of the running child
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self.starts = 0  # how many children this worker has started

    # ------------------------------------------------------------------------------------------ the child
    def _mode(self) -> str:
        mode = self.isolation or sandbox.ISOLATION or sandbox.available_isolation()
        if mode not in sandbox.ISOLATION_MODES:
            raise ValueError(f"unknown sandbox isolation {mode!r}; use one of {', '.join(sandbox.ISOLATION_MODES)}")
        return mode

    def _alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _forget(self) -> None:
        """After a fork: drop (and close, in this process only) the parent's pipes without touching its child."""
        if self._proc is not None:
            for stream in (self._proc.stdin, self._proc.stdout):  # through the file objects, which own the fds
                try:
                    if stream is not None:
                        stream.close()
                except OSError:
                    pass
        self._proc, self._buffer, self._pid = None, b"", os.getpid()
        self._lock = threading.Lock()

    def _start(self, mode: str) -> str | None:
        """Start the child and wait for its ready frame; None, or why it did not start."""
        self.starts += 1
        memory_mb = sandbox.MEMORY_MB if self.memory_mb is None else int(self.memory_mb)
        command = sandbox.child_command(mode, [mode, str(memory_mb), str(sandbox.REPORT_BYTES)])
        try:
            proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, cwd="/", env={}, start_new_session=True,
                                    **sandbox.drop_to_nobody(mode))
        except OSError as exc:
            return f"cannot start the worker ({type(exc).__name__})"
        self._proc, self._buffer, self._mode_running = proc, b"", mode
        assert proc.stdin is not None and proc.stdout is not None
        os.set_blocking(proc.stdin.fileno(), False)  # both ends are used raw, with a deadline
        os.set_blocking(proc.stdout.fileno(), False)
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            self._write_all(sandbox.module_bundle(MODULES), deadline)
            ready = self._read_frame(deadline, 1024)
        except (OSError, ValueError, TimeoutError) as exc:
            self._kill()
            if proc.returncode == sandbox.SETUP_FAILED:
                return f"the worker could not contain itself ({mode} isolation)"
            return f"the worker did not start ({type(exc).__name__})"
        if ready != {"ready": mode}:
            self._kill()
            return "the worker did not start (a malformed ready frame)"
        return None

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # in namespace mode this kills the namespace's init too
        except OSError:
            pass
        proc.kill()
        proc.wait()
        self._buffer = b""
        for stream in (proc.stdin, proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass

    def close(self) -> None:
        """Stop the child; the next request starts a fresh one."""
        if self._pid != os.getpid():
            self._forget()
            return
        with self._lock:
            self._kill()

    def _wait(self, fd: int, event: int, deadline: float) -> None:
        """Until ``fd`` is ready for ``event`` (TimeoutError past ``deadline``)."""
        with selectors.DefaultSelector() as selector:
            selector.register(fd, event)
            while not selector.select(max(0.0, deadline - time.monotonic())):
                if time.monotonic() >= deadline:
                    raise TimeoutError

    def _write_all(self, data: bytes, deadline: float) -> None:
        """Write ``data`` to the child's stdin before ``deadline`` (TimeoutError), OSError if it has gone."""
        assert self._proc is not None and self._proc.stdin is not None
        fd, view = self._proc.stdin.fileno(), memoryview(data)
        while view:
            self._wait(fd, selectors.EVENT_WRITE, deadline)
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                continue

    def _fill(self, deadline: float) -> None:
        """Read what the child's stdout has (at least one byte) into the buffer; ValueError at its end."""
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        self._wait(fd, selectors.EVENT_READ, deadline)
        try:
            chunk = os.read(fd, 1 << 20)
        except BlockingIOError:
            return
        if not chunk:
            raise ValueError("the worker's answer ended early")
        self._buffer += chunk

    def _read_exactly(self, n: int, deadline: float) -> bytes:
        """``n`` bytes from the child's stdout before ``deadline`` (TimeoutError), or ValueError at its end."""
        while len(self._buffer) < n:
            self._fill(deadline)
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    def _read_frame(self, deadline: float, limit: int) -> Any:
        while b"\n" not in self._buffer[:24]:
            if len(self._buffer) >= 24:
                raise ValueError("a malformed frame")
            self._fill(deadline)
        line, _, self._buffer = self._buffer.partition(b"\n")
        size = int(line)
        if not 0 <= size <= limit:
            raise ValueError("an oversized frame")
        return json.loads(self._read_exactly(size, deadline))

    # ------------------------------------------------------------------------------------------ requests
    def run(self, source: str, entry: str, cases: Sequence, support: str = "", coverage: bool = False,
            timeout_s: float | None = None, max_ticks: int | None = None) -> JobResult:
        """Run ``entry`` of ``source`` on ``cases`` in a fresh grandchild; never raises for what the code does.

        :param timeout_s: wall-clock limit for all the cases (default ``sandbox.TIMEOUT_S``)
        :param max_ticks: loop iterations per candidate call (default :data:`LOOP_TICKS`)
        """
        return self.run_many([Job(source, entry, tuple(cases), support, coverage)], timeout_s, max_ticks)[0]

    def run_many(self, jobs: Sequence[Job], timeout_s: float | None = None,
                 max_ticks: int | None = None) -> list[JobResult]:
        """Run many jobs in one round trip, each in its own grandchild with its own deadline (so a source
        that hangs costs its ``timeout_s`` and the others still run); one result per job, in order."""
        jobs = list(jobs)
        if not jobs:
            return []
        timeout_s = sandbox.TIMEOUT_S if timeout_s is None else float(timeout_s)
        if not 0 < timeout_s < float("inf"):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        mode = self._mode()
        if mode == "plain" and sandbox._is_root() and not sandbox.ALLOW_ROOT_PLAIN:
            why = ("sandbox : refusing to run candidate code as root in plain isolation (it would keep root's "
                   "access); use namespace or uid isolation, or set "
                   "bugfix_gym.execution.sandbox.ALLOW_ROOT_PLAIN = True")
            return [_failed(job, why) for job in jobs]
        texts, sent = [], []
        for job in jobs:
            cases = [_wire_case(case) for case in job.cases]
            sent.append([i for i, case in enumerate(cases) if case is not None])
            wire = {"source": job.source, "entry": job.entry, "support": job.support,
                    "cases": [case for case in cases if case is not None], "coverage": bool(job.coverage)}
            try:
                texts.append(json.dumps(wire, allow_nan=False).encode())
            except (TypeError, ValueError):  # a source or a case text that is not text
                return [_failed(job, "sandbox : cannot send the request") for job in jobs]
        request = {"sizes": [len(text) for text in texts], "timeout_s": timeout_s, "total_bytes": BATCH_BYTES,
                   "max_ticks": LOOP_TICKS if max_ticks is None else int(max_ticks)}
        head = json.dumps(request).encode()
        body = b"%d\n" % len(head) + head + b"".join(texts)
        if self._pid != os.getpid():  # a forked copy of this process: the child and the lock are the parent's
            self._forget()
        with self._lock:
            answer = self._exchange(mode, body, len(jobs), len(jobs) * (timeout_s + 0.5) + SLACK_S)
        if isinstance(answer, str):
            return [_failed(job, f"sandbox : {answer}") for job in jobs]
        header, data = answer
        results, offset = [], 0
        for job, indices, (status, code, size) in zip(jobs, sent, header):
            results.append(parse_job(job, indices, status, code, data[offset: offset + size], timeout_s))
            offset += size
        return results

    def _exchange(self, mode: str, body: bytes, n_jobs: int, wait_s: float) -> tuple[list, bytes] | str:
        """Send one request (its frame and the jobs' texts), read the answer: ``(header, payload)`` with one header
        item a job, or why there is none, in words."""
        for attempt in (0, 1):
            if not self._alive() or self._mode_running != mode:
                self._kill()
                why = self._start(mode)
                if why is not None:
                    return why
            deadline = time.monotonic() + wait_s
            try:
                self._write_all(body, deadline)
            except TimeoutError:
                self._kill()
                return f"the worker did not answer within {wait_s:g} s"
            except OSError:  # the child died before it read the request: nothing ran, so try a fresh one once
                self._kill()
                if attempt:
                    return "the worker died"
                continue
            break
        try:
            header = self._read_frame(deadline, 1 << 20)
            jobs = header["jobs"] if type(header) is dict else None
            if type(jobs) is not list or len(jobs) != n_jobs or not all(_header_item(item) for item in jobs):
                raise ValueError("a malformed header")
            total = sum(item[2] for item in jobs)
            if total > BATCH_BYTES:
                raise ValueError("an oversized answer")
            return jobs, self._read_exactly(total, deadline)
        except TimeoutError:
            self._kill()
            return f"the worker did not answer within {wait_s:g} s"
        except (OSError, ValueError, TypeError, KeyError):
            self._kill()
            return "the worker died"


def _header_item(item: Any) -> bool:
    return (type(item) is list and len(item) == 3 and item[0] in ("ok", "timeout", "overflow", "crash", "setup",
                                                                  "skipped")
            and type(item[1]) is int and type(item[2]) is int and 0 <= item[2] <= sandbox.REPORT_BYTES)


_DEFAULT: Worker | None = None
_DEFAULT_LOCK = threading.Lock()


def default_worker() -> Worker:
    """This process's shared worker (created on first use; its child starts with the first request)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = Worker()
        return _DEFAULT


def _close_default() -> None:
    if _DEFAULT is not None:
        _DEFAULT.close()


atexit.register(_close_default)
