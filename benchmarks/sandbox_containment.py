"""What an adversarial pack can still do in each isolation mode, tried for real on this machine.

    python benchmarks/sandbox_containment.py            # every mode this user can run
    python benchmarks/sandbox_containment.py --markdown # the table for docs/environment.md

Each probe is one pack function run by :func:`bugfix_gym.execution.sandbox.run_cases_sandboxed`; it returns
what it managed, and the table prints ``contained`` or ``DONE`` per mode. The script loads only
``sandbox.py`` and ``execution.py`` (standard library), so it also runs under a system Python as
an unprivileged user, e.g. ``setpriv --reuid 65534 --regid 65534 --clear-groups python3 ...``
(the folders it makes live in a fresh temporary folder; nothing outside is written). As root, ``plain``
mode is run with ``ALLOW_ROOT_PLAIN`` set, to show what it would allow.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import types
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "bugfix_gym"
if "bugfix_gym" not in sys.modules:  # the sandbox alone: no numpy or gymnasium needed
    stub = types.ModuleType("bugfix_gym")
    stub.__path__ = [str(PACKAGE)]  # type: ignore[attr-defined]
    sys.modules["bugfix_gym"] = stub
from bugfix_gym.execution import sandbox  # noqa: E402

TRY = ("def f(kind, arg):\n    import os\n    try:\n{body}\n        return 'DONE'\n"
       "    except ImportError:\n        return 'untried: the module does not import'\n"
       "    except Exception:\n        return 'contained'\n")
PROBES = {  # what the pack code tries -> (the body of the try, its argument)
    "write into a folder only the caller may write (0700)": ("        open(arg + '/planted', 'w').close()", "private"),
    "write into the package source": ("        open(arg + '/planted.pth', 'w').close()", str(PACKAGE)),
    "read /etc/shadow": ("        open(arg).read(1)", "/etc/shadow"),
    "open a /proc/sys file for writing": ("        os.close(os.open(arg, os.O_WRONLY))",
                                          "/proc/sys/kernel/core_pattern"),
    "open a cgroup file for writing": ("        os.close(os.open(arg, os.O_WRONLY))", "/sys/fs/cgroup"),
    "connect to a host Unix socket": ("        import socket\n        socket.socket(socket.AF_UNIX).connect(arg)",
                                      "socket"),
    "write to the caller's terminal": ("        os.write(os.open(arg, os.O_WRONLY | os.O_NOCTTY), b'\\x1b[2J')", "tty"),
    "connect to TCP on the host's 127.0.0.1": (
        "        import socket\n        socket.create_connection(('127.0.0.1', int(arg)), 2)", "port"),
    "signal the env process (kill 0)": (f"        os.kill({os.getpid()}, 0)", ""),
    "start a process": ("        pid = os.fork()\n        if pid == 0:\n            os._exit(0)\n"
                        "        os.waitpid(pid, 0)", ""),
    "leave a file in /tmp for a later run": ("        open('/tmp/bugfix_gym_left', 'a').close()\n"
                                             "        assert os.path.exists('/tmp/bugfix_gym_seen')", ""),
}


def _cgroup_file() -> str:
    for root, _, files in os.walk("/sys/fs/cgroup"):
        for name in files:
            if name in ("cgroup.procs", "tasks"):
                return os.path.join(root, name)
    return "/sys/fs/cgroup/none"


def _arguments(scratch: Path, port: int, unix: str, tty: str) -> dict[str, str]:
    private = scratch / "private"
    private.mkdir(mode=0o700)
    return {"private": str(private), "socket": unix, "tty": tty, "port": str(port), "/sys/fs/cgroup": _cgroup_file()}


def run(modes: list[str]) -> dict[str, dict[str, str]]:
    """Probe -> mode -> ``contained`` | ``DONE`` | why it could not run."""
    sandbox.ALLOW_ROOT_PLAIN = True
    table: dict[str, dict[str, str]] = {probe: {} for probe in PROBES}
    with tempfile.TemporaryDirectory() as folder, socket.socket() as server, \
            socket.socket(socket.AF_UNIX) as unix:
        scratch = Path(folder)
        scratch.chmod(0o755)
        server.bind(("127.0.0.1", 0))
        server.listen()
        unix.bind(str(scratch / "host.sock"))
        unix.listen()
        os.chmod(scratch / "host.sock", 0o777)
        leader, follower = os.openpty()
        tty = os.ttyname(follower)
        args = _arguments(scratch, server.getsockname()[1], str(scratch / "host.sock"), tty)
        for mode in modes:
            for probe, (body, arg) in PROBES.items():
                value = args.get(arg, arg)
                if probe.startswith("leave"):  # a first run plants a file, the second looks for what the first left
                    sandbox.run_cases_sandboxed("def f(kind, arg):\n    open('/tmp/bugfix_gym_seen', 'a').close()\n"
                                                "    return 0\n", "f", [((probe, value), 0)], isolation=mode)
                report = sandbox.run_cases_sandboxed(TRY.format(body=body), "f", [((probe, value), "contained")],
                                                     isolation=mode)
                text = str(report.first_failure)
                table[probe][mode] = "contained" if report.ok else "DONE" if "got 'DONE'" in text else \
                    "untried (no socket module)" if "untried" in text else text
            for left in ("/tmp/bugfix_gym_left", "/tmp/bugfix_gym_seen"):  # what uid / plain mode left on the host
                if os.path.exists(left):
                    os.unlink(left)
        os.close(leader)
        os.close(follower)
    return table


def main(argv: list[str] | None = None) -> dict[str, dict[str, str]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = parser.parse_args(argv)
    root = os.geteuid() == 0
    modes = [m for m in ("namespace", "uid", "plain") if m != "uid" or root]
    if sandbox.available_isolation() != "namespace":
        modes.remove("namespace")
    table = run(modes)
    who = "root" if root else f"uid {os.geteuid()}"
    if args.markdown:
        print(f"| as {who}, pack code tries to ... | " + " | ".join(modes) + " |")
        print("|---|" + "---|" * len(modes))
    for probe, row in table.items():
        cells = [row[m] for m in modes]
        print(f"| {probe} | " + " | ".join(cells) + " |" if args.markdown else f"{probe:55s} " + "  ".join(cells))
    return table


if __name__ == "__main__":
    main()
