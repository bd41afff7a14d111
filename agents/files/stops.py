"""A training run that survives every way it can be stopped.

* :func:`stop_signals_interrupt`: ``SIGTERM`` (``timeout``, ``kill``, ``docker stop``, Slurm,
  Kubernetes) and ``SIGHUP`` (a closed terminal) raise :class:`StopRequested`, a
  ``KeyboardInterrupt``, so they save the run exactly like Ctrl-C.
* :func:`signals_deferred`: ``SIGINT``, ``SIGTERM`` and ``SIGHUP`` are held back while a snapshot or
  the final model is written (they arrive once it is on disk; a signal mask would not do, as
  the kernel gives a process's signal to any thread that does not block it), and :func:`ignore_stop_signals`
  makes a second Ctrl-C during the save after an interrupt do nothing: the run is never lost
  half-written.
* :class:`RunLock`: an exclusive ``fcntl.flock`` on ``<run folder>/.lock`` for as long as a
  command uses the folder, so a second ``train --resume`` of the same folder refuses at once
  instead of writing over the first (the kernel drops the lock when the process dies).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import threading
from typing import Any, Iterator

STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
LOCK_FILE = ".lock"


class StopRequested(KeyboardInterrupt):
    """A stop signal other than Ctrl-C, raised where training was; ``signum`` says which.

    :param signum: the signal's number
    """

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def exit_status(interrupt: KeyboardInterrupt) -> int:
    """The shell's exit status for a stop: 128 + the signal's number (130 for Ctrl-C)."""
    return 128 + getattr(interrupt, "signum", signal.SIGINT)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """While inside, ``SIGTERM`` and ``SIGHUP`` raise :class:`StopRequested` (nothing changes off the main thread)."""
    if not _main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise StopRequested(signum)

    others = [s for s in STOP_SIGNALS if s != signal.SIGINT]
    old = {s: signal.signal(s, stop) for s in others}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold the stop signals back while inside: one that comes meanwhile is only noted, and raised again
    on the way out, to the handlers that were there before (nothing changes off the main thread)."""
    if not _main_thread():
        yield
        return
    pending: list[int] = []
    old = {s: signal.signal(s, lambda signum, frame: pending.append(signum)) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(pending):
            signal.raise_signal(s)


def ignore_stop_signals() -> None:
    """Ignore further stop signals: the run is stopping and saving (``SIGKILL`` still works)."""
    if _main_thread():
        for s in STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)


class RunLock:
    """An exclusive lock on a run folder, held until :meth:`release` or the process ends.

    :param folder: the run folder (it must exist)
    :raises BlockingIOError: another process holds the lock
    """

    def __init__(self, folder: str | pathlib.Path):
        import fcntl

        self.path = pathlib.Path(folder) / LOCK_FILE
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise BlockingIOError(f"another process is using {folder}") from None
        self.fd: int | None = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
