"""A normal client's latency on ``bugfix-gym serve`` before and during a bounded flood, on loopback only.

    python benchmarks/serve_flood.py                         # 10000 flood requests, 60 slow connections
    python benchmarks/serve_flood.py --flood 200 --slow 20 --baseline 20     # a quick run

The server is ``bugfix-gym serve`` itself, in a child process on 127.0.0.1 (port 0) with its default limits
(16 connections, requests taking the model in arrival order, a 30 s request deadline; docs/serve.md
"Security"), serving a TinyAgent of the behaviour-cloned base agent. The normal client sends one greedy chat at a time
on one keep-alive connection, as an OpenAI client does. Three phases, each stopping by itself:

1. **before**: ``--baseline`` requests of the normal client alone;
2. **fast flood**: ``--flood`` requests counted out among ``--procs`` processes of ``--threads`` threads each,
   every request on a new connection, as fast as the server answers; the normal client keeps sending
   until the last flood request is answered;
3. **slow flood**: ``--slow`` connections that each send their headers and half a 1 MiB body, then stop;
   the server cuts them at its request deadline (``--deadline`` here) or refuses them at its connection cap;
   the normal client keeps sending until every slow connection is closed.

The flood's answers are counted (200, 503, and connections reset before an answer) and so are the normal
client's. Nothing is left running: the flood ends with its count, and the server is stopped with SIGINT
(killed if it does not stop).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _chat_body(prompt: str) -> bytes:
    return json.dumps({"model": "bench", "messages": [{"role": "user", "content": prompt}],
                       "temperature": 0}).encode()


def _flood_worker(host: str, port: int, body: bytes, count: int, threads: int) -> dict[str, int]:
    """``count`` requests from ``threads`` threads, each on a new connection: the tally of their answers."""
    lock = threading.Lock()
    left = [count]
    tally: dict[str, int] = {}

    def one() -> None:
        while True:
            with lock:
                if left[0] == 0:
                    return
                left[0] -= 1
            try:
                connection = http.client.HTTPConnection(host, port, timeout=60)
                connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
                key = str(connection.getresponse().status)
                connection.close()
            except OSError:
                key = "reset"
            with lock:
                tally[key] = tally.get(key, 0) + 1

    workers = [threading.Thread(target=one) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return tally


def _slow_worker(host: str, port: int, count: int) -> dict[str, int]:
    """``count`` connections that each send headers and half a 1 MiB body, then wait for the server to act."""
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {1 << 20}\r\n\r\n").encode()
    socks, tally = [], {}
    for _ in range(count):
        try:
            sock = socket.create_connection((host, port), timeout=120)
            sock.sendall(head + b" " * (1 << 19))
            socks.append(sock)
        except OSError:
            tally["reset"] = tally.get("reset", 0) + 1
    for sock in socks:
        try:
            first = sock.recv(64)
            key = first.split(b" ")[1].decode() if first.startswith(b"HTTP/") else "closed"
        except OSError:
            key = "reset"
        tally[key] = tally.get(key, 0) + 1
        sock.close()
    return tally


def _start_worker(*args: Any) -> subprocess.Popen:
    """A flood process: this file run as ``--worker fast|slow HOST PORT COUNT [THREADS]``; its tally is its output."""
    return subprocess.Popen([sys.executable, __file__, "--worker", *map(str, args)], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT)


def _tally(process: subprocess.Popen) -> dict[str, int]:
    out, _ = process.communicate(timeout=600)
    return json.loads(out)


class Client:
    """The normal client: one keep-alive connection, one request at a time, reconnecting when closed."""

    def __init__(self, host: str, port: int, body: bytes):
        self.host, self.port, self.body = host, port, body
        self.connection: http.client.HTTPConnection | None = None

    def request(self) -> tuple[str, float]:
        started = time.perf_counter()
        try:
            if self.connection is None:
                self.connection = http.client.HTTPConnection(self.host, self.port, timeout=120)
            self.connection.request("POST", "/v1/chat/completions", self.body, {"Content-Type": "application/json"})
            answer = self.connection.getresponse()
            answer.read()
            status = str(answer.status)
            if answer.getheader("Connection", "").lower() == "close":
                self.close()
        except OSError:
            self.close()
            status = "reset"
        return status, time.perf_counter() - started

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None


def _while(client: Client, running: Any) -> dict[str, Any]:
    """The normal client's requests while ``running()``: the latencies of its 200s and a tally of the rest."""
    latencies, tally = [], {}
    while running():
        status, seconds = client.request()
        tally[status] = tally.get(status, 0) + 1
        if status == "200":
            latencies.append(seconds)
    return {"latencies": latencies, "tally": tally}


def _summary(name: str, phase: dict[str, Any]) -> str:
    lat = sorted(phase["latencies"])
    if not lat:
        return f"{name:12s} no request answered 200; {phase['tally']}"
    p95 = lat[min(len(lat) - 1, int(0.95 * len(lat)))]
    tally = ", ".join(f"{k}: {v}" for k, v in sorted(phase["tally"].items()))
    return (f"{name:12s} {len(lat):6d} {statistics.median(lat) * 1e3:12.1f} {p95 * 1e3:10.1f} "
            f"{max(lat) * 1e3:10.1f}   {tally}")


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        import platform

        return platform.processor() or "unknown CPU"


def _model_file(folder: Path) -> Path:
    import gymnasium as gym

    import bugfix_gym
    from agents.algorithms.ppo import TokenPPO
    from agents.bugfix.base_agent import cached_base_agent

    base = cached_base_agent(bugfix_gym.build_tokenizer()).eval()
    model = TokenPPO("TinyAgentPolicy", gym.make("BugFix-v0"), base_agent=base, n_episodes=4, seed=0,
                     policy_kwargs=dict(call_grammar=list(bugfix_gym.CALLS)))
    path = folder / "bench.zip"
    model.save(path)
    return path


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--baseline", type=int, default=100, help="normal requests before the flood (default 100)")
    parser.add_argument("--flood", type=int, default=10000, help="fast flood requests in all (default 10000)")
    parser.add_argument("--procs", type=int, default=2, help="fast flood processes (default 2)")
    parser.add_argument("--threads", type=int, default=32, help="threads per flood process (default 32)")
    parser.add_argument("--slow", type=int, default=60, help="slow connections (default 60)")
    parser.add_argument("--deadline", type=float, default=5.0, help="the server's --request-deadline (default 5)")
    args = parser.parse_args(argv)
    import gymnasium as gym

    import bugfix_gym  # noqa: F401 - registers BugFix-v0

    prompt = gym.make("BugFix-v0").reset(seed=1)[0]
    body = _chat_body(prompt)
    with tempfile.TemporaryDirectory() as folder:
        model = _model_file(Path(folder))
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("BUGFIX_GYM_API_KEY", None)
        server = subprocess.Popen([sys.executable, "-m", "agents.cli", "serve", str(model), "--port", "0",
                                   "--model-name", "bench", "--request-deadline", str(args.deadline)],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT, env=env,
                                  preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            line = server.stdout.readline() if server.stdout else ""
            if " at http://" not in line:
                raise SystemExit(f"the server did not start: {line!r}")
            host, port = line.split(" at http://")[1].split("/")[0].rsplit(":", 1)
            return _measure(args, host, int(port), body)
        finally:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(timeout=30)


def _measure(args: argparse.Namespace, host: str, port: int, body: bytes) -> dict[str, Any]:
    client = Client(host, port, body)
    for _ in range(5):  # warm up
        client.request()
    count = [0]

    def baseline() -> bool:
        count[0] += 1
        return count[0] <= args.baseline

    phases = {"before": _while(client, baseline)}
    shares = [args.flood // args.procs + (i < args.flood % args.procs) for i in range(args.procs)]
    started = time.perf_counter()
    flood = [_start_worker("fast", host, port, n, args.threads) for n in shares]
    try:
        phases["fast flood"] = _while(client, lambda: any(p.poll() is None for p in flood))
        fast_s = time.perf_counter() - started
        fast = _merge(_tally(p) for p in flood)
        slow_proc = _start_worker("slow", host, port, args.slow)
        flood.append(slow_proc)
        phases["slow flood"] = _while(client, lambda: slow_proc.poll() is None)
        slow = _tally(slow_proc)
    finally:
        for p in flood:  # an interrupted run leaves no flood behind
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    count[0] = 0
    phases["after"] = _while(client, baseline)
    client.close()

    print(f"{'normal client':12s} {'200s':>6s} {'median ms':>12s} {'p95 ms':>10s} {'max ms':>10s}   answers")
    for name, phase in phases.items():
        print(_summary(name, phase))
    print(f"\nfast flood: {args.flood} requests from {args.procs} processes x {args.threads} threads, each on a new "
          f"connection, in {fast_s:.1f} s: {', '.join(f'{k}: {v}' for k, v in sorted(fast.items()))}")
    print(f"slow flood: {args.slow} connections sending half of a 1 MiB body: "
          f"{', '.join(f'{k}: {v}' for k, v in sorted(slow.items()))}")
    print(f"server: bugfix-gym serve, default limits, --request-deadline {args.deadline:g}; CPU: {_cpu()}, "
          f"{os.cpu_count()} CPUs, torch threads 1 (serve sets it); load average "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return {"phases": phases, "fast": fast, "slow": slow, "fast_s": fast_s}


def _merge(tallies: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for tally in tallies:
        for key, value in tally.items():
            out[key] = out.get(key, 0) + value
    return out


def _worker(argv: list[str]) -> None:
    """``--worker fast HOST PORT COUNT THREADS`` or ``--worker slow HOST PORT COUNT``: print the tally as JSON."""
    kind, host, port, count = argv[0], argv[1], int(argv[2]), int(argv[3])
    if kind == "fast":
        import gymnasium as gym

        import bugfix_gym  # noqa: F401 - registers BugFix-v0

        body = _chat_body(gym.make("BugFix-v0").reset(seed=1)[0])
        print(json.dumps(_flood_worker(host, port, body, count, int(argv[4]))))
    else:
        print(json.dumps(_slow_worker(host, port, count)))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        _worker(sys.argv[2:])
    else:
        main()
