"""The sandbox child: call task-pack code under limits and send back one outcome per call.

:mod:`bugfix_gym.execution.sandbox` starts ``python -I -S -c BOOT MODE TIMEOUT_S MEMORY_MB
REPORT_BYTES`` (in ``namespace`` mode under ``unshare``) with an empty environment, ``/`` as the
working directory and everything on stdin: first this module's source and that of its leaf
``cases.py`` (the bootstrap, :data:`bugfix_gym.execution.sandbox.BOOT`, runs them as the top-level
modules ``cases`` and ``sandbox_child``: the child opens no file of the checkout, so a checkout
that ``nobody`` cannot read keeps namespace isolation), then the request: JSON ``{"source",
"name", "args"}``, the argument lists only, never the expected values. It answers with one JSON object on the
saved stdout, ``{"load_error": null | name, "outcomes": [...]}``, one outcome per argument
list: ``["value", v]`` (a plain JSON value), ``["raised", exception name]``, ``["type", type
name]`` (a value that is not plain JSON) or ``["big"]`` (too large to send). The parent trusts
none of it: it checks the shape and the count and compares the values itself.

Standard library only: ``-I -S`` puts nothing but the standard library on ``sys.path``, and the
bootstrap has put ``cases`` in ``sys.modules``. (Imported as ``bugfix_gym.execution.sandbox_child``,
it uses ``bugfix_gym.execution.cases`` instead.)

Modes (:func:`bugfix_gym.execution.sandbox.available_isolation` picks one):

* ``namespace``: this process is the init of fresh user, PID, network, IPC and mount namespaces
  (as root, started as ``nobody``, so the namespace's root is ``nobody`` outside). It makes every
  mount read-only and puts fresh tmpfs over ``/tmp``, ``/var/tmp``, ``/dev/shm`` and the
  terminals (:func:`_private_filesystem`), then forks the worker and waits; when it exits, the
  kernel kills every process left in the namespace. The worker drops every capability before it
  runs task code, so it can neither signal nor trace this init (init ignores signals from inside
  its namespace that it has no handler for) and sees no process outside the namespace.
* ``uid``: the worker is this process; it switches to ``UNPRIVILEGED_UID`` (the caller is root),
  where ``RLIMIT_NPROC = 0`` forbids new processes.
* ``plain``: the worker is this process, with resource limits only.
"""

from __future__ import annotations

import json
import os
import signal
import sys

if __package__:  # imported as bugfix_gym.execution.sandbox_child (documentation tools, type checkers)
    from . import cases as execution
else:  # loaded by the child's bootstrap, which put the leaf module ``cases`` in sys.modules first
    import cases as execution  # type: ignore[no-redef]

UNPRIVILEGED_UID = 65534  # "nobody"
MAX_VALUE_CHARS = 100_000  # a returned value longer than this as JSON comes back as ["big"]
SETUP_FAILED = 121  # exit status when the worker cannot apply its limits; it never runs task code then


def _limit(resource_module, which: str, value: int) -> None:
    kind = getattr(resource_module, which, None)
    if kind is None:
        return
    try:
        resource_module.setrlimit(kind, (value, value))
    except (ValueError, OSError):
        pass  # a limit the OS refuses (or one already lower); the wall clock still holds


_LIBC: tuple = ()


def _libc():
    """``(ctypes, the C library)``, loaded once per process (a worker's grandchildren inherit it)."""
    global _LIBC
    if not _LIBC:
        import ctypes

        _LIBC = (ctypes, ctypes.CDLL(None, use_errno=True))
    return _LIBC


def _no_new_privileges() -> None:
    """Set no_new_privs: executing a setuid program gives no privileges (Linux; elsewhere nothing)."""
    if sys.platform.startswith("linux"):
        ctypes, libc = _libc()
        if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
            raise OSError(ctypes.get_errno(), "cannot set no_new_privs")


def _drop_capabilities() -> None:
    """Empty the bounding, effective, permitted and inheritable capability sets (Linux)."""
    ctypes, libc = _libc()
    for cap in range(64):
        if libc.prctl(24, cap, 0, 0, 0) != 0 and ctypes.get_errno() == 22:  # PR_CAPBSET_DROP; EINVAL: past the last
            break
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable for capabilities 0-31 and 32-63: none
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "cannot drop capabilities")
    with open("/proc/self/status") as status:
        if any(line.startswith("CapEff:") and int(line.split()[1], 16) for line in status):
            raise OSError("capabilities are still effective")


_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND = 1, 2, 4, 8, 32, 4096
_MS_NOATIME, _MS_NODIRATIME, _MS_RELATIME = 1024, 2048, 1 << 21
_KEPT_FLAGS = ((os.ST_NOSUID, _MS_NOSUID), (os.ST_NODEV, _MS_NODEV), (os.ST_NOEXEC, _MS_NOEXEC),
               (getattr(os, "ST_NOATIME", 1024), _MS_NOATIME), (getattr(os, "ST_NODIRATIME", 2048), _MS_NODIRATIME),
               (getattr(os, "ST_RELATIME", 4096), _MS_RELATIME))
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm", "/dev/pts", "/dev/mqueue")  # fresh, empty tmpfs in namespace mode


def _mount(libc, ctypes, source: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> int:
    def enc(text):
        return None if text is None else text.encode()
    if libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        return ctypes.get_errno()
    return 0


def _mount_points() -> list[str]:
    with open("/proc/self/mountinfo") as info:
        points = [line.split()[4] for line in info if len(line.split()) > 4]
    return [p.encode().decode("unicode_escape") for p in points]  # "\040" is a space


def _private_filesystem() -> None:
    """Namespace init, in its own mount namespace: every mount read-only, fresh throw-away tmpfs over
    the shared scratch places and the terminals (:data:`SCRATCH`). Raises OSError unless ``/`` went
    read-only and every scratch place that exists got its tmpfs."""
    ctypes, libc = _libc()
    for point in _mount_points():
        try:
            flags = os.statvfs(point).f_flag
        except OSError:
            continue  # a mount point hidden under another mount
        kept = sum(ms for st, ms in _KEPT_FLAGS if flags & st)
        error = _mount(libc, ctypes, None, point, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | kept, None)
        if error and point == "/":
            raise OSError(error, "cannot make / read-only")
    for point in SCRATCH:
        if os.path.isdir(point):
            flags = _MS_NOSUID | _MS_NODEV | (_MS_RDONLY if point.startswith("/dev/") and point != "/dev/shm" else 0)
            error = _mount(libc, ctypes, "tmpfs", point, "tmpfs", flags, "size=16m,mode=1777")
            if error:
                raise OSError(error, f"cannot mount a private {point}")
    probe = "/tmp/.bugfix_gym_probe"
    with open(probe, "w"):  # the scratch space is writable ...
        pass
    os.unlink(probe)
    if not os.statvfs("/").f_flag & os.ST_RDONLY:  # ... and / is not
        raise OSError("/ is still writable")


def _encode(outcome: execution.Outcome, budget: int) -> str:
    kind, payload = outcome
    if kind == "raised":
        return json.dumps(["raised", payload])
    if not execution.is_plain(payload):
        return json.dumps(["type", execution.safe_name(type(payload).__name__) or "object"])
    try:
        text = json.dumps(payload)
    except (ValueError, RecursionError, MemoryError):  # e.g. an int over the digit limit of str()
        return '["big"]'
    return f'["value", {text}]' if len(text) <= min(MAX_VALUE_CHARS, budget) else '["big"]'


def _work(mode: str, timeout_s: float, memory_mb: int, report_bytes: int, request: dict) -> None:
    """Apply limits, drop privileges, call the function on every argument list, write the report, exit."""
    import resource

    try:
        _limit(resource, "RLIMIT_AS", memory_mb * 1024 * 1024)
        _limit(resource, "RLIMIT_CPU", int(timeout_s) + 1)
        _limit(resource, "RLIMIT_FSIZE", 1024 * 1024)
        _limit(resource, "RLIMIT_CORE", 0)
        _limit(resource, "RLIMIT_NPROC", 0)  # no new processes: honoured for every uid but 0
        if mode != "plain":
            _no_new_privileges()  # before setuid: as nobody, ctypes may not be importable
        if mode == "namespace":
            _drop_capabilities()
        elif mode == "uid":
            os.setgroups([])
            os.setgid(UNPRIVILEGED_UID)
            os.setuid(UNPRIVILEGED_UID)
    except Exception:  # noqa: BLE001 - no limits, no task code
        os._exit(SETUP_FAILED)
    report = os.dup(1)  # keep the real stdout for the report ...
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # ... and give task code nothing to read and nowhere visible to print
        os.dup2(devnull, fd)
    os.close(devnull)

    name, arg_lists = request["name"], request["args"]
    try:
        func, reset = execution.compile_function(request["source"], name)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - task code may raise anything
        text = json.dumps({"load_error": execution.error_name(exc), "outcomes": []})
    else:
        sys.setrecursionlimit(max(sys.getrecursionlimit(), 1000))
        budget = report_bytes - 64 * len(arg_lists) - 64
        parts = []
        for args in arg_lists:
            part = _encode(execution.call_one(func, reset, args), budget)
            budget -= len(part)
            parts.append(part)
        text = '{"load_error": null, "outcomes": [' + ", ".join(parts) + "]}"
    data = text.encode()
    while data:
        data = data[os.write(report, data):]
    os._exit(0)  # skip interpreter teardown: task code may have left threads or atexit hooks


def _init(mode: str, *limits) -> None:
    """Namespace init: fork the worker, wait for it, exit with its status (the kernel then empties the namespace)."""
    for sig in (signal.SIGINT, signal.SIGTERM):  # init gets no signal from inside its namespace without a handler
        signal.signal(sig, signal.SIG_DFL)
    try:
        _private_filesystem()
        os.chdir("/tmp")
    except Exception:  # noqa: BLE001 - no private filesystem, no task code
        os._exit(SETUP_FAILED)
    worker = os.fork()
    if worker == 0:
        _work(mode, *limits)
    _, status = os.waitpid(worker, 0)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


def main(argv: list[str]) -> None:
    mode, timeout_s, memory_mb, report_bytes = argv[0], float(argv[1]), int(argv[2]), int(argv[3])
    request = json.loads(sys.stdin.buffer.read())
    if mode == "namespace":
        _init(mode, timeout_s, memory_mb, report_bytes, request)
    _work(mode, timeout_s, memory_mb, report_bytes, request)


if __name__ == "__main__":
    main(sys.argv[1:])
