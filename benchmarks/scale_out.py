"""Env steps/s and TokenPPO iteration time of DummyVecEnv, SubprocVecEnv and RayVecEnv at 1-8 workers.

    python benchmarks/scale_out.py                      # default: 1 2 4 8 workers, latency 0 and 20 ms
    python benchmarks/scale_out.py --seconds 1 --workers 1 2 --latencies-ms 0 20 --tokenppo-iterations 0

Every backend steps ``n`` copies of BugFix-v0's ``DiscreteCalls`` view (``n`` = workers;
one process per env for ``SubprocVecEnv`` and ``RayVecEnv``, all in this process for
``DummyVecEnv``) for a fixed wall-clock time per cell, measured side by side in one run.
``tool_latency_s`` (a sleep per ``test`` / ``submit`` call, standing in for a container)
is set in the running envs with ``env_method("set_wrapper_attr", ...)``, so one build of
each vector env serves every latency. Two fixed action streams, both far cheaper than an
env step:

* ``aligned``: every env plays the same cycling script of calls, so in each vector step
  all envs sleep, or none does: the parallelism the backend gives;
* ``independent``: each env plays random legal calls from its own seeded generator, as
  independent policies would: a synchronous ``step_wait`` waits for the slowest env, so
  latency calls that fall on different steps add up.

Speed-up is steps/s over the same backend's steps/s at 1 worker. With latency, the row
"lockstep bound" is the speed-up a synchronous vector env of parallel workers would get if
sleeping were its only cost (n x the fraction of env steps that sleep / the fraction of
vector steps in which any env sleeps, the row "sleeping env/vec"), counted from the calls
played in the longest run of that stream and worker count. The goal
checked at the end: with latency, speed-up >= 0.7 x workers for every worker count up to
this machine's cores, for SubprocVecEnv and RayVecEnv.

The second table times ``TokenPPO.learn`` iterations on each backend (plain text BugFix-v0
in SB3's ``Monitor``, the base agent's weights, the same latencies): the rollout (the
sampler playing the policy until ``n_episodes`` episodes end) and the update, separately.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv

from bugfix_gym import CALLS
from bugfix_gym.views.text_wrappers import ToolLatency
from bugfix_gym.views.wrappers import DiscreteCalls

if TYPE_CHECKING:
    from agents import TokenPPO

BACKENDS = ("DummyVecEnv", "SubprocVecEnv", "RayVecEnv", "RayVecEnv-async")  # async: send / receive
STREAMS = ("aligned", "independent")
SCRIPT = [CALLS.index(c) for c in ("read", "test", "edit fix_comparison", "edit fix_init", "revert", "submit")]
LATENCY_CALLS = [CALLS.index("test"), CALLS.index("submit")]  # the calls that sleep tool_latency_s


def make_env() -> gym.Env:
    """One BugFix-v0 in the ``DiscreteCalls`` view (latency is set later, in the running env's ``ToolLatency``)."""
    return DiscreteCalls(ToolLatency(gym.make("bugfix_gym:BugFix-v0")))


def make_text_env() -> gym.Env:
    """One plain (text) BugFix-v0 in SB3's ``Monitor``, as TokenPPO trains on it."""
    from stable_baselines3.common.monitor import Monitor

    return Monitor(ToolLatency(gym.make("bugfix_gym:BugFix-v0")))


def build(backend: str, n_workers: int, env_fn: Callable[[], gym.Env] = make_env) -> VecEnv:
    env_fns = [env_fn] * n_workers
    if backend == "DummyVecEnv":
        return DummyVecEnv(env_fns)
    if backend == "SubprocVecEnv":
        return SubprocVecEnv(env_fns)
    from agents import RayVecEnv

    return RayVecEnv(env_fns)  # also for "RayVecEnv-async": the same envs, stepped with send / receive


def action_stream(stream: str, n_envs: int, seed: int = 0) -> Callable[[dict, int], np.ndarray]:
    """``actions(obs, k)`` for vector step ``k``: the scripted or random legal call index per env."""
    if stream == "aligned":
        return lambda obs, k: np.full(n_envs, SCRIPT[k % len(SCRIPT)])
    rngs = [np.random.default_rng([seed, i]) for i in range(n_envs)]
    return lambda obs, k: np.array([rng.choice(np.flatnonzero(mask)) for rng, mask in zip(rngs, obs["action_mask"])])


@dataclass
class Cell:
    """One measurement: env steps/s, and how the latency calls fell on the vector steps timed."""

    steps_per_s: float
    n_envs: int
    n_vector_steps: int
    env_sleep_frac: float  # env steps that were test / submit
    vector_sleep_frac: float  # vector steps in which at least one env called test / submit

    def lockstep_bound(self) -> float:
        """Speed-up over one env if sleeping were the only cost (a vector step lasts one sleep if any env sleeps)."""
        return self.n_envs * self.env_sleep_frac / self.vector_sleep_frac if self.vector_sleep_frac else float("nan")


def measure_async(vec: VecEnv, stream: str, tool_latency_s: float, seconds: float) -> Cell:
    """Like :func:`measure`, but every env steps as soon as its previous step is back (``send`` /
    ``receive``): each env plays its own stream (its own script position, or its own random calls)."""
    vec.env_method("set_wrapper_attr", "tool_latency_s", tool_latency_s)
    vec.seed(0)
    obs = vec.reset()
    n = vec.num_envs
    streams = [action_stream(stream, 1, seed=i) for i in range(n)]
    masks = {i: obs["action_mask"][i: i + 1] for i in range(n)}
    position = [0] * n

    def send(rows: list[int]) -> int:
        acts = [int(streams[i]({"action_mask": masks[i]}, position[i])[0]) for i in rows]
        for i in rows:
            position[i] += 1
        vec.send(rows, acts)
        return sum(a in LATENCY_CALLS for a in acts)

    send(list(range(n)))
    steps, sleeps = 0, 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        rows, obs, *_ = vec.receive()
        for k, i in enumerate(rows):
            masks[i] = obs["action_mask"][k: k + 1]
        steps += len(rows)
        sleeps += send(rows)
    vec.receive()  # let the last steps finish
    return Cell(steps / elapsed, n, steps, sleeps / max(steps, 1), float("nan"))


def measure(vec: VecEnv, stream: str, tool_latency_s: float, seconds: float) -> Cell:
    """Step ``vec`` for ``seconds`` after a short warm-up; env steps/s = vector steps x envs / time."""
    vec.env_method("set_wrapper_attr", "tool_latency_s", tool_latency_s)
    vec.seed(0)
    obs = vec.reset()
    actions = action_stream(stream, vec.num_envs)
    for k in range(2 * len(SCRIPT)):  # warm caches, pipes and actors
        obs, *_ = vec.step(actions(obs, k))
    k, env_sleeps, vector_sleeps = 0, 0, 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        act = actions(obs, k)
        sleeps = np.isin(act, LATENCY_CALLS)  # [n_envs]
        env_sleeps, vector_sleeps = env_sleeps + int(sleeps.sum()), vector_sleeps + int(sleeps.any())
        obs, *_ = vec.step(act)
        k += 1
    return Cell(k * vec.num_envs / elapsed, vec.num_envs, k, env_sleeps / (k * vec.num_envs), vector_sleeps / k)


class IterationClock(BaseCallback):
    """Marks the start and end of every rollout of ``learn`` (SB3's callback hooks)."""

    def __init__(self) -> None:
        super().__init__()
        self.starts: list[float] = []
        self.ends: list[float] = []

    def _on_rollout_start(self) -> None:
        self.starts.append(time.perf_counter())

    def _on_rollout_end(self) -> None:
        self.ends.append(time.perf_counter())

    def _on_step(self) -> bool:
        return True


def tokenppo_iteration_seconds(model: TokenPPO, tool_latency_s: float, n_iterations: int) -> tuple[float, float]:
    """Mean wall-clock seconds of a ``TokenPPO.learn`` iteration on ``model.env``: (rollout, update).

    ``tool_latency_s`` is set in the running envs first; one warm-up iteration is run and
    not counted. The rollout is the sampler playing the policy in the vector env until
    ``n_episodes`` episodes have finished (policy forward passes plus env steps); the update
    is everything between the end of one rollout and the start of the next (PPO epochs).
    """
    from agents.algorithms.callbacks import StopAfterIterations

    model.env.env_method("set_wrapper_attr", "tool_latency_s", tool_latency_s)
    clock = IterationClock()
    model.learn(total_timesteps=10**9, callback=[StopAfterIterations(1 + n_iterations), clock])
    rollouts = [end - start for start, end in zip(clock.starts[1:], clock.ends[1:])]
    updates = [start - end for end, start in zip(clock.ends[1:], clock.starts[2:])]
    return float(np.mean(rollouts)), float(np.mean(updates))


def tokenppo_table(backends: list[str], workers: list[int], latencies_ms: list[float], n_episodes: int,
                   n_iterations: int) -> dict:
    """``results[latency_ms][backend][n_workers] = (rollout_s, update_s)`` of TokenPPO on text BugFix-v0."""
    from agents import TokenPPO

    results: dict = {lat: {b: {} for b in backends} for lat in latencies_ms}
    for backend in backends:
        for n in workers:
            vec = build(backend, n, make_text_env)
            model = TokenPPO("TinyAgentPolicy", vec, n_episodes=n_episodes, seed=0, critic_warmup_steps=0,
                             async_envs=backend.endswith("async"))
            for lat in latencies_ms:
                results[lat][backend][n] = tokenppo_iteration_seconds(model, lat / 1000, n_iterations)
            vec.close()
            print(f"  measured TokenPPO on {backend} x {n}", flush=True)
    return results


def print_tokenppo_table(results: dict, n_episodes: int, n_iterations: int) -> None:
    """Per latency, backends x workers: rollout + update seconds."""
    print(f"\nTokenPPO iteration time, rollout + update in seconds (mean of {n_iterations} iterations after a "
          f"warm-up one; {n_episodes} episodes per iteration, text BugFix-v0 in Monitor, base agent weights)")
    for lat, rows in results.items():
        workers = sorted(next(iter(rows.values())))
        print(f"\ntool latency {lat:g} ms")
        print(f"{'backend':16s}" + "".join(f"{f'{w} worker' + ('s' if w > 1 else ''):>20s}" for w in workers))
        for backend, cells in rows.items():
            print(f"{backend:16s}" + "".join(f"{f'{r:.2f} + {u:.2f}':>20s}" for r, u in cells.values()))


def print_table(title: str, rows: dict[str, dict[int, Cell]], calls: dict[int, Cell] | None) -> None:
    """Backends x workers: steps/s (speed-up over the backend's first worker count); then, with latency,
    the lockstep bound and the share of env steps / vector steps that sleep, from ``calls``."""
    workers = sorted(next(iter(rows.values())))
    print(f"\n{title}")
    print(f"{'backend':16s}" + "".join(f"{f'{w} worker' + ('s' if w > 1 else ''):>20s}" for w in workers))
    for backend, by_workers in rows.items():
        base = by_workers[workers[0]].steps_per_s
        print(f"{backend:16s}" + "".join(f"{f'{c.steps_per_s:,.0f} ({c.steps_per_s / base:.2f}x)':>20s}"
                                         for c in by_workers.values()))
    if calls is not None:
        print(f"{'lockstep bound':16s}" + "".join(f"{f'({calls[w].lockstep_bound():.2f}x)':>20s}" for w in workers))
        print(f"{'sleeping env/vec':16s}" + "".join(
            f"{f'{calls[w].env_sleep_frac:.0%} / {calls[w].vector_sleep_frac:.0%}':>20s}" for w in workers))


def longest_runs(results: dict, stream: str) -> dict[int, Cell]:
    """Per worker count, the cell of ``stream`` with the most vector steps, over every latency and backend.

    Every backend and latency plays the same calls (same seeds), so the longest run gives
    the best count of how the latency calls fall.
    """
    cells = [c for by_stream in results.values() for by_workers in by_stream[stream].values()
             for c in by_workers.values() if c.vector_sleep_frac == c.vector_sleep_frac]  # lockstep cells only
    return {n: max((c for c in cells if c.n_envs == n), key=lambda c: c.n_vector_steps)
            for n in {c.n_envs for c in cells}}


def check_goal(results: dict, backends: list[str], workers: list[int], cores: int) -> None:
    """With latency: speed-up >= 0.7 x workers for every worker count up to the cores, per parallel backend."""
    upto = [n for n in workers if 1 < n <= cores]
    parallel = [b for b in ("SubprocVecEnv", "RayVecEnv", "RayVecEnv-async") if b in backends]
    if 1 not in workers or not upto or not parallel:
        return
    print(f"\ngoal: with latency, speed-up over 1 worker >= 0.7 x workers up to {cores} workers (the cores here)")
    for lat in [x for x in results if x > 0]:
        for stream in STREAMS:
            for b in parallel:
                rates = {n: c.steps_per_s for n, c in results[lat][stream][b].items()}
                ups = {n: rates[n] / rates[1] for n in upto}
                detail = ", ".join(f"{n} workers {up:.2f}x (needs {0.7 * n:.1f}x)" for n, up in ups.items())
                met = all(up >= 0.7 * n for n, up in ups.items())
                print(f"  {lat:g} ms, {stream:11s} {b:13s}: {detail}: {'met' if met else 'MISSED'}")


def main(argv: list[str] | None = None) -> dict[str, dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8], help="worker counts (default 1 2 4 8)")
    parser.add_argument("--latencies-ms", type=float, nargs="+", default=[0.0, 20.0],
                        help="tool latency per test/submit call in ms (default 0 20)")
    parser.add_argument("--seconds", type=float, default=2.0, help="stepping time per cell (default 2)")
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--tokenppo-iterations", type=int, default=3,
                        help="timed TokenPPO iterations per cell after a warm-up one; 0 skips that table (default 3)")
    parser.add_argument("--tokenppo-episodes", type=int, default=32, help="TokenPPO n_episodes (default 32)")
    args = parser.parse_args(argv)
    if min(args.workers) < 1 or args.seconds <= 0 or min(args.latencies_ms) < 0:
        parser.error("--workers must be >= 1, --seconds > 0 and --latencies-ms >= 0")
    if args.tokenppo_iterations < 0 or args.tokenppo_episodes < 1:
        parser.error("--tokenppo-iterations must be >= 0 and --tokenppo-episodes >= 1")
    torch.set_num_threads(1)
    cores = os.cpu_count() or 1
    workers = sorted(set(args.workers))
    if any(b.startswith("RayVecEnv") for b in args.backends):
        from agents.rollout.ray_vec_env import init_ray

        init_ray(num_cpus=cores)  # one local session for every RayVecEnv of the run

    # results[latency_ms][stream][backend][n_workers] -> Cell
    results = {lat: {s: {b: {} for b in args.backends} for s in STREAMS} for lat in args.latencies_ms}
    for backend in args.backends:
        for n in workers:
            start = time.perf_counter()
            vec = build(backend, n)
            built = time.perf_counter() - start
            for lat in args.latencies_ms:
                for stream in STREAMS:
                    how = measure_async if backend.endswith("async") else measure
                    results[lat][stream][backend][n] = how(vec, stream, lat / 1000, args.seconds)
            vec.close()
            print(f"  measured {backend} x {n} (built in {built:.1f} s)", flush=True)

    print(f"\nenv steps/s of BugFix-v0 (DiscreteCalls view), in brackets the speed-up over 1 worker; "
          f"{cores} cores, {args.seconds:g} s per cell")
    for lat in args.latencies_ms:
        for stream in STREAMS:
            calls = longest_runs(results, stream) if lat > 0 else None
            print_table(f"tool latency {lat:g} ms, {stream} calls", results[lat][stream], calls)
    check_goal(results, args.backends, workers, cores)

    ppo: dict = {}
    if args.tokenppo_iterations > 0:
        ppo = tokenppo_table(args.backends, workers, args.latencies_ms, args.tokenppo_episodes,
                             args.tokenppo_iterations)
        print_tokenppo_table(ppo, args.tokenppo_episodes, args.tokenppo_iterations)
    return {"env_steps": results, "tokenppo": ppo}


if __name__ == "__main__":
    main()
