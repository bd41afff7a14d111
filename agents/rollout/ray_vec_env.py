"""RayVecEnv: a Stable-Baselines3 ``VecEnv`` whose environments each live in a Ray actor.

The learner stays one process; the environments spread over the cores of this machine or
over the nodes of a Ray cluster. The protocol is SB3's ``SubprocVecEnv`` with a Ray actor
method call in place of each pipe message: ``step_async`` sends every env its action at
once, ``step_wait`` gathers the results with one ``ray.get``; a finished episode is reset
inside the actor, its last observation kept in ``info["terminal_observation"]``; seeds and
options set with ``seed()`` / ``set_options()`` apply at the next ``reset()``.

Text environments work as they are: ``BugFix-v0``'s observations (strings) are stacked into
an ``object`` array of shape ``[n_envs]``, and ``step_async`` takes a list (or array) of
call strings.

Ray core is an optional dependency: ``pip install 'bugfix-gym[ray]'``. A multi-node cluster
is joined with ``address="auto"`` after ``ray start --head`` (see ``docs/scale_out.md``).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvObs, VecEnvStepReturn

from agents.rollout.env_actor import EnvActor, registering_packages


def _import_ray():
    try:
        import ray
    except ImportError as err:
        raise ImportError("RayVecEnv needs Ray core: pip install 'bugfix-gym[ray]'") from err
    return ray


@functools.cache
def _remote_actor_class():
    return _import_ray().remote(EnvActor)


def stack_obs(obs_list: Sequence[Any], space: spaces.Space) -> VecEnvObs:
    """One observation per env -> arrays with the env index first; ``Text`` -> ``object`` array ``[n_envs]``.

    SB3's ``SubprocVecEnv`` stacking, plus ``Text`` spaces (whose observations are strings,
    which ``np.stack`` would turn into a fixed-width unicode array).
    """
    if isinstance(space, spaces.Dict):  # SB3's VecEnvObs: one level of Dict / Tuple of arrays
        return {key: stack_obs([obs[key] for obs in obs_list], sub)  # type: ignore[misc]
                for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(stack_obs([obs[i] for obs in obs_list], sub)  # type: ignore[misc]
                     for i, sub in enumerate(space.spaces))
    if isinstance(space, spaces.Text):
        out = np.empty(len(obs_list), dtype=object)  # [n_envs]
        for i, obs in enumerate(obs_list):
            out[i] = obs
        return out
    return np.stack(obs_list)  # [n_envs, *obs_shape]


def _user_code_paths() -> list[str]:
    """This process's import path outside the Python installation (script and test folders, ``src/``).

    A local session's workers get it, as ``SubprocVecEnv``'s processes do, so ``env_fns``
    defined in any importable module of this process unpickle in the actors.
    """
    install = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})
    return [path for path in dict.fromkeys(os.path.abspath(p) for p in sys.path if p)
            if os.path.isdir(path) and not path.startswith(install)]


def init_ray(address: str | None = None, num_cpus: int | None = None, **init_kwargs: Any) -> None:
    """Start (``address=None``) or join (``address="auto"`` or ``"host:port"``) Ray, unless already initialised.

    A local session is quiet (no dashboard, only errors in the log, not Ray's start-up
    notices), has ``num_cpus`` cores (all of them by default), and its workers import
    from this process's own code folders (:func:`_user_code_paths`). ``init_kwargs`` go
    to ``ray.init`` and override these.
    """
    ray = _import_ray()
    if ray.is_initialized():
        return
    kwargs: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.ERROR}
    if address is None:
        kwargs["num_cpus"] = num_cpus if num_cpus is not None else (os.cpu_count() or 1)
        kwargs["job_config"] = ray.job_config.JobConfig(code_search_path=_user_code_paths())
    elif num_cpus is not None:
        raise ValueError("num_cpus is for a local Ray session; with address= each cluster node declares its "
                         "cores itself (`ray start --num-cpus N`), so leave num_cpus=None")
    kwargs.update(init_kwargs)
    # "local" starts a new instance even if RAY_ADDRESS or an earlier `ray start` points elsewhere
    ray.init(address=address if address is not None else "local", **kwargs)


class RayVecEnv(VecEnv):
    """SB3 ``VecEnv`` with each environment in its own Ray actor (process), on this machine or a cluster.

    Ray is initialised on construction unless it already is (then ``address``, ``num_cpus``
    and ``init_kwargs`` are unused): a new local session by default, or the cluster at
    ``address``; see :func:`init_ray`. ``close()`` ends the actors and leaves Ray running for
    other users in the process (``ray.shutdown()`` ends it; so does the interpreter's exit).
    The environments' code must be importable on every node (install bugfix-gym there).

    :param env_fns: functions that each return a *new* environment; each is called inside its actor
    :param address: ``None`` starts a local Ray session; ``"auto"`` joins the cluster started
        with ``ray start --head`` (or named by ``RAY_ADDRESS``); ``"host:port"`` joins that one
    :param num_cpus: cores of a local session (default: the smaller of ``len(env_fns)`` and
        this machine's cores); only with ``address=None``
    :param actor_options: ``ray.remote`` options for every actor, e.g. ``{"num_cpus": 1}`` to
        reserve a core per env, ``{"resources": {"sandbox": 1}}``, ``{"max_restarts": 2}``;
        by default an actor needs a core to be placed and holds none while it runs, so more
        envs than cores share them (right for envs that mostly wait on tools)
    :param init_kwargs: extra keyword arguments for ``ray.init``
    """

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], address: str | None = None,
                 num_cpus: int | None = None, actor_options: dict[str, Any] | None = None,
                 init_kwargs: dict[str, Any] | None = None):
        if len(env_fns) == 0:
            raise ValueError("RayVecEnv needs at least one env_fn")
        if address is None and num_cpus is None:
            num_cpus = min(len(env_fns), os.cpu_count() or 1)
        init_ray(address, num_cpus, **(init_kwargs or {}))
        self._ray = _import_ray()
        actor_class = _remote_actor_class().options(**(actor_options or {}))
        packages = registering_packages()  # so an env_fn may gym.make an id this process registered
        self.actors = [actor_class.remote(env_fn, packages) for env_fn in env_fns]
        self._pending: list[Any] = []
        self._in_flight: dict[int, Any] = {}  # env index -> step reference (asynchronous stepping)
        self.waiting = False
        self.closed = False
        observation_space, action_space = self._ray.get(self.actors[0].spaces.remote())
        super().__init__(len(env_fns), observation_space, action_space)

    # ------------------------------------------------------------------ stepping
    def step_async(self, actions: np.ndarray | Sequence[Any]) -> None:
        if len(actions) != self.num_envs:
            raise ValueError(f"step_async needs one action per env ({self.num_envs}), got {len(actions)}")
        self._pending = [actor.step.remote(action) for actor, action in zip(self.actors, actions)]
        self.waiting = True

    def step_wait(self) -> VecEnvStepReturn:
        results = self._ray.get(self._pending)
        self._pending, self.waiting = [], False
        obs, rews, dones, infos, reset_infos = zip(*results)
        self.reset_infos = list(reset_infos)
        return stack_obs(obs, self.observation_space), np.stack(rews), np.stack(dones), list(infos)

    # ------------------------------------------------------------------ asynchronous stepping (beyond SB3)
    def send(self, indices: Sequence[int], actions: Sequence[Any]) -> None:
        """Start a step of the envs ``indices`` only (one action each); :meth:`receive` returns the results.

        Each env steps as soon as its action arrives, so a slow tool call in one env does not hold
        the others back (``step_async`` / ``step_wait`` wait for every env at each step). Do not
        mix the two ways within one episode of an env.
        """
        if self.waiting:
            raise RuntimeError("send() while a step_async() is in flight; call step_wait() first")
        for i, action in zip(indices, actions):
            if i in self._in_flight:
                raise RuntimeError(f"env {i} is still stepping; receive() its result first")
            self._in_flight[i] = self.actors[i].step.remote(action)

    def receive(self, timeout: float | None = None) -> tuple[list[int], VecEnvObs, np.ndarray, np.ndarray, list[dict]]:
        """Wait until at least one sent step has finished, and return every finished one.

        :return: ``(indices, observations, rewards, dones, infos)`` of those envs, in ``VecEnv``
            conventions (auto-reset, ``terminal_observation``); empty when nothing is in flight
        """
        if not self._in_flight:
            return [], stack_obs([], self.observation_space), np.zeros(0), np.zeros(0, dtype=bool), []
        refs = list(self._in_flight.values())
        self._ray.wait(refs, num_returns=1, timeout=timeout)
        done_refs, _ = self._ray.wait(refs, num_returns=len(refs), timeout=0)  # everything ready now
        finished = set(done_refs)
        indices = [i for i, ref in self._in_flight.items() if ref in finished]
        results = self._ray.get([self._in_flight.pop(i) for i in indices])
        obs, rews, dones, infos, reset_infos = zip(*results) if results else ((), (), (), (), ())
        for i, info in zip(indices, reset_infos):
            self.reset_infos[i] = info
        return indices, stack_obs(list(obs), self.observation_space), np.array(rews), np.array(dones, dtype=bool), \
            list(infos)

    def reset(self) -> VecEnvObs:
        if self._in_flight:  # finish the steps still running before starting over
            self._ray.get(list(self._in_flight.values()))
            self._in_flight.clear()
        refs = [actor.reset.remote(self._seeds[i], self._options[i]) for i, actor in enumerate(self.actors)]
        obs, reset_infos = zip(*self._ray.get(refs))
        self.reset_infos = list(reset_infos)
        # seeds and options are used once
        self._reset_seeds()
        self._reset_options()
        return stack_obs(obs, self.observation_space)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if not self._ray.is_initialized():  # Ray already shut down: its actors went with it
            return
        errors = self._ray.exceptions.RayError
        try:
            if self.waiting:
                self._ray.get(self._pending)
        except errors:  # a dead actor's step: the others are closed all the same
            pass
        for actor in self.actors:
            try:
                self._ray.get(actor.close.remote())
            except errors:  # this actor died: nothing of it to close
                pass
            actor.__ray_terminate__.remote()  # queued behind close(): every later call raises RayActorError

    def get_images(self) -> Sequence[np.ndarray | None]:
        if self.render_mode != "rgb_array":
            warnings.warn(
                f"The render mode is {self.render_mode}, but this method assumes it is `rgb_array` to obtain images.")
            return [None for _ in self.actors]
        return self._ray.get([actor.render.remote() for actor in self.actors])

    # ------------------------------------------------------------------ attributes and methods
    def has_attr(self, attr_name: str) -> bool:
        return all(self._ray.get([actor.has_attr.remote(attr_name) for actor in self.actors]))

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        return self._ray.get([actor.get_attr.remote(attr_name) for actor in self._targets(indices)])

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        self._ray.get([actor.set_attr.remote(attr_name, value) for actor in self._targets(indices)])

    def env_method(self, method_name: str, *method_args, indices: VecEnvIndices = None, **method_kwargs) -> list[Any]:
        return self._ray.get([actor.env_method.remote(method_name, method_args, method_kwargs)
                              for actor in self._targets(indices)])

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        return self._ray.get([actor.is_wrapped.remote(wrapper_class) for actor in self._targets(indices)])

    def _targets(self, indices: VecEnvIndices) -> list[Any]:
        return [self.actors[i] for i in self._get_indices(indices)]
