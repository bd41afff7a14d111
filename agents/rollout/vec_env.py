"""A ``DummyVecEnv`` for text envs whose observation space is gymnasium's own ``Text``.

SB3's ``DummyVecEnv`` stores observations in fixed-shape numpy buffers, so it fails on a
``gymnasium.spaces.Text`` observation space, which has no shape (``TypeError: 'NoneType'
object is not iterable``). BugFix-v0 does not need this module: its spaces are
:class:`bugfix_gym.contract.spaces.BufferedText` (``shape == ()``, object dtype), which SB3's own
vector envs, ``evaluate_policy`` and ``EvalCallback`` hold as they are. Other text envs
that use the plain ``Text`` space get :class:`TextDummyVecEnv`, which keeps one Python
string per sub-environment in an ``object`` array; everything else (auto-reset,
``terminal_observation``, ``get_attr`` / ``env_method``, seeding) is SB3's own code. The
token algorithms use it automatically for such an env.

:class:`FreshInfoDummyVecEnv` is SB3's ``DummyVecEnv`` without its deep copies of each step's
info dicts and observations, for envs that return a new info dict from every step (the
episode sampler's task envs): the copies cost about as much as BugFix-v0's own steps.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv
from stable_baselines3.common.vec_env.base_vec_env import VecEnvObs, VecEnvStepReturn
from stable_baselines3.common.vec_env.util import dict_to_obs
from stable_baselines3.common.vec_env.patch_gym import _patch_env


def is_unshaped_text(space: spaces.Space) -> bool:
    """True for a ``Text`` space without a shape (gymnasium's own ``Text``; BugFix-v0's
    :class:`bugfix_gym.contract.spaces.BufferedText` has one and works in SB3's ``DummyVecEnv`` as is)."""
    return isinstance(space, spaces.Text) and space.shape is None


class TextDummyVecEnv(DummyVecEnv):
    """``DummyVecEnv`` whose observation buffer holds strings when the space is ``Text``.

    :param env_fns: functions that each return a *new* environment instance
    """

    def __init__(self, env_fns: list[Callable[[], gym.Env]]):
        probe = [_patch_env(fn()) for fn in env_fns]
        if not is_unshaped_text(probe[0].observation_space):
            # shaped observations: SB3's DummyVecEnv as is (reuse the instances just built)
            super().__init__([functools.partial(_same, e) for e in probe])
            return
        if len({id(e.unwrapped) for e in probe}) != len(probe):
            raise ValueError("TextDummyVecEnv needs a new environment instance from every env_fn "
                             "(use `lambda: gym.make('BugFix-v0')`, not `lambda: env`)")
        self.envs = probe
        env = self.envs[0]
        VecEnv.__init__(self, len(env_fns), env.observation_space, env.action_space)
        # the only change from DummyVecEnv: one object slot per env instead of a shaped array
        self.keys = [None]  # type: ignore[list-item]  # SB3's key for an unstructured space
        self.buf_obs = OrderedDict([(None, np.empty((self.num_envs,), dtype=object))])  # type: ignore[list-item]
        self.buf_dones = np.zeros((self.num_envs,), dtype=bool)
        self.buf_rews = np.zeros((self.num_envs,), dtype=np.float32)
        self.buf_infos = [{} for _ in range(self.num_envs)]
        self.metadata = env.metadata


class FreshInfoDummyVecEnv(DummyVecEnv):
    """SB3's ``DummyVecEnv`` whose ``step_wait`` hands out the step's info dicts and observations
    without deep-copying them (a new list of the same objects).

    SB3 deep-copies them because an env could return one info dict and change it later. Use this
    only with envs that return a new info dict from every ``step`` and ``reset`` and never touch it
    again (BugFix-v0 and its wrappers do: every value is built or copied for that step). The auto-reset,
    ``terminal_observation`` and ``TimeLimit.truncated`` are SB3's, in SB3's order.

    :param env_fns: functions that each return a *new* environment instance
    """

    def step_wait(self) -> VecEnvStepReturn:
        for i in range(self.num_envs):
            obs, self.buf_rews[i], terminated, truncated, info = self.envs[i].step(self.actions[i])
            self.buf_dones[i] = terminated or truncated
            info["TimeLimit.truncated"] = truncated and not terminated
            if self.buf_dones[i]:
                info["terminal_observation"] = obs
                obs, self.reset_infos[i] = self.envs[i].reset()
            self.buf_infos[i] = info
            self._save_obs(i, obs)
        return self._obs_from_buf(), np.copy(self.buf_rews), np.copy(self.buf_dones), list(self.buf_infos)

    def _obs_from_buf(self) -> VecEnvObs:
        """The observations: copies of the buffers (their items are immutable strings here), not deep copies."""
        return dict_to_obs(self.observation_space, OrderedDict((k, np.copy(v)) for k, v in self.buf_obs.items()))


def _same(env: gym.Env) -> gym.Env:
    return env


def make_text_vec_env(env: str | gym.Env | Callable[[], gym.Env], n_envs: int = 1, monitor: bool = True,
                      **make_kwargs) -> TextDummyVecEnv:
    """A :class:`TextDummyVecEnv` of ``n_envs`` fresh environments.

    :param env: an env id (``"BugFix-v0"``), a callable returning a new env, or an env
        instance (only for ``n_envs=1``)
    :param n_envs: number of sub-environments
    :param monitor: wrap each in SB3's ``Monitor`` (episode return / length in ``info``)
    :param make_kwargs: keyword arguments for ``gym.make`` when ``env`` is an id
    """
    from stable_baselines3.common.monitor import Monitor

    if isinstance(env, gym.Env):
        if n_envs != 1:
            raise ValueError("pass an env id or a factory to build more than one sub-environment")
        instance = env
        factory: Callable[[], gym.Env] = lambda: instance  # noqa: E731
    elif isinstance(env, str):
        env_id = env
        factory = lambda: gym.make(env_id, **make_kwargs)  # noqa: E731
    else:
        factory = env

    def make() -> gym.Env:
        e = factory()
        return Monitor(e) if monitor else e

    return TextDummyVecEnv([make for _ in range(n_envs)])
