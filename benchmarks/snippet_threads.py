"""Wall time of the README's and the docs' first code blocks, as written, under each torch thread setting.

    python benchmarks/snippet_threads.py                       # README.md's first block, default / 1 / 2 threads
    python benchmarks/snippet_threads.py --doc docs/ppo.md     # docs/ppo.md's quickstart
    python benchmarks/snippet_threads.py --threads default 1   # only these settings

Each run is a fresh ``python`` process in a fresh temporary folder (the blocks save files in
their working directory) that executes the document's first ```` ```python ```` block. The
settings: ``default`` runs the block untouched (what a reader gets), ``1`` / ``2`` put
``torch.set_num_threads(n)`` before it (a count the reader chose, which the algorithms keep).
The base agent comes from its cache (``BUGFIX_GYM_CACHE``); run the block once before timing it
so that the first setting does not pay for the behaviour cloning. Printed: wall and CPU seconds
per setting, and the load average (on a shared machine the wall time moves with the load).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def first_python_block(doc: pathlib.Path) -> str:
    """The first ```` ```python ```` block of ``doc``."""
    match = re.search(r"```python\n(.*?)```", doc.read_text(), flags=re.S)
    if match is None:
        raise SystemExit(f"{doc} has no ```python block")
    return match.group(1)


def time_block(code: str, threads: str, timeout: float) -> tuple[float, float]:
    """(wall, CPU) seconds one fresh process takes to run ``code`` under the thread setting ``threads``
    (wall inf: stopped at ``timeout``). CPU time counts every thread's work, spinning included."""
    prefix = "" if threads == "default" else f"import torch\ntorch.set_num_threads({int(threads)})\n"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with tempfile.TemporaryDirectory() as tmp:
        start, cpu = time.perf_counter(), _children_cpu()
        try:
            subprocess.run([sys.executable, "-c", prefix + code], cwd=tmp, env=env, check=True, timeout=timeout,
                           stdout=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return float("inf"), float("nan")
        return time.perf_counter() - start, _children_cpu() - cpu


def _children_cpu() -> float:
    """User + system seconds of this process's finished children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` says."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--doc", default="README.md", help="the document whose first python block is timed")
    parser.add_argument("--threads", nargs="+", default=["default", "1", "2"], help="'default' and/or counts")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds before a run is abandoned")
    args = parser.parse_args()
    code = first_python_block(ROOT / args.doc)
    print(f"{args.doc}'s first python block; {cpu_model()}, {os.cpu_count()} logical CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    for threads in args.threads:
        seconds, cpu = time_block(code, threads, args.timeout)
        shown = f"{seconds:7.1f} s wall, {cpu:6.1f} s CPU" if seconds != float("inf") else \
            f"> {args.timeout:.0f} s (stopped)"
        print(f"  threads {threads:>7}: {shown}  (load average {os.getloadavg()[0]:.1f})", flush=True)


if __name__ == "__main__":
    main()
