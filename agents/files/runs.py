"""Training runs that survive faults: unique run folders, per-iteration snapshots, resume, memory checks.

A run folder holds ``run.json`` (what was asked: the command's arguments), ``tokenppo.zip``
(the model, :mod:`agents.files.checkpoint`) and, for a run that stopped early, ``resume.json``: the
rest of the training state at the end of the last finished iteration — the sampler's and the
envs' episodes in progress, the envs' random generators, the sampling and minibatch generators.
With both, a resumed run continues exactly as the uninterrupted run would have.

:class:`Snapshots` is an SB3 callback that copies that state in memory at the start of every
iteration (after the previous update), so Ctrl-C or a diverged update can save the last good
iteration without re-running anything.
"""

from __future__ import annotations

import copy
import json
import pathlib
import time
from typing import Any, Protocol

from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.monitor import Monitor

from agents.files.checkpoint import ParameterSnapshot, atomic_write
from agents.files.stops import signals_deferred

MODEL_FILE, RUN_FILE, RESUME_FILE = "tokenppo.zip", "run.json", "resume.json"


class TokenAlgorithm(Protocol):
    """What a run needs of a token algorithm (:class:`agents.algorithms.on_policy.TokenOnPolicyAlgorithm`):
    SB3's algorithm, its training progress and its sampling state, all public methods."""

    env: Any
    policy: Any

    def save(self, path: Any) -> None: ...
    def training_progress(self) -> dict[str, Any]: ...
    def set_training_progress(self, progress: dict[str, Any]) -> None: ...
    def sampling_state(self) -> dict[str, Any]: ...
    def set_sampling_state(self, state: dict[str, Any]) -> None: ...


def new_run_dir(root: str | pathlib.Path = "runs", prefix: str = "tokenppo") -> pathlib.Path:
    """A new, empty folder ``root/prefix-<date>-<time>[-k]``; two runs started in the same second get
    different folders (created atomically, so concurrent runs cannot share one)."""
    root = pathlib.Path(root)
    root.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime(f"{prefix}-%Y%m%d-%H%M%S")
    for k in range(1, 10_000):
        path = root / (stamp if k == 1 else f"{stamp}-{k}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"could not create a new run folder under {root}")


# ---------------------------------------------------------------------- reading a run folder (data, never orders)
MAX_RUN_FILE_BYTES = 256 * 2**20  # run.json / resume.json
#: the most envs a run steps in lockstep (``train --n-envs``'s bound, checked again when run.json is read)
MAX_N_ENVS = 1024
_SETTINGS = {"n_envs": (int, 1, MAX_N_ENVS), "seed": (int, 0, 2**32 - 1), "eval_episodes": (int, 1, 10_000)}
_PPO = {"n_episodes": (int, 1, 10**7), "n_minibatches": (int, 1, 10**7)}
_OPTIONAL = ("n_minibatches",)  # Reinforce's runs have none


def _no_constant(text: str) -> Any:
    raise ValueError(f"{text} is not a JSON number")


def read_run_file(path: pathlib.Path) -> dict[str, Any]:
    """A run folder's JSON file (``run.json``, ``resume.json``) as an object: a regular file (a FIFO or a
    device is refused before it is opened), at most :data:`MAX_RUN_FILE_BYTES`, plain JSON (no
    ``Infinity`` / ``NaN``). Raises ``ValueError`` (one line) or ``OSError``.

    :param path: the file
    """
    import os
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))  # a FIFO opens without blocking
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{path.name} is not a regular file")
        if info.st_size > MAX_RUN_FILE_BYTES:
            raise ValueError(f"{path.name} is larger than {MAX_RUN_FILE_BYTES // 2**20} MiB")
        blob = f.read(MAX_RUN_FILE_BYTES + 1)
    try:
        data = json.loads(blob.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ValueError(f"{path.name} is not JSON ({type(e).__name__})") from None
    if type(data) is not dict:
        raise ValueError(f"{path.name} is not a JSON object")
    return data


def check_run_settings(settings: dict[str, Any]) -> None:
    """The entries of ``run.json`` that size the run, checked before anything is built (``ValueError``, one line)."""
    for where, table in ((settings, _SETTINGS), (settings.get("ppo"), _PPO)):
        if type(where) is not dict:
            raise ValueError("run.json has no 'ppo' object")
        for key, (kind, low, high) in table.items():
            if key in _OPTIONAL and key not in where:
                continue
            value = where.get(key)
            if type(value) is not kind or not low <= value <= high:
                raise ValueError(f"run.json's {key!r} is not a whole number from {low} to {high}")
    for key, kinds in (("tensorboard", (bool,)), ("env", (dict,)), ("tasks", (str,)),
                       ("validation", (dict, type(None)))):
        if type(settings.get(key)) not in kinds:
            raise ValueError(f"run.json's {key!r} is missing or of the wrong type")


def check_resume_state(state: dict[str, Any]) -> None:
    """The shape of ``resume.json`` (``ValueError``, one line); each env's own state is checked by its ``set_state``."""
    kinds = {"envs": (list, type(None)), "sampler": (list, dict, type(None)), "sample_generator": (list,),
             "shuffle_rng": (dict, type(None)), "monitor_rewards": (list, type(None))}
    for key, allowed in kinds.items():
        if type(state.get(key)) not in allowed:
            raise ValueError(f"resume.json's {key!r} is missing or of the wrong type")


# ---------------------------------------------------------------------- training state
def training_state(algo: TokenAlgorithm) -> dict[str, Any]:
    """Everything besides the model file that decides how training continues, as JSON data: the
    algorithm's sampling state and the envs' own (episodes in progress, random generators)."""
    envs = algo.env.env_method("get_state") if algo.env is not None else None
    monitored = algo.env is not None and all(algo.env.env_is_wrapped(Monitor))
    return {
        **algo.sampling_state(),
        "envs": envs,
        "monitor_rewards": [list(map(float, r)) for r in algo.env.get_attr("rewards")] if monitored else None,
    }


def restore_training_state(algo: TokenAlgorithm, state: dict[str, Any]) -> None:
    """Put back what :func:`training_state` returned (the envs must be the same kind and number)."""
    if state["envs"] is not None:
        if algo.env is None or algo.env.num_envs != len(state["envs"]):
            raise ValueError("the run's saved env states do not fit this env (another number of envs)")
        algo.env.reset()  # the wrappers' own bookkeeping (Monitor, OrderEnforcing) starts an episode ...
        for i, env_state in enumerate(state["envs"]):  # ... which then becomes the saved one
            algo.env.env_method("set_state", env_state, indices=[i])
            if state.get("monitor_rewards") is not None:
                algo.env.set_attr("rewards", list(state["monitor_rewards"][i]), indices=[i])
    algo.set_sampling_state(state)


class Snapshots(BaseCallback):
    """Keep, in memory, the state at the start of the latest iteration (the end of the previous one).

    :meth:`save` writes it to a run folder: ``tokenppo.zip`` + ``resume.json``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.last: dict[str, Any] | None = None

    def _on_rollout_start(self) -> None:
        self.take()

    def _on_step(self) -> bool:
        return True

    @property
    def algo(self) -> TokenAlgorithm:
        return self.model  # type: ignore[return-value]  # the callback runs inside a token algorithm's learn()

    def take(self) -> None:
        """Copy the weights, the optimizer, the training progress and the training state."""
        algo = self.algo
        self.last = {
            "weights": ParameterSnapshot(algo.policy),
            "progress": copy.deepcopy(algo.training_progress()),
            "training": copy.deepcopy(training_state(algo)),
        }

    @property
    def iteration(self) -> int:
        """The iteration the snapshot was taken at (its updates done)."""
        return 0 if self.last is None else int(self.last["progress"]["counters"]["iteration"])

    def save(self, run_dir: str | pathlib.Path) -> pathlib.Path:
        """Write the snapshot as the run's model and resume state; returns the model path."""
        if self.last is None:
            raise RuntimeError("no snapshot taken yet")
        algo, snap = self.algo, self.last
        snap["weights"].restore()  # training stops here: roll back to the snapshot
        algo.set_training_progress(snap["progress"])
        run_dir = pathlib.Path(run_dir)
        path = run_dir / MODEL_FILE
        with signals_deferred():  # a Ctrl-C or SIGTERM now arrives once both files are written
            atomic_write(path, algo.save)
            atomic_write(run_dir / RESUME_FILE, lambda f: f.write(json.dumps(snap["training"]).encode()))
        return path


# ---------------------------------------------------------------------- memory
def available_memory_bytes() -> int | None:
    """``MemAvailable`` from ``/proc/meminfo`` (None where it cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def estimate_memory_bytes(n_episodes: int, n_envs: int, max_len: int, d_model: int, n_layer: int,
                          vocab_size: int, minibatch: int) -> int:
    """A generous estimate of the peak memory of one TokenPPO iteration, from its sizes.

    Per stored episode: Python lists while sampling and the padded ``[N, T]`` tensors of the
    buffer (~12 fields); per minibatch: the activations kept for backward (~24 floats per layer
    and width per token) plus the logits at policy positions; per env: its KV cache.
    """
    episode = max_len * (6 * 64 + 12 * 4)
    minibatch_activations = minibatch * max_len * (24 * d_model * n_layer + vocab_size) * 4
    kv = n_envs * n_layer * 2 * max_len * d_model * 4
    return n_episodes * episode + 3 * minibatch_activations + kv + 200 * 2**20
